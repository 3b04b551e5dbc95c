"""Detectors: each reads the reduced stats of a step and returns a :class:`Finding` or None.

A detector is a keyword-only dataclass: thresholds are fields (with defaults), state is private and round-trips
through ``state_dict``. Baselines learn only from steps the detector found healthy, so a failure does not teach
the baseline that failure is normal. Warm-up, patience and hysteresis are applied by the guard
(:class:`rlguard.guards.Guard`) from the ``warmup``, ``patience`` and ``clear_after`` fields.

Three generic shapes cover most failure modes: :class:`SpikeDetector` (a value far above its rolling median, in
log space), :class:`CusumDetector` (a sustained upward shift, Page's CUSUM) and :class:`ThresholdDetector`
(absolute bounds, optionally above the run's own baseline). The rest read several stats together.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from rlguard.guards.events import SEVERITY_LEVEL, Finding, Severity
from rlguard.guards.robust import RollingWindow, cusum_step, mann_kendall_z
from rlguard.guards.state import PrivateState


@dataclass(kw_only=True)
class Detector(PrivateState):
    """Base class. Subclasses set ``name``, ``source`` and ``summary`` and implement :meth:`check`.

    Attributes:
        warmup: steps the detector watches (building its baseline) before it may fire.
        patience: consecutive findings needed to raise the alarm (1 = at once).
        clear_after: consecutive clean steps before a raised alarm clears (hysteresis).
    """

    name: ClassVar[str] = ""
    source: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    warmup: int = 10
    patience: int = 1
    clear_after: int = 5

    def __post_init__(self) -> None:
        for f in ("warmup", "clear_after"):
            if getattr(self, f) < 0:
                raise ValueError(f"{type(self).__name__}.{f} must be >= 0; got {getattr(self, f)}.")
        if self.patience < 1:
            raise ValueError(f"{type(self).__name__}.patience must be >= 1; got {self.patience}.")

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        """Judge one step and update the baseline; ``armed`` is False during warm-up (learn, never find)."""
        raise NotImplementedError

    def reads(self) -> tuple[str, ...]:
        """The canonical stats this detector reads (its ``metric`` by default)."""
        metric = getattr(self, "metric", "")
        return (metric,) if isinstance(metric, str) and metric else ()

    def observes(self, stats: Mapping[str, float]) -> bool:
        """Whether this step carries evidence for the detector. A step without evidence is not judged and does
        not count: neither a clean step (it does not break a streak of findings or clear an alarm) nor a
        warm-up step. Default: a finite value of one of the stats it :meth:`reads` (frameworks log generation
        stats on some optimizer steps only: TRL with ``steps_per_generation > gradient_accumulation_steps``). A
        detector that declares no stats (a plugin without ``metric`` or ``reads``) is judged on every step."""
        reads = self.reads()
        return not reads or any(_finite(stats, name) for name in reads)


def _metric(stats: Mapping[str, float], name: str) -> float | None:
    value = stats.get(name)
    return None if value is None else float(value)


def _finite(stats: Mapping[str, float], name: str) -> bool:
    value = stats.get(name)
    return value is not None and math.isfinite(value)


def _anchor_median(anchor: list[float]) -> float | None:
    """Median of the run's early healthy stretch (None until it holds 3 values)."""
    if len(anchor) < 3:
        return None
    return RollingWindow(len(anchor), anchor).median()


def _rank(finding: Finding | None) -> int:
    return 0 if finding is None else SEVERITY_LEVEL[finding.severity]


def _absolute(
    metric: str, value: float, warn_above: float | None, critical_above: float | None, advice: str
) -> Finding | None:
    """A finding for a value beyond an absolute bound: these need no baseline and hold from the first step."""
    for severity, bound in (("critical", critical_above), ("warn", warn_above)):
        if bound is not None and value >= bound:
            return Finding(
                severity,  # type: ignore[arg-type]
                value,
                bound,
                f"{metric}={value:.4g} is above the absolute bound {bound:g} (it needs no baseline). {advice}".rstrip(),
            )
    return None


