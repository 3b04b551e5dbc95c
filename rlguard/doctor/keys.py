"""The doctor's one table from TRL's and verl's metric keys to rlguard's canonical names (DESIGN.md).

A key is read after stripping a logger's namespace (``train/`` from wandb and TensorBoard exports of TRL runs).
``rlguard/<name>`` (what rlguard's adapters log) and bare canonical names map to themselves and win over a
framework's own key for the same name: they are computed by rlguard's exact objectives.

:data:`TRL_TO_CANONICAL` is also the table of the live TRL callback (:mod:`rlguard.adapters.trl_guard`); this module
imports no framework, so the doctor reads logs without TRL or verl installed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rlguard.guards.stats import STAT_REDUCTIONS

#: canonical stat names: the reduced stats of :mod:`rlguard.guards.stats` and the two it derives
CANONICAL: frozenset[str] = frozenset(
    {k for k in STAT_REDUCTIONS if not k.startswith("_")} | {"reward_std", "mismatch_prob_corr"}
)
#: names the doctor adds for plotting only (no detector reads them): verl's probability-space mismatch
DOCTOR_ONLY: frozenset[str] = frozenset({"mismatch_prob_abs_mean", "mismatch_prob_abs_max"})

#: TRL GRPOTrainer's logged keys (trl/trainer/grpo_trainer.py, ``_metrics[mode][...]``) and transformers' Trainer
TRL_TO_CANONICAL: dict[str, str] = {
    "loss": "loss",
    "entropy": "entropy",
    "kl": "kl_ref",
    "clip_ratio/region_mean": "clip_frac",
    "clip_ratio/low_mean": "clip_frac_low",
    "clip_ratio/high_mean": "clip_frac_high",
    "cispo_clip_ratio": "clip_frac",
    "reward": "reward_mean",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_zero_std_groups",
    "completions/mean_length": "length_mean",
    "completion_length": "length_mean",  # TRL < 0.14
    "completions/max_length": "length_max",
    "completions/clipped_ratio": "truncated_frac",
    "sampling/sampling_logp_difference/mean": "mismatch_logp_abs_mean",
    "sampling/sampling_logp_difference/max": "mismatch_logp_abs_max",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
}
#: verl's keys (dp actor, ray trainer's compute_data_metrics, rollout_corr_helper, utils/debug/metrics.py)
VERL_TO_CANONICAL: dict[str, str] = {
    "actor/pg_loss": "loss",
    "actor/entropy": "entropy",
    "actor/grad_norm": "grad_norm",
    "actor/lr": "lr",
    "actor/pg_clipfrac": "clip_frac",
    "actor/ppo_kl": "kl_old",  # k1 estimate of KL(pi_old || pi); the canonical kl_old is k3
    "actor/kl_loss": "kl_ref",
    "actor/reward_kl_penalty": "kl_ref",  # KL in the reward (use_kl_in_reward) instead of the loss
    "critic/score/mean": "reward_mean",  # the verifier's score; critic/rewards/* include the KL penalty
    "response_length/mean": "length_mean",
    "response_length/max": "length_max",
    "response_length/clip_ratio": "truncated_frac",
    "rollout_corr/k3_kl": "mismatch_kl",
    "rollout_corr/rollout_rs_masked_fraction": "masked_frac",
    "training/rollout_probs_diff_mean": "mismatch_prob_abs_mean",  # |p_train - p_rollout|, probability space
    "training/rollout_probs_diff_max": "mismatch_prob_abs_max",
    "training/rollout_actor_probs_pearson_corr": "mismatch_prob_corr",
}
#: framework key -> canonical name; where two keys give one name, the first listed wins
KEY_TO_CANONICAL: dict[str, str] = {**TRL_TO_CANONICAL, **VERL_TO_CANONICAL}

#: logger namespaces stripped before lookup (wandb and TensorBoard prefix TRL's keys with ``train/``)
NAMESPACES: tuple[str, ...] = ("train/",)
_RLGUARD = "rlguard/"

#: keys known to carry no canonical stat: counters, timings, evaluation, and framework stats without a counterpart
KNOWN_PREFIXES: tuple[str, ...] = (
    "eval_",
    "eval/",
    "val-core/",
    "val-aux/",
    "test/",
    "timing_s/",
    "timing_per_token_ms/",
    "perf/",
    "rewards/",
    "tools/",
    "vespo/",
    "sampling/",
    "clip_ratio/",
    "completions/",
    "critic/",
    "prompt_length/",
    "response_length/",
    "rollout_corr/",
    "training/",
    "actor/",
    "_",
    # the guard's own records in the adapters' logs: its events and actions, not stats
    "rlguard/event/",
    "rlguard/guard/",
)
KNOWN_KEYS: frozenset[str] = frozenset(
    {"step", "global_step", "epoch", "num_tokens", "step_time", "total_flos", "aux_loss", "policy_loss", "entropy_coef"}
    | {"train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second", "Step"}
)
#: canonical names that no detector judges on its own (verl's probability-space mismatch is judged by
#: ``mismatch_growth`` when the run logs no other mismatch stat)
_NOT_JUDGED = frozenset({"lr"}) | (DOCTOR_ONLY - {"mismatch_prob_abs_mean", "mismatch_prob_abs_max"})


def strip_namespace(key: str) -> str:
    """``train/reward`` -> ``reward``; other keys unchanged."""
    for ns in NAMESPACES:
        if key.startswith(ns):
            return key[len(ns) :]
    return key


#: verl's trainers log the workers' metrics under ``actor/`` (``rename_dict``): the guarded loss's ``rlguard/<name>``
#: arrives as ``actor/rlguard/<name>``
_VERL_WORKER_RLGUARD = "actor/" + _RLGUARD


def canonical_name(key: str, key_map: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The canonical name of a raw key and its priority (lower wins), or None if it has none. ``key_map`` (the
    user's ``--map KEY=CANONICAL``) wins over every table."""
    if key_map and key in key_map:
        return key_map[key], -1
    key = strip_namespace(key)
    if key.startswith(_VERL_WORKER_RLGUARD):
        key = key[len("actor/") :]
    if key.startswith(_RLGUARD) and key[len(_RLGUARD) :] in CANONICAL:
        return key[len(_RLGUARD) :], 0
    if key in KEY_TO_CANONICAL:
        return KEY_TO_CANONICAL[key], 2 + list(KEY_TO_CANONICAL).index(key)
    if key in CANONICAL:
        return key, 1
    return None


