"""How a TRL ``GRPOConfig`` translates into an rlguard objective: pure, imports no framework and no other rlguard
layer than the objectives.

:func:`map_trl_config` is the whole translation. What depends on the objective is declared by the objective
(``Objective.trl``, ``ratio_level``, ``sequence_variant``: ``docs/design.md``, "Objectives describe
themselves"), so a plugin objective is translated like a built-in:

- ``objective=None``: the objective of ``loss_type``: grpo and bnpo -> ``grpo``, dr_grpo, dapo, sapo, luspo,
  vespo, and cispo;
- ``importance_sampling_level="sequence"``: an objective with a sequence-level ratio (gspo, gspo_token, luspo,
  gmpo, vespo) stays itself, one that declares a ``sequence_variant`` becomes it (grpo, dapo and dr_grpo become
  ``gspo``), the others are refused; TRL's luspo at ``"token"`` (TRL warns) is ``grpo`` with luspo's aggregation;
- the objective's own TRL settings (``Objective.trl.fields``): ``epsilon``, ``epsilon_high`` -> ``clip_low``,
  ``clip_high`` of the GRPO family and Clip-Cov; CISPO's ``clip_high`` is the absolute cap ``epsilon_high``
  (``fixed``: ``bounds="absolute"``); ``delta`` (TRL's two-sided clip) -> ``clip_c``, the dual clip, which it
  equals when ``delta >= 1 + epsilon_high``; ``sapo_temperature_pos``/``_neg`` -> ``tau_pos``/``tau_neg``;
  ``vespo_k_pos`` ... ``vespo_lambda_neg`` -> VESPO's ``k_pos`` ... ``lambda_neg``; GMPO (log-space clip) keeps
  its own. A setting the objective declares ``unsupported`` is refused (vLLM importance-sampling correction with
  VESPO: TRL folds it into VESPO's weight);
- ``beta``, ``use_bias_correction_kl`` -> ``beta`` with ``kl_estimator="k3"``, ``kl_unbiased``;
- ``off_policy_mask_threshold`` -> ``off_policy_mask_delta``;
- ``top_entropy_quantile < 1``: TRL's own ``get_high_entropy_mask`` weights the objective's policy term (not the
  KL term, not the normalisers) and the entropy bonus, as in TRL (in the trainer, per micro-batch);
- ``use_adaptive_entropy``: the guard's ``adaptive_entropy`` intervention (Skywork-OR1's controller, TRL's own:
  :func:`adaptive_entropy_settings` maps ``entropy_coef``, ``entropy_coef_min``/``_max``/``_delta`` and
  ``entropy_target`` onto it), which ``GuardedGRPOTrainer`` runs in place of TRL's; refused with
  ``top_entropy_quantile < 1`` (TRL measures the entropy of the masked tokens only, the guard of all);
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

import functools
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rlguard.core_losses import Objective, get_objective
from rlguard.core_losses.registry import objective_class

if TYPE_CHECKING:
    from trl.trainer.grpo_config import GRPOConfig

__all__ = [
    "LOSS_TYPE_AGGREGATION",
    "LOSS_TYPE_OBJECTIVE",
    "TRLLossMapping",
    "adaptive_entropy_settings",
    "map_trl_config",
    "needs_rollout_logprobs",
    "paper_trl_settings",
]

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
#: TRL loss types whose token-level variant is another objective (TRL's luspo at token level: the token ratio, the
#: PPO clip, LUSPO's per-sequence token sum)
_TOKEN_LEVEL_OBJECTIVE = {"luspo": "grpo"}
#: Aggregations that weight a sequence by its token count.
_TOKEN_SUMMED = ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
#: TRL's settings an objective may declare it reads (``Objective.trl.fields``) whose value TRL resolves first
_EPSILONS = ("epsilon", "epsilon_high")
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
        """The objective instance, constructed once (:func:`map_trl_config` builds it to validate the values)."""
        return self._instance

    @functools.cached_property
    def _instance(self) -> Objective:
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
        **_objective_kwargs(args, cls, warn),
        **_rollout_kwargs(args, cls),
    }
    kwargs.update(user)
    _check_rollout_logprobs(args, kwargs)
    mapping = TRLLossMapping(name, kwargs, _normaliser(args, kwargs["aggregation"], "aggregation" in user))
    objective = mapping.build()  # validates every value now, at configuration time
    if warn:
        _warn_on_known_differences(args, cls, mapping, objective)
    return mapping


def adaptive_entropy_settings(args: GRPOConfig) -> dict[str, Any] | None:
    """The fields of the guard's ``adaptive_entropy`` intervention (:class:`~rlguard.guards.interventions.entropy_coef.
    AdaptiveEntropy`) that TRL's ``use_adaptive_entropy=True`` means, or None when it is off: TRL's ``entropy_coef``
    is the initial coefficient, ``entropy_coef_min``/``_max`` its bounds, ``entropy_coef_delta`` its step and
    ``entropy_target`` the target."""
    if not args.use_adaptive_entropy:
        return None
    return {
        "target": args.entropy_target,
        "delta": args.entropy_coef_delta,
        "coef_min": args.entropy_coef_min,
        "coef_max": args.entropy_coef_max,
        "initial_coef": args.entropy_coef,
    }


def paper_trl_settings(objective: str) -> dict[str, Any]:
    """The TRL settings under which :func:`map_trl_config` gives ``objective`` its own (its paper's) clip range and
    aggregation: ``epsilon``/``epsilon_high`` from the objective's default bounds (GRPO family; CISPO's absolute
    cap), and the ``loss_type`` whose aggregation is the objective's default. ``GuardedGRPOConfig`` fills the ones
    the user did not set. SAPO and GMPO take no clip range from TRL; an aggregation no ``loss_type`` has is
    returned as ``{"aggregation": ...}`` for ``objective_kwargs``.

    >>> paper_trl_settings("gspo")
    {'epsilon': 0.0003, 'epsilon_high': 0.0004, 'loss_type': 'grpo'}
    """
    cls = objective_class(objective)
    defaults = cls.hyperparameters()
    # the clip range of the epsilons the objective reads: its fields' defaults, or what it declares for TRL
    out: dict[str, Any] = {setting: defaults[f] for f, setting in cls.trl.fields.items() if setting in _EPSILONS}
    out.update({k: v for k, v in cls.trl.paper.items() if k in _EPSILONS})
    # the loss type of this objective first (dapo -> dapo), then one of the same aggregation (gspo -> grpo); bnpo
    # last: its normaliser is the micro-batch's own tokens
    order = sorted(LOSS_TYPE_AGGREGATION, key=lambda t: (LOSS_TYPE_OBJECTIVE[t] != objective, t == "bnpo"))
    loss_type = next((t for t in order if LOSS_TYPE_AGGREGATION[t] == defaults["aggregation"]), None)
    if loss_type is None:
        out["aggregation"] = defaults["aggregation"]
    else:
        out["loss_type"] = loss_type
    return out


def needs_rollout_logprobs(kwargs: dict[str, Any]) -> list[str]:
    """The objective arguments among ``kwargs`` that need the rollout engine's log-probs (``rollout_is``,
    ``rollout_mask``), as ``name=value`` strings; empty if none."""
    return [f"{k}={kwargs[k]!r}" for k in ("rollout_is", "rollout_mask") if kwargs.get(k) is not None]


def _check_rollout_logprobs(args: GRPOConfig, kwargs: dict[str, Any]) -> None:
    """Rollout corrections need log-probs from a rollout engine, which TRL passes only when it generates with vLLM."""
    needed = needs_rollout_logprobs(kwargs)
    if needed and not args.use_vllm:
        raise ValueError(
            f"objective_kwargs {', '.join(needed)} corrects for the rollout engine's log-probs, but use_vllm=False: "
            "TRL then generates with the trained model itself and passes no rollout log-probs, so the first step "
            "would fail. Set use_vllm=True (TRL's vLLM generation reports them), or remove "
            f"{' and '.join(n.split('=')[0] for n in needed)} from objective_kwargs."
        )


def _reject_unsupported(args: GRPOConfig) -> None:
    if args.use_adaptive_entropy and args.top_entropy_quantile < 1.0:
        raise NotImplementedError(
            f"use_adaptive_entropy=True with top_entropy_quantile={args.top_entropy_quantile}: TRL's controller then "
            "measures the entropy of the high-entropy tokens only, while the guard's adaptive_entropy reads the "
            "step's entropy over all completion tokens, so the coefficient would follow another entropy. Use "
            "top_entropy_quantile=1.0, or a fixed entropy_coef."
        )
    if args.importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            f"importance_sampling_level must be 'token' or 'sequence'; got {args.importance_sampling_level!r}."
        )


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
        if args.importance_sampling_level == "token":
            return _TOKEN_LEVEL_OBJECTIVE.get(args.loss_type, name)
    cls = objective_class(name)
    if args.importance_sampling_level == "sequence" and cls.ratio_level != "sequence":
        if cls.sequence_variant is None:
            raise NotImplementedError(
                f"importance_sampling_level='sequence' with objective {name!r}: rlguard's {name} has a token-level "
                "ratio only. Use an objective with a sequence-level ratio (gspo, gspo_token, luspo, gmpo, vespo) or "
                "one that has a sequence-level variant (grpo, dapo, dr_grpo: gspo)."
            )
        return cls.sequence_variant
    return name


def _trl_setting(args: GRPOConfig, setting: str) -> Any:
    """TRL's value of ``setting``, resolved as TRL resolves it (``epsilon_high`` unset: ``epsilon``)."""
    if setting == "epsilon_high":
        return args.epsilon if args.epsilon_high is None else args.epsilon_high
    return getattr(args, setting)


def _objective_kwargs(args: GRPOConfig, cls: type[Objective], warn: bool) -> dict[str, Any]:
    """The objective's own TRL settings (``cls.trl``) in its own terms."""
    fields = cls.trl.fields
    kwargs = {field: _trl_setting(args, setting) for field, setting in fields.items()}
    delta, epsilon_high = args.delta, _trl_setting(args, "epsilon_high")
    # TRL: coef_1 <- min(r, delta) before -min(coef_1 A, clip(r) A). For A > 0 and delta >= 1 + eps_high the
    # clipped branch is already the smaller one wherever r > delta, so nothing changes; for A < 0 the loss is
    # -A max(min(r, delta), clip(r)) = -A min(max(r, clip(r)), delta), the dual clip with c = delta.
    if "delta" in fields.values() and delta is not None and delta < 1.0 + epsilon_high:
        raise ValueError(
            f"delta={delta} is below 1 + epsilon_high = {1.0 + epsilon_high}: TRL's two-sided clip then also cuts "
            "positive-advantage ratios below the clip range, which rlguard's dual clip (clip_c) does not do. "
            f"Use delta >= {1.0 + epsilon_high} (INTELLECT-2 recommends delta > 1 + epsilon)."
        )
    if "delta" not in fields.values() and delta is not None and warn:
        warnings.warn(
            f"delta={delta} is ignored by objective {cls.name!r} (TRL ignores it for cispo and sapo too).",
            UserWarning,
            stacklevel=4,
        )
    return {**kwargs, **cls.trl.fixed}


def _rollout_kwargs(args: GRPOConfig, cls: type[Objective]) -> dict[str, Any]:
    """TRL's vLLM importance-sampling correction as rollout_is/rollout_mask.

    TRL's ``*_truncate`` modes weight by ``min(rho, C_max)``; its ``*_mask`` modes weight by ``rho`` and zero it
    outside ``[C_min, C_max]``, which is rollout_mask plus rollout_is with the cap ``C_max`` (inactive on kept
    tokens). ``rho`` is per token, or the product over the sequence for ``sequence_*``.
    """
    if not (args.use_vllm and args.vllm_importance_sampling_correction):
        return {}
    why = cls.trl.unsupported.get("vllm_importance_sampling_correction")
    if why is not None:
        raise NotImplementedError(
            f"objective {cls.name!r} with vLLM importance-sampling correction: {why}. Set "
            "vllm_importance_sampling_correction=False, or use another objective."
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


def _warn_on_known_differences(
    args: GRPOConfig, cls: type[Objective], mapping: TRLLossMapping, objective: Objective
) -> None:
    aggregation = mapping.kwargs["aggregation"]
    sequence_ratio = cls.ratio_level == "sequence"
    # length-weighted on purpose where the objective's own aggregation sums over tokens (LUSPO, VESPO)
    own = cls.hyperparameters()["aggregation"]
    if sequence_ratio and own not in _TOKEN_SUMMED and aggregation in _TOKEN_SUMMED:
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
    if sequence_ratio and mapping.kwargs.get("rollout_mask") == "token":
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
    high = objective.ratio_bounds()[1]
    if "epsilon_high" in cls.trl.fields.values() and high is not None and high <= 1.0:
        warnings.warn(
            f"objective {cls.name!r} bounds the importance ratio from above at {high:g} (epsilon_high="
            f"{_trl_setting(args, 'epsilon_high')}): every token whose ratio rose gets the same capped weight or "
            "clipped term. For cispo (TRL's absolute cap) TRL and ScaleRL recommend epsilon_high=5.0.",
            UserWarning,
            stacklevel=3,
        )
