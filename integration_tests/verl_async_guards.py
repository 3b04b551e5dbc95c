"""A guard with scripted decisions for the guarded asynchronous verl runs (``+trainer.rlguard_guard=
verl_async_guards:scripted_async_guard``): a skip at step 2, the clip range narrowed and the actor's LR halved from
step 2 on (schedules, applied by the workers a step later), a critical alarm at steps 3 and 4: the first rolls back
to the last healthy snapshot (step 1: step 2 was skipped), the second halts (one rollback allowed).
``scripted_fully_async_guard`` is the same with the second alarm at step 5: in the fully async trainer, steps are
parameter versions and the rollback at 3 republishes the restored weights as version 4, so the next trained
version is 5."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from verl_main_ppo_guards import LR_SCALE, NARROW, WIDE, ScriptedFault

from rlguard.guards import GuardConfig
from rlguard.guards.detectors import Detector
from rlguard.guards.registry import detector_registry
from rlguard.guards.schedules import Piecewise
from rlguard.hookspecs import hookimpl
from rlguard.plugins import plugin_manager

__all__ = [
    "FAULT_STEPS",
    "FULLY_ASYNC_FAULT_STEPS",
    "LR_SCALE",
    "NARROW",
    "SKIP_STEPS",
    "WIDE",
    "scripted_async_guard",
    "scripted_fully_async_guard",
]

SKIP_STEPS, FAULT_STEPS, FULLY_ASYNC_FAULT_STEPS = (2,), (3, 4), (3, 5)


@dataclass(kw_only=True)
class ScriptedSkip(ScriptedFault):
    """Critical at the steps in ``steps``: the skip intervention's detector."""

    name = "scripted_skip"


@dataclass(kw_only=True)
class ScriptedAsyncFault(ScriptedFault):
    """Critical at the steps in ``steps``: the rollback intervention's detector."""

    name = "scripted_async_fault"


@hookimpl
def rlguard_add_detectors() -> Sequence[type[Detector]]:
    return [ScriptedSkip, ScriptedAsyncFault]


def scripted_async_guard() -> GuardConfig:
    """The guard of the module docstring; registers its detectors in this process first."""
    return _scripted(FAULT_STEPS)


def scripted_fully_async_guard() -> GuardConfig:
    """The guard of the module docstring for the fully async trainer (alarms at versions 3 and 5)."""
    return _scripted(FULLY_ASYNC_FAULT_STEPS)


def _scripted(fault_steps: tuple[int, ...]) -> GuardConfig:
    module = sys.modules[__name__]
    manager = plugin_manager()
    if not manager.is_registered(module):
        manager.register(module)
        detector_registry.cache_clear()
    return GuardConfig(
        detectors={"scripted_skip": {"steps": SKIP_STEPS}, "scripted_async_fault": {"steps": fault_steps}},
        interventions={
            "skip_step": {"on": ("scripted_skip",)},
            "rollback": {"on": ("scripted_async_fault",), "max_rollbacks": 1},
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
