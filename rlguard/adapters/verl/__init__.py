"""verl adapter: every rlguard objective in verl's policy-loss registry as ``rlguard.<name>``.

Nothing to import or call: with rlguard installed, verl registers the losses on ``import verl``::

    python -m verl.trainer.main_ppo ... actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo

rlguard declares this module in verl's ``verl.plugins`` entry-point group, which verl imports in every process,
Ray workers included, unless ``VERL_USE_EXTERNAL_PLUGINS=none``. Where entry points are off,
``actor_rollout_ref.model.external_lib=rlguard.adapters.verl`` or ``VERL_USE_EXTERNAL_MODULES=rlguard.adapters.verl``
do the same.

Each ``rlguard.<name>`` has verl's calling convention (keyword arguments ``old_log_prob, log_prob, advantages,
response_mask, loss_agg_mode, config, rollout_is_weights``; returns ``(loss, metrics)``) and only translates; the
math is :mod:`rlguard.core_losses`. :func:`~rlguard.adapters.verl.mapping.objective_hyperparameters` and
:func:`~rlguard.adapters.verl.mapping.normalisers` are the translation:

====================================  ===========================================================================
verl (``actor_rollout_ref.actor.*``)  rlguard
====================================  ===========================================================================
``clip_ratio_low``, ``_high``         ``clip_low``, ``clip_high`` (``clip_ratio`` where null). GMPO: log space;
                                      CISPO: ``bounds="relative"``, the weight clamped to ``[1 - low, 1 + high]``
``clip_ratio_c``                      ``clip_c`` (dual clip) of grpo, dapo, dr_grpo, as verl's ``vanilla``; not of
                                      gspo and gspo_token, as verl's ``gspo``
``tau_pos``, ``tau_neg``              SAPO's ``tau_pos``, ``tau_neg``
``clip_ratio_c`` (DPPO)               ``is_cap`` of dppo_tv, dppo_kl (their truncated IS weight; ``clip_ratio_*``
                                      are their thresholds ``delta`` as in verl)
``policy_loss.clip_cov_ratio``,       Clip-Cov's ``clip_cov_ratio``, ``clip_cov_lb``, ``clip_cov_ub``; the draw
``_lb``, ``_ub``                      uses torch's default generator, as verl's ``clip_cov``
``policy_loss.kl_cov_ratio``,         KL-Cov's ``kl_cov_ratio``, ``kl_cov_coef``
``ppo_kl_coef``
``policy_loss.dro_beta``              DRO's ``tau`` (required, as in verl)
``loss_agg_mode``                     ``aggregation``; ``token-sum`` is ``token-mean`` with ``num_tokens = 1/dp``.
                                      sapo and gmpo keep ``seq-mean-token-mean``: verl's ``sapo`` and ``geo_mean``
                                      ignore ``loss_agg_mode``
``global_batch_info``                 ``num_tokens = batch_num_tokens / dp_size``, ``num_sequences =
                                      global_batch_size / dp_size``, ``max_length = loss_scale_factor``: the
                                      micro-batch losses of all ranks add up to the mini-batch's, as in ``agg_loss``
``rollout_is_weights``                multiply each token's policy term before aggregation, as verl's losses do
``policy_loss.*`` of                  ``aggregation``, ``off_policy_mask_delta``, ``on_nonfinite``, and
:class:`RLGuardPolicyLossConfig`      ``objective_kwargs`` (override every mapped value)
====================================  ===========================================================================

With ``policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig`` the same ``rlguard.<name>``
runs guarded (poisoned sequences masked, micro-batch skipping, the guard's controls):
:mod:`rlguard.adapters.verl.guarded`; the guard on the driver is :mod:`rlguard.adapters.verl.driver`.

Where rlguard and verl's own losses differ (float64 parity otherwise, tests/test_adapters_verl.py):

- verl's ``gspo`` is GSPO-token (``sg[s_i] pi_t / sg[pi_t]``). With one advantage and IS weight per sequence
  (GRPO's advantages, ``rollout_is="sequence"``) it equals ``rlguard.gspo``; with per-token ones use
  ``rlguard.gspo_token``.
- verl's ``geo_mean`` averages over the micro-batch's rows and ignores ``global_batch_info``, so its loss
  depends on the micro-batch split; ``rlguard.gmpo`` normalises by ``global_batch_size`` and does not. Token-level
  IS weights enter ``rlguard.gmpo`` through their mean over the sequence, ``geo_mean`` through their geometric
  mean.
- Metrics: ``actor/pg_clipfrac`` is rlguard's ``clip_frac`` (dual-clipped tokens included, which ``vanilla``
  leaves out), ``actor/pg_clipfrac_lower`` is ``clip_frac_low`` (``vanilla`` reports the dual-clip fraction
  there), ``actor/ppo_kl`` is verl's k1 estimate (mean ``log pi_old - log pi``). Every canonical metric of the
  objective follows under ``rlguard/`` (``rlguard/clip_frac_high``, ``rlguard/seq_ratio_max``,
  ``rlguard/kl_old``, ...); verl averages each over micro-batches, so ``rlguard/ratio_max`` is the mean of the
  micro-batch maxima. For ``clip_cov`` rlguard's ``clip_frac`` counts PPO-clipped and Clip-Cov-dropped tokens
  (verl's ``clip_cov`` reports the dropped ones only); for ``dppo_*`` it counts the masked tokens with ``A != 0``
  (verl's counts zero-advantage tokens outside the region too); ``kl_cov``'s ``actor/ppo_kl`` is the k1 estimate
  above (verl's ``kl_cov`` reports the mean ``|log r|`` under that key).

verl adds its KL loss (``use_kl_loss``) and entropy bonus (``entropy_coeff``) around the policy loss, as for its
own losses. Mismatch correction is verl's ``algorithm.rollout_correction`` (TIS, MIS, IcePop), computed on the
driver: the loss receives its ``rollout_is_weights`` and rejection-masked ``response_mask``, never the rollout
engine's log-probs, so rlguard's ``rollout_is``/``rollout_mask`` cannot run inside verl.

Importing this package checks the verl version and lets verl 0.9.1 build models with TRL >= 1.0 installed
(:mod:`rlguard.adapters.verl.compat`, which holds every patch and version gate).

Modules (``docs/design.md``, "Adapters"): :mod:`~rlguard.adapters.verl.mapping` (pure translation),
:mod:`~rlguard.adapters.verl.loss` (the loss glue), :mod:`~rlguard.adapters.verl.guarded` (the workers' actuator),
:mod:`~rlguard.adapters.verl.driver` (the guard on the driver), :mod:`~rlguard.adapters.verl.registration` and
:mod:`~rlguard.adapters.verl.compat`.
"""

from __future__ import annotations

import logging
from typing import Any

from rlguard.adapters.verl import trainers
from rlguard.adapters.verl.compat import check_verl_compatibility, patch_verl_trl_value_head_check
from rlguard.adapters.verl.driver import GuardHalt, VerlGuardDriver
from rlguard.adapters.verl.guarded import GuardedPolicyLossConfig, guarded_policy_loss, poisoned_sequences
from rlguard.adapters.verl.loss import RLGuardPolicyLossConfig, policy_loss
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

__all__ = [
    "LOSS_MODE_PREFIX",
    "VERL_LOSS_AGG_MODES",
    "GuardHalt",
    "GuardedPolicyLossConfig",
    "Normalisers",
    "RLGuardPolicyLossConfig",
    "VerlGuardDriver",
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
