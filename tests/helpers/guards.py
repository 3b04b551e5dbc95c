"""Guards and actuators with scripted behaviour, a step's context for calling one intervention directly, and the
``stable`` guard driven through healthy and poisoned steps."""

from __future__ import annotations

import math
from collections.abc import Mapping

from rlguard.guards import Decision, Guard, GuardConfig
from rlguard.guards.decision import decision_action
from rlguard.guards.events import Finding
from rlguard.guards.interventions import StepContext


class ScriptedGuard(Guard):
    """A real Guard whose decision at each step is scripted; records the stats it was given."""

    def __init__(self, script: Mapping[int, Decision]) -> None:
        super().__init__(GuardConfig.preset("monitor"))
        self.script = dict(script)
        self.seen: list[dict[str, float]] = []

    def observe(self, step: int, stats: Mapping[str, float]) -> Decision:
        self.seen.append(dict(stats))
        return self.script.get(step, Decision(step))


class StubActuator:
    """Every capability, no model: records the calls' outcome only."""

    capabilities = frozenset({"snapshot", "restore", "drop_update", "lr_scale", "clip", "beta", "entropy_coef", "stop"})

    def __init__(self) -> None:
        self.snapshots: list[int] = []

    def snapshot(self, step: int) -> None:
        self.snapshots.append(step)

    def has_snapshot(self) -> bool:
        return bool(self.snapshots)

    def set_lr_scale(self, scale: float) -> None: ...
    def drop_update(self) -> None: ...
    def apply_update(self) -> None: ...
    def restore(self) -> bool:
        return bool(self.snapshots)

    def set_controls(self, controls: object) -> None: ...
    def stop(self) -> None: ...


def step_context(step: int, stats: dict[str, float], findings: dict[str, Finding] | None = None) -> StepContext:
    """The context of ``step`` with these stats and findings: no alarms, no skips, no healthy step yet, unbound."""
    return StepContext(step, stats, findings or {}, {}, {}, 0, None)


def stable_guard() -> Guard:
    """The ``stable`` preset with a snapshot at every healthy step."""
    return Guard(GuardConfig.preset("stable", snapshot_interval=1))


def healthy_steps(guard: Guard, steps: range) -> list[float]:
    """Healthy stats at ``steps``; the LR scale of each decision."""
    return [guard.observe(t, {"loss": 0.1, "update_ratio": 1e-4, "nonfinite": 0.0}).controls.lr_scale for t in steps]


def poisoned_steps(guard: Guard, steps: range) -> list[str]:
    """A non-finite loss at ``steps``; the action of each decision."""
    return [decision_action(guard.observe(t, {"loss": math.nan, "nonfinite": 3.0})) for t in steps]
