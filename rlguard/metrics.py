"""The one metric table: every canonical stat, how ranks and micro-batches combine it, and the frameworks' keys.

Each :class:`Metric` row says what a canonical name means, how it is reduced (``mean``, ``sum``, ``max``,
``min``), what weights a mean (tokens, sequences, samples, or each observation equally), the keys TRL and verl log
it under, and whether a built-in detector judges it. Everything else is derived from :data:`METRICS`: the
guard's step-stat reduction and the TRL adapter's cross-process reduction (:mod:`rlguard.guards.stats.reduction`), the
verl driver's stats and the doctor's key maps (:mod:`rlguard.doctor.keys`), and :func:`canonical_stats`. Beside it,
:data:`DOMAINS`: the values each stat can take, which a log's key must fit before the doctor maps it by name. See
``docs/design.md`` ("Metric table").

This module imports nothing from rlguard and no framework: every layer may read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "CANONICAL",
    "JUDGED",
    "KEY_TO_CANONICAL",
    "METRICS",
    "REDUCTIONS",
    "RLGUARD_PREFIX",
    "STALENESS_BUCKETS",
    "TRL_TO_CANONICAL",
    "VERL_TO_CANONICAL",
    "Metric",
    "Reduction",
    "Weighting",
    "canonical_name",
    "canonical_stats",
]

Reduction = Literal["mean", "sum", "max", "min"]
#: what weights a ``mean`` across micro-batches and ranks: unmasked tokens, live sequences, samples (rewards,
#: completions, groups: the count passed with the value), or each observation equally
Weighting = Literal["tokens", "sequences", "samples", "equal"]


@dataclass(frozen=True)
class Metric:
    """One canonical stat.

    Attributes:
        name: the canonical name (``docs/design.md``); ``_``-prefixed names are internal moments.
        reduction: how local values combine across micro-batches and ranks.
        weight: what weights a ``mean`` (ignored for the other reductions).
        trl: TRL's logged keys for it (``GRPOTrainer._metrics`` and transformers' ``Trainer``).
        verl: verl's logged keys for it (dp actor, ray trainer, rollout-correction helper).
        judged: a built-in detector reads it.
        derived: computed after reduction from internal moments (``reward_std``, ``mismatch_prob_corr``).
        doctor_only: read from logs for plots only; no run of rlguard produces it.
        doc: what it is.
    """

    name: str
    reduction: Reduction
    weight: Weighting
    trl: tuple[str, ...] = ()
    verl: tuple[str, ...] = ()
    judged: bool = False
    derived: bool = False
    doctor_only: bool = False
    doc: str = ""


#: The gap-by-age buckets ``(stat, lowest age, highest age)`` in policy versions. Age 0 is on-policy: the engine's
#: numerics alone, the reference the others are read against; age 1 is a one-step-off pipeline (verl's
#: ``one_step_off_policy``); then powers of two, since a sample's drift grows with the updates made since it was
#: sampled and a doubling of them is the least change worth a bucket; 4 and up lies at and past TRL's default
#: bound (``AsyncGRPOConfig.max_staleness = 4``). Fixed, so that every log and every rank has the same names.
STALENESS_BUCKETS: tuple[tuple[str, int, float], ...] = (
    ("mismatch_logp_abs_mean_age0", 0, 0),
    ("mismatch_logp_abs_mean_age1", 1, 1),
    ("mismatch_logp_abs_mean_age2_3", 2, 3),
    ("mismatch_logp_abs_mean_age4plus", 4, math.inf),
)

_M = Metric
#: The table. Order matters where two framework keys map to one name: the first listed wins.
METRICS: tuple[Metric, ...] = (
    _M(
        "loss",
        "mean",
        "equal",
        ("loss",),
        ("actor/pg_loss",),
        judged=True,  # non-finite check
        doc="the objective's value (each micro-batch's share)",
    ),
    _M("entropy", "mean", "tokens", ("entropy",), ("actor/entropy",), judged=True, doc="mean per-token entropy"),
    _M(
        "kl_ref",
        "mean",
        "tokens",
        ("kl",),
        ("actor/kl_loss", "actor/reward_kl_penalty"),
        judged=True,
        doc="KL to the reference policy (estimator as configured; verl's in-reward penalty too)",
    ),
    _M(
        "kl_old",
        "mean",
        "tokens",
        (),
        ("actor/ppo_kl",),
        judged=True,
        doc="KL to the behaviour policy, k3 token mean (verl's actor/ppo_kl is its k1 estimate)",
    ),
    _M("ratio_mean", "mean", "tokens", doc="token importance ratio pi/pi_old, mean over unmasked tokens"),
    _M("ratio_min", "min", "equal", doc="smallest token ratio"),
    _M("ratio_max", "max", "equal", judged=True, doc="largest token ratio"),
    _M("seq_ratio_mean", "mean", "sequences", doc="GSPO's length-normalised sequence ratio, mean over sequences"),
    _M("seq_ratio_min", "min", "equal", doc="smallest sequence ratio"),
    _M("seq_ratio_max", "max", "equal", doc="largest sequence ratio"),
    _M(
        "clip_frac",
        "mean",
        "tokens",
        ("clip_ratio/region_mean", "cispo_clip_ratio"),
        ("actor/pg_clipfrac",),
        judged=True,
        doc="fraction of unmasked tokens whose term was clipped (TRL's CISPO: the upper cap's)",
    ),
    _M("clip_frac_low", "mean", "tokens", ("clip_ratio/low_mean",), ("actor/pg_clipfrac_lower",), doc="clipped below"),
    _M("clip_frac_high", "mean", "tokens", ("clip_ratio/high_mean",), doc="clipped above"),
    _M(
        "clip_log_width",
        "min",
        "equal",
        doc="the objective's clip range in force, its narrower side in log-ratio units: min(log hi, -log lo)",
    ),
    _M(
        "mismatch_logp_abs_mean",
        "mean",
        "tokens",
        ("sampling/sampling_logp_difference/mean",),
        judged=True,
        doc="mean |log p_trainer - log p_rollout|",
    ),
    _M(
        "mismatch_logp_abs_max",
        "max",
        "equal",
        ("sampling/sampling_logp_difference/max",),
        judged=True,
        doc="largest |log p_trainer - log p_rollout|",
    ),
    _M("mismatch_kl", "mean", "tokens", (), ("rollout_corr/k3_kl",), judged=True, doc="k3 KL trainer vs rollout"),
    _M(
        "masked_frac",
        "mean",
        "tokens",
        (),
        ("rollout_corr/rollout_rs_masked_fraction",),
        doc="fraction of tokens removed by rollout correction or off-policy masking",
    ),
    _M("grad_norm", "max", "equal", ("grad_norm",), ("actor/grad_norm",), judged=True, doc="before clipping"),
    _M("lr", "max", "equal", ("learning_rate",), ("actor/lr",), doc="the learning rate of this step"),
    _M(
        "update_ratio",
        "max",
        "equal",
        doc="relative size of the last optimizer update, ||theta_t - theta_(t-1)|| / ||theta_(t-1)|| (actuators "
        "that measure it report it into the next step's stats)",
    ),
    _M("reward_mean", "mean", "samples", ("reward",), ("critic/score/mean",), judged=True, doc="mean reward"),
    _M(
        "reward_std",
        "mean",
        "samples",
        ("reward_std",),
        judged=True,  # advantage_collapse
        derived=True,
        doc="reward standard deviation over the step's samples (from the reduced moments)",
    ),
    _M(
        "frac_zero_std_groups",
        "mean",
        "samples",
        ("frac_reward_zero_std",),
        judged=True,
        doc="groups whose rewards are all equal",
    ),
    _M("frac_zero_std_solved", "mean", "samples", doc="groups whose rewards are all equal and maximal"),
    _M(
        "length_mean",
        "mean",
        "samples",
        ("completions/mean_length", "completion_length"),  # the second: TRL < 0.14
        ("response_length/mean",),
        judged=True,
    ),
    _M("length_max", "max", "equal", ("completions/max_length",), ("response_length/max",), doc="longest completion"),
    _M(
        "truncated_frac",
        "mean",
        "samples",
        ("completions/clipped_ratio",),
        ("response_length/clip_ratio",),
        judged=True,
        doc="completions that hit the generation budget",
    ),
    _M("repetition_rate", "mean", "samples", judged=True, doc="completions caught in an n-gram loop"),
    _M("nonfinite", "sum", "equal", judged=True, doc="count of NaN/Inf in loss, log-probs or gradients"),
    _M(
        "mismatch_prob_corr",
        "mean",
        "equal",
        (),
        ("training/rollout_actor_probs_pearson_corr",),
        derived=True,
        doc="Pearson correlation of trainer and rollout token probabilities",
    ),
    _M(
        "mismatch_prob_abs_mean",
        "mean",
        "tokens",
        (),
        ("training/rollout_probs_diff_mean",),
        judged=True,  # by mismatch_growth when the run logs no other mismatch stat
        doctor_only=True,
        doc="|p_train - p_rollout|, probability space (verl)",
    ),
    _M(
        "mismatch_prob_abs_max",
        "max",
        "equal",
        (),
        ("training/rollout_probs_diff_max",),
        judged=True,  # by mismatch_growth when the run logs no other mismatch stat
        doctor_only=True,
        doc="largest |p_train - p_rollout| (verl)",
    ),
    # evaluation beside the reward: read from logs by the doctor (rlguard.doctor.keys picks the key and its direction)
    # eval_drop and frozen_values judge both; eval_drop reads eval_loss negated
    _M("eval_score", "mean", "equal", judged=True, doctor_only=True, doc="held-out, higher is better (accuracy)"),
    _M("eval_loss", "mean", "equal", judged=True, doctor_only=True, doc="held-out, lower is better (loss, error)"),
    # staleness (asynchronous pipelines): an age is in policy versions, the optimizer updates between the weights that
    # sampled and the weights updated (TRL: model_version - sample.model_version; verl: current_param_version minus a
    # trajectory's param_version); read by staleness_remedy (evidence), by no detector
    _M("staleness_mean", "mean", "samples", ("sample/staleness_mean",), doc="mean age of the samples"),
    _M("staleness_max", "max", "equal", ("sample/staleness_max",), doc="largest age of the samples"),
    # the same ages in optimizer steps: the updates between the weights that sampled and the weights updated, which
    # differ from versions where weights are published every k > 1 steps (TRL's weight_sync_steps, verl's
    # trigger_parameter_sync_step); logged by rlguard's adapters (PublishedSteps), by neither framework
    _M("staleness_steps_mean", "mean", "samples", doc="mean age of the samples in optimizer steps"),
    _M("staleness_steps_max", "max", "equal", doc="largest age of the samples in optimizer steps"),
    # TRL pushes 1 per dropped sample and sums the logging window ("total" in its name: a counter of deltas)
    _M("stale_dropped", "sum", "equal", ("sample/dropped_stale_total",), doc="samples dropped over the age bound"),
    _M("policy_version", "max", "equal", (), ("fully_async/count/current_param_version",), doc="trainer's version"),
    _M(
        "staleness_bound",
        "max",
        "equal",
        doc="the pipeline's age bound in force (max_staleness), as the actuator has it",
    ),
    # |log p_trainer - log p_rollout| over the tokens of one age bucket's samples (STALENESS_BUCKETS)
    *(
        _M(n, "mean", "tokens", doc=f"|log p_trainer - log p_rollout|, ages {lo}-{hi}")
        for n, lo, hi in STALENESS_BUCKETS
    ),
    # internal moments: reward_std and mismatch_prob_corr are computed exactly from the combined data
    _M("_reward_sq_mean", "mean", "samples"),
    _M("_p_n", "sum", "equal"),
    _M("_p_x", "sum", "equal"),
    _M("_p_y", "sum", "equal"),
    _M("_p_xx", "sum", "equal"),
    _M("_p_yy", "sum", "equal"),
    _M("_p_xy", "sum", "equal"),
)

#: canonical names: derived ones included, internal moments and the doctor's plot-only names not
CANONICAL: frozenset[str] = frozenset(m.name for m in METRICS if not m.name.startswith("_") and not m.doctor_only)
DOCTOR_ONLY: frozenset[str] = frozenset(m.name for m in METRICS if m.doctor_only)
JUDGED: frozenset[str] = frozenset(m.name for m in METRICS if m.judged)
#: what a step's accumulator reduces: every stat that is neither derived nor read from logs only
REDUCTIONS: dict[str, Reduction] = {m.name: m.reduction for m in METRICS if not m.derived and not m.doctor_only}
WEIGHTS: dict[str, Weighting] = {m.name: m.weight for m in METRICS if not m.derived and not m.doctor_only}


#: framework key -> canonical name; where two keys give one name, the first listed wins
TRL_TO_CANONICAL: dict[str, str] = {key: m.name for m in METRICS for key in m.trl}
VERL_TO_CANONICAL: dict[str, str] = {key: m.name for m in METRICS for key in m.verl}
KEY_TO_CANONICAL: dict[str, str] = {**TRL_TO_CANONICAL, **VERL_TO_CANONICAL}

#: rlguard's own metrics in a framework's logs: ``rlguard/<name>``; verl's trainers log the workers' metrics under
#: ``actor/`` (its ``rename_dict``), so the guarded loss's arrive as ``actor/rlguard/<name>``
RLGUARD_PREFIX = "rlguard/"
_VERL_WORKER_PREFIX = "actor/" + RLGUARD_PREFIX
#: logger namespaces stripped before lookup (wandb and TensorBoard prefix TRL's keys with ``train/``)
NAMESPACES: tuple[str, ...] = ("train/",)


def strip_namespace(key: str) -> str:
    """``train/reward`` -> ``reward``; other keys unchanged."""
    for ns in NAMESPACES:
        if key.startswith(ns):
            return key[len(ns) :]
    return key


_KEY_PRIORITY = {key: i for i, key in enumerate(KEY_TO_CANONICAL)}


def canonical_name(key: str, key_map: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The canonical name of a raw logged key and its priority (lower wins), or None if it has none.

    ``key_map`` (the doctor's ``--map KEY=CANONICAL``) wins over every table; an empty name refuses the key. Then
    ``rlguard/<name>`` (and verl's ``actor/rlguard/<name>``): rlguard's exact objectives computed them; then a bare
    canonical name; then the frameworks' keys in table order.
    """
    if key_map and key in key_map:
        return (key_map[key], -1) if key_map[key] else None  # ``--map KEY=``: refused
    key = strip_namespace(key)
    if key.startswith(_VERL_WORKER_PREFIX):
        key = key[len("actor/") :]
    if key.startswith(RLGUARD_PREFIX) and key[len(RLGUARD_PREFIX) :] in CANONICAL:
        return key[len(RLGUARD_PREFIX) :], 0
    if key in KEY_TO_CANONICAL:
        return KEY_TO_CANONICAL[key], 2 + _KEY_PRIORITY[key]
    if key in CANONICAL:
        return key, 1
    return None


def canonical_stats(raw: Mapping[str, Any], key_map: Mapping[str, str] | None = None) -> dict[str, float]:
    """One step's logged metrics -> canonical stats, each from the highest-priority key present.

    Values that are not real numbers (None, strings, booleans) are skipped; ``rlguard/guard/*`` and
    ``rlguard/event/*`` are the guard's own records, not stats.
    """
    best: dict[str, tuple[int, float]] = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        hit = canonical_name(key, key_map)
        if hit is not None and (hit[0] not in best or hit[1] < best[hit[0]][0]):
            best[hit[0]] = (hit[1], float(value))
    return {name: value for name, (_, value) in best.items()}
