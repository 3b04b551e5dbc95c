"""What the guard on verl's driver reads from verl's config: the guard (``+trainer.rlguard_guard``,
:func:`resolve_guard_setting`, checked when the command line is parsed by :func:`check_guard_setting`) and the
policy loss it acts through (:func:`check_trainer_config`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from rlguard.adapters.verl.guarded import GuardedPolicyLossConfig
from rlguard.guards import Guard, GuardConfig
from rlguard.guards.config import PRESETS, check_preset
from rlguard.guards.registry import check_members

__all__ = ["GUARDED_TARGET", "check_guard_setting", "check_trainer_config", "resolve_guard_setting"]

#: the config key of the guard, as errors name it
_WHERE = "trainer.rlguard_guard"

#: ``policy_loss._target_`` of the guarded loss config; the defining module's path is accepted too
GUARDED_TARGET = "rlguard.adapters.verl.GuardedPolicyLossConfig"
_GUARDED_TARGETS = (GUARDED_TARGET, f"{GuardedPolicyLossConfig.__module__}.{GuardedPolicyLossConfig.__name__}")


def resolve_guard_setting(spec: str | GuardConfig | Guard | Mapping[str, Any]) -> str | GuardConfig | Guard:
    """``trainer.rlguard_guard`` as the driver's ``guard``: a preset name, a mapping of ``GuardConfig`` fields with
    an optional ``preset`` they change (``+trainer.rlguard_guard='{preset: strict, alerts: {webhook_env: X}}'``),
    or ``"module:factory"`` naming a callable (importable in verl's task-runner process) that returns a
    ``GuardConfig`` or a ``Guard``. A mapping is type-checked strictly (:meth:`GuardConfig.from_mapping`), and the
    detectors' and interventions' settings of a ``GuardConfig`` are range-checked
    (:func:`~rlguard.guards.registry.check_members`: a NaN, negative or out-of-range threshold is refused, naming
    ``trainer.rlguard_guard.<kind>s[name].<field>``).

    Security: ``module:factory`` imports that module and calls that function, like Hydra's ``_target_``: whoever
    writes the config runs code in the training job. Take it only from configs you trust (your own files and
    command lines), never from a config a third party can edit.
    """
    if isinstance(spec, Mapping):
        fields = OmegaConf.to_container(OmegaConf.create(dict(spec)), resolve=True)
        config = GuardConfig.from_mapping(fields, where=_WHERE)  # type: ignore[arg-type]
        check_members(config, where=_WHERE)
        return config
    if not isinstance(spec, str):
        return spec
    if ":" not in spec:
        return check_preset(spec)
    module_name, _, attribute = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"trainer.rlguard_guard={spec!r} names no importable callable ({err}); give a preset "
            f"({', '.join(map(repr, PRESETS))}) or 'module:factory' with the module on PYTHONPATH."
        ) from err
    guard = factory()
    if not isinstance(guard, (GuardConfig, Guard)):
        raise ValueError(f"trainer.rlguard_guard={spec!r} returned {guard!r}; expected a GuardConfig or a Guard.")
    if isinstance(guard, GuardConfig):
        check_members(guard, where=_WHERE)
    return guard


def check_guard_setting(config: Any) -> None:
    """Refuse a bad ``trainer.rlguard_guard`` of verl's ``config`` (:func:`resolve_guard_setting`) when the command
    line is parsed, before Ray starts and the workers load the model. A ``module:factory`` is imported and called
    where the trainer is built (the task-runner process, where its module must be importable), and checked there."""
    spec = config.trainer.get("rlguard_guard", None) or "default"
    if isinstance(spec, str) and ":" in spec:
        return
    resolve_guard_setting(spec)


def check_trainer_config(config: Any) -> None:
    """Refuse a verl config the driver cannot act on: a policy loss that is not a guarded ``rlguard.<name>``
    (``loss_mode``, ``_target_``: the driver acts through it), or distillation."""
    policy = config.actor_rollout_ref.actor.policy_loss
    mode, target = policy.get("loss_mode", ""), policy.get("_target_", "")
    if not str(mode).startswith("rlguard.") or target not in _GUARDED_TARGETS:
        raise ValueError(
            "the verl guard acts through rlguard's losses: set actor_rollout_ref.actor.policy_loss.loss_mode="
            f"rlguard.<objective> and policy_loss._target_={GUARDED_TARGET}; got loss_mode={mode!r}, "
            f"_target_={target!r}."
        )
    distillation = config.get("distillation")
    if distillation is not None and distillation.get("enabled", False):
        raise ValueError("the verl guard does not support distillation (distillation_ppo_loss); set enabled=false.")
