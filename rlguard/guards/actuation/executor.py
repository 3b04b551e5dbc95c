"""The one executor: :func:`apply_decision` turns a :class:`~rlguard.guards.Decision` into calls of an
:class:`~rlguard.guards.actuation.contract.Actuator`, in the order of the contract; :func:`bind_guard` binds a guard
to an actuator at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from rlguard.guards.actuation.budget import check_snapshot_budget
from rlguard.guards.actuation.contract import OUTCOME_CAPABILITY, Actuator, Applied, check_capabilities
from rlguard.guards.decision import Controls, Decision
from rlguard.plugins import load_plugins, plugin_manager

if TYPE_CHECKING:
    from rlguard.guards.guard import Guard

__all__ = ["apply_decision", "bind_guard"]


def apply_decision(decision: Decision, actuator: Actuator, *, hook: pluggy.HookRelay | None = None) -> Applied:
    """Carry out ``decision`` on ``actuator``: the one place where a decision takes effect (the order is the
    contract's, :mod:`rlguard.guards.actuation.contract`), then call the plugins' ``rlguard_on_decision`` through
    ``hook``: the relay of the guard that made the decision (:meth:`Guard.apply <rlguard.guards.Guard.apply>`
    passes its own, which holds its alerts), or the process-wide plugins' where None."""
    can = actuator.capabilities
    skipped: list[str] = []

    def able(capability: str) -> bool:
        if capability not in can:
            skipped.append(capability)
            return False
        return True

    outcome, controls = decision.outcome, decision.controls
    if decision.snapshot and able("snapshot"):
        actuator.snapshot(decision.step)
    if outcome == "rollback" and not (able("restore") and actuator.has_snapshot()):
        outcome = "halt"  # nothing to go back to: stop rather than train on
    if controls.lr_scale != 1.0 and able("lr_scale"):
        actuator.set_lr_scale(controls.lr_scale)
    if outcome != "step" and able("drop_update"):
        actuator.drop_update()
    actuator.apply_update()
    if outcome == "rollback" and not actuator.restore():
        outcome = "halt"
    missing = sorted(controls.capabilities_needed() - can)
    skipped.extend(missing)
    actuator.set_controls(controls.without(missing))
    if outcome == "halt" and able("stop"):
        actuator.stop()
    applied = Applied(outcome, tuple(dict.fromkeys(skipped)))
    (hook or load_plugins(plugin_manager(), "guard").hook).rlguard_on_decision(decision=decision, applied=applied)
    return applied


def bind_guard(guard: Guard, actuator: Actuator, *, where: str) -> None:
    """At start-up: refuse ``guard``'s schedules that ``actuator`` (named ``where`` in messages) cannot carry out
    (:func:`check_capabilities`) and tell the guard which outcomes and controls it cannot carry out, so that their
    events say ``record-only``; log what a rollback snapshot costs and refuse one over the guard's ``snapshot_budget``
    (:func:`~rlguard.guards.actuation.budget.check_snapshot_budget`), for an actuator that reports its cost
    (``snapshot_cost()``; the plain-torch and TRL actuators do)."""
    missing = check_capabilities(guard.config, actuator.capabilities, where=where)
    unable: dict[str, str] = {o: c for o, c in OUTCOME_CAPABILITY.items() if c in missing}
    unable.update({name: c for name, c in Controls.capabilities().items() if c in missing})
    guard.set_record_only(unable, where=where)
    guard.capabilities = frozenset(actuator.capabilities)
    cost = getattr(actuator, "snapshot_cost", None)
    if not guard.config.observe_only and "snapshot" in actuator.capabilities and cost is not None:
        check_snapshot_budget(cost(), guard.config.snapshot_budget, where=where)
