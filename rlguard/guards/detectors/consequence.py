"""Severity by consequence: the one rule that says when a detector's finding is critical, for every detector,
absolute bounds included.

``critical`` means the run is failing or will fail:

- the state cannot recover (``Finding.unrecoverable``: non-finite values, one-token completions), or
- the condition is **sustained**: critical in ``sustained`` of ``within`` consecutive observations of its detector
  (the run rules of Shewhart charts: one point beyond the limits may be chance, several in a short run are a
  shift; Western Electric, *Statistical Quality Control Handbook*, 1956), or
- a lone critical observation is **followed by lost control** (a sustained critical finding of a detector of
  reward, entropy, KL, length or gradients within ``horizon`` logged steps after it), or not followed by
  recovery (``recovered`` clean observations in a row of its detector, starting within the horizon).

Everything else is a ``warn``:

- a single observation the run recovered from, whatever its size (the live guard still skips that step: it
  decides on the step itself; this rule needs what followed);
- a condition present from the first observations while the reward rises (the run learns with it);
- a condition of the budget (``truncation``) while the reward rises;
- groups without reward variance in a run whose reward is at the top of its range (converged, nothing left to
  learn: :func:`converged`, applied by the detector itself);
- a reward drawdown without an established peak (:func:`established_peak`): a reward at zero with blips has no
  level to collapse from.

Each detector declares its class (``Detector.consequence``): ``control`` (the default: the condition is a loss of
control), ``budget`` (a property of the generation budget), ``signal`` (groups that carry no gradient) or
``reward`` (a drawdown, which needs a peak). :func:`judge` applies the rule over a log with hindsight (the
doctor); :func:`converged` is applied by ``zero_variance_groups`` on each step, so the live guard labels alike.

:class:`OnlineConsequence` applies the same rule as findings are made, from the past only (the live guard with
``GuardConfig(consequence="online")``): a critical observation is critical at once when it is unrecoverable or
sustained; a lone one is a warning (its step may still be skipped: ``Finding.observed`` keeps the detector's own
severity) until lost control follows within the horizon, or recovery does not show, and is raised to critical at
that later step. What it cannot apply is what needs the future: the exemptions of a rising reward (a condition
present from the first observations, or of the budget), and "the log ends before recovery". "An established
peak" becomes an established *level*: :class:`RewardLevel`, the reward's EWMA clearly above the floor of its range
(a run warm-started at 0.5 that falls has collapsed, though it never rose above its start).
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rlguard.guards.events import SEVERITY_LEVEL, Event, Finding, Severity
from rlguard.guards.robust import RollingWindow, mann_kendall_z
from rlguard.guards.state import GuardStateError, state_count, state_list, state_object

if TYPE_CHECKING:
    from rlguard.guards.detectors.base import Detector

#: consequence classes whose sustained critical finding is lost control (what makes a lone spike critical)
CONTROL_CLASSES = frozenset({"control", "reward"})


@dataclass(frozen=True)
class ConsequenceRule:
    """The rule's thresholds, all counted in observations (logged steps that carry the detector's stats).

    Attributes:
        sustained: critical observations among ``within`` consecutive ones that make a condition sustained
            (3 of 5: a Shewhart run rule; a lone point beyond the limits is 1 in 370 for a Gaussian at 3 sigma).
        within: see ``sustained``.
        horizon: logged steps after a lone critical observation in which lost control makes it critical
            (the consequences of a bad update show within a few updates: the next rollouts come from it).
        recovered: clean observations in a row of its detector, starting within ``horizon`` logged steps of a lone
            critical one, that show the run recovered from it; without them (the condition lingers, or the log
            ends first) it stays critical.
        start: a condition whose first finding comes within the detector's warm-up plus this many observations
            is present from the first observations.
        trend_z: Mann-Kendall z above which the reward rises (one-sided, 2.3% by chance; Mann 1945, Kendall 1975).
        anchor: first reward observations whose median is the run's start.
        peak_observations: smoothed-reward observations clearly above the start that establish a peak.
        peak_sigmas: "clearly above": this many sigmas of the smoothed reward's noise ...
        peak_share: ... and this share of the reward's range over the log (widened to ``[0, 1]``).
        alpha: smoothing of the reward (EWMA), as ``reward_collapse``'s.
        level_window: the last rewards from which the live rule estimates the EWMA's noise (:class:`RewardLevel`:
            bounded memory; the doctor uses every reward before the finding).
    """

    sustained: int = 3
    within: int = 5
    horizon: int = 10
    recovered: int = 3
    start: int = 10
    trend_z: float = 2.0
    anchor: int = 10
    peak_observations: int = 5
    peak_sigmas: float = 3.0
    peak_share: float = 0.1
    alpha: float = 0.2
    level_window: int = 200

    def __post_init__(self) -> None:
        if not 1 <= self.sustained <= self.within:
            raise ValueError(f"ConsequenceRule needs 1 <= sustained <= within; got {self.sustained}, {self.within}.")
        for name in ("horizon", "recovered", "start", "anchor", "peak_observations", "level_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"ConsequenceRule.{name} must be >= 1; got {getattr(self, name)}.")


@dataclass(frozen=True)
class Timeline:
    """A log as the guard judged it, one entry per logged step.

    Attributes:
        steps: the logged steps, increasing.
        rewards: ``reward_mean`` at each step (NaN where the step has none).
        findings: each step's findings by detector (``Guard.last_findings``).
        observed: the detectors that judged each step (the step carried their stats).
    """

    steps: Sequence[int]
    rewards: Sequence[float]
    findings: Sequence[Mapping[str, Finding]]
    observed: Sequence[frozenset[str]]


# -- the pieces the detectors share -------------------------------------------------------------------------------
def normalized_reward(level: float, lowest: float, highest: float) -> float:
    """``level`` as a share of the reward's range, the range being what was seen widened to ``[0, 1]`` (rewards
    of verifiable tasks are accuracies or sums of them; a run seen only at 0.99 is at the top of ``[0, 1]``)."""
    lo, hi = min(lowest, 0.0), max(highest, 1.0)
    return (level - lo) / (hi - lo)


def converged(level: float, lowest: float, highest: float, failing_share: float = 0.2) -> bool:
    """Whether groups without reward variance come from a converged run: with a normalised reward ``p`` at most
    a share ``1 - p`` of the groups can be all-failed (each contributes the lowest reward), so at
    ``p >= 1 - failing_share`` the groups left without signal are mostly solved: nothing is left to learn."""
    return normalized_reward(level, lowest, highest) >= 1.0 - failing_share


def reward_rises(rewards: Sequence[float], trend_z: float = 2.0) -> bool:
    """A rising reward: Mann-Kendall z >= ``trend_z`` over the finite values (at least 8) and the median of their
    last third above that of their first third (a trend that moved the level)."""
    values = [r for r in rewards if math.isfinite(r)]
    if len(values) < 8:
        return False
    third = len(values) // 3
    gained = statistics.median(values[-third:]) > statistics.median(values[:third])
    return gained and mann_kendall_z(values) >= trend_z


def ewma_margin(rewards: Sequence[float], span: float, rule: ConsequenceRule) -> float:
    """How far the reward's EWMA must be above a reference to be "clearly above" it: ``rule.peak_sigmas`` sigmas of
    the EWMA's noise (``sigma * sqrt(alpha / (2 - alpha))``, the stationary sd of an EWMA of white noise; Roberts
    1959) and ``rule.peak_share`` of the reward's range ``span``. The reward's noise comes from its successive
    differences (``sd(x_t - x_t-1) = sqrt(2) sigma``, so that a trend does not inflate it): their robust sigma, or
    their root mean square where that is larger (rewards of a few prompts are bimodal, MAD near 0)."""
    diffs = [b - a for a, b in itertools.pairwise(rewards)]
    noise = 0.0
    if diffs:
        std = math.sqrt(sum(d * d for d in diffs) / len(diffs))
        noise = max(RollingWindow(len(diffs), diffs).sigma(), std) / math.sqrt(2)
    return max(rule.peak_sigmas * noise * math.sqrt(rule.alpha / (2 - rule.alpha)), rule.peak_share * span)


def ewma_path(rewards: Sequence[float], alpha: float) -> list[float]:
    """The reward's EWMA after each observation, started at the first: ``e_t = (1 - alpha) e_t-1 + alpha x_t``."""
    out: list[float] = []
    ewma = rewards[0] if rewards else 0.0
    for r in rewards:
        ewma = (1 - alpha) * ewma + alpha * r
        out.append(ewma)
    return out


