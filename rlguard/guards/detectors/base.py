"""The detector contract (:class:`Detector`) and the helpers the built-in detectors share.

Design: ``docs/design.md`` (the guard layer). The underscored helpers are private to the package
:mod:`rlguard.guards.detectors`: its modules share them, nothing outside imports them.
"""

from __future__ import annotations

import itertools
import math
import operator
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlguard.guards.consequence.rule import ConsequenceRule, converged, normalized_reward
from rlguard.guards.events import SEVERITY_LEVEL, Finding
from rlguard.guards.fields import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range
from rlguard.guards.robust import EarlySorted, RollingWindow, median_of
from rlguard.guards.state import PrivateState

#: the detectors' name for :class:`~rlguard.guards.robust.EarlySorted`
_EarlySorted = EarlySorted

#: the fewest observations a detector's robust baseline is built from: the median and MAD of 5 observations survive
#: two outliers among them (their breakdown point, Hampel 1974), a rolling z-score needs a spread, a 3-of-5 run rule
#: needs a window of 5
MIN_BASELINE = 5


#: the most observations a level-shift window holds (:class:`LevelShift`): the doctor's change-point estimate looks
#: back at most this far from a finding
SHIFT_WINDOW = 200
#: observations after an excursion's possible onset at which :class:`LevelShift` gives its estimate: the doctor reads
#: it within the consequence rule's horizon of the onset (``ConsequenceRule.horizon`` logged steps, at least as many
#: as the detector's observations), and a sustained finding need not pay for it at every step
SHIFT_READ = ConsequenceRule.horizon


def step_noise(values: Sequence[float]) -> float:
    """The per-observation noise of ``values`` (at least 2) from their successive differences (``sd(x_t - x_t-1) =
    sqrt(2) sigma`` for independent noise), so that a trend or a shift in them does not inflate it: the differences'
    robust sigma, or their root mean square where that is larger (rewards of a few prompts are bimodal: MAD near
    0), over ``sqrt(2)``."""
    diffs = [b - a for a, b in itertools.pairwise(values)]
    return differences_noise(RollingWindow(len(diffs), diffs))


def differences_noise(diffs: RollingWindow) -> float:
    """:func:`step_noise` from the successive differences themselves (a window of at least 1), for a detector that
    keeps them as its values arrive."""
    values = diffs.values
    rms = math.sqrt(sum(map(operator.mul, values, values)) / len(diffs))
    return max(diffs.sigma(), rms) / math.sqrt(2)


def _best_split(values: Sequence[float], sign: float) -> tuple[int, float] | None:
    """The least-squares split of ``values`` into two segments of constant mean whose later mean lies on the
    ``sign`` side of the earlier one: (index of the first observation after it, the sum of squares it removes,
    ``t (n - t) / n (mean_after - mean_before)^2``), or None."""
    n = len(values)
    total, left = math.fsum(values), 0.0
    best, at = 0.0, None
    for t in range(1, n):
        left += values[t - 1]
        before, after = left / t, (total - left) / (n - t)
        gain = t * (n - t) / n * (after - before) ** 2
        if sign * (after - before) > 0 and gain > best:
            best, at = gain, t
    return None if at is None else (at, best)


def level_shift(values: Sequence[float], sign: float) -> int | None:
    """Where the level of ``values`` shifted to the level it ends at, by least squares: the split into two segments
    of constant mean with the smallest residual sum of squares, the maximum-likelihood estimate of a single change
    point in the mean of a Gaussian sequence (Hinkley 1970, Biometrika 57), refined by binary segmentation
    (Vostrikova 1981) of the segment after it while a further split is significant by the Schwarz criterion (it
    removes more than ``2 sigma^2 ln n``, Yao 1988; ``sigma`` the values' :func:`step_noise`): a stat that drifted
    before it shifted (entropy creeping up, then blowing up) is dated to the shift into the level it ends at, not
    to the drift. Only shifts whose later mean lies on the ``sign`` side of the earlier one (+1: above, -1: below)
    count. Returns the index of the first observation after the shift; None for fewer than 2 values or no shift."""
    n = len(values)
    if n < 2:
        return None
    penalty = 2.0 * step_noise(values) ** 2 * math.log(n)
    found: int | None = None
    while (split := _best_split(values[found or 0 :], sign)) is not None:
        at, gain = split
        if found is not None and gain <= penalty:
            break
        found = (found or 0) + at
    return found


