"""Detectors of what the rollouts say: reward collapse, groups without signal, completion lengths (explosion and
collapse), truncation and repetition loops."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from rlguard.guards.consequence.rule import converged, normalized_reward
from rlguard.guards.detectors.base import Detector, LevelShift, _anchor_median, _EarlySorted, _RewardLevel
from rlguard.guards.detectors.noise import ROUNDING, DifferencesNoise
from rlguard.guards.detectors.shapes import CusumDetector, ThresholdDetector
from rlguard.guards.events import Finding
from rlguard.guards.robust import RollingWindow, expected_maximum


@dataclass(kw_only=True)
class RewardCollapse(Detector):
    """Reward falls well below its best level: the EWMA of ``reward_mean`` drops below the level it held at its
    running maximum by more than ``warn_drop`` (``critical_drop``) robust sigmas and by ``min_rel_drop`` of the
    reward range seen.

    The running maximum of a noisy EWMA overshoots the level it was taken at, more the more observations it ranges
    over (:func:`expected_maximum`): the level held at the best is the maximum less that expected excess, for the
    observations since the best last rose clearly above what the noise of the level before could reach (a new
    level). Without it a stationary run's ordinary EWMA sits further below its "best" the longer the run.

    Attributes:
        alpha: EWMA smoothing of ``reward_mean``.
        window: steps in the robust spread of ``reward_mean``.
        warn_drop: drop, in robust sigmas, that warns; critical_drop: that is critical.
        min_rel_drop: the drop must also be this share of the range of levels (the level at the best - the worst
            EWMA seen).
        critical_rel_drop: a drop of ``warn_drop`` sigmas that is also this share of the range is critical too
            (a bounded, noisy reward, 0 or 1 per prompt, cannot fall ``critical_drop`` of its wide sigmas), if the
            drop is also ``>= min_level_drop`` of the best level (a 3% dip of a saturated 0.96 is no collapse) and
            has lasted ``sustained`` observations (noise dips of the EWMA do not last; counted from the running best
            and worst: ``warn_drop`` sigmas, this share of their range and ``min_level_drop`` below the best).
        min_level_drop: see ``critical_rel_drop``.
        sustained: see ``critical_rel_drop``.
        metric: the stat whose drawdown is judged (``eval_drop`` judges an evaluation with the same rule).
        min_drop: every finding needs a drop of at least this share of the best level (0: none).
    """

    name = "reward_collapse"
    finding_class = "reward"
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
    metric: str = "reward_mean"
    min_drop: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._s_ewma: float | None = None
        self._s_best = -math.inf
        self._s_worst = math.inf
        self._s_window = RollingWindow(self.window)
        self._s_low = 0  # consecutive observations far below the best and its range (critical_rel_drop)
        self._s_level_n = 0  # armed observations at the best's level: those the running maximum ranges over
        self._shift = LevelShift(-1.0)  # the rewards since the EWMA was last at its best
        self._noise = DifferencesNoise()  # the noise of the window's successive differences, kept beside it
        self._floor = (0, 0.0)  # (m, expected_maximum(m)): at most the expected maximum of m to 5m / 4 observations

    def _differences(self) -> RollingWindow:
        """The successive differences of the window's values, in order (:meth:`DifferencesNoise.differences`)."""
        return self._noise.differences(self._s_window)

    def _see_best(self, ewma: float, scale: float, judged_clean: bool) -> None:
        """Take the armed observation's EWMA into the running maximum and count the observations at its level, those
        judged without a finding (one far below the level is no draw of it): a new best above what the level before
        could reach by noise (its maximum plus the expected maximum of as many more observations, in units of
        ``scale``, the EWMA's noise) starts a new level."""
        n = self._s_level_n
        new_level = math.isfinite(scale) and ewma > self._s_best + expected_maximum(n) * scale
        if new_level or n == 0:
            self._s_level_n = 1
        elif judged_clean:
            self._s_level_n = n + 1
        self._s_best = ewma if ewma > self._s_best else self._s_best  # max(), without its call (a hot path)

    def reads(self) -> tuple[str, ...]:
        return (self.metric,)

    def change_point(self) -> int | None:
        """Where the drawdown began: the least-squares change of level of the rewards since the EWMA was last at its
        best (:class:`~rlguard.guards.detectors.base.LevelShift`)."""
        return self._shift.change_point()

    def _what(self) -> str:
        """The stat's name in a message."""
        return "reward"

    def _advice(self) -> str:
        """What to do, ending a message."""
        return "Check for reward hacking or collapse; roll back to the best step and lower the LR."

    def _settled(self, ewma: float, raw: float, deep: bool) -> bool:
        """Whether an armed observation is clean whatever the EWMA's noise scale, from a lower bound of the scale
        (:meth:`DifferencesNoise.lower`, O(1)): at or below the best (no new level), the drop short of the smallest
        bound and, where ``deep``, the fall under ``warn_drop`` scales (no sustained low). Rounding is monotone, and
        the margins (1e-9 relative, ``ROUNDING`` of the best) exceed that of the operations up to :meth:`_judge`'s."""
        least = bound if (bound := self.critical_drop) < (warn := self.warn_drop) else warn  # min(), without its call
        if not (ewma <= self._s_best and least > 0):
            return False
        low = 1e-6 if (lower := self._noise.lower(self._s_window)) < 1e-6 else lower  # max(), without its call
        low = low * math.sqrt(self.alpha / (2 - self.alpha)) * (1 - 1e-9)
        reach = raw * (1 + 1e-9) + ROUNDING * abs(self._s_best)
        n, (m, excess) = self._s_level_n, self._floor
        if not m <= n <= m + m // 4:  # the expected maximum grows with n: that of m <= n observations is at most it
            self._floor = m, excess = n, expected_maximum(n)
        return reach < (least + excess) * low and not (deep and reach >= self.warn_drop * low)  # settled

    def _judge(self, ewma: float, raw: float, deep: bool) -> tuple[Finding | None, bool, float]:
        """The armed observation's finding, whether it is held out of the window, and the EWMA's noise scale."""
        # step-to-step noise, so that the window's own trend (a rising reward) does not inflate it
        scale = max(self._noise.noise(self._s_window), 1e-6) * math.sqrt(self.alpha / (2 - self.alpha))
        excess = expected_maximum(self._s_level_n) * scale
        fall = self._s_best - excess - ewma  # below the level held at the best
        drop = fall / scale
        rel = fall / max(self._s_best - excess - self._s_worst, 1e-12)  # of the range of levels seen
        of_consequence = fall >= self.min_drop * abs(self._s_best)
        # a drop that would warn but for min_drop is no healthy value either: its noise stays out of the window
        held = drop >= self.warn_drop and rel >= self.min_rel_drop and not of_consequence
        self._s_low = self._s_low + 1 if deep and raw >= self.warn_drop * scale else 0
        of_level = self._s_low >= self.sustained
        finding = None
        for severity, bound, min_rel in (
            ("critical", self.critical_drop, self.min_rel_drop),
            ("critical", self.warn_drop, self.critical_rel_drop if of_level else math.inf),
            ("warn", self.warn_drop, self.min_rel_drop),
        ):
            if drop >= bound and rel >= min_rel and of_consequence:
                finding = Finding(
                    severity,  # type: ignore[arg-type]
                    ewma,
                    self._s_best - excess - bound * scale,
                    f"{self._what()} (EWMA) {ewma:.4g} fell {drop:.1f} robust sigmas below its level "
                    f"{self._s_best - excess:.4g} at its best {self._s_best:.4g}, {rel:.0%} of its range "
                    f"(threshold {bound:g} sigmas and {min_rel:.0%}). " + self._advice(),
                )
                break
        return finding, held, scale

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        reward = stats.get(self.metric)
        if reward is None or not math.isfinite(reward):
            return None
        reward = float(reward)
        prev = self._s_ewma
        self._s_ewma = reward if prev is None else (1 - self.alpha) * prev + self.alpha * reward
        ewma = self._s_ewma
        finding, held, scale = None, False, math.nan
        if armed and len(self._s_window) >= 5:
            # how long the fall has lasted is counted from the running extremes (their ratio: both inflate alike),
            # how deep it is from the level (:meth:`_judge`); of the first, the conditions that need no scale
            raw = self._s_best - ewma
            deep = raw >= self.critical_rel_drop * (self._s_best - self._s_worst)
            deep = deep and raw >= self.min_level_drop * abs(self._s_best)
            if self._settled(ewma, raw, deep):  # clean whatever the scale (most steps): the noise is not needed
                self._s_low = 0
            else:
                finding, held, scale = self._judge(ewma, raw, deep)
        if finding is None and not held:
            self._noise.push(self._s_window, reward)
        if armed:
            self._see_best(ewma, scale, finding is None and not held)
        self._s_worst = ewma if ewma < self._s_worst else self._s_worst  # min(), without its call (a hot path)
        self._shift.see(step, reward, ewma >= self._s_best)
        self._shift.judged(finding, self.clear_after)
        return finding