def established_peak(rewards: Sequence[float], before: int, rule: ConsequenceRule) -> bool:
    """Whether the reward had a peak to collapse from before position ``before``: at least
    ``rule.peak_observations`` observations at which its EWMA was clearly above the run's start (the median of
    its first ``rule.anchor`` observations), by :func:`ewma_margin` with the reward's range over the whole log
    (5th to 95th percentile, widened to ``[0, 1]``: a blip of a reward at zero is no peak)."""
    seen = [r for r in rewards[:before] if math.isfinite(r)]
    every = sorted(r for r in rewards if math.isfinite(r))
    if len(seen) < rule.anchor + rule.peak_observations:
        return False
    start = statistics.median(seen[: rule.anchor])
    # the reward's range over the log (5th to 95th percentile), widened to [0, 1] as in normalized_reward
    span = max(every[int(0.95 * (len(every) - 1))], 1.0) - min(every[int(0.05 * (len(every) - 1))], 0.0)
    margin = ewma_margin(seen, span, rule)
    return sum(e > start + margin for e in ewma_path(seen, rule.alpha)) >= rule.peak_observations


def sustained_count(critical: Callable[[int], bool], k: int, rule: ConsequenceRule) -> int:
    """Critical observations among the ``rule.within`` of a detector that end at its observation ``k`` (counting
    it); ``critical(j)`` says whether observation ``j`` was. Sustained at ``>= rule.sustained``."""
    return sum(1 for j in range(max(k - rule.within + 1, 0), k + 1) if critical(j))