def rise_onset(values: Sequence[float], base: float) -> int | None:
    """Where a rise of ``values`` above a known ``base`` level began: the maximum-likelihood (least-squares) change
    point of the better fitting of two one-change models, each of two parameters with the level before the change
    known (``base``): a shift of the mean from ``base`` to a new level (Hinkley 1970, Biometrika 57; the CUSUM's
    known pre-change mean, Hinkley 1971, Biometrika 58) or a ramp from ``base`` at a constant slope, the two-phase
    regression whose first phase is the flat baseline (Hinkley 1969/1971, JASA 64, 66; "broken stick"). A step is
    dated where its new level begins, a steady ramp where it leaves the base; a small elevation followed by a much
    larger shift is dated to the large shift (a mean shift fits it better than a ramp). The same number of
    parameters in both models: the smaller residual sum of squares is the larger likelihood (and the smaller Schwarz
    criterion). Only rises count (a new mean above ``base``, a positive slope). Returns the index of the first
    observation after the change (0: the values are all above it); None for fewer than 3 values or no rise."""
    n = len(values)
    if n < 3:
        return None
    d = [v - base for v in values]
    squares = math.fsum(x * x for x in d)
    # suffix sums from index t: of d, and of (t' - t) d over t' >= t (the ramp's regressor is t' - t + 1 there)
    tail = [0.0] * (n + 1)
    lever = [0.0] * (n + 1)
    for t in range(n - 1, -1, -1):
        tail[t] = tail[t + 1] + d[t]
        lever[t] = lever[t + 1] + tail[t + 1]
    best, found = squares, None
    for t in range(n):
        m = n - t
        # a new mean from t on: the mean of d[t:] removes tail^2 / m
        if tail[t] > 0 and squares - tail[t] ** 2 / m < best:
            best, found = squares - tail[t] ** 2 / m, t
        # a ramp s * (t' - t + 1) from t on: sum h = m (m + 1) / 2, sum h^2 = m (m + 1) (2m + 1) / 6
        hd = lever[t] + tail[t]
        hh = m * (m + 1) * (2 * m + 1) / 6
        if hd > 0 and squares - hd * hd / hh < best:
            best, found = squares - hd * hd / hh, t
    return found


class LevelShift:
    """The observations of a detector's stat since it was last at the detector's baseline, for the change-point
    estimate of a finding that judges a shift of level (a drawdown from the best level, a ratio to the early
    baseline): :func:`level_shift` over them, the window from the last observation at the baseline to the finding,
    and never before the detector's previous excursion ended (``clear_after`` clean observations after a finding,
    the alarm's hysteresis: the window then holds only those). Kept beside the detector's state, not in it (a
    checkpoint does not save it: after a resume the window starts at the resume); at most :data:`SHIFT_WINDOW`
    observations.

    Attributes:
        sign: the direction of the shift the detector finds (+1: up, -1: down).
    """

    def __init__(self, sign: float) -> None:
        self.sign = sign
        self.steps: deque[int] = deque(maxlen=SHIFT_WINDOW)
        self.values: deque[float] = deque(maxlen=SHIFT_WINDOW)
        self._clean = 1  # observations since the detector's last finding (none yet: as after a clean one)
        self._found = False  # a finding is in the window
        self._calm = SHIFT_WINDOW  # observations since the detector's last critical finding
        self._since = SHIFT_READ + 1  # observations since an excursion could last have begun

    def see(self, step: int, value: float, at_baseline: bool) -> None:
        """One observation (in the space the detector judges: log for a ratio); ``at_baseline``: the stat is at the
        detector's baseline there, so the window starts again from it."""
        if at_baseline:
            self.steps.clear()
            self.values.clear()
            self._found = False
        self.steps.append(step)
        self.values.append(value)

    def judged(self, finding: Finding | None, clear_after: int) -> None:
        """After :meth:`see`'s observation was judged: ``finding``, the detector's finding there. Once
        ``clear_after`` clean observations follow a finding, the excursion has ended and the window keeps only them.
        An excursion can begin at a finding after a clean observation, or at a critical one after ``clear_after``
        observations without one (its critical onset)."""
        if finding is None:  # most observations: no excursion begins, one more without a finding of either kind
            self._since, self._calm, self._clean = self._since + 1, self._calm + 1, self._clean + 1
        else:
            critical = finding.severity == "critical"
            began = self._clean > 0 or (critical and self._calm >= max(clear_after, 1))
            self._since = 0 if began else self._since + 1
            self._calm = 0 if critical else self._calm + 1
            self._clean, self._found = 0, True
            return
        if self._found and self._clean >= max(clear_after, 1):
            while len(self.steps) > self._clean:
                self.steps.popleft()
                self.values.popleft()
            self._found = False

    @property
    def read(self) -> bool:
        """Whether an estimate is read now: at most :data:`SHIFT_READ` observations after an excursion could last
        have begun (the doctor reads a change point within the consequence rule's horizon of an onset)."""
        return self._since <= SHIFT_READ

    def change_point(self) -> int | None:
        """The step of the first observation after the least-squares change of level in the window (None: none, or
        not :attr:`read` now)."""
        if not self.read:
            return None
        at = level_shift(list(self.values), self.sign)
        return None if at is None else self.steps[at]


