"""How a TRL ``GRPOConfig`` translates into an rlguard objective: pure, imports no framework.

:func:`map_trl_config` is the whole translation:

- ``objective=None``: the objective of ``loss_type``: grpo and bnpo -> ``grpo``, dr_grpo, dapo, sapo, luspo,
  vespo, and cispo (with ``bounds="absolute"``, TRL's convention);
- ``importance_sampling_level="sequence"`` turns grpo, dapo and dr_grpo into ``gspo``; luspo at ``"token"`` (TRL
  warns) is ``grpo`` with luspo's aggregation; vespo's weight is per sequence at either level;
- ``vespo_k_pos``, ``vespo_lambda_pos``, ``vespo_k_neg``, ``vespo_lambda_neg`` -> VESPO's ``k_pos`` ... ``lambda_neg``
  (vLLM importance-sampling correction with vespo is refused: TRL folds it into VESPO's weight);
- ``epsilon``, ``epsilon_high`` -> ``clip_low``, ``clip_high`` of the GRPO family and Clip-Cov; CISPO's
  ``clip_high`` is the absolute cap ``epsilon_high``; GMPO (log-space clip) keeps its own;
- ``delta`` (TRL's two-sided clip) -> ``clip_c``, the dual clip, which it equals when ``delta >= 1 + epsilon_high``;
- ``beta``, ``use_bias_correction_kl`` -> ``beta`` with ``kl_estimator="k3"``, ``kl_unbiased``;
- ``sapo_temperature_pos``/``_neg`` -> ``tau_pos``/``tau_neg``;
- ``off_policy_mask_threshold`` -> ``off_policy_mask_delta``;
- ``top_entropy_quantile < 1``: TRL's own ``get_high_entropy_mask`` weights the objective's policy term (not the
  KL term, not the normalisers) and the entropy bonus, as in TRL (in the trainer, per micro-batch);
- ``use_adaptive_entropy`` is refused (TRL's controller is trainer state updated inside its loss);
- vLLM's ``*_truncate`` modes -> ``rollout_is``; ``*_mask`` modes -> ``rollout_mask`` plus ``rollout_is``;
- ``loss_type``, unless ``objective_kwargs`` names an ``aggregation``: grpo, sapo -> ``seq-mean-token-mean``;
  bnpo, dapo, cispo, vespo -> ``token-mean``; luspo -> ``seq-mean-token-sum``; dr_grpo ->
  ``seq-mean-token-sum-norm`` with ``max_length=max_completion_length``.

``objective_kwargs`` override every mapped value. Normalisers, with ``B`` the micro-batch's rows, ``GA`` the
current gradient-accumulation steps (1 in evaluation), ``W`` the number of processes (DDP averages gradients)
and ``N`` TRL's ``num_items_in_batch`` (the loss tokens of the whole generation batch on all processes):

- ``seq-mean-*``: ``num_sequences = B * GA`` (TRL's ``.mean()`` over rows, divided by ``GA``);
- ``token-mean`` from ``loss_type="bnpo"``: ``num_tokens`` = this micro-batch's loss tokens times ``GA``;
- any other ``token-mean``: ``num_tokens = N / W * GA / steps_per_generation`` (1 instead of the last factor in
  evaluation), TRL's normaliser of dapo and cispo.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rlguard.core_losses import CISPO, GMPO, GRPO, GSPO, LUSPO, SAPO, VESPO, ClipCov, Objective, get_objective
from rlguard.core_losses.registry import objective_class
from rlguard.guards.actuator import make_guard

if TYPE_CHECKING:
    from trl.trainer.grpo_config import GRPOConfig

__all__ = ["LOSS_TYPE_AGGREGATION", "LOSS_TYPE_OBJECTIVE", "TRLLossMapping", "map_trl_config"]

#: The TRL loss types rlguard reproduces, with the objective and aggregation each one means.
LOSS_TYPE_OBJECTIVE = {
    "grpo": "grpo",
    "bnpo": "grpo",
    "dr_grpo": "dr_grpo",
    "dapo": "dapo",
    "cispo": "cispo",
    "sapo": "sapo",
    "luspo": "luspo",
    "vespo": "vespo",
}
LOSS_TYPE_AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
    "cispo": "token-mean",
    "luspo": "seq-mean-token-sum",
    "vespo": "token-mean",
}
#: Objectives whose ratio is one per sequence, and aggregations that weight a sequence by its token count.
_SEQUENCE_RATIO = (GSPO, GMPO)
_TOKEN_SUMMED = ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
#: Token-ratio objectives that TRL's importance_sampling_level="sequence" turns into GSPO.
_TO_GSPO = ("grpo", "dapo", "dr_grpo")
#: Objectives whose own ratio ignores importance_sampling_level (VESPO's weight is always per sequence).
_OWN_RATIO_LEVEL = ("vespo",)
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
    if args.use_adaptive_entropy:
        raise NotImplementedError(
            "use_adaptive_entropy=True is not supported by GuardedGRPOTrainer: TRL's controller is trainer state that "
            "its _compute_loss updates at each accumulation boundary (a window-global entropy reduced across "
            "processes, saved with checkpoints), not a loss; rlguard's loss path does not run it, and copying it "
            "would be a second controller to keep in sync. Use a fixed entropy_coef, or schedule entropy_coef with "
            "the guard (GuardConfig(schedules={'entropy_coef': ...}))."
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
        if name == "luspo" and args.importance_sampling_level == "token":
            return "grpo"  # TRL's luspo at token level: the token ratio, PPO clip, LUSPO's per-sequence token sum
    if name in _OWN_RATIO_LEVEL:
        return name
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
    if issubclass(cls, ClipCov):  # Clip-Cov's PPO clip is TRL's
        return {"clip_low": args.epsilon, "clip_high": epsilon_high}
    if issubclass(cls, VESPO):
        return {
            "k_pos": args.vespo_k_pos,
            "lambda_pos": args.vespo_lambda_pos,
            "k_neg": args.vespo_k_neg,
            "lambda_neg": args.vespo_lambda_neg,
        }
    return {}


def _rollout_kwargs(args: GRPOConfig) -> dict[str, Any]:
    """TRL's vLLM importance-sampling correction as rollout_is/rollout_mask.

    TRL's ``*_truncate`` modes weight by ``min(rho, C_max)``; its ``*_mask`` modes weight by ``rho`` and zero it
    outside ``[C_min, C_max]``, which is rollout_mask plus rollout_is with the cap ``C_max`` (inactive on kept
    tokens). ``rho`` is per token, or the product over the sequence for ``sequence_*``.
    """
    if not (args.use_vllm and args.vllm_importance_sampling_correction):
        return {}
    if args.loss_type == "vespo" or getattr(args, "objective", None) == "vespo":
        raise NotImplementedError(
            "VESPO with vLLM importance-sampling correction: TRL folds the engine ratio into VESPO's sequence weight "
            "W (log W gains sum_t log rho_t); rlguard's rollout_is multiplies each token's term instead, which is a "
            "different estimator. Set vllm_importance_sampling_correction=False, or use another objective."
        )
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
    if issubclass(cls, _SEQUENCE_RATIO) and not issubclass(cls, LUSPO) and aggregation in _TOKEN_SUMMED:
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