class RecoveryWatch:
    """Whether a detector recovered after a lone critical observation: ``clean`` observations in a row without a
    finding of it, starting at or before position ``until`` (the observation's position plus the horizon). Fed one
    observation of the detector at a time, in order: the doctor feeds the log's, the live guard each step's."""

    def __init__(self, until: int, clean: int) -> None:
        self.until, self.clean = until, clean
        self.streak = 0  # clean observations in a row so far

    def see(self, position: int, found: bool) -> bool | None:
        """Feed the observation at ``position`` (``found``: it has a finding of the detector, any severity): True
        once recovered, False once recovery can no longer start within the horizon, None while undecided."""
        if found or (not self.streak and position > self.until):
            self.streak = 0
            return False if position > self.until else None
        self.streak += 1
        return True if self.streak >= self.clean else None


# -- the rule over a whole log ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Episode:
    first: int  # position (index into the timeline) of its first finding
    last: int  # position of its last finding
    first_obs: int  # index of its first finding among the detector's observations


def _episodes(obs: list[int], found: Mapping[int, Finding], clear_after: int) -> dict[int, _Episode]:
    """position of each finding -> its episode: findings separated by fewer than ``clear_after`` clean
    observations (the alarm's hysteresis) belong together."""
    out: dict[int, _Episode] = {}
    current: list[tuple[int, int]] = []  # (obs index, position)
    clean = 0

    def close() -> None:
        if current:
            ep = _Episode(current[0][1], current[-1][1], current[0][0])
            out.update({p: ep for _, p in current})

    for k, p in enumerate(obs):
        if p in found:
            if clean >= max(clear_after, 1):
                close()
                current = []
            current.append((k, p))
            clean = 0
        else:
            clean += 1
    close()
    return out