def warmed_up(warmup: int, seen: int, span: int | None) -> bool:
    """Whether a detector with ``warmup`` is past it after ``seen`` observations whose steps span ``span``
    optimizer steps (the step of this observation minus that of its first; None: unknown). The warm-up covers the
    run's first ``warmup`` optimizer steps, its early transient, and at least :data:`MIN_BASELINE` observations,
    the fewest a robust baseline needs: a guard that sees every step is armed after ``warmup`` observations, one
    fed every 5th step (stats logged every 5 steps) after ``max(MIN_BASELINE, warmup / 5)`` of them, not after
    ``5 * warmup`` steps."""
    if seen >= warmup:
        return True
    return span is not None and seen >= MIN_BASELINE and span >= warmup


@dataclass(kw_only=True)
class Detector(PrivateState):
    """Base class. Subclasses set ``name``, ``source`` and ``summary`` and implement :meth:`check`.

    ``finding_class`` is what a finding of the detector is, for the consequence rule
    (:mod:`rlguard.guards.consequence.rule`): ``control`` (a loss of control: the default), ``budget`` (a property
    of the generation budget), ``signal`` (groups that carry no gradient), ``reward`` (a drawdown, which needs a
    level to fall from) or ``drift`` (a stat that grows as the policy learns, KL to the reference or the completion
    length: a loss of control, unless it comes with a rising reward below the detector's absolute bounds).

    Attributes:
        warmup: optimizer steps the detector watches (building its baseline) before it may fire, and at least
            :data:`MIN_BASELINE` observations (:func:`warmed_up`): on a guard that sees every step, observations.
        patience: consecutive findings needed to raise the alarm (1 = at once).
        clear_after: consecutive clean steps before a raised alarm clears (hysteresis).
    """

    name: ClassVar[str] = ""
    source: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    finding_class: ClassVar[str] = "control"
    #: the range of each number a config may set (:func:`rlguard.guards.fields.field_range`): every threshold,
    #: factor and count of a detector is ``>= 0``; a streak and the windows hold at least one observation; a floor
    #: of a robust sigma (``min_sigma``) divides, so it is ``> 0``
    field_ranges: ClassVar[dict[str, Range]] = {
        "*": NON_NEGATIVE,
        "min_sigma": POSITIVE,
        "patience": AT_LEAST_ONE,
        "window": AT_LEAST_ONE,
        "trend_window": AT_LEAST_ONE,
        "level_window": AT_LEAST_ONE,
        "control_window": AT_LEAST_ONE,
        "recent": AT_LEAST_ONE,
    }

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "consequence" in cls.__dict__:  # the attribute's earlier name, still set by plugins
            warnings.warn(
                f"{cls.__qualname__}.consequence is now called finding_class; rename the class attribute.",
                DeprecationWarning,
                stacklevel=2,
            )
            cls.finding_class = cls.__dict__["consequence"]

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

    def change_point(self) -> int | None:
        """The step at which the condition this detector finds now began, by its own change-point estimate (a
        CUSUM's: the first observation since its statistic was last 0, Page 1954); None where it gives none (the
        onset of an excursion is then its first finding). Read after :meth:`check` of a step with a finding."""
        return None

    def evidence(self, finding: Finding) -> int:
        """The observations ``finding`` rests on at least: 1 (one value against a baseline or a bound), more for a
        statistic that accumulates them (a CUSUM's alarm); from ``ConsequenceRule.sustained`` on, sustained."""
        return 1

    def baseline_needed(self) -> int | None:
        """Observations its judgement needs before it may fire, where that is fixed by what it judges: None (the
        default) for a robust baseline of its own stat, built over :attr:`warmup` (the doctor fits that to the log);
        0 for absolute bounds alone (a fact, not a deviation from a baseline), which with hindsight the doctor judges
        from the first record."""
        return None

    def reads(self) -> tuple[str, ...]:
        """The canonical stats this detector reads (its ``metric`` by default)."""
        metric = getattr(self, "metric", "")
        return (metric,) if isinstance(metric, str) and metric else ()

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool | None:
        """What :meth:`observes` says of every step whose stats have the ``names`` (``finite``: all finite numbers):
        True, False, or None where the values decide (it is asked at each step). The guard asks once per set of names
        (docs/guides/plugins.md); a class that overrides :meth:`observes` overrides this too, or it is asked at every
        step. Default: the default :meth:`observes`'s answer from the stats it :meth:`reads`."""
        reads = self.reads()
        if reads and names.isdisjoint(reads):
            return False
        return True if finite or not reads else None

    def observes(self, stats: Mapping[str, float]) -> bool:
        """Whether this step carries evidence for the detector. A step without evidence is not judged and does
        not count: neither a clean step (it does not break a streak of findings or clear an alarm) nor a
        warm-up step. Default: a finite value of one of the stats it :meth:`reads` (frameworks log generation
        stats on some optimizer steps only: TRL with ``steps_per_generation > gradient_accumulation_steps``). A
        detector that declares no stats (a plugin without ``metric`` or ``reads``) is judged on every step."""
        reads = self.reads()
        for name in reads:  # _finite, inlined
            value = stats.get(name)
            if value is not None and math.isfinite(value):
                return True
        return not reads


