"""The consequence rule as findings are made, from the past only (the live guard with
``GuardConfig(consequence="online")``): :class:`OnlineConsequence`.

A critical observation is critical at once when it is unrecoverable or sustained; a lone one is a warning (its step
may still be skipped: ``Finding.observed`` keeps the detector's own severity) until lost control follows within the
horizon, or recovery does not show, and is raised to critical at that later step. A condition present from the
run's first observations is a warning while the reward holds an established level and nothing else loses control
(:meth:`OnlineConsequence.present_from_start`): there is no healthy state before it to roll back to, and its level
alone is no evidence of lost control (a KL to the reference above its bound from the first record measures against
another model than the run's initial policy, or a resumed run: at initialisation the policy is the reference and
the KL is 0). What it cannot apply is what needs the future: the exemptions of a rising reward (a drift, a
condition of the budget), and "unresolved" at the end of the log. "An established peak" becomes an established *level*:
:class:`RewardLevel`, the reward's EWMA clearly above the floor of its range (a run warm-started at 0.5 that falls
has collapsed, though it never rose above its start). The rule itself is :mod:`rlguard.guards.consequence.rule`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rlguard.guards.consequence.level import RewardLevel
from rlguard.guards.consequence.rule import (
    CONTROL_CLASSES,
    ConsequenceRule,
    RecoveryWatch,
    sustained_count,
    sustained_why,
)
from rlguard.guards.events import SEVERITY_LEVEL, Finding, Severity
from rlguard.guards.robust import RollingWindow
from rlguard.guards.state import GuardStateError, state_count, state_list, state_object

if TYPE_CHECKING:
    from rlguard.guards.detectors.base import Detector

__all__ = ["OnlineConsequence", "OnlineVerdict"]


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
    """The rule of :func:`~rlguard.guards.consequence.offline.label_findings` applied as findings are made, from
    the past only: a critical finding is critical at once when it is unrecoverable, or sustained
    (:func:`sustained_count`), or lone with a detector of lost control intrinsically critical at the same step; a
    lone one is otherwise a warning, raised to critical
    at a later step when, within ``rule.horizon`` logged steps, a detector of lost control becomes intrinsically
    critical, or when its own detector does not recover (:class:`RecoveryWatch`: the verdict comes after the
    horizon, so the delay is at least ``horizon + 1`` logged steps). A ``reward``-class finding is critical at
    once with an established level (:class:`RewardLevel`; the finding is itself the fall of a smoothed reward,
    found ``patience`` times in a row), a warning without one.

    Only findings whose streak reached the detector's patience are watched: the others raise no alarm in the guard
    either. Counted in logged steps (calls of :meth:`judge_step`) and per detector in its observations, as the doctor's.
    """

    def __init__(self, detectors: Mapping[str, Detector], rule: ConsequenceRule | None = None) -> None:
        self.rule = rule or ConsequenceRule()
        self.classes = {name: det.finding_class for name, det in detectors.items()}
        self._detectors = dict(detectors)
        #: the clean observations in a row that end a detector's episode of findings
        self._clear = {name: det.clear_after for name, det in detectors.items()}
        self.level = RewardLevel(self.rule)
        self._position = -1
        self._observations = dict.fromkeys(detectors, 0)
        self._critical: dict[str, deque[int]] = {n: deque(maxlen=self.rule.within) for n in detectors}
        self._pending: dict[str, list[_Lone]] = {n: [] for n in detectors}
        #: per detector, its current episode of findings (any severity): the observation it began at, the
        #: reward's EWMA then, and the clean observations in a row since its last finding
        self._episode: dict[str, tuple[int, float | None] | None] = dict.fromkeys(detectors)
        self._clean = dict.fromkeys(detectors, 0)

    def present_from_start(self, name: str, intrinsic: Collection[str]) -> str | None:
        """Why ``name``'s sustained condition is a warning, or None: it has been found in one episode (no
        ``clear_after`` clean observations in a row) since the detector's very first observation (an absolute
        bound, which needs no baseline: a relative excursion always has a "before"), the reward holds an
        established level not clearly below its level at that first observation (:meth:`RewardLevel.holds`), and
        no other detector of lost control is critical in itself at this step (``intrinsic``). No healthy state
        precedes such a condition, so a rollback cannot undo it, and its level alone is no lost control (a KL to
        the reference far above its bound from the first record measures against another model than the run's
        initial policy, or a resumed run). A reward that falls, or another detector that loses control, makes it
        critical. Until the detector has made ``rule.peak_observations`` observations (those an established reward
        level needs) the verdict waits: a warning that says so."""
        episode = self._episode[name]
        if episode is None or episode[0] != 0 or self.classes[name] == "reward":
            return None
        if self._lost_control(name, intrinsic, 0) is not None:
            return None
        if self._observations[name] < self.rule.peak_observations:
            return (
                f"present from the run's first observation: judged after {self.rule.peak_observations} observations, "
                "by whether the reward holds an established level"
            )
        if not self.level.holds(episode[1]):
            return None
        return (
            "present from the run's first observations, while the reward holds its level and nothing else lost control"
        )

    def reset(self) -> None:
        """Forget the criticals and lone observations seen (after a rollback the run is judged afresh; the reward's
        level is the task's and stays)."""
        for recent in self._critical.values():
            recent.clear()
        for pending in self._pending.values():
            pending.clear()

    def judge_step(
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
        sustained: dict[str, str] = {}
        for name in observed:
            k, self._observations[name] = self._observations[name], self._observations[name] + 1
            f = findings.get(name)
            self._follow_episode(name, k, f is not None)
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
            elif (
                why := sustained_why(
                    sustained_count(self._critical[name].__contains__, k, rule), self._detectors[name].evidence(f), rule
                )
            ) is not None:
                sustained[name] = why
                intrinsic.append(name)
            else:
                lone.append(name)
        for name, because in sustained.items():
            why = self.present_from_start(name, intrinsic)
            if why is not None:
                labels[name] = ("warn", why)
                intrinsic.remove(name)
            else:
                labels[name] = ("critical", because)
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
        judged yet, each detector's episode of findings, the reward's level."""
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
            "episodes": {
                n: {"start": None if e is None else e[0], "ewma": None if e is None else e[1], "clean": self._clean[n]}
                for n, e in self._episode.items()
            },
            "level": {
                "ewma": lv.ewma,
                "lowest": lv.lowest,
                "lowest_at_best": lv.lowest_at_best,
                "highest": lv.highest,
                "top": list(lv.top),
                "recent": list(lv.recent.values),
            },
        }

    def load_state_dict(self, state: Mapping[str, Any], *, where: str = "consequence") -> None:
        """Restore :meth:`state_dict`, validated first (:class:`~rlguard.guards.state.GuardStateError` naming
        ``where`` and the key; nothing changes then); detectors this rule does not judge are ignored."""
        keys = ("position", "observations", "critical", "pending", "level")
        # "episodes" is absent from the states of earlier versions: their episodes start afresh
        state = state_object(state, where, (*keys, "episodes") if "episodes" in state else keys)
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
        episodes: dict[str, tuple[tuple[int, float | None] | None, int]] = {}
        for n, v in state_object(state.get("episodes", {}), f"{where}.episodes").items():
            if n in self.classes:
                e = state_object(v, f"{where}.episodes.{n}", ("start", "ewma", "clean"))
                start = None if e["start"] is None else state_count(e["start"], f"{where}.episodes.{n}.start")
                at = None if e["ewma"] is None else _number(e["ewma"], f"{where}.episodes.{n}.ewma")
                episodes[n] = (None if start is None else (start, at), state_count(e["clean"], f"{where}.episodes.{n}"))
        # "lowest_at_best" is absent from the states of earlier versions: their floor stays the lowest reward seen
        level_keys: tuple[str, ...] = ("ewma", "lowest", "highest", "top", "recent")
        if isinstance(state["level"], Mapping) and "lowest_at_best" in state["level"]:
            level_keys = (*level_keys, "lowest_at_best")
        lv = state_object(state["level"], f"{where}.level", level_keys)
        ewma = None if lv["ewma"] is None else _number(lv["ewma"], f"{where}.level.ewma")
        bounds = [_number(lv[k], f"{where}.level.{k}") for k in ("lowest", "highest")]
        at_best = _number(lv.get("lowest_at_best", bounds[0]), f"{where}.level.lowest_at_best")
        top, recent = (
            [_number(x, f"{where}.level.{k}") for x in state_list(lv[k], f"{where}.level.{k}")]
            for k in ("top", "recent")
        )
        self._position = position
        self._observations.update(observations)
        for n, ks in critical.items():
            self._critical[n] = deque(ks, maxlen=self.rule.within)
        self._pending.update(pending)
        for n, (episode, clean) in episodes.items():
            self._episode[n], self._clean[n] = episode, clean
        self.level.ewma, (self.level.lowest, self.level.highest) = ewma, bounds
        self.level.lowest_at_best = at_best
        self.level.top = top[: self.rule.peak_observations]
        self.level.recent = RollingWindow(self.rule.level_window, recent)

    def _lone(self, value: Any, where: str) -> _Lone:
        if isinstance(value, Mapping):  # states written before Finding lost its unread ``transient`` field
            value = {k: v for k, v in value.items() if k != "transient"}
        x = state_object(value, where, ("position", "step", "streak", "recovered", *_FINDING_FIELDS))
        if not isinstance(x["recovered"], bool):
            raise GuardStateError(f"{where}: recovered must be true or false")
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
            x["unrecoverable"],
            x["observed"],
        )
        return _Lone(position, state_count(x["step"], f"{where}.step"), finding, watch, x["recovered"])

    def _follow_episode(self, name: str, k: int, found: bool) -> None:
        """Update ``name``'s episode of findings with its observation ``k`` (with a finding or clean)."""
        if found:
            self._clean[name] = 0
            if self._episode[name] is None:
                self._episode[name] = (k, self.level.ewma)
            return
        self._clean[name] += 1
        if self._clean[name] >= self._clear[name]:
            self._episode[name] = None

    def _lost_control(self, name: str, intrinsic: Collection[str], step: int) -> str | None:
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
                if why is not None and self.present_from_start(name, intrinsic) is not None:
                    why = None  # the condition's level alone: not raised while the reward holds its level
                    lone.recovered = True
                if why is not None:
                    if name not in raised:
                        note = f" [critical by consequence at step {step}: the observation of step {lone.step}, {why}]"
                        raised[name] = replace(lone.finding, message=lone.finding.message + note)
                elif within or not lone.recovered:
                    keep.append(lone)
            self._pending[name] = keep
        return raised


_FINDING_FIELDS = ("severity", "value", "threshold", "message", "unrecoverable", "observed")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GuardStateError(f"{where}: expected a number; got {type(value).__name__} {value!r:.80}")
    return float(value)
