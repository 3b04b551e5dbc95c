"""Which detectors may observe a step, decided once per distinct set of stat names (the guard's per-step loop).

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
from rlguard.guards.detectors.base import Detector
from rlguard.guards.detectors.update import finite_values

__all__ = ["Observers", "Watch"]

#: one detector in a step's plan: its name, itself, its alarm, and its ``observes`` where the step's values decide
#: (None: it observes every step of the plan)
Watch: TypeAlias = tuple[str, Detector, AlarmState, Callable[[Mapping[str, float]], bool] | None]

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
    it. The plans hold the detectors and alarm objects: :meth:`clear` after either is replaced (a loaded state)."""

    def __init__(self, detectors: Mapping[str, Detector], alarms: Mapping[str, AlarmState]) -> None:
        self._detectors, self._alarms = detectors, alarms
        self.clear()

    def clear(self) -> None:
        """Forget every plan (the detectors' or alarms' objects, or what a detector reads, changed)."""
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
                plan.append((name, det, self._alarms[name], None if says else det.observes))
        return plan
