"""Every version gate and every patch of verl internals, in one place (``docs/design.md``, "Adapters").

rlguard's verl adapter relies on these parts of verl 0.9.1 that are not a declared extension point; each is
checked at start-up (:func:`check_verl_compatibility` on import of :mod:`rlguard.adapters.verl`,
:func:`check_verl_trainer` when a :class:`~rlguard.adapters.verl.driver.VerlGuardDriver` starts), so that a change
upstream fails with a clear message before training, not at the first rollback:

- ``verl.models.transformers.monkey_patch.is_trl_available`` rebound (:func:`patch_verl_trl_value_head_check`);
- ``verl.utils.tracking.Tracking`` replaced while a legacy ``RayPPOTrainer.fit`` runs (:func:`guarded_tracking`);
- the driver calls the trainer's private ``_save_checkpoint``, ``_load_checkpoint`` (overridden) and
  ``_shutdown_dump_executor`` and uses ``checkpoint_manager.sleep_replicas``/``update_weights`` and the actor
  worker group's ``set_loss_fn``/``load_checkpoint``.

verl's public extension points rlguard uses, needing no gate: ``core_algos.register_policy_loss`` and the
``verl.plugins`` entry-point group.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

__all__ = [
    "SUPPORTED_VERL",
    "check_verl_compatibility",
    "check_verl_trainer",
    "guarded_tracking",
    "patch_verl_trl_value_head_check",
]

SUPPORTED_VERL = ">=0.9.1,<0.10"
#: what the driver calls on a verl trainer (``RayPPOTrainer`` or a V1 trainer) beyond its public ``fit``
_TRAINER_PRIVATE = ("_save_checkpoint", "_load_checkpoint")


def check_verl_compatibility() -> None:
    """Raise ``RuntimeError`` if the installed verl is outside :data:`SUPPORTED_VERL`."""
    version = metadata.version("verl")
    parts = version.split(".")
    try:
        ok = (int(parts[0]), int(parts[1])) == (0, 9) and int(parts[2].split("+")[0].split("rc")[0] or 0) >= 1
    except (ValueError, IndexError):
        ok = False
    if not ok:
        raise RuntimeError(
            f"rlguard's verl adapter supports verl{SUPPORTED_VERL}; the installed verl is {version}. Install a "
            "supported verl (pip install 'rlguard[verl]')."
        )


def check_verl_trainer(trainer: Any) -> None:
    """Raise ``RuntimeError`` if ``trainer`` lacks a private method the guard's driver calls."""
    missing = [name for name in _TRAINER_PRIVATE if not callable(getattr(trainer, name, None))]
    if missing:
        raise RuntimeError(
            f"the verl guard's driver needs {', '.join(missing)} on {type(trainer).__name__} (verl{SUPPORTED_VERL}'s "
            "RayPPOTrainer and V1 trainers have them). Install a supported verl."
        )


@contextmanager
def guarded_tracking(log_hook: Callable[[Callable[..., None], dict[str, Any], int, Any], None]) -> Iterator[None]:
    """Within the block, ``verl.utils.tracking.Tracking`` (what ``RayPPOTrainer.fit`` instantiates) is a subclass
    whose ``log(data, step, backend)`` calls ``log_hook(verl_log, data, step, backend)`` instead."""
    import verl.utils.tracking as tracking

    base: type = tracking.Tracking

    class GuardedTracking(base):  # type: ignore[valid-type, misc]  # verl's class, untyped
        def log(self, data: dict[str, Any], step: int, backend: Any = None) -> None:
            log_hook(super().log, data, step, backend)

    setattr(tracking, "Tracking", GuardedTracking)  # noqa: B010  # rebinding verl's name is the point
    try:
        yield
    finally:
        setattr(tracking, "Tracking", base)  # noqa: B010


_VALUE_HEAD_MODULES = ("trl.experimental.ppo", "trl")


def _trl_value_head_available() -> bool:
    """True when TRL is installed and still has ``AutoModelForCausalLMWithValueHead`` where verl imports it."""
    from verl.utils.import_utils import is_trl_available

    if not is_trl_available():
        return False
    for module in _VALUE_HEAD_MODULES:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
            try:
                if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                    return True
            except ImportError:
                continue
    return False


def patch_verl_trl_value_head_check() -> None:
    """Let verl 0.9.1's ``apply_monkey_patch`` run with TRL >= 1.0 installed.

    ``apply_monkey_patch`` (verl/models/transformers/monkey_patch.py), called for every model verl's FSDP engine
    builds, imports ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo`` or ``trl`` whenever TRL
    is installed, only to replace that class's ``state_dict``; TRL 1.x removed the class, so the import raises and
    the engine fails. This rebinds the ``is_trl_available`` name in that one module to "TRL is installed and has
    the class": the patch still runs wherever the class exists, and is skipped where no model of that class can
    exist. Nothing else in verl or TRL changes. Idempotent.
    """
    from verl.models.transformers import monkey_patch

    # verl's module imports the name without re-exporting it, and types it as functools.cache's wrapper
    monkey_patch.is_trl_available = _trl_value_head_available  # type: ignore[attr-defined, assignment]