def _metric(stats: Mapping[str, float], name: str) -> float | None:
    value = stats.get(name)
    return None if value is None else float(value)


def _finite(stats: Mapping[str, float], name: str) -> bool:
    value = stats.get(name)
    return value is not None and math.isfinite(value)


def _anchor_median(anchor: list[float], early: EarlySorted | None = None) -> float | None:
    """Median of the run's early healthy stretch (None until it holds 3 values): :func:`median_of` it, from
    ``early``'s sorted copy where given."""
    if len(anchor) < 3:
        return None
    if early is None:
        return median_of(anchor)  # what a window of them reads, without building one
    return early.median(anchor)


def _rank(finding: Finding | None) -> int:
    return 0 if finding is None else SEVERITY_LEVEL[finding.severity]


def _absolute(
    metric: str, value: float, warn_above: float | None, critical_above: float | None, advice: str
) -> Finding | None:
    """A finding for a value beyond an absolute bound: these need no baseline and hold from the first step."""
    if warn_above is None and critical_above is None:  # none set (most detectors)
        return None
    for severity, bound in (("critical", critical_above), ("warn", warn_above)):
        if bound is not None and value >= bound:
            return Finding(
                severity,  # type: ignore[arg-type]
                value,
                bound,
                f"{metric}={value:.4g} is above the absolute bound {bound:g} (it needs no baseline). {advice}".rstrip(),
                absolute=True,
            )
    return None


class _RewardLevel:
    """Mixin of the detectors that tell a converged run from a failing one: the reward's recent median and the range
    seen (state ``_s_recent``, ``_s_low``, ``_s_high``), for
    :func:`~rlguard.guards.consequence.rule.converged`."""

    level_window: int
    converged_failing: float
    _s_recent: RollingWindow
    _s_low: float
    _s_high: float

    def _init_level(self) -> None:
        self._s_recent = RollingWindow(self.level_window)
        self._s_low, self._s_high = math.inf, -math.inf

    def _see_reward(self, stats: Mapping[str, float]) -> None:
        reward = stats.get("reward_mean")
        if reward is not None and math.isfinite(reward):
            reward = float(reward)
            self._s_recent.push(reward)
            if reward < self._s_low:  # min and max, without the calls (a NaN never reaches here)
                self._s_low = reward
            if reward > self._s_high:
                self._s_high = reward

    def _converged(self) -> bool:
        return len(self._s_recent) > 0 and converged(
            self._s_recent.median(), self._s_low, self._s_high, self.converged_failing
        )

    def _level(self) -> str:
        if len(self._s_recent) == 0:
            return "no reward logged to tell a converged run from a stalled one"
        level = self._s_recent.median()
        return f"the reward {level:.4g} is {normalized_reward(level, self._s_low, self._s_high):.0%} of its range"