@dataclass(kw_only=True)
class SpikeDetector(Detector):
    """A value far above its rolling median: ``value / median >= factor`` and robust z (log space) ``>= min_z``.

    Attributes:
        metric: the stat to watch.
        window: healthy steps in the rolling baseline.
        warn_factor: ratio to the median that warns.
        critical_factor: ratio to the median that is critical.
        min_z: robust z-score (log space) also required, so that a noisy metric needs a larger jump.
        floor: values at or below it are no evidence either way: neither judged nor learnt (a zero gradient norm
            when every group has zero reward variance; a zero clip fraction on the on-policy first step of a batch),
            so the baseline is made of the values that carry information.
        min_value: no finding below this absolute value.
        warn_above: absolute value that warns from the first logged step, with no baseline (None: off).
        critical_above: absolute value that is critical from the first logged step (None: off).
        advice: what to do, appended to the message.
    """

    metric: str = ""
    window: int = 50
    warn_factor: float = 5.0
    critical_factor: float = 20.0
    min_z: float = 6.0
    floor: float = 1e-8
    min_value: float = 0.0
    warn_above: float | None = None
    critical_above: float | None = None
    advice: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1.0 < self.warn_factor <= self.critical_factor:
            raise ValueError(
                f"{self.name}: need 1 < warn_factor <= critical_factor; got {self.warn_factor}, {self.critical_factor}."
            )
        self._s_window = RollingWindow(self.window)

    def observes(self, stats: Mapping[str, float]) -> bool:
        """A finite value above ``floor``: non-finite values are the ``nonfinite`` detector's; values at the floor
        would make the next ordinary value look like a huge spike over a median at the floor (with alternating
        on- and off-policy steps the median would sit between 0 and the usual value)."""
        value = _metric(stats, self.metric)
        return value is not None and math.isfinite(value) and value > self.floor

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        value = _metric(stats, self.metric)
        if value is None or not self.observes(stats):
            return None
        x = math.log(value)
        finding = _absolute(self.metric, value, self.warn_above, self.critical_above, self.advice)
        # two baseline values suffice: a finding needs both the factor and the robust z over them
        if finding is None and armed and len(self._s_window) >= 2 and value >= self.min_value:
            median = self._s_window.median()
            factor = math.exp(x - median)
            z = self._s_window.robust_z(x, floor=0.05)
            base = math.exp(median)
            for severity, bound in (("critical", self.critical_factor), ("warn", self.warn_factor)):
                if factor >= bound and z >= self.min_z:
                    finding = Finding(
                        severity,  # type: ignore[arg-type]
                        value,
                        bound * base,
                        f"{self.metric}={value:.4g} is {factor:.1f}x its rolling median {base:.4g} "
                        f"(threshold {bound:g}x, robust z={z:.1f}). {self.advice}".rstrip(),
                        transient=True,
                    )
                    break
        if finding is None:
            self._s_window.push(x)
        return finding


