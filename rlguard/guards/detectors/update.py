"""Detectors of the update itself: non-finite values, the gradient norm, the importance ratio, the clip fraction,
the KL to the reference and behaviour policies, and the train-inference mismatch."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from rlguard.guards.detectors.base import Detector, _finite
from rlguard.guards.detectors.shapes import CusumDetector, SpikeDetector
from rlguard.guards.events import Finding
from rlguard.guards.signal import without_signal
from rlguard.metrics import METRICS


def finite_values(stats: Mapping[str, float]) -> bool:
    """Whether every value of ``stats`` is a finite number, where one sum tells: a sum of values is finite only if
    each is (a NaN or an infinity carries through). False also where the sum overflows or a value is no number:
    the caller then tests the values it needs one by one."""
    try:
        return math.isfinite(sum(stats.values()))
    except (ArithmeticError, TypeError, ValueError, RuntimeWarning):  # RuntimeWarning: numpy's overflow, as error
        return False


@dataclass(kw_only=True)
class NonFinite(Detector):
    """NaN/Inf in the loss, log-probs or gradients (the ``nonfinite`` count), or in any judged stat (reward, KL,
    entropy, lengths, ...): critical at once, no warm-up; unrecoverable (a NaN reaches the weights through the
    update)."""

    name = "nonfinite"
    source = "numerical hygiene; every framework's NaN guard"
    summary = "NaN/Inf in loss, log-probs or gradients (count > 0), or in any judged stat: critical"

    warmup: int = 0
    clear_after: int = 1

    def reads(self) -> tuple[str, ...]:
        return ("nonfinite", "loss", "grad_norm")

    def observes(self, stats: Mapping[str, float]) -> bool:
        """Any step that carries the loss, the gradient norm or a judged stat, finite or not (a NaN is its
        evidence)."""
        return not stats.keys().isdisjoint(_WATCHED)

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool:
        """Its names settle it (:meth:`observes`)."""
        return not names.isdisjoint(_WATCHED)

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        count = stats.get("nonfinite", 0.0)
        # a sum of values is finite only if each is (a NaN or an infinity carries through): all of the step's values
        # at once (most steps), else those it judges
        if not count > 0 and (finite_values(stats) or math.isfinite(sum([stats[k] for k in _VALUES if k in stats]))):
            return None
        bad = [k for k in _VALUES if k in stats and not math.isfinite(stats[k])]
        if count > 0 or bad:
            what = f"{count:g} non-finite values" if count > 0 else "non-finite " + ", ".join(bad)
            return Finding(
                "critical",
                float(count) if count > 0 else math.inf,
                0.0,
                f"{what} this step. Skip the optimizer step and inspect the batch (engine log-probs, rewards); "
                "if it repeats, roll back and lower the learning rate.",
                unrecoverable=True,
            )
        return None


#: what ``nonfinite`` watches: the loss, then every stat a built-in detector judges (the metric table's order)
_WATCHED: tuple[str, ...] = ("loss", *(m.name for m in METRICS if m.judged))
#: the stats whose own value ``nonfinite`` judges: those it watches but its count
_VALUES: tuple[str, ...] = tuple(k for k in _WATCHED if k != "nonfinite")


class _PolicyGradientSteps(Detector):
    """Mixin of the detectors whose stat is the size of the policy-gradient update (the gradient norm, the policy's
    move from the behaviour policy: KL to it, the clip fraction). A step whose batch carries no policy-gradient
    signal (:func:`~rlguard.guards.signal.without_signal`, the test ``skip_no_signal`` skips by) updates by the KL or
    entropy terms alone, another process whose size (0, or the KL term's pull: orders of magnitude below a learning
    step's) says nothing about the learning steps': it is not an observation (neither learnt nor judged, nor counted
    toward the warm-up), so that a too-hard start does not make the first learning steps look like a spike."""

    #: ``super().observes`` of the class, resolved once per class (:meth:`__init_subclass__`): the ``observes`` of
    #: the first class after this mixin in its method resolution order that defines one, the method ``super()``
    #: finds, without building a ``super`` object at each call (it is asked several times a step)
    _observes_with_signal: ClassVar[Callable[[Detector, Mapping[str, float]], bool]]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        mro = cls.__mro__
        after = mro[mro.index(_PolicyGradientSteps) + 1 :]
        cls._observes_with_signal = next(c.__dict__["observes"] for c in after if "observes" in c.__dict__)

    def observes(self, stats: Mapping[str, float]) -> bool:
        """The step's stat, on a step whose batch carries a policy-gradient signal (a log without
        ``frac_zero_std_groups``: every step)."""
        return not without_signal(stats) and self._observes_with_signal(stats)

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool | None:
        """No step without the stat its detector judges (:meth:`reads`); else the values decide."""
        reads = self.reads()
        return False if reads and names.isdisjoint(reads) else None


@dataclass(kw_only=True)
class GradNormSpike(_PolicyGradientSteps, SpikeDetector):
    name = "grad_norm_spike"
    source = "robust z-score on log gradient norm (median/MAD; Hampel 1974)"
    summary = "grad norm >= 5x (warn) / 20x (critical) its rolling median, robust z >= 6"
    metric: str = "grad_norm"
    advice: str = "Skip this step; if spikes repeat, lower the LR or tighten clipping."


@dataclass(kw_only=True)
class GradNormExplosion(_PolicyGradientSteps, CusumDetector):
    name = "grad_norm_explosion"
    source = "CUSUM on log gradient norm (Page 1954)"
    summary = (
        "sustained rise of log grad norm: CUSUM >= 15 (warn) / 40 (critical, once >= 5x the early baseline); "
        "recent median >= 4x the early baseline (warn)"
    )
    metric: str = "grad_norm"
    drift_ratio: float | None = 4.0
    critical_ratio: float | None = 5.0
    advice: str = "Lower the LR; check for a growing train-inference mismatch or length explosion."


@dataclass(kw_only=True)
class KLRefBlowup(SpikeDetector):
    name = "kl_ref_blowup"
    finding_class = "drift"  # the policy moves away from the reference as it learns
    source = (
        "robust spike on log KL(pi||pi_ref); GRPO's KL term, arXiv 2402.03300; absolute bound 4x the largest 95th "
        "percentile of KL on healthy real runs (benchmarks/doctor_real_logs.py, leave-one-repository-out)"
    )
    summary = (
        "KL to reference >= 10x (warn) / 100x (critical) its rolling median, z >= 6; absolute: >= 1 (warn) / "
        "2 (critical) nats from the first step"
    )
    metric: str = "kl_ref"
    warn_factor: float = 10.0
    critical_factor: float = 100.0
    floor: float = 1e-4
    # chosen from real logs, the doctor's one such setting: 4x the largest 95th percentile of KL over the healthy
    # runs of benchmarks/doctor_real_logs.py (0.53 nats, on-policy distillation; GRPO runs with a KL term stay
    # below 0.08), rounded: 2.13 -> 2; the warning at half. Fails on a healthy run that holds more KL than that
    # for 3 of 5 logs while its reward does not rise (the consequence rule makes single steps warnings).
    warn_above: float | None = 1.0
    critical_above: float | None = 2.0
    advice: str = "Lower the LR or raise beta; roll back if it persists."


@dataclass(kw_only=True)
class KLOldBlowup(_PolicyGradientSteps, SpikeDetector):
    name = "kl_old_blowup"
    source = "PPO's approximate KL early stop (Schulman et al. 2017; CleanRL target_kl)"
    summary = "KL to the behaviour policy >= 10x (warn) / 100x (critical) its rolling median, z >= 6"
    metric: str = "kl_old"
    warn_factor: float = 10.0
    critical_factor: float = 100.0
    floor: float = 1e-4
    advice: str = "Tighten the clip range or lower the LR; fewer PPO epochs per batch."


@dataclass(kw_only=True)
class RatioExplosion(SpikeDetector):
    name = "ratio_explosion"
    source = "GSPO, arXiv 2507.18071 (token-ratio variance in MoE); IcePop, arXiv 2510.18855"
    summary = "max importance ratio >= 5x (warn) / 50x (critical) its rolling median and >= 2"
    metric: str = "ratio_max"
    warn_factor: float = 5.0
    critical_factor: float = 50.0
    floor: float = 1.0
    min_value: float = 2.0
    advice: str = "Skip this step; consider sequence-level ratios (gspo) or rollout masking (rollout_mask='token')."


@dataclass(kw_only=True)
class ClipFracBurst(_PolicyGradientSteps, SpikeDetector):
    name = "clip_frac_burst"
    source = "PPO clip fraction diagnostics (Engstrom et al. 2020; CleanRL clipfrac)"
    summary = "clip fraction >= 3x (warn) / 10x (critical) its rolling median and >= 0.05"
    metric: str = "clip_frac"
    warn_factor: float = 3.0
    critical_factor: float = 10.0
    floor: float = 1e-3
    min_value: float = 0.05
    patience: int = 2
    advice: str = "The policy moved far from pi_old: lower the LR or the number of PPO epochs."


#: mismatch stats in the order MismatchGrowth prefers them, with their absolute (warn, critical) bounds. k3 KL:
#: Yao et al. 2025's range. Mean |log-prob gap| d: for a gap of spread sigma, KL ~ E[d^2]/2 and E|d| ~ 0.8 sigma,
#: so KL 0.005 / 0.02 is E|d| ~ 0.08 / 0.16. Mean |p_train - p_rollout| (verl's rollout_probs_diff_mean) is at
#: most the mean |log-prob gap|, so the same bounds are lenient for it. Maxima are heavy-tailed: CUSUM only.
MISMATCH_STATS: dict[str, tuple[float | None, float | None]] = {
    "mismatch_kl": (5e-3, 2e-2),
    "mismatch_logp_abs_mean": (0.08, 0.16),
    "mismatch_prob_abs_mean": (0.08, 0.16),
    "mismatch_logp_abs_max": (None, None),
    "mismatch_prob_abs_max": (None, None),
}

#: the mismatch stats' names, in that order
_MISMATCH_NAMES: tuple[str, ...] = tuple(MISMATCH_STATS)


@dataclass(kw_only=True)
class MismatchGrowth(CusumDetector):
    """Train-inference mismatch, judged from whichever mismatch stat the run has (:data:`MISMATCH_STATS`, first
    present wins; the choice is fixed at the first observation so that the baseline stays one quantity)."""

    name = "mismatch_growth"
    source = "Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL training'; IcePop"
    summary = (
        "train-inference gap rising (CUSUM >= 15 / 40) or above absolute bounds: k3 KL >= 0.005 (warn) / 0.02 "
        "(critical); mean |log-prob gap| or verl's mean |prob diff| >= 0.08 / 0.16"
    )
    metric: str = "mismatch_kl"
    floor: float = 1e-7
    min_sigma: float = 0.1
    warn_above: float | None = 5e-3
    critical_above: float | None = 2e-2
    patience: int = 2
    advice: str = "Enable rollout correction (rollout_is='token' or rollout_mask='geometric'); check engine dtype."

    def __post_init__(self) -> None:
        super().__post_init__()
        self._s_metric: str | None = None
        self._k3_bounds = (self.warn_above, self.critical_above)  # the fields (configurable) are k3 KL's

    def reads(self) -> tuple[str, ...]:
        return (self._s_metric,) if self._s_metric else _MISMATCH_NAMES

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool | None:
        """No step without a mismatch stat, whichever it comes to read (:meth:`reads`); else the values decide."""
        return False if names.isdisjoint(_MISMATCH_NAMES) and names.isdisjoint(self.reads()) else None

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        if self._s_metric is None:
            self._s_metric = next(k for k in MISMATCH_STATS if _finite(stats, k))
        # set on every step, not once: a guard restored from a checkpoint has the stat in its state only
        self.metric = self._s_metric
        self.warn_above, self.critical_above = (
            self._k3_bounds if self.metric == "mismatch_kl" else MISMATCH_STATS[self.metric]
        )
        return super().check(step, stats, armed)