@dataclass(kw_only=True)
class ZeroVarianceGroups(_RewardLevel, ThresholdDetector):
    """Groups whose completions all got the same reward carry no GRPO signal (advantage collapse).

    Whether they are solved or failed is decided from the reward level
    (:func:`~rlguard.guards.consequence.rule.normalized_reward`: with a normalised reward ``p`` at most ``1 - p`` of the
    groups can be all failed, at most ``p`` all solved), or read from ``frac_zero_std_solved`` where the run logs it. A
    run whose reward is at the top of its range has converged (:func:`~rlguard.guards.consequence.rule.converged`): "too
    easy, nothing left to learn", a warning however many groups.

    Attributes:
        converged_failing: the run has converged once at most this share of its groups can be all failed.
        level_window: recent reward observations whose median is the reward level.
    """

    name = "zero_variance_groups"
    finding_class = "signal"
    source = "DAPO dynamic sampling, arXiv 2503.14476, sec. 3.2; solved or failed from the reward level"
    summary = (
        "share of all-equal-reward groups >= 0.5 (warn) / 0.9 (critical); says too easy or too hard from the reward "
        "level; a converged run (reward in the top 20% of its range) only warns"
    )

    metric: str = "frac_zero_std_groups"
    warn: float = 0.5
    critical: float = 0.9
    patience: int = 3
    converged_failing: float = 0.2
    level_window: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._init_level()

    def baseline_needed(self) -> int | None:
        """The share of groups is judged against absolute bounds, solved or failed from the reward level: the median
        of ``level_window`` rewards, so that many observations."""
        return self.level_window

    def critical_condition(self, value: float) -> bool:
        """At or above the critical share, at a reward level that has not converged (where the groups left without
        variance are mostly solved: a warning, :meth:`check`), from the rewards seen so far."""
        return super().critical_condition(value) and not self._converged()

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        self._see_reward(stats)
        finding = super().check(step, stats, armed)
        if finding is not None and finding.severity == "critical" and self._converged():
            return replace(finding, severity="warn")
        return finding

    def describe(self, value: float, bound: float, stats: Mapping[str, float]) -> str:
        head = f"{value:.0%} of groups have zero reward variance (threshold {bound:.0%})"
        if len(self._s_recent) == 0:
            return head + "; no reward logged to tell solved from failed groups."
        level = self._s_recent.median()
        p = normalized_reward(level, self._s_low, self._s_high)
        solved_stat = stats.get("frac_zero_std_solved")
        if solved_stat is not None and math.isfinite(solved_stat):
            solved, failed = solved_stat, max(value - solved_stat, 0.0)
            basis = "frac_zero_std_solved"
        else:
            # all-solved share in [value + p - 1, min(p, value)]; the midpoint
            solved = (max(value + p - 1.0, 0.0) + min(p, value)) / 2
            failed, basis = value - solved, f"the reward level {level:.3g}"
        if converged(level, self._s_low, self._s_high, self.converged_failing):
            kind = (
                f"too easy, nothing left to learn: the reward {level:.3g} is at the top of its range, so at most "
                f"{1 - p:.0%} of groups can be all failed; filter solved prompts or use harder ones (DAPO dynamic "
                "sampling), or stop: the run has converged"
            )
        elif solved >= failed:
            kind = f"too easy: about {solved:.0%} of groups all solved (from {basis}); filter solved prompts"
        else:
            kind = (
                f"too hard: about {failed:.0%} of groups all failed (from {basis}); use easier prompts, more "
                "samples per prompt, or reward shaping"
            )
        return f"{head}; {kind}."