@dataclass(kw_only=True)
class CusumDetector(Detector):
    """A sustained upward shift of a metric (log space): one-sided CUSUM of robust z-scores (Page 1954), plus a
    drift check against the run's early healthy stretch.

    The rolling baseline keeps learning while the statistic is above 0, from values winsorized at median + 2 sigma:
    a slow healthy drift (lengths growing as the model learns to reason) is absorbed, a fast rise is not. What the
    rolling baseline absorbs the anchored one keeps: the median of the first ``anchor`` healthy observations. A
    slow drift (the median of the last ``recent`` observations ``>= drift_ratio`` x the anchor) warns; a CUSUM alarm
    is critical only once that recent median is also ``>= critical_ratio`` x the anchor (a sustained trend of
    consequence, not one spike on top of a drift), otherwise it warns.

    Attributes:
        metric: the stat to watch.
        window: steps in the rolling baseline.
        slack: CUSUM's ``k``: drift per step (in robust sigmas) that is ignored.
        warn_h: statistic that warns; critical_h: statistic that is critical.
        min_sigma: floor of the baseline's robust sigma in log space (0.05 = 5% changes are noise).
        z_cap: each step adds at most ``z_cap - slack``, so one outlier cannot look like a sustained shift.
        floor: values are read as ``max(value, floor)``.
        warn_above: absolute value that warns regardless of the trend (None: off).
        critical_above: absolute value that is critical regardless of the trend (None: off).
        anchor: healthy observations that form the anchored baseline.
        recent: observations whose median is compared with the anchor for drift.
        drift_ratio: recent median / anchor that warns (None: off).
        critical_ratio: recent median / anchor a CUSUM alarm needs to be critical (None: CUSUM alone suffices).
        critical_drift: recent median / anchor that is critical, whatever the CUSUM, once ``lost_control``'s
            recent median is below its early one (a drift that cost reward); None: off.
        lost_control: the stat whose fall makes a drift critical (``reward_mean``).
        control_window: recent observations of ``lost_control`` (at least 5) whose median is compared with its
            early median.
        advice: what to do, appended to the message.
    """

    metric: str = ""
    window: int = 50
    slack: float = 1.0
    warn_h: float = 15.0
    critical_h: float = 40.0
    min_sigma: float = 0.05
    z_cap: float = 5.0
    floor: float = 1e-8
    warn_above: float | None = None
    critical_above: float | None = None
    anchor: int = 10
    recent: int = 5
    drift_ratio: float | None = None
    critical_ratio: float | None = None
    critical_drift: float | None = None
    lost_control: str = "reward_mean"
    control_window: int = 20
    advice: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        for f in ("drift_ratio", "critical_ratio", "critical_drift"):
            if (v := getattr(self, f)) is not None and v <= 1.0:
                raise ValueError(f"{self.name}.{f} must be > 1 (a ratio to the early baseline) or None; got {v}.")
        if self.anchor < 3 or self.recent < 1:
            raise ValueError(f"{self.name}: need anchor >= 3 and recent >= 1; got {self.anchor}, {self.recent}.")
        self._s_window = RollingWindow(self.window)
        self._s_recent = RollingWindow(self.recent)
        self._s_anchor: list[float] = []
        self._s_cusum = 0.0
        self._s_control_anchor: list[float] = []
        self._s_control = RollingWindow(self.control_window)

    def _control_lost(self, stats: Mapping[str, float]) -> str | None:
        """Track ``lost_control``; a description if its recent median is below its early median by more than a
        standard error (``sqrt(pi / 2n)`` robust sigmas, the median's)."""
        if self.critical_drift is None or not _finite(stats, self.lost_control):
            return None
        value = float(stats[self.lost_control])
        if len(self._s_control_anchor) < self.anchor:
            self._s_control_anchor.append(value)
            return None
        self._s_control.push(value)
        early, recent = _anchor_median(self._s_control_anchor), self._s_control.median()
        n = len(self._s_control)
        if early is None or n < min(5, self.control_window):
            return None
        # a fall beyond a standard error of the recent median: a flat noisy reward does not count as lost
        standard_error = self._s_control.sigma() * math.sqrt(math.pi / 2 / n)
        if recent >= early - standard_error:
            return None
        return f"{self.lost_control} fell from {early:.4g} (early median) to {recent:.4g} (recent median)"

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        value = _metric(stats, self.metric)
        if value is None or not math.isfinite(value):
            return None
        finding = _absolute(self.metric, value, self.warn_above, self.critical_above, self.advice)
        x = math.log(max(value, self.floor))
        lost = self._control_lost(stats)
        self._s_recent.push(x)
        if len(self._s_window) < 3 or not armed:
            self._s_window.push(x)
            if finding is None and len(self._s_anchor) < self.anchor:
                self._s_anchor.append(x)
            return finding
        z = self._s_window.robust_z(x, floor=self.min_sigma)
        self._s_cusum = cusum_step(self._s_cusum, min(z, self.z_cap), self.slack)
        sigma = self._s_window.sigma(self.min_sigma)
        self._s_window.push(min(x, self._s_window.median() + 2.0 * sigma))
        anchor = _anchor_median(self._s_anchor)
        ratio = math.exp(x - anchor) if anchor is not None else math.inf
        drift = math.exp(self._s_recent.median() - anchor) if anchor is not None else 1.0
        if _rank(finding) < 2 and self._s_cusum >= self.warn_h:
            critical = self._s_cusum >= self.critical_h and (
                self.critical_ratio is None or drift >= self.critical_ratio
            )
            bound = self.critical_h if critical else self.warn_h
            base = math.exp(self._s_window.median())
            early = f", {ratio:.1f}x the early baseline {math.exp(anchor):.4g}" if anchor is not None else ""
            trend = Finding(
                "critical" if critical else "warn",
                value,
                bound,
                f"{self.metric}={value:.4g}: a sustained rise: CUSUM {self._s_cusum:.1f} >= {bound:g} (rolling "
                f"median {base:.4g}{early}). {self.advice}".rstrip(),
            )
            finding = trend if _rank(trend) > _rank(finding) else finding
        drift_critical = self.critical_drift is not None and drift >= self.critical_drift and lost is not None
        if _rank(finding) < 2 and anchor is not None and drift_critical:
            finding = Finding(
                "critical",
                drift,
                self.critical_drift or 0.0,
                f"{self.metric}: its recent median {math.exp(self._s_recent.median()):.4g} is {drift:.1f}x the run's "
                f"early baseline {math.exp(anchor):.4g} (threshold {self.critical_drift:g}x) and {lost}. "
                f"{self.advice}".rstrip(),
            )
        if finding is None and self.drift_ratio is not None and anchor is not None and drift >= self.drift_ratio:
            finding = Finding(
                "warn",
                drift,
                self.drift_ratio,
                f"{self.metric}: a slow drift: its recent median {math.exp(self._s_recent.median()):.4g} is "
                f"{drift:.1f}x the run's early baseline {math.exp(anchor):.4g} (threshold {self.drift_ratio:g}x). "
                f"{self.advice}".rstrip(),
            )
        if finding is None and self._s_cusum == 0.0 and len(self._s_anchor) < self.anchor:
            self._s_anchor.append(x)
        return finding


