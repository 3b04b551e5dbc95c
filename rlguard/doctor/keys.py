"""The doctor's key maps, derived from the one metric table (:mod:`rlguard.metrics`, ``docs/design.md``).

A key is read after stripping a logger's namespace (``train/`` from wandb and TensorBoard exports of TRL runs).
``rlguard/<name>`` (what rlguard's adapters log) and bare canonical names map to themselves and win over a
framework's own key for the same name: they are computed by rlguard's exact objectives.

The key tables and :func:`canonical_stats` are :mod:`rlguard.metrics`'s, shared with the live adapters; this module
adds what only the doctor needs (keys known to carry no stat) and imports no framework, so the doctor reads logs
without TRL or verl installed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rlguard.metrics import (
    CANONICAL,
    DOCTOR_ONLY,
    JUDGED,
    KEY_TO_CANONICAL,
    NAMESPACES,
    TRL_TO_CANONICAL,
    VERL_TO_CANONICAL,
    canonical_name,
    canonical_stats,
    strip_namespace,
)

__all__ = [
    "CANONICAL",
    "DOCTOR_ONLY",
    "KEY_TO_CANONICAL",
    "KNOWN_KEYS",
    "KNOWN_PREFIXES",
    "NAMESPACES",
    "TRL_TO_CANONICAL",
    "VERL_TO_CANONICAL",
    "KeyReport",
    "canonical_name",
    "canonical_stats",
    "classify_keys",
    "parse_key_map",
    "strip_namespace",
    "suggest_canonical",
]


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


@dataclass(frozen=True)
class KeyReport:
    """How the keys of a log were read.

    Attributes:
        mapped: raw key -> canonical name, for every key that has one (auto-mapped keys included).
        known: keys recognised as carrying no canonical stat (counters, timings, evaluation, ...).
        unrecognised: every other key, sorted (auto-mapped keys excluded).
        suggestions: unrecognised key -> the canonical name it looks like (for ``--map KEY=CANONICAL``), where it
            was not mapped automatically (ambiguous, or auto-mapping off).
        auto_mapped: raw key -> canonical name mapped because exactly one canonical stat matches it (and no other
            key of the log claims that stat).
    """

    mapped: dict[str, str]
    known: list[str]
    unrecognised: list[str]
    suggestions: dict[str, str] = field(default_factory=dict)
    auto_mapped: dict[str, str] = field(default_factory=dict)

    @property
    def judged(self) -> list[str]:
        """Canonical names found that a built-in detector judges (``judged`` in :data:`rlguard.metrics.METRICS`)."""
        return sorted({c for c in self.mapped.values() if c in JUDGED})

    @property
    def key_map(self) -> dict[str, str]:
        """The raw key -> canonical name map to read the log with (``--map`` entries and the automatic ones)."""
        return dict(self.mapped)


def classify_keys(keys: Iterable[str], key_map: Mapping[str, str] | None = None, auto_map: bool = True) -> KeyReport:
    """Sort the raw keys of a log into mapped, known and unrecognised; with ``auto_map``, map each unrecognised
    key whose words match exactly one canonical stat that no other key claims (``reward_avg`` -> ``reward_mean``),
    or, where several claim it, the one key whose words are exactly the stat's (``reward_avg`` rather than
    ``format_reward_avg``); suggest the rest."""
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
    claims: dict[str, list[str]] = {}
    for k, c in suggestions.items():
        claims.setdefault(c, []).append(k)
    auto: dict[str, str] = {}
    for c, claimants in claims.items() if auto_map else ():
        exact = [k for k in claimants if _exact(k, c)]
        if len(claimants) == 1 or len(exact) == 1:  # one key, or one whose words are the stat's and no more
            auto[claimants[0] if len(claimants) == 1 else exact[0]] = c
    return KeyReport(
        {**mapped, **auto},
        known,
        [k for k in unrecognised if k not in auto],
        {k: c for k, c in suggestions.items() if k not in auto},
        auto,
    )


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


#: words that name an aggregate of a stat without changing which stat it is
_AGGREGATES = frozenset({"avg", "mean", "average"})


def _words(key: str) -> set[str]:
    return {_ABBREVIATIONS.get(w, w) for w in re.split(r"[^a-z0-9]+", strip_namespace(key).lower()) if w}


def _exact(key: str, name: str) -> bool:
    """Whether ``key``'s words are those of a rule for ``name``, aggregates (avg, mean) aside."""
    words = _words(key) - _AGGREGATES
    return any(need == words for need, rule_name in _SUGGEST if rule_name == name)


def suggest_canonical(key: str) -> str | None:
    """The one canonical name an unrecognised key looks like (``reward_avg`` -> ``reward_mean``,
    ``avg_response_len`` -> ``length_mean``), or None when none or several match. A rule whose words are all
    within another matching rule's (``reward`` within ``reward std``) gives way to it."""
    words = _words(key)
    hits = [(need, name) for need, name in _SUGGEST if need <= words]
    specific = {name for need, name in hits if not any(need < other for other, _ in hits)}
    return next(iter(specific)) if len(specific) == 1 else None


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
