"""The guard's per-step loop (``Observers.judge``, ``Guard._healthy``, ``Decision._neutral``): its shortcuts for the
common step (no finding, no alarm to clear, nothing proposed) decide what the plain definition decides. The plain
definition, written out here: every detector's ``observes`` asked at every step, its observations counted in dicts,
every observation shown to its alarm (``AlarmState.see``), health read from every alarm, the decision built by its
constructor."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.decision import Controls, Decision
from rlguard.guards.detectors.base import warmed_up
from rlguard.guards.events import Event, Finding
from tests.helpers.profiles import examples
from tests.helpers.synthetic import healthy_stream


class _Plain(Guard):
    """A guard whose loop is the plain definition (module docstring)."""

    def __init__(self, config: GuardConfig) -> None:
        super().__init__(config)
        self.seen = dict.fromkeys(self.detectors, 0)
        self.first_seen: dict[str, int | None] = dict.fromkeys(self.detectors)
        self.judged_clean: set[str] = set()
        self.seen_clean: set[str] = set()

    def _run_detectors(self, step: int, stats: Mapping[str, float]) -> tuple[dict[str, Finding], list[Event]]:
        found: dict[str, Finding] = {}
        observed: list[str] = []
        for name, det in self.detectors.items():
            if not det.observes(stats):
                continue
            count = self.seen[name]
            if self.first_seen[name] is None:
                self.first_seen[name] = step
            first = self.first_seen[name]
            assert first is not None
            span = step - first if self.config.warmup_unit == "steps" else None
            armed = warmed_up(det.warmup, count, span)
            finding = det.check(step, stats, armed)
            self.seen[name] = count + 1
            observed.append(name)
            if finding is None:
                self.seen_clean.add(name)
                if armed:
                    self.judged_clean.add(name)
            else:
                found[name] = finding
        self.last_findings, self.last_observed = found, observed
        for n, ledger in self._ledgers.items():  # what the interventions' context reads
            ledger.judged_clean, ledger.seen_clean = n in self.judged_clean, n in self.seen_clean
        findings, raised, patient = (
            found,
            {},
            [n for n in found if self._alarms[n].streak + 1 >= self.detectors[n].patience],
        )
        if self.live_rule is not None:
            verdict = self.live_rule.judge_step(step, stats, observed, found, patient)
            findings, raised = verdict.findings, verdict.raised
        events: list[Event | None] = []
        for name in observed:
            det, alarm = self.detectors[name], self._alarms[name]
            events.append(alarm.see(step, name, findings.get(name), det.patience, det.clear_after))
            if name in raised:
                events.append(alarm.raise_critical(step, name, raised.pop(name)))
            alarm.critical_age = alarm.critical_age + 1 if alarm.level == 2 else 0
        events.extend(self._alarms[name].raise_critical(step, name, finding) for name, finding in raised.items())
        return findings, [e for e in events if e is not None]

    def _healthy(self, findings: Mapping[str, Finding]) -> bool:
        despite = self.config.healthy_despite
        return not any(n not in despite for n in findings) and not any(
            a.level for n, a in self._alarms.items() if n not in despite
        )

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "seen": dict(self.seen),
            "first_seen": dict(self.first_seen),
            "judged_clean": sorted(self.judged_clean),
            "seen_clean": sorted(self.seen_clean),
        }

    def load_state_dict(self, state: Mapping[str, Any], *, source: str = "guard state") -> None:
        super().load_state_dict(state, source=source)
        self.seen.update({n: v for n, v in state["seen"].items() if n in self.seen})
        self.first_seen.update({n: v for n, v in state["first_seen"].items() if n in self.first_seen})
        self.judged_clean = {n for n in state["judged_clean"] if n in self.detectors}
        self.seen_clean = {n for n in state["seen_clean"] if n in self.detectors}


#: what a step may suffer: a spike, a NaN, a missing stat, no policy-gradient signal, a collapse, a bad count
_FAULTS = st.sampled_from(["none"] * 6 + ["spike", "nan", "inf", "missing", "no_signal", "collapse", "count", "sparse"])


def _faulty(stats: dict[str, float], fault: str) -> dict[str, float]:
    stats = dict(stats)
    if fault == "spike":
        stats["grad_norm"] *= 80.0
        stats["kl_old"] *= 200.0
    elif fault == "nan":
        stats["loss"] = math.nan
    elif fault == "inf":
        stats["entropy"] = math.inf
    elif fault == "missing":
        for name in ("entropy", "reward_mean", "grad_norm"):
            stats.pop(name)
    elif fault == "no_signal":
        stats["frac_zero_std_groups"] = 1.0
    elif fault == "collapse":
        stats["entropy"] *= 1e-3
        stats["reward_mean"] = -1.0
        stats["reward_std"] = 0.0
    elif fault == "count":
        stats["nonfinite"] = 3.0
    elif fault == "sparse":  # a step without the generation stats (logged on some steps only)
        stats = {k: v for k, v in stats.items() if k in ("loss", "grad_norm", "lr", "kl_old", "clip_frac")}
    return stats


def _state(guard: Guard) -> str:
    return json.dumps(guard.state_dict(), default=repr)


@examples(quick=25, long=250)
@given(
    seed=st.integers(0, 2**16),
    faults=st.lists(_FAULTS, min_size=20, max_size=120),
    preset=st.sampled_from(["monitor", "default", "strict", "stable"]),
    unit=st.sampled_from(["steps", "observations"]),
    resume_at=st.integers(0, 120),
)
def test_the_loop_decides_as_the_plain_definition(
    seed: int, faults: list[str], preset: str, unit: str, resume_at: int
) -> None:
    config = GuardConfig.preset(preset, warmup_unit=unit)
    stream = healthy_stream(len(faults), seed)
    guard, plain = Guard(config), _Plain(config)
    for k, (stats, fault) in enumerate(zip(stream, faults, strict=True)):
        step = 2 * k + 1  # every other optimizer step: warm-ups in steps differ from those in observations
        stats = _faulty(stats, fault)
        if k == resume_at:  # resumed from the same state, both continue alike
            state = json.loads(_state(guard))
            assert state == json.loads(_state(plain))
            guard, plain = Guard(config), _Plain(config)
            guard.load_state_dict(state)
            plain.load_state_dict(state)
        got, expected = guard.observe(step, stats), plain.observe(step, stats)
        assert got == expected and vars(got) == vars(expected)
        assert guard.last_findings == plain.last_findings and guard.last_observed == plain.last_observed
        assert guard.alarms() == plain.alarms() and guard.last_healthy_step == plain.last_healthy_step
        assert guard.observations() == plain.seen
    assert _state(guard) == _state(plain)


def test_a_neutral_decision_is_the_one_its_constructor_builds() -> None:
    events = (Event(3, "grad_norm_spike", "warn", 2.0, "m"),)
    for snapshot in (True, False):
        built = Decision(step=3, controls=Controls(), snapshot=snapshot, events=events)
        fast = Decision._neutral(3, Controls(), snapshot=snapshot, events=events)
        assert fast == built and list(vars(fast).items()) == list(vars(built).items()) and repr(fast) == repr(built)
        assert [f.name for f in fields(Decision)] == list(vars(fast))  # every field set, none more


def test_a_loaded_state_s_clean_sets_are_kept_as_the_plain_definition_keeps_them() -> None:
    # judged_clean without seen_clean, and the reverse: a state file may hold either (each set is read as given);
    # resumed within the warm-ups (10 observations), so that a detector judged clean in the state is not yet armed
    config = GuardConfig.preset("default")
    stream = healthy_stream(40, 3)
    first = Guard(config)
    for step, stats in enumerate(stream[:5], start=1):
        first.observe(step, stats)
    state = json.loads(_state(first))
    names = sorted(state["seen"])
    state["judged_clean"], state["seen_clean"] = names[::2], names[1::2]
    guard, plain = Guard(config), _Plain(config)
    guard.load_state_dict(state)
    plain.load_state_dict(state)
    for step, stats in enumerate(stream[5:], start=6):
        assert guard.observe(step, stats) == plain.observe(step, stats)
        assert _state(guard) == _state(plain)


def test_an_alarm_raised_in_a_step_cut_short_by_a_detector_s_error_is_read_at_the_next_step() -> None:
    # a NaN raises the nonfinite alarm, then a later detector fails in the same step; the next step does not
    # carry nonfinite's stats: the alarm stays raised, so that step is not healthy
    guard = Guard(GuardConfig.preset("monitor"))
    stream = healthy_stream(30, 4)
    for step, stats in enumerate(stream[:20], start=1):
        guard.observe(step, stats)
    assert guard.last_healthy_step == 20
    detector = guard.detectors["ratio_explosion"]  # judged after nonfinite

    def failing(step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        raise RuntimeError("a plugin's error")

    detector.check = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="a plugin's error"):
        guard.observe(21, {**stream[20], "loss": math.nan})
    assert guard.alarms() == {"nonfinite": "critical"}
    guard.observe(22, {"lr": 1e-6})
    assert guard.last_healthy_step == 20
