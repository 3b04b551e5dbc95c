"""TRL adapter: every rlguard objective inside ``trl.GRPOTrainer``; TRL's own settings keep their meaning.

>>> from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
>>> args = GuardedGRPOConfig(objective="gspo", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4)  # doctest: +SKIP
>>> GuardedGRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=data).train()  # doctest: +SKIP

``GuardedGRPOTrainer`` overrides one private TRL method, ``GRPOTrainer._compute_loss``. It obtains the per-token
log-probs and entropies exactly as TRL does, puts them with TRL's advantages, old, reference and vLLM log-probs
and loss mask into a :class:`~rlguard.core_losses.PolicyBatch`, and calls the objective with the normalisers of
TRL's ``loss_type``. No loss formula lives in this module; :func:`map_trl_config` is the whole translation:

- ``objective=None``: the objective of ``loss_type``: grpo and bnpo -> ``grpo``, dr_grpo, dapo, sapo, and cispo
  (with ``bounds="absolute"``, TRL's convention);
- ``importance_sampling_level="sequence"`` turns grpo, dapo and dr_grpo into ``gspo``;
- ``epsilon``, ``epsilon_high`` -> ``clip_low``, ``clip_high`` of the GRPO family; CISPO's ``clip_high`` is the
  absolute cap ``epsilon_high``; GMPO (log-space clip) keeps its own;
- ``delta`` (TRL's two-sided clip) -> ``clip_c``, the dual clip, which it equals when ``delta >= 1 + epsilon_high``;
- ``beta``, ``use_bias_correction_kl`` -> ``beta`` with ``kl_estimator="k3"``, ``kl_unbiased``;
- ``sapo_temperature_pos``/``_neg`` -> ``tau_pos``/``tau_neg``;
- ``off_policy_mask_threshold`` -> ``off_policy_mask_delta``;
- vLLM's ``*_truncate`` modes -> ``rollout_is``; ``*_mask`` modes -> ``rollout_mask`` plus ``rollout_is``;
- ``loss_type``, unless ``objective_kwargs`` names an ``aggregation``: grpo, sapo -> ``seq-mean-token-mean``;
  bnpo, dapo, cispo -> ``token-mean``; dr_grpo -> ``seq-mean-token-sum-norm`` with
  ``max_length=max_completion_length``.

With ``GuardedGRPOConfig(guard="default")`` (or ``"monitor"``, ``"strict"``, a ``GuardConfig``) a
:class:`~rlguard.adapters.trl_guard.StabilityCallback` acts on the guard's decisions every optimizer step (skip,
LR scale, clip range, rollback, halt; see :mod:`rlguard.adapters.trl_guard`), and the objective drops and counts
non-finite log-probs (``on_nonfinite="mask"``) so that a poisoned batch reaches the guard instead of crashing.

``GuardedGRPOConfig(logprobs_from_hidden=True)`` computes the policy's log-probs and entropies with
:func:`rlguard.core_losses.logprobs_from_hidden` instead of TRL's fused LM head (:mod:`rlguard.adapters.trl_logprobs`).

``objective_kwargs`` override every mapped value. Normalisers, with ``B`` the micro-batch's rows, ``GA`` the
current gradient-accumulation steps (1 in evaluation), ``W`` the number of processes (DDP averages gradients)
and ``N`` TRL's ``num_items_in_batch`` (the loss tokens of the whole generation batch on all processes):

- ``seq-mean-*``: ``num_sequences = B * GA`` (TRL's ``.mean()`` over rows, divided by ``GA``);
- ``token-mean`` from ``loss_type="bnpo"``: ``num_tokens`` = this micro-batch's loss tokens times ``GA``;
- any other ``token-mean``: ``num_tokens = N / W * GA / steps_per_generation`` (1 instead of the last factor in
  evaluation), TRL's normaliser of dapo and cispo.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

try:
    import trl
    from accelerate.utils import is_peft_model  # type: ignore[import-untyped]  # accelerate ships no py.typed
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"rlguard.adapters.trl needs TRL: pip install 'rlguard[trl]' ({err}).") from err

from rlguard.adapters.trl_guard import StabilityCallback, canonical_stats, make_guard
from rlguard.adapters.trl_logprobs import check_hidden_logprobs_supported, use_hidden_logprobs
from rlguard.core_losses import CISPO, GMPO, GRPO, GSPO, SAPO, Objective, PolicyBatch, aggregate, get_objective
from rlguard.core_losses.registry import objective_class
from rlguard.doctor.keys import TRL_TO_CANONICAL
from rlguard.guards import Guard, GuardConfig, StepStats, collect_step_stats

__all__ = [
    "SUPPORTED_TRL",
    "TRL_TO_CANONICAL",
    "GuardedGRPOConfig",
    "GuardedGRPOTrainer",
    "StabilityCallback",
    "TRLLossMapping",
    "canonical_stats",
    "check_trl_compatibility",
    "map_trl_config",
]

SUPPORTED_TRL = ">=1.16,<1.17"

#: The TRL loss types rlguard reproduces, with the objective and aggregation each one means.
LOSS_TYPE_OBJECTIVE = {
    "grpo": "grpo",
    "bnpo": "grpo",
    "dr_grpo": "dr_grpo",
    "dapo": "dapo",
    "cispo": "cispo",
    "sapo": "sapo",
}
LOSS_TYPE_AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
    "cispo": "token-mean",
}
#: Objectives whose ratio is one per sequence, and aggregations that weight a sequence by its token count.
_SEQUENCE_RATIO = (GSPO, GMPO)
_TOKEN_SUMMED = ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
#: Token-ratio objectives that TRL's importance_sampling_level="sequence" turns into GSPO.
_TO_GSPO = ("grpo", "dapo", "dr_grpo")
#: Multimodal inputs that TRL's _compute_loss forwards to _get_per_token_logps_and_entropies.
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
_LOGPS_ARGS = ("model", "input_ids", "attention_mask", "logits_to_keep", "compute_entropy", "compute_aux_loss")

Normaliser = Literal["sequences", "local_tokens", "global_tokens"]


@dataclass(frozen=True)
class TRLLossMapping:
    """What a ``GRPOConfig`` means in rlguard: the objective, its arguments and the normaliser to pass.

    Attributes:
        objective: registered objective name.
        kwargs: its constructor arguments (TRL's settings, then ``objective_kwargs``).
        normaliser: ``"sequences"`` (``seq-mean-*``), ``"local_tokens"`` (bnpo) or ``"global_tokens"``.
    """

    objective: str
    kwargs: dict[str, Any]
    normaliser: Normaliser

    def build(self) -> Objective:
        """The objective instance."""
        return get_objective(self.objective, **self.kwargs)


def map_trl_config(args: GRPOConfig, *, warn: bool = True) -> TRLLossMapping:
    """Translate ``args`` (a ``GRPOConfig``, optionally with ``objective``/``objective_kwargs``) into an objective.

    Raises ``ValueError`` for settings with no exact rlguard meaning and ``NotImplementedError`` for TRL features
    the adapter does not support yet; ``warn`` emits ``UserWarning`` where rlguard's loss knowingly differs from
    TRL's or where the combination is known to bias training.
    """
    _reject_unsupported(args)
    user: dict[str, Any] = dict(getattr(args, "objective_kwargs", None) or {})
    if "beta" in user:
        raise ValueError(
            f"objective_kwargs must not set beta (got {user['beta']!r}): set GRPOConfig.beta, which also makes TRL "
            "load the reference model."
        )
    name = _objective_name(args)
    cls = objective_class(name)
    aggregation = user.get("aggregation") or LOSS_TYPE_AGGREGATION.get(args.loss_type)
    if aggregation is None:
        raise ValueError(
            f"loss_type={args.loss_type!r} has no rlguard aggregation; name one in objective_kwargs['aggregation'] "
            f"or use a loss_type among {sorted(LOSS_TYPE_AGGREGATION)}."
        )
    kwargs: dict[str, Any] = {
        "aggregation": aggregation,
        "max_length": args.max_completion_length,
        "beta": args.beta,
        "kl_estimator": "k3",
        "kl_unbiased": bool(args.use_bias_correction_kl),
        "off_policy_mask_delta": args.off_policy_mask_threshold,
        **_clip_kwargs(args, cls, warn),
        **_rollout_kwargs(args),
    }
    kwargs.update(user)
    mapping = TRLLossMapping(name, kwargs, _normaliser(args, kwargs["aggregation"], "aggregation" in user))
    mapping.build()  # validates every value now, at configuration time
    if warn:
        _warn_on_known_differences(args, cls, mapping)
    return mapping


def _reject_unsupported(args: GRPOConfig) -> None:
    if args.top_entropy_quantile < 1.0:
        raise NotImplementedError(
            f"top_entropy_quantile={args.top_entropy_quantile} is not supported by GuardedGRPOTrainer yet: the "
            "entropy mask weights the policy term but not the normalisers, which PolicyBatch cannot express. Use 1.0."
        )
    if args.use_adaptive_entropy:
        raise NotImplementedError(
            "use_adaptive_entropy=True is not supported by GuardedGRPOTrainer yet; use a fixed entropy_coef."
        )
    if args.importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            f"importance_sampling_level must be 'token' or 'sequence'; got {args.importance_sampling_level!r}."
        )
    guard = getattr(args, "guard", None)
    if guard is not None:
        make_guard(guard)  # validates the preset name or config now


def _objective_name(args: GRPOConfig) -> str:
    name: str | None = getattr(args, "objective", None)
    if name is None:
        if args.loss_type not in LOSS_TYPE_OBJECTIVE:
            raise NotImplementedError(
                f"loss_type={args.loss_type!r} has no rlguard objective; rlguard reproduces "
                f"{sorted(LOSS_TYPE_OBJECTIVE)}. Name an objective (GuardedGRPOConfig(objective=...)) or use stock "
                "trl.GRPOTrainer."
            )
        name = LOSS_TYPE_OBJECTIVE[args.loss_type]
    if args.importance_sampling_level == "sequence":
        if name in _TO_GSPO:
            return "gspo"
        if not issubclass(objective_class(name), GSPO):
            raise NotImplementedError(
                f"importance_sampling_level='sequence' with objective {name!r}: rlguard's {name} has a token-level "
                f"ratio only. Sequence-level ratios: {list(_TO_GSPO)} (which become 'gspo'), 'gspo' or 'gspo_token'."
            )
    return name


def _clip_kwargs(args: GRPOConfig, cls: type[Objective], warn: bool) -> dict[str, Any]:
    """TRL's clip settings in the objective's own terms."""
    epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    if issubclass(cls, GRPO):
        clip_c = args.delta
        # TRL: coef_1 <- min(r, delta) before -min(coef_1 A, clip(r) A). For A > 0 and delta >= 1 + eps_high the
        # clipped branch is already the smaller one wherever r > delta, so nothing changes; for A < 0 the loss is
        # -A max(min(r, delta), clip(r)) = -A min(max(r, clip(r)), delta), the dual clip with c = delta.
        if clip_c is not None and clip_c < 1.0 + epsilon_high:
            raise ValueError(
                f"delta={clip_c} is below 1 + epsilon_high = {1.0 + epsilon_high}: TRL's two-sided clip then also cuts "
                "positive-advantage ratios below the clip range, which rlguard's dual clip (clip_c) does not do. "
                f"Use delta >= {1.0 + epsilon_high} (INTELLECT-2 recommends delta > 1 + epsilon)."
            )
        return {"clip_low": args.epsilon, "clip_high": epsilon_high, "clip_c": clip_c}
    if args.delta is not None and warn:
        warnings.warn(
            f"delta={args.delta} is ignored by objective {cls.name!r} (TRL ignores it for cispo and sapo too).",
            UserWarning,
            stacklevel=4,
        )
    if issubclass(cls, CISPO):
        if warn and epsilon_high <= 1.0:
            warnings.warn(
                f"CISPO caps the importance weight at epsilon_high={epsilon_high} (TRL's absolute convention), so "
                "every ratio above it gets that weight; TRL and ScaleRL recommend epsilon_high=5.0.",
                UserWarning,
                stacklevel=4,
            )
        return {"bounds": "absolute", "clip_low": None, "clip_high": epsilon_high}
    if issubclass(cls, SAPO):
        return {"tau_pos": args.sapo_temperature_pos, "tau_neg": args.sapo_temperature_neg}
    return {}


def _rollout_kwargs(args: GRPOConfig) -> dict[str, Any]:
    """TRL's vLLM importance-sampling correction as rollout_is/rollout_mask.

    TRL's ``*_truncate`` modes weight by ``min(rho, C_max)``; its ``*_mask`` modes weight by ``rho`` and zero it
    outside ``[C_min, C_max]``, which is rollout_mask plus rollout_is with the cap ``C_max`` (inactive on kept
    tokens). ``rho`` is per token, or the product over the sequence for ``sequence_*``.
    """
    if not (args.use_vllm and args.vllm_importance_sampling_correction):
        return {}
    mode = args.vllm_importance_sampling_mode
    level, kind = mode.split("_", 1) if "_" in mode else (mode, "")
    if level not in ("token", "sequence") or kind not in ("truncate", "mask"):
        raise ValueError(
            f"vllm_importance_sampling_mode must be one of token_truncate, token_mask, sequence_truncate, "
            f"sequence_mask; got {mode!r}."
        )
    c_min, c_max = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
    cap = math.inf if c_max is None else c_max
    if kind == "truncate":
        if c_min is not None or c_max is None:
            raise NotImplementedError(
                f"vllm_importance_sampling_mode={mode!r} with clip_min={c_min}, clip_max={c_max}: rlguard's truncated "
                "IS caps from above only. Set vllm_importance_sampling_clip_min=None and a clip_max."
            )
        return {"rollout_is": level, "rollout_is_cap": cap}
    return {
        "rollout_is": level,
        "rollout_is_cap": cap,
        "rollout_mask": level,
        "rollout_mask_low": 0.0 if c_min is None else c_min,
        "rollout_mask_high": cap,
    }


def _normaliser(args: GRPOConfig, aggregation: str, user_aggregation: bool) -> Normaliser:
    if aggregation != "token-mean":
        return "sequences"
    return "local_tokens" if args.loss_type == "bnpo" and not user_aggregation else "global_tokens"


def _warn_on_known_differences(args: GRPOConfig, cls: type[Objective], mapping: TRLLossMapping) -> None:
    aggregation = mapping.kwargs["aggregation"]
    if issubclass(cls, _SEQUENCE_RATIO) and aggregation in _TOKEN_SUMMED:
        warnings.warn(
            f"objective {mapping.objective!r} has one ratio per sequence but aggregation={aggregation!r} sums over "
            "tokens, so each sequence weighs in proportion to its length (trl#3823). For the paper's objective use "
            "loss_type='grpo' or objective_kwargs={'aggregation': 'seq-mean-token-mean'}.",
            UserWarning,
            stacklevel=3,
        )
    if args.beta != 0.0 and args.use_bias_correction_kl and args.importance_sampling_level == "sequence":
        warnings.warn(
            "with importance_sampling_level='sequence' TRL weights the KL term by the sequence ratio; rlguard weights "
            "it by each token's ratio pi/pi_old (DeepSeek-V3.2's unbiased estimator), so the KL term differs from "
            "TRL's off-policy. Set use_bias_correction_kl=False for the plain k3 term, identical in both.",
            UserWarning,
            stacklevel=3,
        )
    if issubclass(cls, _SEQUENCE_RATIO) and mapping.kwargs.get("rollout_mask") == "token":
        warnings.warn(
            "tokens removed by token-level masked IS leave rlguard's sequence ratio log s_i; TRL's sequence ratio "
            "keeps them, so the losses differ on sequences with masked tokens.",
            UserWarning,
            stacklevel=3,
        )
    masks = mapping.kwargs.get("off_policy_mask_delta") is not None or mapping.kwargs.get("rollout_mask") is not None
    if args.beta != 0.0 and masks:
        warnings.warn(
            "tokens removed by off-policy masking or vLLM masked IS lose their KL term in rlguard; TRL keeps it "
            "(it masks the policy term only), so the losses differ on masked tokens.",
            UserWarning,
            stacklevel=3,
        )


@dataclass
class GuardedGRPOConfig(GRPOConfig):
    """``trl.GRPOConfig`` plus the choice of rlguard objective. Every TRL field keeps its meaning (see the module).

    Attributes:
        objective: a registered rlguard objective (``rlguard losses`` lists them); ``None`` follows ``loss_type``.
        objective_kwargs: arguments of the objective, overriding what TRL's settings map to, e.g.
            ``{"aggregation": "seq-mean-token-mean"}`` or ``{"rollout_mask": "geometric"}``; a JSON object string
            (the command line) is parsed. Not ``beta``.
        guard: stability guard acting in the loop (:mod:`rlguard.adapters.trl_guard`): a preset name
            (``"monitor"``, ``"default"``, ``"strict"``) or a ``GuardConfig``; ``None`` for none. With a guard the
            objective masks non-finite log-probs (``on_nonfinite="mask"``) so that the guard can skip the step.
        logprobs_from_hidden: compute the policy's per-token log-probs and entropies with
            :func:`rlguard.core_losses.logprobs_from_hidden` (chunked over tokens, logits recomputed in backward)
            instead of TRL's fused LM head kernel; see :mod:`rlguard.adapters.trl_logprobs` for what it refuses.
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
    guard: str | GuardConfig | None = field(
        default=None,
        metadata={"help": "Stability guard acting in the loop: 'monitor', 'default', 'strict' or a GuardConfig."},
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

    # a JSON string given for these (e.g. on the command line) is parsed into a dict; the base declares it unannotated
    _VALID_DICT_FIELDS = [*GRPOConfig._VALID_DICT_FIELDS, "objective_kwargs"]  # noqa: RUF012

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[no-untyped-call]  # parses a JSON string given for objective_kwargs
        if self.objective_kwargs is None:
            self.objective_kwargs = {}
        if not isinstance(self.objective_kwargs, dict):
            raise ValueError(f"objective_kwargs must be a dict or a JSON object string; got {self.objective_kwargs!r}.")
        map_trl_config(self)

    def to_dict(self) -> dict[str, Any]:
        """TRL's dict of the settings, JSON-ready (a ``GuardConfig`` given as ``guard`` appears as its repr)."""
        out: dict[str, Any] = super().to_dict()
        if isinstance(out.get("guard"), GuardConfig):
            out["guard"] = repr(out["guard"])
        return out

    def objective_mapping(self) -> TRLLossMapping:
        """How this config translates into an rlguard objective (:func:`map_trl_config`, without warnings)."""
        return map_trl_config(self, warn=False)


class GuardedGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose policy loss is an rlguard objective; everything else is TRL's.

    Takes the arguments of ``GRPOTrainer``; ``args`` may be a :class:`GuardedGRPOConfig` or a plain ``GRPOConfig``
    (then the objective follows ``loss_type``). The objective's canonical metrics are logged as ``rlguard/<name>``
    next to TRL's own keys (``kl``, ``entropy``, ``clip_ratio/*_mean``, ``cispo_clip_ratio``), which are filled
    from them. ``clip_ratio/low_min`` and ``clip_ratio/high_max`` are not logged.

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
        if guard is not None and "on_nonfinite" not in mapping.kwargs:
            # NaN/Inf log-probs are dropped and counted, so that the guard sees them and skips the step
            mapping = dataclasses.replace(mapping, kwargs={**mapping.kwargs, "on_nonfinite": "mask"})
        self.rlguard_mapping = mapping
        self.rlguard_guard: Guard | None = guard
        self.rlguard_objective: Objective = mapping.build()
        self._rlguard_configured_objective = self.rlguard_objective
        self._rlguard_step_stats = StepStats()
        if getattr(config, "logprobs_from_hidden", False):
            self._use_hidden_logprobs()

    def _use_hidden_logprobs(self) -> None:
        """Route TRL's fused LM head of the policy through ``logprobs_from_hidden`` (the model TRL patched)."""
        model: Any = self.model
        model = model.get_base_model() if is_peft_model(model) else model
        check_hidden_logprobs_supported(model, zero3=is_deepspeed_zero3_enabled(), fsdp=bool(self.is_fsdp_enabled))
        use_hidden_logprobs(model, self.temperature)

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

    def rlguard_set_clip(
        self,
        scale: float = 1.0,
        clip_low: float | None = None,
        clip_high: float | None = None,
        *,
        beta: float | None = None,
        entropy_coef: float | None = None,
    ) -> None:
        """Use ``scale`` times the clip range (the scheduled ``clip_low``/``clip_high`` where given, else the
        configured one) and the scheduled ``beta``/``entropy_coef`` (else the configured ones) from the next loss
        on; objectives without a clip range keep theirs."""
        base = self._rlguard_configured_objective
        changes: dict[str, Any] = {}
        for name, scheduled in (("clip_low", clip_low), ("clip_high", clip_high)):
            value = scheduled if scheduled is not None else getattr(base, name, None)
            if value is not None:
                changes[name] = value * scale
        if beta is not None:
            if beta > 0 and base.beta == 0:
                raise ValueError(
                    f"the guard's schedule sets beta={beta:g}, but the run was configured with beta=0, so TRL loads no "
                    "reference model: set GuardedGRPOConfig(beta=...) > 0 (the schedule then replaces it) or drop "
                    "the beta schedule."
                )
            changes["beta"] = beta
        if entropy_coef is not None:
            changes["entropy_coef"] = entropy_coef
        if any(getattr(self.rlguard_objective, k) != v for k, v in changes.items()):
            self.rlguard_objective = dataclasses.replace(base, **changes)

    def _compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # (B, T)
        logprobs, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([prompt_mask, completion_mask], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _FORWARD_KEYS},
        )  # (B, T), (B, T), () or None
        training = self._training()
        accumulation = self.current_gradient_accumulation_steps if training else 1
        batch = self._policy_batch(inputs, logprobs, entropies, mask)
        out = self.rlguard_objective(batch, **self._normalisers(inputs, logprobs, mask, accumulation))
        if training and self.rlguard_guard is not None:
            collect_step_stats(batch=batch, output=out, stats=self._rlguard_step_stats)
        loss = out.loss
        mode = "train" if training else "eval"
        if self._entropy_bonus_enabled:
            # TRL's bonus: coef * (token mean of the entropy over this micro-batch) / GA, whatever the loss_type
            fmask = mask.to(entropies.dtype)
            mean_entropy = aggregate(entropies, fmask, "token-mean", num_tokens=fmask.sum().clamp(min=1) * accumulation)
            loss = loss - self.entropy_coef * mean_entropy
            policy_loss = self.accelerator.gather(out.loss.detach() * accumulation).mean().item()
            self._metrics[mode]["policy_loss"].append(policy_loss)
            if training and self.accelerator.sync_gradients:
                self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._log_rlguard_metrics(mode, out.metrics, mask, accumulation)
        return loss

    def _training(self) -> bool:
        """TRL's mode switch: ``self.model.training``."""
        return self.model is not None and bool(self.model.training)

    def _policy_batch(
        self, inputs: Mapping[str, Any], logprobs: Tensor, entropies: Tensor, mask: Tensor
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

    def _log_rlguard_metrics(self, mode: str, metrics: Mapping[str, Tensor], mask: Tensor, accumulation: int) -> None:
        """Reduce the objective's metrics over processes (one gather) and log them, also under TRL's keys."""
        names = sorted(metrics)
        count = mask.sum().to(torch.float64)
        local = torch.stack([*(metrics[n].detach().to(torch.float64) for n in names), count]).unsqueeze(0)
        gathered = self.accelerator.gather(local)  # (W, K + 1)
        values = _reduce_over_processes(names, gathered[:, :-1], gathered[:, -1]).tolist()
        reduced = dict(zip(names, values, strict=True))
        reduced["loss"] = reduced["loss"] * accumulation  # the micro-batch's share at the scale of one step
        for name, value in reduced.items():
            self._metrics[mode][f"rlguard/{name}"].append(value)
        for name, key in _trl_keys(self.rlguard_objective, self.beta != 0.0).items():
            if name in reduced:
                self._metrics[mode][key].append(reduced[name])


def _reduce_over_processes(names: list[str], values: Tensor, counts: Tensor) -> Tensor:
    """Per metric: max of ``*_max``, min of ``*_min``, sum of ``nonfinite``, mean of ``loss`` (each process
    holds its share), else the token-weighted mean. values ``(W, K)``, counts ``(W,)``; returns ``(K,)``."""
    weights = counts / counts.sum().clamp(min=1.0)  # (W,)
    out = []
    for k, name in enumerate(names):
        column = values[:, k]
        if name.endswith("_max"):
            out.append(column.max())
        elif name.endswith("_min"):
            out.append(column.min())
        elif name == "nonfinite":
            out.append(column.sum())
        elif name == "loss":
            out.append(column.mean())
        else:
            out.append((column * weights).sum())
    return torch.stack(out)


def _trl_keys(objective: Objective, with_kl: bool) -> dict[str, str]:
    """Canonical metric -> the key TRL's own _compute_loss logs it under, for this objective."""
    keys = {"entropy": "entropy"}
    if with_kl:
        keys["kl_ref"] = "kl"
    if isinstance(objective, CISPO):
        keys["clip_frac_high"] = "cispo_clip_ratio"
    elif not isinstance(objective, SAPO):
        keys.update(
            {
                "clip_frac_low": "clip_ratio/low_mean",
                "clip_frac_high": "clip_ratio/high_mean",
                "clip_frac": "clip_ratio/region_mean",
            }
        )
    return keys


# ---------------------------------------------------------------- compatibility
#: The parameters GuardedGRPOTrainer relies on, per private GRPOTrainer method.
_EXPECTED_SIGNATURES: dict[str, tuple[str, ...]] = {
    "_compute_loss": ("self", "model", "inputs"),
    "_get_per_token_logps_and_entropies": ("self", *_LOGPS_ARGS, *_FORWARD_KEYS),
}


def check_trl_compatibility() -> None:
    """Raise ``RuntimeError`` naming the supported TRL range if a private method the trainer uses has changed."""
    for method, expected in _EXPECTED_SIGNATURES.items():
        fn = getattr(GRPOTrainer, method, None)
        params = () if fn is None else tuple(inspect.signature(fn).parameters)
        exact = method == "_compute_loss"
        ok = params == expected if exact else set(expected) <= set(params)
        if not ok:
            raise RuntimeError(
                f"rlguard's GuardedGRPOTrainer supports trl{SUPPORTED_TRL}; the installed trl {trl.__version__} "
                f"has GRPOTrainer.{method}{params if fn is not None else ' missing'}, expected "
                f"{'exactly ' if exact else 'at least '}{expected}. Install a supported trl or use trl.GRPOTrainer."
            )
