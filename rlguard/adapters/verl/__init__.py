"""verl adapter: every rlguard objective in verl's policy-loss registry as ``rlguard.<name>``.

Nothing to import or call: with rlguard installed, verl registers the losses on ``import verl``::

    python -m verl.trainer.main_ppo ... actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo

rlguard declares this module in verl's ``verl.plugins`` entry-point group, which verl imports in every process,
Ray workers included, unless ``VERL_USE_EXTERNAL_PLUGINS=none``; then
``actor_rollout_ref.model.external_lib=rlguard.adapters.verl`` or ``VERL_USE_EXTERNAL_MODULES=rlguard.adapters.verl``
do the same. Each ``rlguard.<name>`` has verl's calling convention and only translates
(:mod:`~rlguard.adapters.verl.mapping`); the math is :mod:`rlguard.core_losses`. With
``policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig`` it runs guarded
(:mod:`~rlguard.adapters.verl.guarded`); the guard on the driver is :mod:`~rlguard.adapters.verl.driver`.

How every verl setting maps, where rlguard and verl's own losses differ (and why), and the guard in verl:
``docs/guides/verl.md``. Importing this package checks the verl version and lets verl 0.9.1 build models with
TRL >= 1.0 installed (:mod:`~rlguard.adapters.verl.compat`, which holds every patch and version gate).

Modules (``docs/design.md``, "Adapters"): :mod:`~rlguard.adapters.verl.mapping` (pure translation),
:mod:`~rlguard.adapters.verl.loss` (the loss glue), :mod:`~rlguard.adapters.verl.guarded` (the workers' actuator),
:mod:`~rlguard.adapters.verl.driver` (the guard on the driver), :mod:`~rlguard.adapters.verl.settings` (what the
driver reads from verl's config), :mod:`~rlguard.adapters.verl.registration` and :mod:`~rlguard.adapters.verl.compat`.
"""

from __future__ import annotations

import logging
from typing import Any

from rlguard.adapters._optional import install_hint

try:
    from rlguard.adapters.verl import trainers
    from rlguard.adapters.verl.compat import check_verl_compatibility, patch_verl_trl_value_head_check
    from rlguard.adapters.verl.driver import GuardHalt, VerlGuardDriver
    from rlguard.adapters.verl.guarded import GuardedPolicyLossConfig, guarded_policy_loss, poisoned_sequences
    from rlguard.adapters.verl.loss import RLGuardPolicyLossConfig, VerlLossInputs, policy_loss
    from rlguard.adapters.verl.mapping import (
        LOSS_MODE_PREFIX,
        VERL_LOSS_AGG_MODES,
        Normalisers,
        loss_mode,
        normalisers,
        objective_hyperparameters,
    )
    from rlguard.adapters.verl.registration import register
    from rlguard.adapters.verl.trainers import guarded_trainer_class, register_v1_trainer
except ModuleNotFoundError as err:  # verl or a module it needs and does not declare: say how to install them
    hint = install_hint(err, "rlguard.adapters.verl", "verl", ("verl", "fastapi", "uvicorn"))
    if hint is None:
        raise
    raise hint from err

__all__ = [
    "LOSS_MODE_PREFIX",
    "VERL_LOSS_AGG_MODES",
    "GuardHalt",
    "GuardedPolicyLossConfig",
    "Normalisers",
    "RLGuardPolicyLossConfig",
    "VerlGuardDriver",
    "VerlLossInputs",
    "guarded_policy_loss",
    "guarded_trainer_class",
    "loss_mode",
    "normalisers",
    "objective_hyperparameters",
    "patch_verl_trl_value_head_check",
    "poisoned_sequences",
    "policy_loss",
    "register",
    "register_v1_trainer",
]

logger = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    """``GuardedRayPPOTrainer`` and ``GuardedPPOTrainerSync``, built on first use (:mod:`~.trainers`)."""
    return getattr(trainers, name)


def _on_import() -> None:
    # verl loads entry points with `except Exception: logger.debug(...)`, which would hide a failure here and
    # leave users with "Unsupported loss mode: rlguard.gspo"; say why at WARNING first.
    try:
        check_verl_compatibility()
        register()
        patch_verl_trl_value_head_check()
    except Exception:
        logger.warning("rlguard could not register its losses with verl", exc_info=True)
        raise


_on_import()
