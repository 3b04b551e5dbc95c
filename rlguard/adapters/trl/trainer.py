"""TRL adapter: every rlguard objective inside ``trl.GRPOTrainer``; TRL's own settings keep their meaning.

>>> from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
>>> args = GuardedGRPOConfig(objective="gspo", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4)  # doctest: +SKIP
>>> GuardedGRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=data).train()  # doctest: +SKIP

``GuardedGRPOTrainer`` overrides one private TRL method, ``GRPOTrainer._compute_loss``. It obtains the per-token
log-probs and entropies exactly as TRL does, puts them with TRL's advantages, old, reference and vLLM log-probs
and loss mask into a :class:`~rlguard.core_losses.PolicyBatch`, and calls the objective with the normalisers of
TRL's ``loss_type``. No loss formula lives in this module; :func:`~rlguard.adapters.trl.mapping.map_trl_config`
is the whole translation (see :mod:`rlguard.adapters.trl.mapping` for every setting and the normalisers).


With ``GuardedGRPOConfig(guard="default")`` (or ``"monitor"``, ``"strict"``, a ``GuardConfig``) a
:class:`~rlguard.adapters.trl.callback.StabilityCallback` acts on the guard's decisions every optimizer step (skip,
LR scale, clip range, rollback, halt; see :mod:`rlguard.adapters.trl.callback`), and the objective drops and counts
non-finite log-probs (``on_nonfinite="mask"``) so that a poisoned batch reaches the guard instead of crashing.

``GuardedGRPOConfig(logprobs_from_hidden=True)`` computes the policy's log-probs and entropies with
:func:`rlguard.core_losses.logprobs_from_hidden` instead of TRL's fused LM head (:mod:`rlguard.adapters.trl.logprobs`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
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

from rlguard.adapters.trl.callback import StabilityCallback
from rlguard.adapters.trl.compat import FORWARD_KEYS, check_trl_compatibility
from rlguard.adapters.trl.logprobs import (
    FUSED_REQUEST,
    FusedRequest,
    check_hidden_logprobs_supported,
    use_hidden_logprobs,
)
from rlguard.adapters.trl.mapping import TRLLossMapping, map_trl_config, paper_trl_settings
from rlguard.core_losses import (
    CISPO,
    GRPO,
    GSPO,
    VESPO,
    LossOutput,
    Objective,
    PolicyBatch,
    RolloutBatch,
    aggregate,
    kl_estimate,
)
from rlguard.core_losses.objectives.weighted import weighted
from rlguard.core_losses.ratios import clipped_surrogate, seq_log_ratio, token_log_ratio
from rlguard.guards import Guard, GuardConfig, StepStats, collect_step_stats
from rlguard.guards.actuator import make_guard, objective_with_controls
from rlguard.guards.decision import Controls
from rlguard.metrics import REDUCTIONS, WEIGHTS

__all__ = ["GuardedGRPOConfig", "GuardedGRPOTrainer", "guard_from_spec"]

logger = logging.getLogger(__name__)


@dataclass
class GuardedGRPOConfig(GRPOConfig):
    """``trl.GRPOConfig`` plus the choice of rlguard objective. Every TRL field keeps its meaning (see the module).

    Attributes:
        objective: a registered rlguard objective (``rlguard losses`` lists them); ``None`` follows ``loss_type``.
        objective_kwargs: arguments of the objective, overriding what TRL's settings map to, e.g.
            ``{"aggregation": "seq-mean-token-mean"}`` or ``{"rollout_mask": "geometric"}``; a JSON object string
            (the command line) is parsed. Not ``beta``.
        guard: stability guard acting in the loop (:mod:`rlguard.adapters.trl.callback`): a preset name
            (``"monitor"``, ``"default"``, ``"strict"``), a ``GuardConfig``, or a JSON object (a string, e.g. on
            the command line, or a mapping, e.g. in a YAML config) of ``GuardConfig`` fields with an optional
            ``"preset"`` they change: ``'{"preset": "strict", "snapshot_interval": 5}'``; ``None`` for none. With
            a guard the objective masks non-finite log-probs (``on_nonfinite="mask"``) so that the guard can skip
            the step.
        epsilon, epsilon_high, loss_type: TRL's, with one difference: with an ``objective`` and a setting left
            unset (``None``, also on the command line and in YAML), the objective's paper value fills it
            (:func:`~rlguard.adapters.trl.mapping.paper_trl_settings`: ``objective="gspo"`` gives the clip range
            3e-4/4e-4 and ``loss_type="grpo"``, GSPO's ``seq-mean-token-mean``); without an ``objective``, TRL's
            defaults (0.2, ``"dapo"``). One log line says which values were used.
        logprobs_from_hidden: compute the policy's per-token log-probs and entropies with
            :func:`rlguard.core_losses.logprobs_from_hidden` (chunked over tokens, logits recomputed in backward)
            instead of TRL's fused LM head kernel; see :mod:`rlguard.adapters.trl.logprobs` for what it refuses.
        fused_objective: compute the objective itself in the LM-head pass
            (:func:`rlguard.core_losses.objective_from_hidden`): the gradients of the hidden states and the LM head
            are formed while each chunk's logits are live, so backward makes no second pass over the vocabulary.
            Implies ``logprobs_from_hidden`` and refuses what it refuses, and TRL's entropy bonus
            (``entropy_coef``; the objective's own ``objective_kwargs={"entropy_coef": ...}`` works).
    """

    objective: str | None = field(
        default=None,
        metadata={"help": "rlguard objective (see `rlguard losses`); None follows loss_type."},
    )
    objective_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Arguments of the rlguard objective, as a dict or a JSON string; they override the values mapped "
            "from TRL's settings."
        },
    )
    # TRL's and transformers' parsers take the second member of a union as the type: str here, converted below
    guard: GuardConfig | str | dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "Stability guard acting in the loop: 'monitor', 'default', 'strict', or a JSON object of "
            'GuardConfig fields with an optional preset they change, e.g. \'{"preset": "strict", '
            '"snapshot_interval": 5}\'.'
        },
    )
    # None = not set by the user: the objective's paper value, or TRL's default without an objective (see above)
    epsilon: float | None = field(  # type: ignore[assignment]  # TRL's float, resolved in __post_init__
        default=None,
        metadata={
            "help": "Lower clip bound (TRL's epsilon). Unset: the objective's paper value with `objective` (gspo: "
            "3e-4), else TRL's 0.2."
        },
    )
    epsilon_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper clip bound (TRL's epsilon_high). Unset: the objective's paper value with `objective` when "
            "epsilon is unset too (gspo: 4e-4), else epsilon."
        },
    )
    loss_type: str | None = field(  # type: ignore[assignment]  # TRL's str, resolved in __post_init__
        default=None,
        metadata={
            "help": "TRL's loss_type (it sets the aggregation). Unset: the one of the objective's paper aggregation "
            "with `objective` (gspo: 'grpo'), else TRL's 'dapo'."
        },
    )
    logprobs_from_hidden: bool = field(
        default=False,
        metadata={
            "help": "Compute the policy's per-token log-probs and entropies with rlguard's logprobs_from_hidden from "
            "the last hidden states and the LM head weight, a chunk of tokens at a time (logits recomputed in "
            "backward), instead of TRL's fused LM head kernel (TRL 1.16 does not build the full logits either; "
            "rlguard's chunks are smaller, see benchmarks/logprobs_memory.py). Float32 accumulation; the "
            "temperature divides the hidden states, which is exact. Refused for LM heads with a bias or LoRA, "
            "logit soft-capping or scaling, MoE auxiliary losses, DeepSpeed ZeRO-3 and FSDP. The reference model "
            "keeps TRL's kernel."
        },
    )

    fused_objective: bool = field(
        default=False,
        metadata={
            "help": "Compute the objective in the LM-head pass with rlguard's objective_from_hidden: the gradients "
            "of hidden states and LM head are formed while each chunk's logits are live (three matrix products, "
            "no recomputation in backward). Implies logprobs_from_hidden and refuses what it refuses, and TRL's "
            "entropy bonus (entropy_coef != 0); objective_kwargs={'entropy_coef': ...} is the objective's own."
        },
    )

    # a JSON string given for these (e.g. on the command line) is parsed into a dict; the base declares it unannotated
    _VALID_DICT_FIELDS = [*GRPOConfig._VALID_DICT_FIELDS, "objective_kwargs"]  # noqa: RUF012

    def __post_init__(self) -> None:
        used = self._fill_unset_trl_settings()
        super().__post_init__()  # type: ignore[no-untyped-call]  # parses a JSON string given for objective_kwargs
        if self.objective_kwargs is None:
            self.objective_kwargs = {}
        if not isinstance(self.objective_kwargs, dict):
            raise ValueError(f"objective_kwargs must be a dict or a JSON object string; got {self.objective_kwargs!r}.")
        if "aggregation" in used and "aggregation" not in self.objective_kwargs:
            self.objective_kwargs = {**self.objective_kwargs, "aggregation": used["aggregation"]}
        self.guard = guard_from_spec(self.guard)
        map_trl_config(self)
        if self.objective is not None:
            _log_settings_used(self, used)

    def _fill_unset_trl_settings(self) -> dict[str, Any]:
        """Fill ``epsilon``, ``epsilon_high``, ``loss_type`` left ``None``; return what the objective's paper gave."""
        paper = {} if self.objective is None else paper_trl_settings(self.objective)
        used: dict[str, Any] = {}
        if self.epsilon is None:
            # an explicit epsilon keeps TRL's meaning of an unset epsilon_high (= epsilon)
            if self.epsilon_high is None and "epsilon_high" in paper:
                self.epsilon_high = used["epsilon_high"] = paper["epsilon_high"]
            if "epsilon" in paper:
                self.epsilon = used["epsilon"] = paper["epsilon"]
            else:
                self.epsilon = _TRL_DEFAULTS["epsilon"]
        if self.loss_type is None:
            self.loss_type = paper.get("loss_type", _TRL_DEFAULTS["loss_type"])
            used.update({k: paper[k] for k in ("loss_type", "aggregation") if k in paper})
        return used

    def to_dict(self) -> dict[str, Any]:
        """TRL's dict of the settings, JSON-ready (a ``GuardConfig`` given as ``guard`` appears as its repr)."""
        out: dict[str, Any] = super().to_dict()
        if isinstance(out.get("guard"), GuardConfig):
            out["guard"] = repr(out["guard"])
        return out

    def objective_mapping(self) -> TRLLossMapping:
        """How this config translates into an rlguard objective (:func:`map_trl_config`, without warnings)."""
        return map_trl_config(self, warn=False)


#: TRL's own defaults of the settings GuardedGRPOConfig leaves unset (None) by default
_TRL_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in ("epsilon", "loss_type")
}


def guard_from_spec(spec: GuardConfig | str | Mapping[str, Any] | None) -> GuardConfig | str | None:
    """``GuardedGRPOConfig.guard`` as given -> a preset name, a ``GuardConfig`` or None.

    A JSON object (string) or a mapping holds ``GuardConfig`` fields, with an optional ``"preset"`` they change
    (``"default"`` without one); schedules, which are functions, cannot be given this way.
    """
    if spec is None or isinstance(spec, GuardConfig):
        return spec
    if isinstance(spec, str):
        if not spec.lstrip().startswith("{"):
            make_guard(spec)  # a preset name: validated now
            return spec
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"guard: {spec!r} is not valid JSON ({err}); give a preset name or a JSON object."
            ) from err
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"guard must be a preset name ('monitor', 'default', 'strict'), a GuardConfig or a JSON object of its "
            f"fields; got {spec!r}."
        )
    fields = dict(spec)
    preset = fields.pop("preset", "default")
    allowed = {f.name for f in dataclasses.fields(GuardConfig)} - {"schedules"}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ValueError(
            f"guard: unknown GuardConfig field(s) {unknown} in {dict(spec)!r}; accepted: 'preset' and "
            f"{sorted(allowed)} (schedules only from Python, as a GuardConfig)."
        )
    if not isinstance(preset, str):
        raise ValueError(f"guard: 'preset' must be a preset name ('monitor', 'default', 'strict'); got {preset!r}.")
    return GuardConfig.preset(preset, **fields)