def _label(
    name: str,
    det: Detector,
    timeline: Timeline,
    obs: list[int],
    intrinsic: Mapping[str, set[int]],
    classes: Mapping[str, str],
    rule: ConsequenceRule,
) -> tuple[dict[int, tuple[Severity, str]], set[int]]:
    """Labels of ``name``'s critical findings (position -> severity, why) and the positions that are critical in
    themselves (unrecoverable or sustained), given the other detectors' ``intrinsic`` criticals."""
    n = len(timeline.steps)
    found = {p: f for p in obs if (f := timeline.findings[p].get(name)) is not None}
    critical = [k for k, p in enumerate(obs) if p in found and found[p].severity == "critical"]
    is_critical = set(critical)
    episodes = _episodes(obs, found, det.clear_after)
    kind = classes.get(name, "control")
    labels: dict[int, tuple[Severity, str]] = {}
    mine: set[int] = set()

    def lost_control(lo: int, hi: int) -> str | None:
        for other, positions in intrinsic.items():
            if other != name and classes.get(other, "control") in CONTROL_CLASSES:
                hit = next((p for p in sorted(positions) if lo <= p <= hi), None)
                if hit is not None:
                    return f"{other} at step {timeline.steps[hit]}"
        return None

    for k in critical:
        p = obs[k]
        f, ep = found[p], episodes[p]
        if f.unrecoverable:
            labels[p] = ("critical", "")
            mine.add(p)
            continue
        if kind == "reward" and not established_peak(timeline.rewards, ep.first, rule):
            labels[p] = ("warn", "no established reward peak to collapse from (never clearly above its start)")
            continue
        recent = sustained_count(is_critical.__contains__, k, rule)
        if recent < rule.sustained:
            continue  # a lone observation: judged once the others' intrinsic criticals are known
        window_end = min(ep.last + rule.horizon, n - 1)
        rising = reward_rises(timeline.rewards[ep.first : window_end + 1], rule.trend_z)
        from_start = ep.first_obs < det.warmup + rule.start
        lost = lost_control(ep.first, window_end)
        if rising and lost is None and (kind == "budget" or from_start):
            where = "present from the first observations" if from_start else "a condition of the generation budget"
            labels[p] = ("warn", f"{where}, while the reward rose and nothing lost control")
        else:
            labels[p] = ("critical", f"sustained: critical in {recent} of {rule.within} observations")
            mine.add(p)
    # the first observations of an exempted episode (before it counted as sustained) share its label
    exempt = {episodes[p]: lab for p, lab in labels.items() if lab[0] == "warn"}
    for k in critical:
        if obs[k] not in labels and episodes[obs[k]] in exempt:
            labels[obs[k]] = exempt[episodes[obs[k]]]
    return labels, mine


def _lone(
    name: str,
    timeline: Timeline,
    obs: list[int],
    labels: dict[int, tuple[Severity, str]],
    intrinsic: Mapping[str, set[int]],
    classes: Mapping[str, str],
    rule: ConsequenceRule,
) -> None:
    """Label ``name``'s lone critical observations: critical when lost control follows within the horizon or the
    log ends before recovery shows; a warning otherwise."""
    n = len(timeline.steps)
    for k, p in enumerate(obs):
        f = timeline.findings[p].get(name)
        if f is None or f.severity != "critical" or p in labels:
            continue
        hi = min(p + rule.horizon, n - 1)
        own = next((q for q in sorted(intrinsic.get(name, ())) if p <= q <= hi), None)
        lost = next(
            (
                f"{other} at step {timeline.steps[q]}"
                for other, positions in intrinsic.items()
                if other != name and classes.get(other, "control") in CONTROL_CLASSES
                for q in sorted(positions)
                if p <= q <= hi
            ),
            None,
        )
        recovery = _recovery(name, timeline, obs[k + 1 :], p + rule.horizon, rule.recovered)
        if own is not None:
            labels[p] = (
                "critical",
                f"sustained: critical in {rule.sustained} of {rule.within} observations by step {timeline.steps[own]}",
            )
        elif lost is not None:
            labels[p] = ("critical", f"followed by lost control ({lost})")
        elif not recovery:
            why = (
                "the log ends before" if p + rule.horizon >= n else f"no sign of it within {rule.horizon} logged steps:"
            )
            labels[p] = ("critical", f"{why} recovery ({rule.recovered} clean observations in a row)")
        else:
            labels[p] = (
                "warn",
                "a single observation the run recovered from: nothing lost control after it (the live guard skips "
                "such a step)",
            )


def _recovery(name: str, timeline: Timeline, after: list[int], until: int, clean: int) -> bool:
    """Whether ``name`` recovered over the positions ``after`` (its observations after a lone critical one):
    :class:`RecoveryWatch`; a log that ends first has not."""
    watch = RecoveryWatch(until, clean)
    for q in after:
        verdict = watch.see(q, name in timeline.findings[q])
        if verdict is not None:
            return verdict
    return False


