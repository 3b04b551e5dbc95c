"""TRL adapter: every rlguard objective inside ``trl.GRPOTrainer``; TRL's own settings keep their meaning.

>>> from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
>>> args = GuardedGRPOConfig(output_dir="out", objective="gspo", guard="default")  # doctest: +SKIP
>>> GuardedGRPOTrainer(model, reward_funcs, args=args, train_dataset=dataset).train()  # doctest: +SKIP

``GuardedGRPOTrainer`` overrides one private TRL method, ``GRPOTrainer._compute_loss``. It obtains the per-token
log-probs and entropies exactly as TRL does, puts them with TRL's advantages, old, reference and vLLM log-probs
and loss mask into a :class:`~rlguard.core_losses.PolicyBatch`, and calls the objective with the normalisers of
TRL's ``loss_type``. No loss formula lives in this module; :func:`~rlguard.adapters.trl.mapping.map_trl_config`
is the whole translation (see :mod:`rlguard.adapters.trl.mapping` for every setting and the normalisers).


With ``GuardedGRPOConfig(guard="default")`` (or another preset of :data:`~rlguard.guards.PRESETS`, a ``GuardConfig``) a
:class:`~rlguard.adapters.trl.callback.StabilityCallback` acts on the guard's decisions every optimizer step (skip,
LR scale, clip range, rollback, halt; see :mod:`rlguard.adapters.trl.callback`), and the objective drops and counts
non-finite log-probs (``on_nonfinite="mask"``) so that a poisoned batch reaches the guard instead of crashing.

``use_adaptive_entropy=True`` (TRL's Skywork-OR1 controller of ``entropy_coef``) runs as the guard's
``adaptive_entropy`` intervention (:class:`~rlguard.guards.interventions.entropy_coef.AdaptiveEntropy`, fields from
TRL's settings: :func:`~rlguard.adapters.trl.mapping.adaptive_entropy_settings`), added to the configured guard, or,
with none, to a guard that runs only it (no detector, no snapshot); TRL's copy in its ``_compute_loss`` does not run.

``GuardedGRPOConfig(logprobs_from_hidden=True)`` computes the policy's log-probs and entropies with
:func:`rlguard.core_losses.logprobs_from_hidden` instead of TRL's fused LM head (:mod:`rlguard.adapters.trl.logprobs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

try:
    from accelerate.utils import is_peft_model  # type: ignore[import-untyped]  # accelerate ships no py.typed
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"rlguard.adapters.trl needs TRL: pip install 'rlguard[trl]' ({err}).") from err

from rlguard._deprecated import renamed
from rlguard.adapters.trl.compat import FORWARD_KEYS, check_logged_metrics, check_trl_compatibility, logged_metrics
from rlguard.adapters.trl.config import GuardedGRPOConfig, parse_guard_flag
from rlguard.adapters.trl.logprobs import (
    FUSED_REQUEST,
    FusedRequest,
    check_hidden_logprobs_supported,
    use_hidden_logprobs,
)
from rlguard.adapters.trl.mapping import adaptive_entropy_settings, map_trl_config
from rlguard.adapters.trl.objective_glue import ObjectiveGlue
from rlguard.core_losses import Controls, Objective, PolicyBatch, RolloutBatch, aggregate
from rlguard.guards import Guard, StepStats
from rlguard.guards.interventions.entropy_coef import AdaptiveEntropy

__all__ = ["GuardedGRPOConfig", "GuardedGRPOTrainer", "parse_guard_flag"]


class GuardedGRPOTrainer(ObjectiveGlue, GRPOTrainer):  # type: ignore[misc]
    """``trl.GRPOTrainer`` whose policy loss is an rlguard objective; everything else is TRL's.

    Takes the arguments of ``GRPOTrainer``; ``args`` may be a :class:`GuardedGRPOConfig` or a plain ``GRPOConfig``
    (then the objective follows ``loss_type``). The objective's canonical metrics are logged as ``rlguard/<name>``
    next to TRL's own keys, which keep TRL's meaning: ``entropy``, ``kl``, ``clip_ratio/*`` (``low_mean``,
    ``high_mean``, ``region_mean``, ``low_min``, ``high_max``) and ``cispo_clip_ratio`` are computed as TRL computes
    them (:func:`trl_metric_parts`: e.g. per sequence for GSPO, where rlguard's ``rlguard/clip_frac`` counts
    tokens).

    Every ``StabilityCallback`` among the callbacks is attached to the trainer; ``args.guard`` gives one a guard
    (adding a callback if there is none), which then also sees the objective's metrics of every micro-batch.

    Where TRL's entropy bonus is on (``entropy_coef != 0`` or ``use_adaptive_entropy``), the guard's
    ``entropy_coef`` control is the bonus's coefficient (TRL's token mean of the entropy, whatever the
    ``loss_type``), as verl's driver sends it to verl's ``entropy_coeff``; otherwise it is the objective's own.
    With ``use_adaptive_entropy`` the guard's ``adaptive_entropy`` sets it (module docstring).

    Attributes:
        rlguard_mapping: how the config was translated (:class:`TRLLossMapping`; ``GuardedGRPOConfig``'s own).
        rlguard_configured_objective: the objective as configured.
        rlguard_objective: the objective computing the loss: the configured one with the guard's controls.
        rlguard_guard: the guard acting on this trainer's steps, or None.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trl_compatibility()
        super().__init__(*args, **kwargs)
        check_logged_metrics(self)
        config = cast(GRPOConfig, self.args)
        # a GuardedGRPOConfig mapped itself when it was built; a plain GRPOConfig is mapped here, once
        mapping = config.rlguard_mapping if isinstance(config, GuardedGRPOConfig) else map_trl_config(config)
        settings = adaptive_entropy_settings(config)
        adaptive = None if settings is None else AdaptiveEntropy(**settings)
        # TRL's controller lives in its _compute_loss, which this class replaces, and in its checkpoint file
        # (entropy_ctrl_state.json, which would hold the initial coefficient): the guard's runs and is checkpointed
        self.use_adaptive_entropy = False
        self._rlguard_adaptive_entropy = adaptive
        #: the coefficient of TRL's entropy bonus in the next loss (the guard's entropy_coef where it sets one)
        self._rlguard_entropy_coef = self.entropy_coef if adaptive is None else adaptive.applied_coef
        guard, user_guard = self._attach_stability_callbacks(getattr(config, "guard", None), adaptive)
        if guard is not None and "beta" in guard.config.schedules and config.beta == 0.0:
            raise ValueError(
                "the guard schedules beta, but GuardedGRPOConfig(beta=0.0) makes TRL load no reference model: set "
                "beta > 0 (the schedule then replaces it) or drop the beta schedule."
            )
        objective = mapping.build()
        if user_guard and "on_nonfinite" not in mapping.kwargs:
            # NaN/Inf log-probs are dropped and counted, so that the guard sees them and skips the step
            objective = dataclasses.replace(objective, on_nonfinite="mask")
        self.rlguard_mapping = mapping
        self.rlguard_guard: Guard | None = guard
        self.rlguard_configured_objective: Objective = objective
        self.rlguard_objective: Objective = objective
        self._rlguard_step_stats = StepStats()
        self._rlguard_fused_model: Any = None
        fused = bool(getattr(config, "fused_objective", False))
        if fused and self._entropy_bonus_enabled:
            raise ValueError(
                f"fused_objective=True cannot add TRL's entropy bonus (entropy_coef={self.entropy_coef}, "
                f"use_adaptive_entropy={config.use_adaptive_entropy}): it needs gradients through the entropies "
                "outside the objective. Use objective_kwargs={'entropy_coef': ...} (the objective's own bonus, "
                "aggregated like its loss) or fused_objective=False."
            )
        if fused and self.top_entropy_quantile < 1.0:
            raise ValueError(
                f"fused_objective=True cannot apply top_entropy_quantile={self.top_entropy_quantile}: TRL's "
                "high-entropy mask needs every token's entropy before the objective, which the fused pass computes "
                "inside it. Use top_entropy_quantile=1.0 or fused_objective=False."
            )
        if fused or getattr(config, "logprobs_from_hidden", False):
            policy = self._use_hidden_logprobs()
            self._rlguard_fused_model = policy if fused else None

    def _use_hidden_logprobs(self) -> Any:
        """Route TRL's fused LM head of the policy through rlguard's (the model TRL patched, which it returns)."""
        model: Any = self.model
        model = model.get_base_model() if is_peft_model(model) else model
        check_hidden_logprobs_supported(model, zero3=is_deepspeed_zero3_enabled(), fsdp=bool(self.is_fsdp_enabled))
        use_hidden_logprobs(model, self.temperature)
        return model

    def rlguard_set_controls(self, controls: Controls) -> None:
        """The guard's controls for the objective from the next loss on: clip range, ``beta``, ``entropy_coef``
        (:meth:`~rlguard.core_losses.Objective.with_controls` of the configured objective; ``entropy_coef`` is TRL's
        bonus's where that is on, see the class)."""
        if self._entropy_bonus_enabled:
            self._rlguard_entropy_coef = self.entropy_coef if controls.entropy_coef is None else controls.entropy_coef
            controls = dataclasses.replace(controls, entropy_coef=None)
        self.rlguard_objective = self.rlguard_configured_objective.with_controls(controls)
        if self._rlguard_adaptive_entropy is not None:
            # TRL logs its controller's coefficient after each optimizer step's update, before the gate
            logged_metrics(self, "train")["entropy_coef"].append(self._rlguard_adaptive_entropy.coef)

    def _compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # (B, T)
        training = self._training()
        accumulation = self.current_gradient_accumulation_steps if training else 1
        request = self._fused_request(inputs, mask, accumulation)
        try:
            logprobs, entropies, aux_loss = self._get_per_token_logps_and_entropies(
                model,
                torch.cat([prompt_ids, completion_ids], dim=1),
                torch.cat([prompt_mask, completion_mask], dim=1),
                completion_ids.size(1),
                compute_entropy=True,
                compute_aux_loss=self.aux_loss_enabled,
                **{key: inputs.get(key) for key in FORWARD_KEYS},
            )  # (B, T), (B, T), () or None
        finally:
            if request is not None:
                setattr(self._rlguard_fused_model, FUSED_REQUEST, None)
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            # TRL's own mask (its quantile is over the entropies of all processes); it weights the policy term only
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)  # (B, T) bool
        batch = self._policy_batch(inputs, logprobs, entropies, mask, entropy_mask)
        if request is None:
            out = self.rlguard_objective(batch, **self._normalisers(inputs, logprobs, mask, accumulation))
        else:  # the policy's forward computed it (rlguard.adapters.trl.logprobs); refused with top_entropy_quantile
            assert request.output is not None, "the policy's fused forward did not run"
            out = request.output
        loss = out.loss
        mode = "train" if training else "eval"
        metrics = logged_metrics(self, mode)
        if self._entropy_bonus_enabled:
            # TRL's bonus: coef * (token mean of the entropy over this micro-batch) / GA, whatever the loss_type
            fmask = (mask if entropy_mask is None else mask * entropy_mask).to(entropies.dtype)
            mean_entropy = aggregate(entropies, fmask, "token-mean", num_tokens=fmask.sum().clamp(min=1) * accumulation)
            loss = loss - self._rlguard_entropy_coef * mean_entropy
            # TRL logs the loss before its division by GA where it divides by GA (grpo, bnpo, dr_grpo), else as is
            scale = 1 if self.rlguard_mapping.normaliser == "global_tokens" else accumulation
            policy_loss = self.accelerator.gather(out.loss.detach() * scale).nanmean().item()
            metrics["policy_loss"].append(policy_loss)
            if training and self.accelerator.sync_gradients and self._rlguard_adaptive_entropy is None:
                metrics["entropy_coef"].append(self._rlguard_entropy_coef)  # adaptive: rlguard_set_controls logs it
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            metrics["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._log_rlguard_metrics(mode, out, batch, accumulation, guard=training)
        return loss

    def _fused_request(self, inputs: Mapping[str, Any], mask: Tensor, accumulation: int) -> FusedRequest | None:
        """With ``fused_objective``: the objective, batch and normalisers for the policy's next forward, set on
        the policy (None otherwise)."""
        if self._rlguard_fused_model is None:
            return None
        policy_batch = self._policy_batch(inputs, torch.zeros(mask.shape, device=mask.device), None, mask, None)
        if inputs.get("sampling_per_token_logps") is not None and policy_batch.old_logprobs is None:
            raise NotImplementedError(
                "fused_objective=True needs old_per_token_logps with vLLM importance sampling (TRL computes them "
                "when vllm_importance_sampling_correction is on); use fused_objective=False."
            )
        batch = RolloutBatch(
            advantages=policy_batch.advantages,
            mask=mask,
            old_logprobs=policy_batch.old_logprobs,
            ref_logprobs=policy_batch.ref_logprobs,
            rollout_logprobs=policy_batch.rollout_logprobs,
        )
        weight = self._rlguard_fused_model.get_output_embeddings().weight
        dtype_of = torch.empty(0, dtype=torch.promote_types(weight.dtype, torch.float32))
        request = FusedRequest(self.rlguard_objective, batch, self._normalisers(inputs, dtype_of, mask, accumulation))
        setattr(self._rlguard_fused_model, FUSED_REQUEST, request)
        return request

    def _training(self) -> bool:
        """TRL's mode switch: ``self.model.training``."""
        return self.model is not None and bool(self.model.training)

    def _policy_batch(
        self,
        inputs: Mapping[str, Any],
        logprobs: Tensor,
        entropies: Tensor | None,
        mask: Tensor,
        token_weights: Tensor | None,
    ) -> PolicyBatch:
        old = inputs.get("old_per_token_logps")
        rollout = inputs.get("sampling_per_token_logps")
        if rollout is not None:
            # TRL gives tokens vLLM could not score (NaN) an IS ratio of 1: their rollout log-prob is pi_old's
            behaviour = (logprobs if old is None else old).detach()
            rollout = torch.where(torch.isnan(rollout), behaviour, rollout)
        return PolicyBatch(
            logprobs=logprobs,
            advantages=inputs["advantages"],
            mask=mask,
            old_logprobs=old,
            ref_logprobs=inputs["ref_per_token_logps"] if self.beta != 0.0 else None,
            rollout_logprobs=rollout,
            entropies=entropies,
            token_weights=token_weights,
        )

    def _normalisers(
        self, inputs: Mapping[str, Any], logprobs: Tensor, mask: Tensor, accumulation: int
    ) -> dict[str, Any]:
        """TRL's denominators of this micro-batch (see the module docstring), in the objective's compute dtype."""
        kind = self.rlguard_mapping.normaliser
        if kind == "sequences":
            return {"num_sequences": mask.size(0) * accumulation}
        dtype = torch.promote_types(logprobs.dtype, torch.float32)
        if kind == "local_tokens":
            return {"num_tokens": mask.sum().to(dtype).clamp(min=1.0) * accumulation}
        # num_items_in_batch spans the generation batch of all processes: rescale it to one accumulation window
        # of one process, as TRL does (its loss is averaged over processes by DDP)
        tokens = inputs["num_items_in_batch"].to(dtype).clamp(min=1.0) / self.accelerator.num_processes
        if self._training():
            tokens = tokens * accumulation / cast(GRPOConfig, self.args).steps_per_generation
        return {"num_tokens": tokens}


__getattr__ = renamed(__name__, guard_from_spec=parse_guard_flag)  # its old name here, deprecated
