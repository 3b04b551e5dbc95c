"""verl's calling convention around an rlguard objective: verl's arguments (:class:`VerlLossInputs`), ``policy_loss``
(no formula here) and the loss config.

See :mod:`rlguard.adapters.verl` for the translation and where rlguard and verl's own losses differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from verl.workers.config import PolicyLossConfig

from rlguard.adapters.verl.mapping import (
    ROLLOUT_KEYS,
    Normalisers,
    config_get,
    loss_mode,
    normalisers,
    objective_hyperparameters,
)
from rlguard.core_losses import Objective, PolicyBatch, get_objective, kl_estimate, masked_mean
from rlguard.core_losses.aggregation import AGGREGATIONS
from rlguard.core_losses.batch import NONFINITE_POLICIES
from rlguard.core_losses.registry import objective_class

__all__ = ["RLGuardPolicyLossConfig", "VerlLossInputs", "objective_loss", "policy_loss", "verl_objective"]


@dataclasses.dataclass
class RLGuardPolicyLossConfig(PolicyLossConfig):
    """``actor_rollout_ref.actor.policy_loss`` for the ``rlguard.*`` loss modes, with rlguard's own settings.

    Select it with ``actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.RLGuardPolicyLossConfig``
    (verl's ``PolicyLossConfig`` rejects unknown keys) and set the new keys with hydra's ``+`` prefix. verl's own
    keys (``clip_ratio_*``, ``loss_agg_mode``, ``tau_pos``/``tau_neg``, ...) keep their meaning.

    Attributes:
        aggregation: rlguard's aggregation, overriding ``loss_agg_mode`` for the policy term only (verl's entropy
            and KL terms keep ``loss_agg_mode``). None: ``loss_agg_mode``, except for sapo and gmpo, which keep
            their paper's ``seq-mean-token-mean`` as verl's ``sapo`` and ``geo_mean`` do.
        off_policy_mask_delta: DeepSeek-V3.2's off-policy sequence masking (arXiv 2512.02556, eq. 9): drop the
            sequences with negative advantage whose mean ``log pi_old - log pi`` exceeds ``delta``. None: off.
        on_nonfinite: ``"raise"`` stops on NaN/Inf in unmasked log-probs or advantages; ``"mask"`` drops those
            tokens and reports them in ``rlguard/nonfinite``.
        objective_kwargs: any other constructor argument of the objective (``{"bounds": "absolute"}`` for CISPO,
            ``{"clip_c": 3.0}`` for GSPO, ...); overrides the values mapped from verl's keys.
    """

    aggregation: str | None = None
    off_policy_mask_delta: float | None = None
    on_nonfinite: str = "raise"
    objective_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.aggregation is not None and self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"policy_loss.aggregation must be null or one of {list(AGGREGATIONS)}; got {self.aggregation!r}."
            )
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(
                f"policy_loss.on_nonfinite must be one of {list(NONFINITE_POLICIES)}; got {self.on_nonfinite!r}."
            )
        rollout = sorted(set(self.objective_kwargs) & set(ROLLOUT_KEYS))
        if rollout:
            raise ValueError(
                f"policy_loss.objective_kwargs sets {rollout}: verl does not pass the rollout engine's log-probs to "
                "a policy loss. Use verl's algorithm.rollout_correction (rollout_is, rollout_rs); its weights and "
                "rejection mask reach rlguard's loss as rollout_is_weights and response_mask."
            )


@dataclasses.dataclass(frozen=True)
class VerlLossInputs:
    """The arguments verl gives a policy loss, by its names (``core_algos.PolicyLossFn``; tensors ``(B, T)``): the
    one place where verl's signature meets rlguard's. The registered ``rlguard.<name>`` builds it
    (:mod:`~rlguard.adapters.verl.registration`); :meth:`objective` and :meth:`policy_batch` translate it.

    Attributes:
        old_log_prob: pi_old's log-probs of the sampled tokens.
        log_prob: the policy's log-probs; gradients flow here.
        advantages: per token (verl broadcasts sequence advantages over the response).
        response_mask: 1 for the response tokens that count (verl's rollout rejection already applied).
        loss_agg_mode: verl's aggregation of the step (``actor.loss_agg_mode``).
        config: verl's actor config (``policy_loss``, ``global_batch_info``, the clip ratios, ...).
        rollout_is_weights: verl's ``algorithm.rollout_correction`` weights, or None.
    """

    old_log_prob: Tensor
    log_prob: Tensor
    advantages: Tensor
    response_mask: Tensor
    loss_agg_mode: str = "token-mean"
    config: Any = None
    rollout_is_weights: Tensor | None = None

    def objective(self, name: str) -> tuple[Objective, Normalisers]:
        """Objective ``name`` as the config sets it, and this micro-batch's normalisers (:func:`verl_objective`)."""
        return verl_objective(name, self.config, self.loss_agg_mode)

    def policy_batch(self, mask: Tensor | None = None) -> PolicyBatch:
        """The inputs as a :class:`PolicyBatch` over ``mask`` (default ``response_mask``), verl's
        ``rollout_is_weights`` on each token's policy term (``token_weights``)."""
        mask = self.response_mask if mask is None else mask
        weights = self.rollout_is_weights
        if weights is not None:
            # padding may hold anything; 1 keeps a NaN there from reaching the loss through 0 * NaN
            weights = torch.where(mask.bool(), weights.detach(), torch.ones_like(weights))
        return PolicyBatch(
            logprobs=self.log_prob,
            advantages=self.advantages,
            mask=mask,
            old_logprobs=self.old_log_prob,
            token_weights=weights,
        )


def policy_loss(name: str, inputs: VerlLossInputs) -> tuple[Tensor, dict[str, float]]:
    """rlguard objective ``name`` on verl's ``inputs``.

    Returns:
        ``(loss, metrics)``: the 0-dim loss of this micro-batch (its share of the mini-batch loss under
        ``config.global_batch_info``) and verl-named plus ``rlguard/``-prefixed canonical metrics, as floats.
    """
    objective, norm = inputs.objective(name)
    return objective_loss(objective, norm, inputs)


def verl_objective(name: str, config: Any, loss_agg_mode: str) -> tuple[Objective, Normalisers]:
    """Objective ``name`` as verl's actor ``config`` sets it, and this micro-batch's normalisers
    (``config.global_batch_info``)."""
    if config is None:
        raise ValueError(f"policy loss {loss_mode(name)!r} needs verl's actor config; got config=None.")
    hyperparameters = objective_hyperparameters(name, config, loss_agg_mode)
    aggregation = hyperparameters.get("aggregation", objective_class(name).hyperparameters()["aggregation"])
    norm = normalisers(config_get(config, "global_batch_info") or {}, loss_agg_mode, aggregation)
    if norm.max_length is not None and "max_length" not in hyperparameters:
        hyperparameters["max_length"] = norm.max_length
    return get_objective(name, **hyperparameters), norm


def objective_loss(
    objective: Objective, norm: Normalisers, inputs: VerlLossInputs, mask: Tensor | None = None
) -> tuple[Tensor, dict[str, float]]:
    """``objective`` on verl's ``inputs`` over ``mask`` (default their ``response_mask``), normalised by ``norm``;
    returns ``(loss, metrics)`` as :func:`policy_loss`."""
    batch = inputs.policy_batch(mask)
    out = objective(batch, num_tokens=norm.num_tokens, num_sequences=norm.num_sequences)
    return out.loss, _verl_metrics(out.metrics, inputs.old_log_prob, inputs.log_prob, batch.mask)


def _verl_metrics(
    metrics: Mapping[str, Tensor], old_log_prob: Tensor, log_prob: Tensor, response_mask: Tensor
) -> dict[str, float]:
    """verl's keys and the canonical ones under ``rlguard/``, read from the device in one transfer."""
    with torch.no_grad():
        zero = torch.zeros((), dtype=torch.float64, device=log_prob.device)
        # verl's ppo_kl: the k1 estimate of KL(pi_old || pi) from pi_old's samples, mean of log pi_old - log pi
        k1 = kl_estimate(old_log_prob.detach(), log_prob.detach(), "k1")
        named: dict[str, Tensor] = {
            "actor/pg_clipfrac": metrics.get("clip_frac", zero),
            "actor/pg_clipfrac_lower": metrics.get("clip_frac_low", zero),
            "actor/ppo_kl": masked_mean(k1, response_mask.to(k1.dtype)),
        }
        # "loss" is the micro-batch's share of the mini-batch loss; verl reports it as actor/pg_loss
        named.update({f"rlguard/{key}": value for key, value in metrics.items() if key != "loss"})
        values = torch.stack([value.detach().to(device=zero.device, dtype=torch.float64) for value in named.values()])
        return dict(zip(named, values.tolist(), strict=True))