def canonical_stats(raw: Mapping[str, float], key_map: Mapping[str, str] | None = None) -> dict[str, float]:
    """One step's raw metrics -> canonical stats, each from the highest-priority key present."""
    best: dict[str, tuple[int, float]] = {}
    for key, value in raw.items():
        hit = canonical_name(key, key_map)
        if hit is not None and (hit[0] not in best or hit[1] < best[hit[0]][0]):
            best[hit[0]] = (hit[1], value)
    return {name: value for name, (_, value) in best.items()}


@dataclass(frozen=True)
class KeyReport:
    """How the keys of a log were read.

    Attributes:
        mapped: raw key -> canonical name, for every key that has one.
        known: keys recognised as carrying no canonical stat (counters, timings, evaluation, ...).
        unrecognised: every other key, sorted.
        suggestions: unrecognised key -> the canonical name it looks like (for ``--map KEY=CANONICAL``).
    """

    mapped: dict[str, str]
    known: list[str]
    unrecognised: list[str]
    suggestions: dict[str, str] = field(default_factory=dict)

    @property
    def judged(self) -> list[str]:
        """Canonical names found that a detector can judge (everything but the learning rate and plot-only names)."""
        return sorted({c for c in self.mapped.values() if c not in _NOT_JUDGED})


def classify_keys(keys: Iterable[str], key_map: Mapping[str, str] | None = None) -> KeyReport:
    """Sort the raw keys of a log into mapped, known and unrecognised (with suggestions)."""
    mapped: dict[str, str] = {}
    known: list[str] = []
    unrecognised: list[str] = []
    for key in sorted(set(keys)):
        hit = canonical_name(key, key_map)
        bare = strip_namespace(key)
        if hit is not None:
            mapped[key] = hit[0]
        elif bare in KNOWN_KEYS or bare.startswith(KNOWN_PREFIXES):
            known.append(key)
        else:
            unrecognised.append(key)
    taken = set(mapped.values())
    suggestions = {k: c for k in unrecognised if (c := suggest_canonical(k)) is not None and c not in taken}
    return KeyReport(mapped, known, unrecognised, suggestions)


#: words in a key -> the canonical name it likely holds, first match wins; each rule needs all its words
_SUGGEST: tuple[tuple[frozenset[str], str], ...] = tuple(
    (frozenset(words.split()), name)
    for words, name in (
        ("entropy", "entropy"),
        ("ppo kl", "kl_old"),
        ("old kl", "kl_old"),
        ("kl", "kl_ref"),
        ("reward std", "reward_std"),
        ("reward", "reward_mean"),
        ("score", "reward_mean"),
        ("return", "reward_mean"),
        ("len max", "length_max"),
        ("length max", "length_max"),
        ("len", "length_mean"),
        ("length", "length_mean"),
        ("grad norm", "grad_norm"),
        ("gradnorm", "grad_norm"),
        ("clip", "clip_frac"),
        ("ratio max", "ratio_max"),
        ("ratio", "ratio_mean"),
        ("truncated", "truncated_frac"),
        ("lr", "lr"),
    )
)
_ABBREVIATIONS = {"ent": "entropy", "rew": "reward", "rwd": "reward", "gnorm": "gradnorm", "trunc": "truncated"}


def suggest_canonical(key: str) -> str | None:
    """The canonical name an unrecognised key looks like (``reward_avg`` -> ``reward_mean``,
    ``avg_response_len`` -> ``length_mean``), or None."""
    words = {_ABBREVIATIONS.get(w, w) for w in re.split(r"[^a-z0-9]+", strip_namespace(key).lower()) if w}
    for need, name in _SUGGEST:
        if need <= words:
            return name
    return None


def parse_key_map(items: Iterable[str]) -> dict[str, str]:
    """``["reward_avg=reward_mean", ...]`` (``--map``) -> ``{"reward_avg": "reward_mean"}``; ValueError naming the
    item for a malformed one or an unknown canonical name."""
    out: dict[str, str] = {}
    names = CANONICAL | DOCTOR_ONLY
    for item in items:
        key, sep, name = item.partition("=")
        if not sep or not key or not name:
            raise ValueError(f"--map {item!r}: expected KEY=CANONICAL, e.g. --map reward_avg=reward_mean")
        if name not in names:
            raise ValueError(
                f"--map {item!r}: {name!r} is not a canonical name; canonical names: {', '.join(sorted(names))}"
            )
        out[key] = name
    return out