@dataclass(kw_only=True)
class ThresholdDetector(Detector):
    """Absolute bounds on a metric that is a fraction or a rate, above the run's own level by ``margin``.

    Attributes:
        metric: the stat to watch.
        warn: value that warns; critical: value that is critical.
        margin: a finding also needs ``value >= baseline median + margin`` (0: absolute bounds only).
        window: healthy steps in the baseline.
        advice: what to do, appended to the message.
    """

    metric: str = ""
    warn: float = 0.5
    critical: float = 0.9
    margin: float = 0.0
    window: int = 50
    advice: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warn > self.critical:
            raise ValueError(f"{self.name}: warn ({self.warn}) must not exceed critical ({self.critical}).")
        self._s_window = RollingWindow(self.window)

    def level(self, value: float) -> tuple[Severity, float] | None:
        """Severity and bound crossed by ``value``, before the baseline margin."""
        if value >= self.critical:
            return "critical", self.critical
        if value >= self.warn:
            return "warn", self.warn
        return None

    def describe(self, value: float, bound: float, stats: Mapping[str, float]) -> str:
        """The finding's message; subclasses add context."""
        return f"{self.metric}={value:.4g} >= {bound:g}. {self.advice}".rstrip()

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        value = _metric(stats, self.metric)
        if value is None or not math.isfinite(value):
            return None
        hit = self.level(value) if armed else None
        near_baseline = len(self._s_window) >= 3 and value < self._s_window.median() + self.margin
        if hit is not None and self.margin > 0 and near_baseline:
            hit = None
        if hit is None:
            self._s_window.push(value)
            return None
        severity, bound = hit
        return Finding(severity, value, bound, self.describe(value, bound, stats))


@dataclass(kw_only=True)
class NonFinite(Detector):
    """NaN/Inf in the loss, log-probs or gradients: critical at once, no warm-up."""

    name = "nonfinite"
    source = "numerical hygiene; every framework's NaN guard"
    summary = "NaN/Inf in loss, log-probs or gradients (count > 0): critical"

    warmup: int = 0
    clear_after: int = 1

    def reads(self) -> tuple[str, ...]:
        return ("nonfinite", "loss", "grad_norm")

    def observes(self, stats: Mapping[str, float]) -> bool:
        """Any step that carries one of the stats it reads, finite or not (a NaN is its evidence)."""
        return any(name in stats for name in self.reads())

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        count = stats.get("nonfinite", 0.0)
        bad = [k for k in ("loss", "grad_norm") if k in stats and not math.isfinite(stats[k])]
        if count > 0 or bad:
            what = f"{count:g} non-finite values" if count > 0 else "non-finite " + ", ".join(bad)
            return Finding(
                "critical",
                float(count) if count > 0 else math.inf,
                0.0,
                f"{what} this step. Skip the optimizer step and inspect the batch (engine log-probs, rewards); "
                "if it repeats, roll back and lower the learning rate.",
            )
        return None