def _log_settings_used(config: GuardedGRPOConfig, used: Mapping[str, Any]) -> None:
    """One log line: the clip range and aggregation the objective got, and whether they are its paper's (then at
    WARNING level: TRL users expect TRL's defaults) or the user's TRL settings."""
    kwargs = config.objective_mapping().kwargs
    parts = []
    if "clip_high" in kwargs:
        source = "the paper's" if used.keys() & {"epsilon", "epsilon_high"} else "from epsilon/epsilon_high"
        parts.append(f"clip range ({kwargs.get('clip_low')}, {kwargs['clip_high']}) ({source})")
    source = "the paper's" if used.keys() & {"loss_type", "aggregation"} else "from loss_type/objective_kwargs"
    parts.append(f"aggregation {kwargs['aggregation']!r} ({source}, loss_type={config.loss_type!r})")
    hint = "; set epsilon, epsilon_high or loss_type to use TRL's" if used else ""
    logger.log(
        logging.WARNING if used else logging.INFO,
        "rlguard: objective %r with %s%s.",
        config.objective,
        " and ".join(parts),
        hint,
    )


class GuardedGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose policy loss is an rlguard objective; everything else is TRL's.

    Takes the arguments of ``GRPOTrainer``; ``args`` may be a :class:`GuardedGRPOConfig` or a plain ``GRPOConfig``
    (then the objective follows ``loss_type``). The objective's canonical metrics are logged as ``rlguard/<name>``
    next to TRL's own keys, which keep TRL's meaning: ``entropy``, ``kl``, ``clip_ratio/*`` (``low_mean``,
    ``high_mean``, ``region_mean``, ``low_min``, ``high_max``) and ``cispo_clip_ratio`` are computed as TRL computes
    them (:func:`trl_metric_parts`: e.g. per sequence for GSPO, where rlguard's ``rlguard/clip_frac`` counts
    tokens).

    Every ``StabilityCallback`` among the callbacks is attached to the trainer; ``args.guard`` gives one a guard
    (adding a callback if there is none), which then also sees the objective's metrics of every micro-batch.

    Attributes:
        rlguard_mapping: how the config was translated (:class:`TRLLossMapping`).
        rlguard_objective: the objective computing the loss (rebuilt when the guard changes the clip range).
        rlguard_guard: the guard acting on this trainer's steps, or None.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trl_compatibility()
        super().__init__(*args, **kwargs)
        config = cast(GRPOConfig, self.args)
        mapping = map_trl_config(config, warn=not isinstance(config, GuardedGRPOConfig))
        guard = self._attach_stability_callbacks(getattr(config, "guard", None))
        if guard is not None and "beta" in guard.config.schedules and config.beta == 0.0:
            raise ValueError(
                "the guard schedules beta, but GuardedGRPOConfig(beta=0.0) makes TRL load no reference model: set "
                "beta > 0 (the schedule then replaces it) or drop the beta schedule."
            )
        if guard is not None and "on_nonfinite" not in mapping.kwargs:
            # NaN/Inf log-probs are dropped and counted, so that the guard sees them and skips the step
            mapping = dataclasses.replace(mapping, kwargs={**mapping.kwargs, "on_nonfinite": "mask"})
        self.rlguard_mapping = mapping
        self.rlguard_guard: Guard | None = guard
        self.rlguard_objective: Objective = mapping.build()
        self._rlguard_configured_objective = self.rlguard_objective
        self._rlguard_step_stats = StepStats()
        self._rlguard_fused_model: Any = None
        fused = bool(getattr(config, "fused_objective", False))
        if fused and self._entropy_bonus_enabled:
            raise ValueError(
                f"fused_objective=True cannot add TRL's entropy bonus (entropy_coef={self.entropy_coef}, "
                f"use_adaptive_entropy={self.use_adaptive_entropy}): it needs gradients through the entropies "
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

    def _attach_stability_callbacks(self, spec: str | GuardConfig | None) -> Guard | None:
        """Attach every ``StabilityCallback`` to this trainer; ``spec`` gives the first one a guard (a callback
        is added if there is none). Returns the acting guard, if any."""
        callbacks = [cb for cb in self.callback_handler.callbacks if isinstance(cb, StabilityCallback)]
        if spec is not None and not any(cb.guard is not None for cb in callbacks):
            if not callbacks:
                callbacks.append(StabilityCallback())
                self.add_callback(callbacks[0])
            callbacks[0].guard = make_guard(spec)
        for cb in callbacks:
            cb.attach(self)
        return next((cb.guard for cb in callbacks if cb.guard is not None), None)

    def rlguard_take_step_stats(self) -> StepStats:
        """The objective's stats of the micro-batches since the last call (this rank's share; not reduced)."""
        stats, self._rlguard_step_stats = self._rlguard_step_stats, StepStats()
        return stats

    def rlguard_set_controls(self, controls: Controls) -> None:
        """The guard's controls for the objective from the next loss on: clip range, ``beta``, ``entropy_coef``
        (:func:`~rlguard.guards.actuator.objective_with_controls` of the configured objective)."""
        self.rlguard_objective = objective_with_controls(self._rlguard_configured_objective, controls)

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
        batch = self._policy_batch(inputs, logprobs, entropies, mask)
        objective, entropy_mask = self.rlguard_objective, None
        if self.top_entropy_quantile < 1.0:
            # TRL's own mask (its quantile is over the entropies of all processes); it weights the policy term only
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)  # (B, T) bool
            objective = weighted(objective, entropy_mask)
        if request is None:
            out = objective(batch, **self._normalisers(inputs, logprobs, mask, accumulation))
        else:  # the policy's forward computed it (rlguard.adapters.trl.logprobs); refused with top_entropy_quantile
            assert request.output is not None, "the policy's fused forward did not run"
            out = request.output
        if training and self.rlguard_guard is not None:
            collect_step_stats(batch=batch, output=out, stats=self._rlguard_step_stats)
        loss = out.loss
        mode = "train" if training else "eval"
        if self._entropy_bonus_enabled:
            # TRL's bonus: coef * (token mean of the entropy over this micro-batch) / GA, whatever the loss_type
            fmask = (mask if entropy_mask is None else mask * entropy_mask).to(entropies.dtype)
            mean_entropy = aggregate(entropies, fmask, "token-mean", num_tokens=fmask.sum().clamp(min=1) * accumulation)
            loss = loss - self.entropy_coef * mean_entropy
            # TRL logs the loss before its division by GA where it divides by GA (grpo, bnpo, dr_grpo), else as is
            scale = 1 if self.rlguard_mapping.normaliser == "global_tokens" else accumulation
            policy_loss = self.accelerator.gather(out.loss.detach() * scale).nanmean().item()
            self._metrics[mode]["policy_loss"].append(policy_loss)
            if training and self.accelerator.sync_gradients:
                self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._log_rlguard_metrics(mode, out, batch, accumulation)
        return loss

    def _fused_request(self, inputs: Mapping[str, Any], mask: Tensor, accumulation: int) -> FusedRequest | None:
        """With ``fused_objective``: the objective, batch and normalisers for the policy's next forward, set on
        the policy (None otherwise)."""
        if self._rlguard_fused_model is None:
            return None
        policy_batch = self._policy_batch(inputs, torch.zeros(mask.shape, device=mask.device), None, mask)
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
        self, inputs: Mapping[str, Any], logprobs: Tensor, entropies: Tensor | None, mask: Tensor
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

    def _log_rlguard_metrics(self, mode: str, out: LossOutput, batch: PolicyBatch, accumulation: int) -> None:
        """Reduce the objective's metrics and TRL's (:func:`trl_metric_parts`) over processes (one gather) and log
        them: the objective's as ``rlguard/<name>``, TRL's under TRL's keys with TRL's meaning."""
        metrics, mask = out.metrics, batch.mask
        names = sorted(metrics)
        tokens = mask.sum().to(torch.float64)
        sequences = (mask != 0).any(dim=-1).sum().to(torch.float64)
        trl = trl_metric_parts(self.rlguard_objective, batch)
        local = torch.stack(
            [*(metrics[n].detach().to(torch.float64) for n in names), tokens, sequences]
            + [t.to(torch.float64) for t in trl.parts()]
        )
        gathered = self.accelerator.gather(local.unsqueeze(0))  # (W, K + 2 + len(trl.parts()))
        k = len(names)
        values = _reduce_over_processes(names, gathered[:, :k], gathered[:, k], gathered[:, k + 1]).tolist()
        reduced = dict(zip(names, values, strict=True))
        reduced["loss"] = reduced["loss"] * accumulation  # the micro-batch's share at the scale of one step
        for name, value in reduced.items():
            self._metrics[mode][f"rlguard/{name}"].append(value)
        for key, value in trl.reduce(gathered[:, k + 2 :]).items():
            self._metrics[mode][key].append(value)


def _reduce_over_processes(names: list[str], values: Tensor, tokens: Tensor, sequences: Tensor) -> Tensor:
    """Per metric, the reduction and weighting of the metric table (:mod:`rlguard.metrics`): max, min, sum, or a
    mean weighted by tokens, sequences or equally. values ``(W, K)``, tokens and sequences ``(W,)``; returns
    ``(K,)``."""
    weights = {
        "tokens": tokens / tokens.sum().clamp(min=1.0),
        "sequences": sequences / sequences.sum().clamp(min=1.0),
        "samples": tokens / tokens.sum().clamp(min=1.0),
        "equal": torch.full_like(tokens, 1.0 / tokens.numel()),
    }  # (W,) each
    out = []
    for k, name in enumerate(names):
        column = values[:, k]
        reduction = REDUCTIONS.get(name, "mean")
        if reduction == "max":
            out.append(column.max())
        elif reduction == "min":
            out.append(column.min())
        elif reduction == "sum":
            out.append(column.sum())
        else:
            out.append((column * weights[WEIGHTS.get(name, "tokens")]).sum())
    return torch.stack(out)


@dataclass(frozen=True)
class TRLMetricParts:
    """One micro-batch's share of the metrics TRL's own loss logs (local sums, counted units, extremes), to gather
    over processes and :meth:`reduce` into TRL's keys; see :func:`trl_metric_parts`."""

    tokens: Tensor  # () loss tokens
    entropy: Tensor  # () sum of per-token entropies
    kl: Tensor | None  # () sum of per-token KL estimates; None without a KL term (TRL logs no "kl")
    clip: Tensor | None  # (6,) low, high, region sums, counted units, low_min, high_max; None: TRL logs none
    cispo: bool = False  # TRL's CISPO logs only cispo_clip_ratio
    vespo_phi: Tensor | None = None  # (2,) sum of VESPO's phi(W_i) over sequences, sequences; None: not VESPO

    def parts(self) -> list[Tensor]:
        """The values to gather, flat."""
        out = [self.tokens, self.entropy]
        out += [] if self.kl is None else [self.kl]
        out += [] if self.vespo_phi is None else list(self.vespo_phi.unbind())
        return out + ([] if self.clip is None else list(self.clip.unbind()))

    def reduce(self, gathered: Tensor) -> dict[str, float]:
        """``(W, len(parts()))`` gathered :meth:`parts` -> TRL's keys and values: means over all processes' tokens
        (or rows, for a sequence ratio), min and max over their sequences (NaN where none counted)."""
        sums = gathered.sum(dim=0)
        tokens = max(sums[0].item(), 1.0)
        out = {"entropy": sums[1].item() / tokens}
        k = 2
        if self.kl is not None:
            out["kl"] = sums[2].item() / tokens
            k = 3
        if self.vespo_phi is not None:  # TRL: the mean of phi(W_i) over all processes' sequences
            out["vespo/phi_seq_mean"] = sums[k].item() / max(sums[k + 1].item(), 1.0)
            k += 2
        if self.clip is None:
            return out
        units = max(sums[k + 3].item(), 1.0)
        low, high, region = (v / units for v in sums[k : k + 3].tolist())
        if self.cispo:
            return {**out, "cispo_clip_ratio": high}
        low_min, high_max = gathered[:, k + 4].min().item(), gathered[:, k + 5].max().item()
        return {
            **out,
            "clip_ratio/low_mean": low,
            "clip_ratio/high_mean": high,
            "clip_ratio/region_mean": region,
            "clip_ratio/low_min": low_min if math.isfinite(low_min) else math.nan,
            "clip_ratio/high_max": high_max if math.isfinite(high_max) else math.nan,
        }


def trl_metric_parts(objective: Objective, batch: PolicyBatch) -> TRLMetricParts:
    """The metrics TRL's ``GRPOTrainer._compute_loss`` logs, as TRL defines them, for this micro-batch.

    ``entropy`` and ``kl`` are token means over the loss mask (before any off-policy or rollout masking, as in
    TRL; rlguard's ``rlguard/entropy`` and ``rlguard/kl_ref`` average over the tokens the loss kept). Clip fractions:
    ``clip_ratio/*`` for the GRPO family, ``cispo_clip_ratio`` for CISPO, none for the others (TRL logs none for
    SAPO). TRL counts a ratio clipped below where ``r < 1 - epsilon`` and ``A < 0``, above where
    ``r > 1 + epsilon_high`` (CISPO: ``r > epsilon_high``, its absolute cap) and ``A > 0``; the dual clip ``delta``
    is not included. ``r`` is the ratio the loss clips: per token, or per sequence for a sequence-ratio objective
    (GSPO, TRL's ``importance_sampling_level="sequence"``), where each row counts once. ``*_mean`` average over
    the units of all processes; ``low_min``/``high_max`` are the extremes of the per-sequence fractions. The
    bounds are the objective's current ones (the guard may change them). rlguard's own ``rlguard/clip_frac*``
    count tokens, the dual clip included, and every capped CISPO weight.
    """
    with torch.no_grad():
        f64 = torch.float64
        logprobs = batch.logprobs.detach().to(f64)
        old = logprobs if batch.old_logprobs is None else batch.old_logprobs.to(f64)
        mask = batch.mask.to(f64)  # (B, T)
        tokens = mask.sum()
        entropy = torch.zeros((), dtype=f64) if batch.entropies is None else (batch.entropies.to(f64) * mask).sum()
        kl = None
        if objective.beta != 0.0 and batch.ref_logprobs is not None:
            behaviour = old if objective.kl_unbiased else None
            per_token = kl_estimate(
                logprobs, batch.ref_logprobs.to(f64), objective.kl_estimator, old_logprobs=behaviour
            )
            kl = (per_token * mask).sum()
        if isinstance(objective, VESPO):
            advantages = batch.advantages.to(f64)
            per_sequence = advantages.dim() == 1
            advantages = advantages.unsqueeze(-1) if per_sequence else advantages  # (B, 1) or (B, T)
            phi = objective.weights(token_log_ratio(logprobs, old), advantages.expand_as(mask), mask)  # (B, T)
            phi = phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # as TRL's get_gamma_weights
            # TRL's phi is (B, 1) for sequence advantages (one value per sequence), else (B, T) over the mask
            phi_parts = (
                torch.stack([phi[:, 0].sum(), torch.tensor(float(phi.size(0)), dtype=f64)])
                if per_sequence
                else torch.stack([(phi * mask).sum(), tokens])
            )
            return TRLMetricParts(tokens, entropy, kl, None, vespo_phi=phi_parts)
        if not isinstance(objective, (GRPO, CISPO)):
            return TRLMetricParts(tokens, entropy, kl, None)
        log_ratio = token_log_ratio(logprobs, old)  # (B, T)
        if isinstance(objective, GSPO):
            log_ratio = seq_log_ratio(log_ratio, mask)  # (B, 1)
        advantages = batch.advantages.to(f64)
        advantages = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
        if isinstance(objective, CISPO):
            cap = objective.weight_bounds()[1]
            high = ((torch.exp(log_ratio) > cap) & (advantages > 0)).to(f64)  # (B, T)
            low = torch.zeros_like(high)
        else:
            terms = clipped_surrogate(log_ratio, advantages, objective.clip_low, objective.clip_high)
            assert terms.clipped_low is not None and terms.clipped_high is not None
            low, high = terms.clipped_low.to(f64), terms.clipped_high.to(f64)  # (B, 1) or (B, T)
        region = torch.maximum(low, high)
        if low.size(-1) == 1:  # one ratio per sequence: each row counts once
            weights, count = torch.ones_like(low), torch.tensor(float(low.size(0)), dtype=f64)
            per_seq_low, per_seq_high = low.squeeze(-1), high.squeeze(-1)  # (B,)
        else:
            weights, count = mask, tokens
            per_seq_low = (low * mask).sum(-1) / mask.sum(-1)  # (B,), NaN for empty rows
            per_seq_high = (high * mask).sum(-1) / mask.sum(-1)
        inf = torch.tensor(math.inf, dtype=f64)
        low_min = torch.where(per_seq_low.isnan(), inf, per_seq_low).min() if per_seq_low.numel() else inf
        high_max = torch.where(per_seq_high.isnan(), -inf, per_seq_high).max() if per_seq_high.numel() else -inf
        clip = torch.stack(
            [(low * weights).sum(), (high * weights).sum(), (region * weights).sum(), count, low_min, high_max]
        )
        return TRLMetricParts(tokens, entropy, kl, clip, cispo=isinstance(objective, CISPO))