@dataclass(kw_only=True)
class LengthExplosion(CusumDetector):
    name = "length_explosion"
    finding_class = "drift"  # reasoning runs lengthen their answers as they learn (DeepSeek-R1, arXiv 2501.12948)
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
    source = (
        "one token carries nothing to learn from (absolute, unrecoverable); an order of magnitude (0.1x) below the "
        "run's early completions (critical), a quarter (warn)"
    )
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
        self._shift = LevelShift(-1.0)  # log lengths since one was last at or above the early baseline
        self._anchor_sorted = _EarlySorted()

    def change_point(self) -> int | None:
        """Where the collapse began: the least-squares change of level of the log lengths since one was last at or
        above the early baseline (:class:`~rlguard.guards.detectors.base.LevelShift`)."""
        return self._shift.change_point()

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        length = stats.get(self.metric)
        if length is None or not math.isfinite(length):
            return None
        length = float(length)
        anchor = _anchor_median(self._s_anchor, self._anchor_sorted)
        if length > 0:
            self._shift.see(step, math.log(length), anchor is None or length >= anchor)
        finding = self._judge(length, armed, anchor)
        self._shift.judged(finding, self.clear_after)
        return finding

    def _judge(self, length: float, armed: bool, anchor: float | None) -> Finding | None:
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
                unrecoverable=True,  # one token carries no signal to learn from: the policy cannot climb back
            )
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
        # the early baseline is what the detector saw in its warm-up (at least 3 observations): once armed, the
        # values it judges stay out of it (on a sparse log the warm-up is shorter than ``anchor`` observations)
        if len(self._s_anchor) < self.anchor and (not armed or len(self._s_anchor) < 3):
            self._s_anchor.append(length)
        return None


@dataclass(kw_only=True)
class Truncation(ThresholdDetector):
    name = "truncation"
    finding_class = "budget"
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
