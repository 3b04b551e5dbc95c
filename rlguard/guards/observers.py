"""The guard's per-step loop over its detectors: which may observe a step, decided once per distinct set of stat
names, and each one's judgement of it with its bookkeeping (:class:`Ledger`) and its alarm.

A log carries the same stats at most steps, so what the names alone say of :meth:`Detector.observes
<rlguard.guards.detectors.Detector.observes>` (:meth:`~rlguard.guards.detectors.Detector.observed_with`: a detector
whose stats the step does not carry is not asked, one whose verdict the names and the values' finiteness settle is
not asked either) is worked out once per set of names and kept; only a detector whose verdict depends on the values
is asked at each step. The result is what asking every detector's ``observes`` gives, step for step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeAlias

from rlguard.guards.alarms import AlarmState
from rlguard.guards.detectors.base import Detector, warmed_up
from rlguard.guards.detectors.update import finite_values
from rlguard.guards.events import Event, Finding

__all__ = ["Ledger", "Observers", "Watch"]


class Ledger:
    """What the guard keeps of one detector's observations (saved in the guard's state as ``seen``, ``first_seen``,
    ``judged_clean`` and ``seen_clean``).

    Attributes:
        seen: the steps it observed (warm-up included).
        first_seen: the step of its first observation (its warm-up is counted in steps from there); None: none yet.
        judged_clean: it judged (armed) an observation without a finding.
        seen_clean: it had an observation without a finding (its absolute bounds, which need no baseline, judge
            from the first observation).
    """

    __slots__ = ("first_seen", "judged_clean", "seen", "seen_clean")

    def __init__(self) -> None:
        self.seen = 0
        self.first_seen: int | None = None
        self.judged_clean = self.seen_clean = False


#: one detector in a step's plan: its name, itself, its alarm, its ``observes`` where the step's values decide
#: (None: it observes every step of the plan), and its ledger
Watch: TypeAlias = tuple[str, Detector, AlarmState, Callable[[Mapping[str, float]], bool] | None, Ledger]

#: the most sets of names kept (a log has a few; a stream of ever new names is planned again rather than kept)
_KEPT = 64


def _described(cls: type) -> bool:
    """Whether ``cls``'s ``observed_with`` describes its ``observes``: defined by the class that defines
    ``observes``, or by a subclass of it."""
    return _defined_in(cls, "observed_with") <= _defined_in(cls, "observes")


def _defined_in(cls: type, attribute: str) -> int:
    """The position in ``cls``'s method resolution order of the class that defines ``attribute``."""
    return next(i for i, owner in enumerate(cls.__mro__) if attribute in owner.__dict__)


class Observers:
    """The detectors that may observe a step, in the guard's order, with how each decides (:data:`Watch`): one plan
    per set of stat names and per whether all of the step's values are finite, built at the first step that needs
    it. The plans hold the detectors, alarm and ledger objects: :meth:`clear` after one is replaced (a loaded
    state)."""

    def __init__(self, detectors: Mapping[str, Detector], alarms: Mapping[str, AlarmState]) -> None:
        self._detectors, self._alarms = detectors, alarms
        #: each detector's ledger, which the guard saves
        self.ledgers = {name: Ledger() for name in detectors}
        #: set where :meth:`judge` showed an alarm a finding or a raised level (an alarm's level may have changed,
        #: even in a step cut short by a detector's error); the reader resets it
        self.alarms_seen = False
        self.clear()

    def clear(self) -> None:
        """Forget every plan (the detectors', alarms' or ledgers' objects, or what a detector reads, changed)."""
        self._plans: dict[frozenset[str], list[list[Watch] | None]] = {}
        self._names: frozenset[str] = frozenset()
        self._pair: list[list[Watch] | None] = [None, None]

    def at(self, stats: Mapping[str, float]) -> list[Watch]:
        """The plan of a step with ``stats``: the detectors that may observe it (the others would say no)."""
        if stats.keys() != self._names:  # the step's names differ from the last step's
            names = frozenset(stats)
            if len(self._plans) >= _KEPT and names not in self._plans:
                self._plans.clear()
            self._names, self._pair = names, self._plans.setdefault(names, [None, None])
        finite = finite_values(stats)
        plan = self._pair[finite]
        if plan is None:
            plan = self._pair[finite] = self._plan(self._names, finite)
        return plan

    def _plan(self, names: frozenset[str], finite: bool) -> list[Watch]:
        plan: list[Watch] = []
        for name, det in self._detectors.items():
            # a class that overrides observes without observed_with (a method its answer does not describe): asked
            says = det.observed_with(names, finite=finite) if _described(type(det)) else None
            if says is not False:
                plan.append((name, det, self._alarms[name], None if says else det.observes, self.ledgers[name]))
        return plan

    def judge(
        self, step: int, stats: Mapping[str, float], *, by_steps: bool, see: bool
    ) -> tuple[dict[str, Finding], list[str], list[Event]]:
        """The step's findings by detector, the detectors that observed it (in the detectors' order) and, where
        ``see``, the events of their alarms, each alarm seeing its detector's finding in the same pass. Each detector
        that observes the step judges it once past its warm-up (:func:`warmed_up`; ``by_steps``: counted in steps
        from its first observation, else in observations), and its :class:`Ledger` counts it."""
        found: dict[str, Finding] = {}
        observed: list[str] = []
        events: list[Event] = []
        for name, det, alarm, ask, ledger in self.at(stats):  # those whose observes may say yes, in order
            if ask is not None and not ask(stats):
                continue  # no evidence this step: alarm, streak and warm-up stay as they are
            count = ledger.seen
            first = ledger.first_seen
            if first is None:
                first = ledger.first_seen = step
            # warmed_up's answer: past the warm-up in observations, or by steps from the first observation
            armed = count >= det.warmup or (by_steps and warmed_up(det.warmup, count, step - first))
            finding = det.check(step, stats, armed)
            ledger.seen = count + 1
            observed.append(name)
            if finding is None:
                if not (ledger.judged_clean and ledger.seen_clean):  # flags set once: most steps read them set
                    ledger.seen_clean = True
                    ledger.judged_clean = ledger.judged_clean or armed
                if not see:
                    continue
                if not alarm.level:  # AlarmState.see of a clean step with no alarm to clear
                    alarm.streak, alarm.clean, alarm.critical_age = 0, alarm.clean + 1, 0
                    continue
            else:
                found[name] = finding
                if not see:
                    continue
            self.alarms_seen = True
            event = alarm.see(step, name, finding, det.patience, det.clear_after)
            if event is not None:
                events.append(event)
            alarm.critical_age = alarm.critical_age + 1 if alarm.level == 2 else 0
        return found, observed, events