def label_findings(
    timeline: Timeline, detectors: Mapping[str, Detector], rule: ConsequenceRule | None = None
) -> dict[str, dict[int, tuple[Severity, str]]]:
    """Detector -> position -> (severity by consequence, why) for each of its critical findings over the log."""
    rule = rule or ConsequenceRule()
    classes = {name: det.consequence for name, det in detectors.items()}
    obs = {name: [p for p, seen in enumerate(timeline.observed) if name in seen] for name in detectors}
    intrinsic: dict[str, set[int]] = {
        name: {p for p in obs[name] if (f := timeline.findings[p].get(name)) is not None and f.severity == "critical"}
        for name in detectors
    }
    labels: dict[str, dict[int, tuple[Severity, str]]] = {}
    for _ in range(3):  # exemptions need the others' intrinsic criticals, which need theirs: iterate to a fixpoint
        results = {n: _label(n, d, timeline, obs[n], intrinsic, classes, rule) for n, d in detectors.items()}
        new = {n: mine for n, (_, mine) in results.items()}
        labels = {n: lab for n, (lab, _) in results.items()}
        if new == intrinsic:
            break
        intrinsic = new
    for name in detectors:
        _lone(name, timeline, obs[name], labels[name], intrinsic, classes, rule)
    return labels


def judge(
    timeline: Timeline,
    detectors: Mapping[str, Detector],
    rule: ConsequenceRule | None = None,
    labels: Mapping[str, Mapping[int, tuple[Severity, str]]] | None = None,
) -> list[Event]:
    """The detectors' events over the log with severity by consequence, in step order: each detector's alarm is
    replayed as the guard raises it (``patience`` findings in a row, cleared after ``clear_after`` clean
    observations), from its findings labelled by :func:`label_findings` (or ``labels``, already computed); a
    label's reason ends its message."""
    labels = labels if labels is not None else label_findings(timeline, detectors, rule)
    events: list[Event] = []
    for name, det in detectors.items():
        level = streak = clean = 0
        for p, seen in enumerate(timeline.observed):
            if name not in seen:
                continue
            f = timeline.findings[p].get(name)
            if f is None:
                streak, clean = 0, clean + 1
                if level and clean >= det.clear_after:
                    level = 0
                continue
            streak, clean = streak + 1, 0
            severity, why = labels.get(name, {}).get(p, (f.severity, ""))
            if streak >= det.patience and SEVERITY_LEVEL[severity] > level:
                level = SEVERITY_LEVEL[severity]
                note = f" [{severity}: {why}]" if why else ""
                events.append(Event(timeline.steps[p], name, severity, f.value, f.message + note, f.threshold))
    return sorted(events, key=lambda e: e.step)


def relabel(
    events: Sequence[Event],
    timeline: Timeline,
    labels: Mapping[str, Mapping[int, tuple[Severity, str]]],
    checked: frozenset[str],
    rule: ConsequenceRule | None = None,
) -> list[Event]:
    """``events`` a live guard recorded, with the hindsight of the log: a critical event of a detector that judged
    the log (``checked``) stays critical if the log's own labels (``labels``, from :func:`label_findings`) have it
    critical within ``rule.horizon`` logged steps from the event, or the log ends sooner; otherwise it becomes a
    warning (the live guard decided on the step itself). Events of detectors that could not judge the log, and
    the guard's actions, are kept as recorded."""
    rule = rule or ConsequenceRule()
    steps = list(timeline.steps)
    out = []
    for e in events:
        if e.severity != "critical" or e.detector.startswith("action:") or e.detector not in checked:
            out.append(e)
            continue
        at = bisect.bisect_left(steps, e.step)
        mine = labels.get(e.detector, {})
        lasting = at + rule.horizon >= len(steps) or any(
            mine.get(q, ("warn", ""))[0] == "critical" for q in range(at, at + rule.horizon + 1)
        )
        note = " [warn in hindsight: the log shows it did not last and nothing lost control after it]"
        out.append(e if lasting else replace(e, severity="warn", message=e.message + note))
    return out


