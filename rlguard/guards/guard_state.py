"""The guard's own part of a checkpointed state read back (:func:`read_guard_state`): its events, alarms,
observation counts and counters, each validated and typed before :meth:`~rlguard.guards.Guard.load_state_dict`
changes anything. The detectors' and interventions' private states validate themselves
(:func:`~rlguard.guards.state.probe_state`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlguard.guards.alarms import AlarmState
from rlguard.guards.events import Event
from rlguard.guards.state import (
    GUARD_COUNTERS,
    STATE_VERSION,
    GuardStateError,
    state_alarm,
    state_count,
    state_list,
    state_object,
    state_step,
)

if TYPE_CHECKING:
    from rlguard.guards.detectors import Detector

__all__ = ["GuardStateRead", "read_guard_state"]


@dataclass(frozen=True)
class GuardStateRead:
    """The guard's part of a state, validated.

    Attributes:
        events: the events recorded so far.
        alarms: detector -> its alarm, for the detectors of the guard that reads it.
        seen: detector -> its observations.
        first_seen: detector -> the step of its first observation (None: none yet).
        judged_clean: the detectors that judged an observation without a finding past their warm-up.
        seen_clean: the detectors that had an observation without a finding.
        counters: :data:`~rlguard.guards.state.GUARD_COUNTERS` -> its value.
        consecutive_skips: ``counters["consecutive_skips"]``, never None.
    """

    events: list[Event]
    alarms: dict[str, AlarmState]
    seen: dict[str, int]
    first_seen: dict[str, int | None]
    judged_clean: list[str]
    seen_clean: list[str]
    counters: dict[str, int | None]
    consecutive_skips: int


def read_guard_state(
    state: object,
    source: str,
    keys: Collection[str],
    detectors: Mapping[str, Detector],
    alarms: Mapping[str, AlarmState],
) -> GuardStateRead:
    """The guard's part of ``state``, validated: its version, its keys (``keys``: those the reading guard writes;
    the live consequence rule's state is optional, a guard that does not apply it ignores it and one that does
    starts it afresh without it) and the type of each value; :class:`GuardStateError` naming ``source`` (the file)
    and the key otherwise. ``detectors`` and ``alarms``: the reading guard's; alarms of detectors it does not run
    are left out. A state written before warm-ups were counted in steps and rollbacks asked for a snapshot from
    before the onset has no ``first_seen`` nor ``judged_clean``: every detector that observed past its warm-up is
    then taken as having judged a clean step."""
    if not isinstance(state, Mapping):
        raise GuardStateError(f"{source}: expected a JSON object (the guard's state); got {type(state).__name__}")
    if state.get("version") != STATE_VERSION or isinstance(state.get("version"), bool):
        raise GuardStateError(
            f"{source}: unsupported guard state version {state.get('version')!r}; this rlguard reads version "
            f"{STATE_VERSION}."
        )
    template = {*keys, "consequence"}
    optional = {"consequence", "first_seen", "judged_clean", "seen_clean"}
    unknown, missing = sorted(set(state) - template), sorted(template - set(state) - optional)
    if unknown or missing:
        raise GuardStateError(
            f"{source}: not a guard state: unknown key(s) {unknown}, missing key(s) {missing}; a guard state has "
            f"{sorted(template)}."
        )
    try:
        events = [Event.from_dict(e) for e in state_list(state["events"], f"{source}: events")]
    except (TypeError, ValueError) as err:
        raise GuardStateError(f"{source}: events: {err}") from None
    read_alarms = {
        n: AlarmState(**state_alarm(a, f"{source}: alarms.{n}"))
        for n, a in state_object(state["alarms"], f"{source}: alarms").items()
        if n in alarms
    }
    seen = {n: state_count(v, f"{source}: seen.{n}") for n, v in state_object(state["seen"], f"{source}: seen").items()}
    first_seen = {
        n: None if v is None else state_step(v, f"{source}: first_seen.{n}")
        for n, v in state_object(state.get("first_seen", {}), f"{source}: first_seen").items()
    }
    clean = [str(n) for n in state_list(state.get("judged_clean", []), f"{source}: judged_clean")]
    seen_clean = [str(n) for n in state_list(state.get("seen_clean", []), f"{source}: seen_clean")]
    if "judged_clean" not in state:
        clean = [n for n, v in seen.items() if n in detectors and v > detectors[n].warmup]
        seen_clean = [n for n, v in seen.items() if n in detectors and v > 0]
    counters = {k: state_step(state[k], f"{source}: {k}") for k in GUARD_COUNTERS}
    skips = counters["consecutive_skips"]
    if skips is None:
        raise GuardStateError(f"{source}: consecutive_skips: expected an integer >= 0; got None")
    return GuardStateRead(events, read_alarms, seen, first_seen, clean, seen_clean, counters, skips)
