"""Which detectors observe a step (``rlguard.guards.observers``): planned once per set of stat names, the same
detectors, in the same order, as asking every detector's ``observes`` at every step."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.alarms import AlarmState
from rlguard.guards.detectors import Detector
from rlguard.guards.detectors.update import finite_values
from rlguard.guards.observers import Observers
from rlguard.metrics import METRICS
from tests.helpers.profiles import examples

#: every stat a built-in detector reads, the counts the non-finite detector reads, and one no detector reads
_NAMES = sorted({m.name for m in METRICS} | {"loss", "nonfinite", "lr"})
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 1e-9, 1e308, math.nan, math.inf, -math.inf]),
)
#: a log's steps: a few sets of names, each step one of them with its own values
_STEPS = st.lists(st.sets(st.sampled_from(_NAMES), max_size=12), min_size=1, max_size=3).flatmap(
    lambda sets: st.lists(
        st.sampled_from(sets).flatmap(lambda names: st.fixed_dictionaries({n: _VALUES for n in sorted(names)})),
        min_size=1,
        max_size=40,
    )
)


@examples(quick=60, long=600)
@given(steps=_STEPS, preset=st.sampled_from(["default", "monitor"]))
def test_the_plan_observes_what_each_detector_s_observes_says(steps: list[dict[str, float]], preset: str) -> None:
    guard = Guard(GuardConfig.preset(preset))
    for step, stats in enumerate(steps, start=1):
        expected = [n for n, d in guard.detectors.items() if d.observes(stats)]  # before check changes a detector
        guard.observe(step, stats)
        assert guard.last_observed == expected


@dataclass(kw_only=True)
class _Metric(Detector):
    """A detector of ``x`` with the default ``observes``, counting what the plan asks it."""

    name = "metric_x"
    metric: str = "x"
    asked: int = 0

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool | None:
        self.asked += 1
        return super().observed_with(names, finite=finite)


@dataclass(kw_only=True)
class _Always(_Metric):
    """Reads ``x`` but observes every step: it overrides ``observes`` alone."""

    name = "always"

    def observes(self, stats: Mapping[str, float]) -> bool:
        return True


def _plan(observers: Observers, stats: Mapping[str, float]) -> list[str]:
    return [name for name, _, _, ask, _ in observers.at(stats) if ask is None or ask(stats)]


def test_names_are_judged_once_per_set_and_an_override_of_observes_alone_keeps_its_say() -> None:
    metric, always = _Metric(), _Always()
    observers = Observers({"metric_x": metric, "always": always}, {"metric_x": AlarmState(), "always": AlarmState()})
    for _ in range(50):
        assert _plan(observers, {"y": 1.0}) == ["always"]  # no x: the default observes says no, without asking
        assert _plan(observers, {"x": 1.0, "y": 2.0}) == ["metric_x", "always"]
    assert _plan(observers, {"x": math.nan, "y": 2.0}) == ["always"]  # not finite: x's value decides
    assert metric.asked == 3  # once per set of names and finiteness, not per step
    observers.clear()
    assert _plan(observers, {"y": 1.0}) == ["always"]
    assert metric.asked == 4


def test_finite_values_is_true_only_when_every_value_is_a_finite_number() -> None:
    assert finite_values({"a": 1.0, "b": -0.0, "c": 3}) and finite_values({})
    for bad in (math.nan, math.inf, -math.inf, 10**400, "1.0", None):
        assert not finite_values({"a": 1.0, "b": bad})  # type: ignore[dict-item]
    assert not finite_values({"a": 1e308, "b": 1e308})  # overflow: the caller tests the values one by one
