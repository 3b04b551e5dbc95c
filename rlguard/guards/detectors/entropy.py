"""Detectors of the policy's entropy: collapse (sharpening without gain) and blow-up (drift towards noise)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from rlguard.guards.detectors.base import Detector, LevelShift, _anchor_median, _EarlySorted, _finite
from rlguard.guards.events import Finding
from rlguard.guards.robust import RollingWindow


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
        self._shift = LevelShift(-1.0)  # log entropy since it was last at or above its baseline
        self._early_sorted, self._rewards_sorted = _EarlySorted(), _EarlySorted()

    def reads(self) -> tuple[str, ...]:
        return ("entropy", "reward_mean")

    def observes(self, stats: Mapping[str, float]) -> bool:
        return _finite(stats, "entropy")

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool | None:
        """A finite ``entropy`` (:meth:`observes`): none without it, each where every value is finite."""
        return False if "entropy" not in names else True if finite else None

    def change_point(self) -> int | None:
        """Where the collapse began: the least-squares change of level of the log entropy since it was last at or
        above its baseline (:class:`~rlguard.guards.detectors.base.LevelShift`)."""
        return self._shift.change_point()

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        entropy = stats.get("entropy")
        if entropy is not None:
            entropy = float(entropy)
        # the baseline, unchanged by _judge until it returns (read once): the upper quartile of the warm-up (None
        # before 3 observations), so that a collapse that starts inside the warm-up does not drag it down
        early = self._s_early
        baseline = self._early_sorted(early)[(3 * (len(early) - 1)) // 4] if len(early) >= 3 else None
        if entropy is not None and entropy > 0 and math.isfinite(entropy):
            self._shift.see(step, math.log(entropy), baseline is None or entropy >= baseline)
        finding = self._judge(entropy, stats, armed, baseline)
        self._shift.judged(finding, self.clear_after)
        return finding

    def _judge(
        self, entropy: float | None, stats: Mapping[str, float], armed: bool, baseline: float | None
    ) -> Finding | None:
        reward = stats.get("reward_mean")
        if reward is not None and math.isfinite(reward):
            reward = float(reward)
            self._s_rewards.push(reward)
            if len(self._s_early_rewards) < self.anchor:
                self._s_early_rewards.append(reward)
        if entropy is None or not math.isfinite(entropy):
            return None
        if not armed or len(self._s_early) < 3:
            if len(self._s_early) < max(self.warmup, 3):
                self._s_early.append(entropy)
            return None
        if baseline is None or baseline <= 0:
            return None
        ratio = entropy / baseline
        highest = self.floor_ratio  # max() of the three bounds, by its comparisons (the builtin's call costs more)
        highest = bound if (bound := self.critical_ratio) > highest else highest
        highest = bound if (bound := self.warn_ratio) > highest else highest
        if ratio >= highest:
            return None  # no bound crossed, whatever the reward does
        z = self._s_rewards.mann_kendall_z() if len(self._s_rewards) >= 5 else 0.0
        early_reward = _anchor_median(self._s_early_rewards, self._rewards_sorted)
        gained = early_reward is not None and len(self._s_rewards) >= 5 and self._s_rewards.median() > early_reward
        improving = z > self.improving_z
        for severity, bound, allowed in (
            ("critical", self.floor_ratio, True),
            ("critical", self.critical_ratio, not improving and not gained),
            ("warn", self.warn_ratio, not improving),
        ):
            if ratio < bound and allowed:
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
                return Finding(
                    severity,  # type: ignore[arg-type]
                    ratio,
                    bound,
                    f"entropy {entropy:.4g} is {ratio:.0%} of the run's baseline {baseline:.4g} "
                    f"(threshold {bound:.0%}), {reward_text}. {advice}",
                )
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
        "the entropy mechanism, arXiv 2505.22617 (both directions); 3 nats per token = e^3 ~ 20 equally likely "
        "next tokens at every position (uniform: ln V = 11.9 nats for Qwen), 8x the run's own early level"
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
        self._shift = LevelShift(1.0)  # log entropy since it was last at or below its early baseline
        self._anchor_sorted = _EarlySorted()

    def change_point(self) -> int | None:
        """Where the blow-up began: the least-squares change of level of the log entropy since it was last at or
        below its early baseline (:class:`~rlguard.guards.detectors.base.LevelShift`)."""
        return self._shift.change_point()

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        entropy = stats.get(self.metric)
        if entropy is None or not math.isfinite(entropy):
            return None
        entropy = float(entropy)
        early = self._s_anchor  # _anchor_median, without its call (the hot path): unchanged by _judge until it returns
        anchor = self._anchor_sorted.median(early) if len(early) >= 3 else None
        if entropy > 0:
            self._shift.see(step, math.log(entropy), anchor is None or entropy <= anchor)
        finding = self._judge(entropy, armed, anchor)
        self._shift.judged(finding, self.clear_after)
        return finding

    def _judge(self, entropy: float, armed: bool, anchor: float | None) -> Finding | None:
        # below warn_ratio (at most critical_ratio) no bound is crossed: the bounds are not walked
        if armed and anchor is not None and anchor > 0 and entropy / anchor >= self.warn_ratio:
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
        # the early baseline is what the detector saw in its warm-up (at least 3 observations): once armed, the
        # values it judges stay out of it (on a sparse log the warm-up is shorter than ``anchor`` observations)
        if len(self._s_anchor) < self.anchor and (not armed or len(self._s_anchor) < 3):
            self._s_anchor.append(entropy)
        return None