# -- the rule as findings are made (the live guard) ---------------------------------------------------------------
class RewardLevel:
    """Whether the reward has an established level, from the rewards seen so far: at least
    ``rule.peak_observations`` observations at which its EWMA was clearly above the floor of its range (the lowest
    reward seen, widened to 0 as in :func:`normalized_reward`: rewards of verifiable tasks are accuracies or sums of
    them, whose least value is 0), by :func:`ewma_margin` with the range seen (widened to ``[0, 1]``). A reward at 0
    with blips has no level; a run warm-started at 0.5 has one from its first observations, so a fall from it is a
    collapse though it never rose above its start (the doctor's peak, :func:`established_peak`, reads it with the
    whole log; live, "above the start" would miss two thirds of the collapses of ``benchmarks/collapse_long``).

    Bounded memory: the ``rule.peak_observations`` largest EWMA values (there are that many above a bound exactly
    when the least of them is), the extremes, and the last ``rule.level_window`` rewards for the noise.
    """

    def __init__(self, rule: ConsequenceRule) -> None:
        self.rule = rule
        self.ewma: float | None = None
        self.lowest, self.highest = math.inf, -math.inf
        self.top: list[float] = []  # the largest EWMA values seen, at most rule.peak_observations
        self.recent = RollingWindow(rule.level_window)

    def push(self, reward: float) -> None:
        """One more ``reward_mean`` observation (non-finite values are ignored)."""
        if not math.isfinite(reward):
            return
        alpha = self.rule.alpha
        self.ewma = reward if self.ewma is None else (1 - alpha) * self.ewma + alpha * reward
        self.lowest, self.highest = min(self.lowest, reward), max(self.highest, reward)
        self.top = sorted([*self.top, self.ewma], reverse=True)[: self.rule.peak_observations]
        self.recent.push(reward)

    def floor(self) -> float:
        """The floor of the reward's range: the lowest reward seen, or 0 below it."""
        return min(self.lowest, 0.0)

    def established(self) -> bool:
        """At least ``rule.peak_observations`` EWMA observations clearly above :meth:`floor`."""
        if len(self.top) < self.rule.peak_observations:
            return False
        span = max(self.highest, 1.0) - self.floor()
        return self.top[-1] > self.floor() + ewma_margin(list(self.recent.values), span, self.rule)


@dataclass
class _Lone:
    """A lone critical observation the live rule has not judged yet."""

    position: int
    step: int
    finding: Finding
    watch: RecoveryWatch
    recovered: bool = False


@dataclass(frozen=True)
class OnlineVerdict:
    """The live rule's verdict on one step.

    Attributes:
        findings: this step's findings by detector, with severity by consequence (``Finding.observed``: the
            detector's own, where the rule labelled it otherwise).
        raised: earlier lone critical findings raised to critical at this step, by detector: the finding as it
            was made, its message saying why and when.
    """

    findings: dict[str, Finding]
    raised: dict[str, Finding] = field(default_factory=dict)


