"""What the guard on verl's driver reads from verl's config: the guard (``+trainer.rlguard_guard``,
:func:`resolve_guard_setting`) and the policy loss it acts through (:func:`check_trainer_config`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from rlguard.adapters.verl.guarded import GuardedPolicyLossConfig
from rlguard.guards import Guard, GuardConfig
from rlguard.guards.config import PRESETS, check_preset

__all__ = ["GUARDED_TARGET", "check_trainer_config", "resolve_guard_setting"]

#: ``policy_loss._target_`` of the guarded loss config; the defining module's path is accepted too
GUARDED_TARGET = "rlguard.adapters.verl.GuardedPolicyLossConfig"
_GUARDED_TARGETS = (GUARDED_TARGET, f"{GuardedPolicyLossConfig.__module__}.{GuardedPolicyLossConfig.__name__}")


def resolve_guard_setting(spec: str | GuardConfig | Guard | Mapping[str, Any]) -> str | GuardConfig | Guard:
    """``trainer.rlguard_guard`` as the driver's ``guard``: a preset name, a mapping of ``GuardConfig`` fields with
    an optional ``preset`` they change (``+trainer.rlguard_guard='{preset: strict, alerts: {webhook_env: X}}'``),
    or ``"module:factory"`` naming a callable (importable in verl's task-runner process) that returns a
    ``GuardConfig`` or a ``Guard``. A mapping is type-checked strictly (:meth:`GuardConfig.from_mapping`).

    Security: ``module:factory`` imports that module and calls that function, like Hydra's ``_target_``: whoever
    writes the config runs code in the training job. Take it only from configs you trust (your own files and
    command lines), never from a config a third party can edit.
    """
    if isinstance(spec, Mapping):
        fields = OmegaConf.to_container(OmegaConf.create(dict(spec)), resolve=True)
        return GuardConfig.from_mapping(fields, where="trainer.rlguard_guard")  # type: ignore[arg-type]
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
    return guard


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