@dataclass(kw_only=True)
class EntropyCollapse(Detector):
    """Policy entropy far below the run's own early baseline (upper quartile of the warm-up) while reward is not
    improving.

    Entropy falling while reward rises is the policy sharpening on what works (normal); falling with flat or
    falling reward is collapse (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).
    Per-token entropy of LLMs is often below 1, so the thresholds are ratios to the baseline, not nats.

    Attributes:
        warn_ratio: entropy / baseline below which it warns (reward not improving).
        critical_ratio: entropy / baseline below which it is critical (reward not improving).
        floor_ratio: entropy / baseline below which it is critical whatever the reward does.
        trend_window: steps of reward for the Mann-Kendall trend test.
        improving_z: Mann-Kendall z above which reward counts as improving.
        anchor: first reward observations whose median is the early reward level; while the recent reward median
            is above it the run has gained from its sharpening, and ``critical_ratio`` only warns.
    """

    name = "entropy_collapse"
    source = "arXiv 2505.22617 (entropy mechanism); DAPO clip-higher, arXiv 2503.14476"
    summary = "entropy < 0.5x (warn) / 0.2x (critical) of the run's baseline with flat reward; < 0.05x always"

    warmup: int = 20
    patience: int = 3
    warn_ratio: float = 0.5
    critical_ratio: float = 0.2
    floor_ratio: float = 0.05
    trend_window: int = 30
    improving_z: float = 2.0
    anchor: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        self._s_early: list[float] = []
        self._s_rewards = RollingWindow(self.trend_window)
        self._s_early_rewards: list[float] = []

    def reads(self) -> tuple[str, ...]:
        return ("entropy", "reward_mean")

    def observes(self, stats: Mapping[str, float]) -> bool:
        return _finite(stats, "entropy")

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        entropy, reward = _metric(stats, "entropy"), _metric(stats, "reward_mean")
        if reward is not None and math.isfinite(reward):
            self._s_rewards.push(reward)
            if len(self._s_early_rewards) < self.anchor:
                self._s_early_rewards.append(reward)
        if entropy is None or not math.isfinite(entropy):
            return None
        if not armed or len(self._s_early) < 3:
            if len(self._s_early) < max(self.warmup, 3):
                self._s_early.append(entropy)
            return None
        # upper quartile of the warm-up: a collapse that starts inside the warm-up does not drag the baseline down
        early = sorted(self._s_early)
        baseline = early[(3 * (len(early) - 1)) // 4]
        if baseline <= 0:
            return None
        ratio = entropy / baseline
        z = mann_kendall_z(list(self._s_rewards.values)) if len(self._s_rewards) >= 5 else 0.0
        early_reward = _anchor_median(self._s_early_rewards)
        gained = early_reward is not None and len(self._s_rewards) >= 5 and self._s_rewards.median() > early_reward
        improving = z > self.improving_z
        reward_text = (
            f"reward trend z={z:+.1f}"
            + (
                f", recent median {self._s_rewards.median():.3g} vs early {early_reward:.3g}"
                if early_reward is not None
                else ""
            )
            + f" ({'improving' if improving else 'gained on its start' if gained else 'not improving'})"
        )
        advice = "raise entropy_coef or clip_high (clip-higher), lower the LR, or roll back to a healthy step."
        for severity, bound, allowed in (
            ("critical", self.floor_ratio, True),
            ("critical", self.critical_ratio, not improving and not gained),
            ("warn", self.warn_ratio, not improving),
        ):
            if ratio < bound and allowed:
                return Finding(
                    severity,  # type: ignore[arg-type]
                    ratio,
                    bound,
                    f"entropy {entropy:.4g} is {ratio:.0%} of the run's baseline {baseline:.4g} "
                    f"(threshold {bound:.0%}), {reward_text}. {advice}",
                )
        return None


@dataclass(kw_only=True)
class RewardCollapse(Detector):
    """Reward falls well below its best level: the EWMA of ``reward_mean`` drops from its running maximum by
    more than ``warn_drop`` (``critical_drop``) robust sigmas and by ``min_rel_drop`` of the reward range seen.

    Attributes:
        alpha: EWMA smoothing of ``reward_mean``.
        window: steps in the robust spread of ``reward_mean``.
        warn_drop: drop, in robust sigmas, that warns; critical_drop: that is critical.
        min_rel_drop: the drop must also be this share of (best - worst EWMA seen).
        critical_rel_drop: a drop of ``warn_drop`` sigmas that is also this share of the range is critical too
            (a bounded, noisy reward, 0 or 1 per prompt, cannot fall ``critical_drop`` of its wide sigmas), if the
            drop is also ``>= min_level_drop`` of the best level (a 3% dip of a saturated 0.96 is no collapse) and
            has lasted ``sustained`` observations (noise dips of the EWMA do not last).
        min_level_drop: see ``critical_rel_drop``.
        sustained: see ``critical_rel_drop``.
    """

    name = "reward_collapse"
    source = "EWMA drawdown with a robust scale (Roberts 1959; Hampel 1974)"
    summary = (
        "EWMA reward drops >= 5 (warn) / 10 (critical) EWMA sigmas and >= 30% of its range below its best; "
        ">= 5 sigmas, 80% of its range and 10% of its best level for 10 steps (critical)"
    )

    warmup: int = 20
    patience: int = 3
    alpha: float = 0.2
    window: int = 50
    warn_drop: float = 5.0
    critical_drop: float = 10.0
    min_rel_drop: float = 0.3
    critical_rel_drop: float = 0.8
    min_level_drop: float = 0.1
    sustained: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        self._s_ewma: float | None = None
        self._s_best = -math.inf
        self._s_worst = math.inf
        self._s_window = RollingWindow(self.window)
        self._s_low = 0  # consecutive observations far below the best level (critical_rel_drop)

    def reads(self) -> tuple[str, ...]:
        return ("reward_mean",)

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        reward = _metric(stats, "reward_mean")
        if reward is None or not math.isfinite(reward):
            return None
        prev = self._s_ewma
        self._s_ewma = reward if prev is None else (1 - self.alpha) * prev + self.alpha * reward
        ewma = self._s_ewma
        finding = None
        if armed and len(self._s_window) >= 5:
            # step-to-step noise from successive differences (sd(x_t - x_t-1) = sqrt(2) sigma for independent
            # noise), so that the window's own trend (a rising reward) does not inflate it: their robust sigma, or
            # their standard deviation where that is larger (rewards of a few prompts are bimodal, MAD near 0)
            diffs = [b - a for a, b in itertools.pairwise(self._s_window.values)]
            std = math.sqrt(sum(d * d for d in diffs) / len(diffs))
            noise = max(RollingWindow(len(diffs), diffs).sigma(), std) / math.sqrt(2)
            scale = max(noise, 1e-6) * math.sqrt(self.alpha / (2 - self.alpha))
            drop = (self._s_best - ewma) / scale
            rel = (self._s_best - ewma) / max(self._s_best - self._s_worst, 1e-12)
            low = drop >= self.warn_drop and rel >= self.critical_rel_drop
            low = low and (self._s_best - ewma) >= self.min_level_drop * abs(self._s_best)
            self._s_low = self._s_low + 1 if low else 0
            of_level = self._s_low >= self.sustained
            for severity, bound, min_rel in (
                ("critical", self.critical_drop, self.min_rel_drop),
                ("critical", self.warn_drop, self.critical_rel_drop if of_level else math.inf),
                ("warn", self.warn_drop, self.min_rel_drop),
            ):
                if drop >= bound and rel >= min_rel:
                    finding = Finding(
                        severity,  # type: ignore[arg-type]
                        ewma,
                        self._s_best - bound * scale,
                        f"reward (EWMA) {ewma:.4g} fell {drop:.1f} robust sigmas below its best {self._s_best:.4g}, "
                        f"{rel:.0%} of its range (threshold {bound:g} sigmas and {min_rel:.0%}). Check for reward "
                        "hacking or collapse; roll back to the best step "
                        "and lower the LR.",
                    )
                    break
        if finding is None:
            self._s_window.push(reward)
        if armed:
            self._s_best = max(self._s_best, ewma)
        self._s_worst = min(self._s_worst, ewma)
        return finding


@dataclass(kw_only=True)
class ZeroVarianceGroups(ThresholdDetector):
    """Groups whose completions all got the same reward carry no GRPO signal (advantage collapse)."""

    name = "zero_variance_groups"
    source = "DAPO dynamic sampling, arXiv 2503.14476, sec. 3.2"
    summary = "share of all-equal-reward groups >= 0.5 (warn) / 0.9 (critical); says too easy or too hard"

    metric: str = "frac_zero_std_groups"
    warn: float = 0.5
    critical: float = 0.9
    patience: int = 3

    def describe(self, value: float, bound: float, stats: Mapping[str, float]) -> str:
        solved = stats.get("frac_zero_std_solved", 0.0)
        easy = solved >= value / 2
        kind = (
            "too easy: most of them are all solved; filter solved prompts or use harder ones (DAPO dynamic sampling)"
            if easy
            else "too hard: most of them are all failed; use easier prompts, more samples per prompt, or reward shaping"
        )
        return f"{value:.0%} of groups have zero reward variance (threshold {bound:.0%}); {kind}."


@dataclass(kw_only=True)
class GradNormSpike(SpikeDetector):
    name = "grad_norm_spike"
    source = "robust z-score on log gradient norm (median/MAD; Hampel 1974)"
    summary = "grad norm >= 5x (warn) / 20x (critical) its rolling median, robust z >= 6"
    metric: str = "grad_norm"
    advice: str = "Skip this step; if spikes repeat, lower the LR or tighten clipping."


@dataclass(kw_only=True)
class GradNormExplosion(CusumDetector):
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
    source = "robust spike on log KL(pi||pi_ref); GRPO's KL term, arXiv 2402.03300"
    summary = (
        "KL to reference >= 10x (warn) / 100x (critical) its rolling median, z >= 6; absolute: >= 1 (warn) / "
        "2 (critical) nats from the first step"
    )
    metric: str = "kl_ref"
    warn_factor: float = 10.0
    critical_factor: float = 100.0
    floor: float = 1e-4
    # the 10 healthy real runs of benchmarks/doctor_real_logs.py peak at 0.57 (on-policy distillation); GRPO runs
    # with a KL term stay below 0.15
    warn_above: float | None = 1.0
    critical_above: float | None = 2.0
    advice: str = "Lower the LR or raise beta; roll back if it persists."


@dataclass(kw_only=True)
class KLOldBlowup(SpikeDetector):
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
class ClipFracBurst(SpikeDetector):
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
        return (self._s_metric,) if self._s_metric else tuple(MISMATCH_STATS)

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        if self._s_metric is None:
            self._s_metric = next(k for k in MISMATCH_STATS if _finite(stats, k))
        # set on every step, not once: a guard restored from a checkpoint has the stat in its state only
        self.metric = self._s_metric
        self.warn_above, self.critical_above = (
            self._k3_bounds if self.metric == "mismatch_kl" else MISMATCH_STATS[self.metric]
        )
        return super().check(step, stats, armed)


@dataclass(kw_only=True)
class LengthExplosion(CusumDetector):
    name = "length_explosion"
    source = "CUSUM on log mean completion length; DAPO overlong shaping, arXiv 2503.14476"
    summary = (
        "sustained rise of mean completion length: CUSUM >= 15 (warn) / 40 (critical, once >= 2x the early "
        "baseline); recent median >= 2.5x the early baseline (warn), or >= 2x with reward a standard error below its "
        "early level (critical)"
    )
    metric: str = "length_mean"
    min_sigma: float = 0.05
    floor: float = 1.0
    patience: int = 2
    drift_ratio: float | None = 2.5
    critical_ratio: float | None = 2.0
    critical_drift: float | None = 2.0
    advice: str = "Check for repetition loops; add an overlong penalty or lower the LR."


@dataclass(kw_only=True)
class LengthCollapse(Detector):
    """Completions collapsing to a few tokens: mean length <= ``critical_tokens`` from the first logged step (no
    baseline needed), or a small share of the run's early baseline (median of its first ``anchor`` observations).

    Attributes:
        critical_tokens: mean length at or below which it is critical at once.
        warn_ratio: length / early baseline below which it warns; critical_ratio: below which it is critical.
        anchor: observations forming the early baseline.
    """

    name = "length_collapse"
    source = "absolute bound; ratio to the early baseline calibrated on real runs (benchmarks/doctor_real_logs.py)"
    summary = (
        "mean completion length <= 1 token (critical, from the first step) or < 0.25x (warn) / 0.1x (critical) "
        "of the early baseline"
    )

    warmup: int = 10
    patience: int = 2
    critical_tokens: float = 1.0
    warn_ratio: float = 0.25
    critical_ratio: float = 0.1
    anchor: int = 10
    metric: str = "length_mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.critical_ratio <= self.warn_ratio < 1:
            raise ValueError(
                f"{self.name}: need 0 < critical_ratio <= warn_ratio < 1; got {self.critical_ratio}, {self.warn_ratio}."
            )
        self._s_anchor: list[float] = []

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        length = _metric(stats, self.metric)
        if length is None or not math.isfinite(length):
            return None
        advice = (
            "Roll back to a healthy step and lower the LR; check the EOS handling and the reward for empty answers."
        )
        if length <= self.critical_tokens:
            return Finding(
                "critical",
                length,
                self.critical_tokens,
                f"mean completion length {length:.3g} tokens <= {self.critical_tokens:g}: completions have collapsed. "
                + advice,
            )
        anchor = _anchor_median(self._s_anchor)
        if armed and anchor is not None and anchor > 0:
            ratio = length / anchor
            for severity, bound in (("critical", self.critical_ratio), ("warn", self.warn_ratio)):
                if ratio < bound:
                    return Finding(
                        severity,  # type: ignore[arg-type]
                        ratio,
                        bound,
                        f"mean completion length {length:.4g} is {ratio:.0%} of the run's early baseline {anchor:.4g} "
                        f"(threshold {bound:.0%}). {advice}",
                    )
        if len(self._s_anchor) < self.anchor:
            self._s_anchor.append(length)
        return None


@dataclass(kw_only=True)
class EntropyBlowup(Detector):
    """Policy entropy far above the run's early baseline and above an absolute level in nats: the policy is
    drifting towards uniform noise (``ln V``: 11.9 nats for Qwen's 151,936 tokens), with reward falling to zero.

    Attributes:
        warn_ratio, critical_ratio: entropy / early baseline that warns / is critical.
        warn_nats, critical_nats: absolute entropy also required (per-token nats).
        severe_nats: entropy that is critical at ``warn_ratio`` already (a run whose early entropy is 2 nats
            cannot reach 8x before the uniform limit).
        anchor: observations forming the early baseline (their median).
    """

    name = "entropy_blowup"
    source = (
        "the entropy mechanism, arXiv 2505.22617 (both directions); calibrated on rasbt/reasoning-from-scratch ch. 7"
    )
    summary = (
        "entropy >= 4x (warn) / 8x (critical) its early baseline and >= 2 / 3 nats; >= 4x and >= 6 nats (critical)"
    )

    warmup: int = 10
    patience: int = 3
    warn_ratio: float = 4.0
    critical_ratio: float = 8.0
    warn_nats: float = 2.0
    critical_nats: float = 3.0
    severe_nats: float = 6.0
    anchor: int = 10
    metric: str = "entropy"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 < self.warn_ratio <= self.critical_ratio or not 0 < self.warn_nats <= self.critical_nats:
            raise ValueError(
                f"{self.name}: need 1 < warn_ratio <= critical_ratio and 0 < warn_nats <= critical_nats; got "
                f"{self.warn_ratio}, {self.critical_ratio}, {self.warn_nats}, {self.critical_nats}."
            )
        self._s_anchor: list[float] = []

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        entropy = _metric(stats, self.metric)
        if entropy is None or not math.isfinite(entropy):
            return None
        anchor = _anchor_median(self._s_anchor)
        if armed and anchor is not None and anchor > 0:
            ratio = entropy / anchor
            for severity, r, nats in (
                ("critical", self.critical_ratio, self.critical_nats),
                ("critical", self.warn_ratio, self.severe_nats),
                ("warn", self.warn_ratio, self.warn_nats),
            ):
                if ratio >= r and entropy >= nats:
                    return Finding(
                        severity,  # type: ignore[arg-type]
                        entropy,
                        max(r * anchor, nats),
                        f"entropy {entropy:.3g} nats is {ratio:.1f}x the run's early baseline {anchor:.3g} (threshold "
                        f"{r:g}x and {nats:g} nats): the policy is drifting towards noise. Roll back, lower the LR or "
                        "clip_high, and check the KL term.",
                    )
        if len(self._s_anchor) < self.anchor:
            self._s_anchor.append(entropy)
        return None


@dataclass(kw_only=True)
class Truncation(ThresholdDetector):
    name = "truncation"
    source = "DAPO overlong filtering, arXiv 2503.14476, sec. 3.4"
    summary = "share of completions hitting the length budget >= 0.2 (warn) / 0.5 (critical), 0.1 above baseline"
    metric: str = "truncated_frac"
    warn: float = 0.2
    critical: float = 0.5
    margin: float = 0.1
    patience: int = 2
    advice: str = "Raise the generation budget or add an overlong penalty; check for repetition loops."


@dataclass(kw_only=True)
class RepetitionLoops(ThresholdDetector):
    name = "repetition"
    source = "n-gram loop detection on completions (Holtzman et al. 2020, degenerate repetition)"
    summary = "share of completions ending in an n-gram loop >= 0.1 (warn) / 0.3 (critical), 0.05 above baseline"
    metric: str = "repetition_rate"
    warn: float = 0.1
    critical: float = 0.3
    margin: float = 0.05
    patience: int = 2
    advice: str = "Roll back; lower the LR, raise entropy_coef, or add a repetition penalty to the reward."


BUILTIN_DETECTORS: tuple[type[Detector], ...] = (
    NonFinite,
    GradNormSpike,
    GradNormExplosion,
    EntropyCollapse,
    EntropyBlowup,
    KLRefBlowup,
    KLOldBlowup,
    RatioExplosion,
    ClipFracBurst,
    MismatchGrowth,
    LengthExplosion,
    LengthCollapse,
    Truncation,
    RepetitionLoops,
    ZeroVarianceGroups,
    RewardCollapse,
)

__all__ = [
    "BUILTIN_DETECTORS",
    "CusumDetector",
    "Detector",
    "SpikeDetector",
    "ThresholdDetector",
]