class OnlineConsequence:
    """:func:`label_findings`' rule applied as findings are made, from the past only: a critical finding is
    critical at once when it is unrecoverable, or sustained (:func:`sustained_count`), or lone with a detector of
    lost control intrinsically critical at the same step; a lone one is otherwise a warning, raised to critical
    at a later step when, within ``rule.horizon`` logged steps, a detector of lost control becomes intrinsically
    critical, or when its own detector does not recover (:class:`RecoveryWatch`: the verdict comes after the
    horizon, so the delay is at least ``horizon + 1`` logged steps). A ``reward``-class finding is critical at
    once with an established level (:class:`RewardLevel`; the finding is itself the fall of a smoothed reward,
    found ``patience`` times in a row), a warning without one.

    Only findings whose streak reached the detector's patience are watched: the others raise no alarm in the guard
    either. Counted in logged steps (calls of :meth:`judge`) and per detector in its observations, as the doctor's.
    """

    def __init__(self, detectors: Mapping[str, Detector], rule: ConsequenceRule | None = None) -> None:
        self.rule = rule or ConsequenceRule()
        self.classes = {name: det.consequence for name, det in detectors.items()}
        self.level = RewardLevel(self.rule)
        self._position = -1
        self._observations = dict.fromkeys(detectors, 0)
        self._critical: dict[str, deque[int]] = {n: deque(maxlen=self.rule.within) for n in detectors}
        self._pending: dict[str, list[_Lone]] = {n: [] for n in detectors}

    def reset(self) -> None:
        """Forget the criticals and lone observations seen (after a rollback the run is judged afresh; the reward's
        level is the task's and stays)."""
        for recent in self._critical.values():
            recent.clear()
        for pending in self._pending.values():
            pending.clear()

    def judge(
        self,
        step: int,
        stats: Mapping[str, float],
        observed: Collection[str],
        findings: Mapping[str, Finding],
        patient: Collection[str],
    ) -> OnlineVerdict:
        """Label this step's ``findings`` (of the detectors that ``observed`` it; ``patient``: those whose streak
        of findings reached their patience) and judge the lone critical findings of earlier steps."""
        rule, p = self.rule, self._position + 1
        self._position = p
        reward = stats.get("reward_mean")
        if reward is not None:
            self.level.push(float(reward))
        labels: dict[str, tuple[Severity, str]] = {}
        intrinsic: list[str] = []
        lone: list[str] = []
        for name in observed:
            k, self._observations[name] = self._observations[name], self._observations[name] + 1
            f = findings.get(name)
            if f is None or f.severity != "critical":
                continue
            self._critical[name].append(k)
            if f.unrecoverable:
                labels[name] = ("critical", "")
                intrinsic.append(name)
            elif self.classes[name] == "reward":
                # the drawdown of a smoothed reward below its best, found ``patience`` times in a row: many
                # observations already; what it needs is a level to fall from
                if self.level.established():
                    labels[name] = ("critical", "a drawdown from an established reward level")
                    intrinsic.append(name)
                else:
                    labels[name] = ("warn", "no established reward level to fall from (never clearly above its floor)")
            elif (recent := sustained_count(self._critical[name].__contains__, k, rule)) >= rule.sustained:
                labels[name] = ("critical", f"sustained: critical in {recent} of {rule.within} observations")
                intrinsic.append(name)
            else:
                lone.append(name)
        for name in lone:
            lost = self._lost_control(name, intrinsic, step)
            if lost is not None:
                labels[name] = ("critical", f"followed by lost control ({lost})")
                continue
            labels[name] = (
                "warn",
                f"a single critical observation: critical if {rule.recovered} clean observations do not follow "
                f"within {rule.horizon} logged steps, or lost control does",
            )
            if name in patient:
                self._pending[name].append(
                    _Lone(p, step, findings[name], RecoveryWatch(p + rule.horizon, rule.recovered))
                )
        raised = self._judge_pending(p, step, observed, findings, intrinsic)
        labelled = dict(findings)
        for name, (severity, why) in labels.items():
            f = findings[name]
            note = f" [{severity} by consequence: {why}]" if why else ""
            labelled[name] = replace(
                f, severity=severity, observed=f.severity if severity != f.severity else None, message=f.message + note
            )
        return OnlineVerdict(labelled, raised)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to judge alike (JSON-ready): positions, recent criticals, lone findings not
        judged yet, the reward's level."""
        lv = self.level
        return {
            "position": self._position,
            "observations": dict(self._observations),
            "critical": {n: list(d) for n, d in self._critical.items()},
            "pending": {
                n: [
                    {"position": x.position, "step": x.step, "streak": x.watch.streak, "recovered": x.recovered}
                    | {k: getattr(x.finding, k) for k in _FINDING_FIELDS}
                    for x in pending
                ]
                for n, pending in self._pending.items()
            },
            "level": {
                "ewma": lv.ewma,
                "lowest": lv.lowest,
                "highest": lv.highest,
                "top": list(lv.top),
                "recent": list(lv.recent.values),
            },
        }

    def load_state_dict(self, state: Mapping[str, Any], *, where: str = "consequence") -> None:
        """Restore :meth:`state_dict`, validated first (:class:`~rlguard.guards.state.GuardStateError` naming
        ``where`` and the key; nothing changes then); detectors this rule does not judge are ignored."""
        state = state_object(state, where, ("position", "observations", "critical", "pending", "level"))
        position = state_count(state["position"], f"{where}.position", least=-1)
        seen = {
            n: v for n, v in state_object(state["observations"], f"{where}.observations").items() if n in self.classes
        }
        observations = {n: state_count(v, f"{where}.observations.{n}") for n, v in seen.items()}
        critical: dict[str, list[int]] = {}
        for n, v in state_object(state["critical"], f"{where}.critical").items():
            if n in self.classes:
                critical[n] = [state_count(k, f"{where}.critical.{n}") for k in state_list(v, f"{where}.critical.{n}")]
        pending: dict[str, list[_Lone]] = {}
        for n, v in state_object(state["pending"], f"{where}.pending").items():
            if n in self.classes:
                pending[n] = [
                    self._lone(x, f"{where}.pending.{n}[{i}]")
                    for i, x in enumerate(state_list(v, f"{where}.pending.{n}"))
                ]
        lv = state_object(state["level"], f"{where}.level", ("ewma", "lowest", "highest", "top", "recent"))
        ewma = None if lv["ewma"] is None else _number(lv["ewma"], f"{where}.level.ewma")
        bounds = [_number(lv[k], f"{where}.level.{k}") for k in ("lowest", "highest")]
        top, recent = (
            [_number(x, f"{where}.level.{k}") for x in state_list(lv[k], f"{where}.level.{k}")]
            for k in ("top", "recent")
        )
        self._position = position
        self._observations.update(observations)
        for n, ks in critical.items():
            self._critical[n] = deque(ks, maxlen=self.rule.within)
        self._pending.update(pending)
        self.level.ewma, (self.level.lowest, self.level.highest) = ewma, bounds
        self.level.top = top[: self.rule.peak_observations]
        self.level.recent = RollingWindow(self.rule.level_window, recent)

    def _lone(self, value: Any, where: str) -> _Lone:
        x = state_object(value, where, ("position", "step", "streak", "recovered", *_FINDING_FIELDS))
        if not isinstance(x["recovered"], bool) or not isinstance(x["transient"], bool):
            raise GuardStateError(f"{where}: recovered and transient must be true or false")
        if not isinstance(x["unrecoverable"], bool) or not isinstance(x["message"], str):
            raise GuardStateError(f"{where}: unrecoverable must be true or false, message a string")
        if x["severity"] not in SEVERITY_LEVEL or x["observed"] not in (None, *SEVERITY_LEVEL):
            raise GuardStateError(f"{where}: severity must be one of {sorted(SEVERITY_LEVEL)}")
        position = state_count(x["position"], f"{where}.position")
        watch = RecoveryWatch(position + self.rule.horizon, self.rule.recovered)
        watch.streak = state_count(x["streak"], f"{where}.streak")
        finding = Finding(
            x["severity"],
            _number(x["value"], f"{where}.value"),
            _number(x["threshold"], f"{where}.threshold"),
            x["message"],
            x["transient"],
            x["unrecoverable"],
            x["observed"],
        )
        return _Lone(position, state_count(x["step"], f"{where}.step"), finding, watch, x["recovered"])

    def _lost_control(self, name: str, intrinsic: Sequence[str], step: int) -> str | None:
        other = next((n for n in intrinsic if n != name and self.classes[n] in CONTROL_CLASSES), None)
        return None if other is None else f"{other} at step {step}"

    def _judge_pending(
        self, p: int, step: int, observed: Collection[str], findings: Mapping[str, Finding], intrinsic: Sequence[str]
    ) -> dict[str, Finding]:
        """Raise the earlier lone critical findings whose consequence showed at this step; drop those judged."""
        raised: dict[str, Finding] = {}
        for name, pending in self._pending.items():
            keep: list[_Lone] = []
            for lone in pending:
                within = p <= lone.watch.until
                why = None
                if lone.position == p:
                    keep.append(lone)
                    continue
                if within and name in intrinsic:
                    continue  # sustained by its own detector: this step's finding is critical itself
                lost = self._lost_control(name, intrinsic, step) if within else None
                if lost is not None:
                    why = f"followed by lost control ({lost})"
                elif not lone.recovered and name in observed:
                    verdict = lone.watch.see(p, name in findings)
                    lone.recovered = verdict is True
                    if verdict is False:
                        why = f"no sign of recovery within {self.rule.horizon} logged steps"
                if why is not None:
                    if name not in raised:
                        note = f" [critical by consequence at step {step}: the observation of step {lone.step}, {why}]"
                        raised[name] = replace(lone.finding, message=lone.finding.message + note)
                elif within or not lone.recovered:
                    keep.append(lone)
            self._pending[name] = keep
        return raised


_FINDING_FIELDS = ("severity", "value", "threshold", "message", "transient", "unrecoverable", "observed")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GuardStateError(f"{where}: expected a number; got {type(value).__name__} {value!r:.80}")
    return float(value)
