"""How a guard's :class:`~rlguard.guards.Decision` takes effect: the one executor and the ``Actuator`` protocol.

Every training loop (TRL under DDP or DeepSpeed, verl, the benchmarks' plain-torch loop) supplies only an actuator;
:func:`apply_decision` is the single place where a decision is turned into actions. See ``docs/design.md``.
"""

from __future__ import annotations

from rlguard.guards.guard import Guard, GuardConfig

__all__ = ["ACTION_CODE", "EVENTS_FILE", "GUARD_STATE_FILE", "SEVERITY_CODE", "make_guard"]

#: the guard's state in each checkpoint folder, and its events next to the run's logs
GUARD_STATE_FILE = "rlguard_guard.json"
EVENTS_FILE = "events.jsonl"
#: how an event's severity and a step's action are logged as numbers (``rlguard/event/*``, ``rlguard/guard/action``)
SEVERITY_CODE: dict[str, float] = {"warn": 1.0, "critical": 2.0}
ACTION_CODE: dict[str, float] = {
    "continue": 0.0,
    "set_clip": 1.0,
    "scale_lr": 2.0,
    "skip_step": 3.0,
    "rollback": 4.0,
    "halt": 5.0,
}


def make_guard(guard: str | GuardConfig | Guard) -> Guard:
    """A guard from a preset name (``"monitor"``, ``"default"``, ``"strict"``), a ``GuardConfig`` or a ``Guard``."""
    if isinstance(guard, Guard):
        return guard
    if isinstance(guard, GuardConfig):
        return Guard(guard)
    if isinstance(guard, str):
        return Guard(GuardConfig.preset(guard))
    raise ValueError(
        f"guard must be a preset name ('monitor', 'default', 'strict'), a GuardConfig or a Guard; got {guard!r}."
    )
