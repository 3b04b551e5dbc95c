"""``Recovery`` in the ``stable`` preset: a halt only after repeated failed recoveries, and a persistent critical
alarm of a detector of the update turned into a rollback where ``halt`` would stop the run."""

from __future__ import annotations

from rlguard.guards.decision import logged_action
from rlguard.guards.interventions import StepContext
from rlguard.guards.interventions.recovery import Recovery
from tests.helpers.guards import healthy_steps, poisoned_steps, stable_guard


def test_recovery_halts_only_after_repeated_failed_recoveries() -> None:
    guard = stable_guard()
    healthy_steps(guard, range(10))
    actions: list[str] = []
    for start in range(10, 10 + 5 * 40, 40):  # 5 crashes, each 36 healthy steps after the last (> probation 30)
        actions += poisoned_steps(guard, range(start, start + 4))
        healthy_steps(guard, range(start + 4, start + 40))
    assert actions.count("rollback") == 5 and "halt" not in actions
    guard = stable_guard()
    healthy_steps(guard, range(10))
    actions = []
    for start in range(10, 10 + 4 * 6, 6):  # crashes 2 healthy steps after each rollback: recoveries fail
        actions += poisoned_steps(guard, range(start, start + 4))
        healthy_steps(guard, range(start + 4, start + 6))
    assert actions.count("rollback") == 3 and actions[-1] == "halt"


def test_recovery_turns_a_persistent_critical_alarm_into_a_rollback_where_halt_would_stop() -> None:
    rec = Recovery()
    ctx = StepContext(50, {}, {}, {"grad_norm_explosion": "critical"}, {"grad_norm_explosion": 24}, 0, 20)
    assert rec.propose(ctx) is None  # not yet persistent
    ctx = StepContext(51, {}, {}, {"grad_norm_explosion": "critical"}, {"grad_norm_explosion": 25}, 0, 20)
    p = rec.propose(ctx)
    assert (
        p is not None and logged_action(p) == "rollback" and p.rollback_to == 20 and "grad_norm_explosion" in p.reason
    )
    ctx = StepContext(90, {}, {}, {"zero_variance_groups": "critical"}, {"zero_variance_groups": 99}, 0, 20)
    assert rec.propose(ctx) is None  # data-side: ignored, as by halt
