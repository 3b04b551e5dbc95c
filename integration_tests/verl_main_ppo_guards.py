"""A guard with scripted decisions for the guarded verl runs (``+trainer.rlguard_guard=verl_main_ppo_guards:
scripted_guard``): the clip range narrows and the actor's LR halves from step 2 on (schedules), a detector raises a
critical alarm at steps 3 and 4, the first alarm rolls back to the last healthy snapshot (one per healthy step) and
the second halts (one rollback allowed). The decisions are fixed in advance so that the test can check what verl did
with each."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlguard.guards import GuardConfig
from rlguard.guards.detectors import Detector
from rlguard.guards.events import Finding
from rlguard.guards.registry import detector_registry
from rlguard.guards.schedules import Piecewise
from rlguard.hookspecs import hookimpl
from rlguard.plugins import plugin_manager

FAULT_STEPS = (3, 4)
# clip bounds (low, high) before step 2 and from it on, applied by the workers a step later: GSPO's sequence ratio
# never leaves [0.01, 11], and nearly always leaves 1 +- 1e-6 after the step's first mini-batch update
WIDE, NARROW = (0.99, 10.0), (1e-6, 1e-6)
# the actor's LR scale from step 2 on, applied by the workers (rlguard's actor worker) a step later
LR_SCALE = 0.5


@dataclass(kw_only=True)
class ScriptedFault(Detector):
    """Critical at the steps in ``steps``, nothing otherwise."""

    name = "scripted_fault"
    source = "integration test"
    summary = "critical at scripted steps"

    steps: tuple[int, ...] = ()
    warmup: int = 0
    clear_after: int = 1

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        if step in self.steps:
            return Finding("critical", float(step), 0.0, f"scripted fault at step {step}")
        return None


@hookimpl
def rlguard_add_detectors() -> Sequence[type[Detector]]:
    return [ScriptedFault]


def scripted_guard() -> GuardConfig:
    """The guard of the module docstring; registers :class:`ScriptedFault` in this process first."""
    module = sys.modules[__name__]
    manager = plugin_manager()
    if not manager.is_registered(module):
        manager.register(module)
        detector_registry.cache_clear()
    return GuardConfig(
        detectors={"scripted_fault": {"steps": FAULT_STEPS}},
        # only the scripted decisions: the interventions that act on the run's own stats are off
        interventions={
            "rollback": {"on": ("scripted_fault",), "max_rollbacks": 1},
            "skip_step": None,
            "lr_backoff": None,
            "clip_controller": None,
        },
        schedules={
            "clip_low": Piecewise(boundaries=(2,), values=(WIDE[0], NARROW[0])),
            "clip_high": Piecewise(boundaries=(2,), values=(WIDE[1], NARROW[1])),
            "lr_scale": Piecewise(boundaries=(2,), values=(1.0, LR_SCALE)),
        },
        snapshot_interval=1,
        # a scripted fault is one critical step: judged by its severity, not by the live consequence rule (which
        # rolls back only a sustained or consequential finding), since what is tested is the rollback's mechanics
        consequence="step",
    )
