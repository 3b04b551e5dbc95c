"""Synthetic contexts for the train-inference gap's remedy (``MismatchRemedy``): an actuator's capabilities with
and without a rollout correction, the gap's finding and another detector's."""

from __future__ import annotations

from rlguard.guards import Guard
from rlguard.guards.events import Finding
from rlguard.guards.interventions import StepContext

NO_ROLLOUT = frozenset(
    {"snapshot", "restore", "drop_update", "lr_scale", "stop", "clip", "kept_gradient", "off_policy_mask"}
)
WITH_ROLLOUT = NO_ROLLOUT | {"rollout_correction", "rollout_mask"}
#: a framework that computes the rollout correction itself and has no geometric or off-policy mask (verl)
TIS_ONLY = NO_ROLLOUT - {"off_policy_mask"} | {"rollout_correction"}


def ctx(
    step: int,
    findings: dict[str, Finding] | None = None,
    caps: frozenset[str] | None = WITH_ROLLOUT,
    guard: Guard | None = None,
) -> StepContext:
    """A step's context with these findings, bound to an actuator with ``caps`` (None: unbound), with the hand-over
    of ``guard``'s interventions (the cause table's, for the interventions it enables)."""
    handed_over = guard.handed_over if guard is not None else {}
    return StepContext(step, {}, findings or {}, {}, {}, 0, None, capabilities=caps, handed_over=handed_over)


def gap(severity: str = "warn") -> dict[str, Finding]:
    return {"mismatch_growth": Finding(severity, 0.01, 0.005, "mismatch_kl=0.01 is above 0.005. Enable ...")}  # type: ignore[arg-type]


def trouble(name: str = "reward_collapse", severity: str = "critical") -> dict[str, Finding]:
    return {name: Finding(severity, 5.0, 3.0, f"{name} fired")}  # type: ignore[arg-type]
