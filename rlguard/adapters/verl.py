"""verl adapter: every rlguard objective in verl's policy-loss registry as ``rlguard.<name>``.

Nothing to import or call: with rlguard installed, verl registers the losses on ``import verl``::

    python -m verl.trainer.main_ppo ... actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo

rlguard declares this module in verl's ``verl.plugins`` entry-point group, which verl imports in every process,
Ray workers included, unless ``VERL_USE_EXTERNAL_PLUGINS=none``. Where entry points are off,
``actor_rollout_ref.model.external_lib=rlguard.adapters.verl`` or ``VERL_USE_EXTERNAL_MODULES=rlguard.adapters.verl``
do the same.

Each ``rlguard.<name>`` has verl's calling convention (keyword arguments ``old_log_prob, log_prob, advantages,
response_mask, loss_agg_mode, config, rollout_is_weights``; returns ``(loss, metrics)``) and only translates; the
math is :mod:`rlguard.core_losses`. :func:`objective_hyperparameters` and :func:`normalisers` are the translation:

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

With ``policy_loss._target_=rlguard.adapters.verl_guard.GuardedPolicyLossConfig`` the same ``rlguard.<name>``
runs guarded (poisoned sequences masked, micro-batch skipping, the guard's clip range):
:mod:`rlguard.adapters.verl_guard`.

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
  micro-batch maxima.

verl adds its KL loss (``use_kl_loss``) and entropy bonus (``entropy_coeff``) around the policy loss, as for its
own losses. Mismatch correction is verl's ``algorithm.rollout_correction`` (TIS, MIS, IcePop), computed on the
driver: the loss receives its ``rollout_is_weights`` and rejection-masked ``response_mask``, never the rollout
engine's log-probs, so rlguard's ``rollout_is``/``rollout_mask`` cannot run inside verl.

Importing this module also lets verl 0.9.1 build models with TRL >= 1.0 installed
(:func:`patch_verl_trl_value_head_check`).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor
from verl.trainer.ppo import core_algos
from verl.workers.config import PolicyLossConfig

from rlguard.core_losses import GMPO, GSPO, SAPO, Objective, PolicyBatch, kl_estimate, list_objectives, masked_mean
from rlguard.core_losses.aggregation import AGGREGATIONS, Normaliser
from rlguard.core_losses.batch import NONFINITE_POLICIES, PreparedBatch
from rlguard.core_losses.ratios import Surrogate
from rlguard.core_losses.registry import objective_class

__all__ = [
    "LOSS_MODE_PREFIX",
    "VERL_LOSS_AGG_MODES",
    "RLGuardPolicyLossConfig",
    "loss_mode",
    "normalisers",
    "objective_hyperparameters",
    "patch_verl_trl_value_head_check",
    "policy_loss",
    "register",
]

logger = logging.getLogger(__name__)

#: verl's loss_mode of objective ``name`` is ``LOSS_MODE_PREFIX + name``.
LOSS_MODE_PREFIX = "rlguard."

#: The values verl's ActorConfig accepts for ``loss_agg_mode``.
VERL_LOSS_AGG_MODES: tuple[str, ...] = (*AGGREGATIONS, "token-sum")

#: Objectives whose verl counterpart ignores ``loss_agg_mode`` (``sapo``, ``geo_mean``): they keep their own.
_OWN_AGGREGATION: tuple[type[Objective], ...] = (SAPO, GMPO)

#: verl's ``policy_loss.*`` keys of its clip_cov, kl_cov and dro losses -> rlguard's names.
_POLICY_LOSS_KEYS = {
    "clip_cov_ratio": "clip_cov_ratio",
    "clip_cov_lb": "clip_cov_lb",
    "clip_cov_ub": "clip_cov_ub",
    "kl_cov_ratio": "kl_cov_ratio",
    "ppo_kl_coef": "kl_cov_coef",
    "dro_beta": "tau",
}

#: Keys of RLGuardPolicyLossConfig that go to the objective unchanged when set.
_PASSED_THROUGH = ("off_policy_mask_delta", "on_nonfinite")

#: rlguard's rollout corrections need the inference engine's log-probs, which verl does not give a policy loss.
_ROLLOUT_KEYS = ("rollout_is", "rollout_is_cap", "rollout_mask", "rollout_mask_low", "rollout_mask_high")


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
        rollout = sorted(set(self.objective_kwargs) & set(_ROLLOUT_KEYS))
        if rollout:
            raise ValueError(
                f"policy_loss.objective_kwargs sets {rollout}: verl does not pass the rollout engine's log-probs to "
                "a policy loss. Use verl's algorithm.rollout_correction (rollout_is, rollout_rs); its weights and "
                "rejection mask reach rlguard's loss as rollout_is_weights and response_mask."
            )


def loss_mode(name: str) -> str:
    """verl's ``loss_mode`` of objective ``name``: ``"rlguard.<name>"``."""
    return LOSS_MODE_PREFIX + name


def _get(config: Any, key: str, default: Any = None) -> Any:
    """``config.get(key, default)`` for verl's dataclass configs, DictConfigs and dicts alike."""
    if config is None:
        return default
    getter = getattr(config, "get", None)
    return getter(key, default) if callable(getter) else getattr(config, key, default)


def objective_hyperparameters(name: str, config: Any, loss_agg_mode: str) -> dict[str, Any]:
    """Constructor arguments of objective ``name`` from verl's actor ``config`` and ``loss_agg_mode``.

    Only the arguments the objective takes are returned; the rest keep the objective's defaults.
    """
    cls = objective_class(name)
    accepted = {f.name for f in dataclasses.fields(cls) if f.init}
    clip_ratio = _get(config, "clip_ratio", 0.2)
    low, high = _get(config, "clip_ratio_low"), _get(config, "clip_ratio_high")
    mapped: dict[str, Any] = {
        "clip_low": clip_ratio if low is None else low,
        "clip_high": clip_ratio if high is None else high,
        "tau_pos": _get(config, "tau_pos", 1.0),
        "tau_neg": _get(config, "tau_neg", 1.05),
    }
    if not issubclass(cls, GSPO):  # verl applies the dual clip in `vanilla` only, not in `gspo`
        mapped["clip_c"] = _get(config, "clip_ratio_c", 3.0)
    policy = _get(config, "policy_loss")
    mapped["is_cap"] = _get(config, "clip_ratio_c", 20.0)  # DPPO's truncation of the IS weight
    for theirs, ours in _POLICY_LOSS_KEYS.items():
        if _get(policy, theirs) is not None:
            mapped[ours] = _get(policy, theirs)
    if name == "dro" and "tau" not in dict(_get(policy, "objective_kwargs") or {}) and mapped.get("tau") is None:
        raise ValueError("policy_loss.dro_beta must be set (> 0) for rlguard.dro, as for verl's dro; got None.")
    aggregation = _get(policy, "aggregation")
    if aggregation is None and not issubclass(cls, _OWN_AGGREGATION):
        if loss_agg_mode not in VERL_LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {list(VERL_LOSS_AGG_MODES)}; got {loss_agg_mode!r}.")
        aggregation = "token-mean" if loss_agg_mode == "token-sum" else loss_agg_mode
    if aggregation is not None:
        mapped["aggregation"] = aggregation
    for key in _PASSED_THROUGH:
        if _get(policy, key) is not None:
            mapped[key] = _get(policy, key)
    hyperparameters = {key: value for key, value in mapped.items() if key in accepted}
    overrides = dict(_get(policy, "objective_kwargs") or {})
    unknown = sorted(set(overrides) - accepted)
    if unknown:
        raise ValueError(
            f"policy_loss.objective_kwargs has {unknown}, which objective {name!r} does not take; "
            f"it accepts: {', '.join(sorted(accepted))}."
        )
    return {**hyperparameters, **overrides}


@dataclasses.dataclass(frozen=True)
class Normalisers:
    """The normalisers of one micro-batch: ``objective(batch, num_tokens=..., num_sequences=...)``."""

    num_tokens: Normaliser | None
    num_sequences: Normaliser | None
    max_length: int | None


def normalisers(global_batch_info: Mapping[str, Any], loss_agg_mode: str, aggregation: str) -> Normalisers:
    """rlguard's normalisers from verl's ``global_batch_info`` (empty when verl gives none).

    verl's ``agg_loss`` divides the local sum by the global count and multiplies by ``dp_size`` (FSDP averages
    gradients over ranks); rlguard divides by the global count over ``dp_size``. Without global counts (a direct
    call, ``dp_size == 1``) both use the micro-batch's own counts.
    """
    dp_size = global_batch_info.get("dp_size") or 1
    batch_num_tokens = global_batch_info.get("batch_num_tokens")
    global_batch_size = global_batch_info.get("global_batch_size")
    if loss_agg_mode == "token-sum" and aggregation == "token-mean":
        num_tokens: Normaliser | None = 1 / dp_size
    elif batch_num_tokens is not None:
        num_tokens = batch_num_tokens / dp_size
    else:
        num_tokens = None
    num_sequences = None if global_batch_size is None else global_batch_size / dp_size
    if dp_size > 1 and aggregation == "token-mean" and num_tokens is None:
        raise ValueError(_missing_count(dp_size, "batch_num_tokens"))
    if dp_size > 1 and aggregation != "token-mean" and num_sequences is None:
        raise ValueError(_missing_count(dp_size, "global_batch_size"))
    return Normalisers(num_tokens, num_sequences, global_batch_info.get("loss_scale_factor"))


def _missing_count(dp_size: int, key: str) -> str:
    return (
        f"config.global_batch_info has dp_size={dp_size} but no {key}: with data parallelism the loss needs the "
        "mini-batch's global count to be independent of the split (verl's agg_loss raises too)."
    )


_WITH_TOKEN_WEIGHTS: dict[type[Objective], Callable[..., Objective]] = {}


def _with_token_weights(cls: type[Objective]) -> Callable[..., Objective]:
    """``cls`` whose per-token policy terms are multiplied by ``token_weights``, as verl applies
    ``rollout_is_weights``: after the surrogate, before KL, entropy and aggregation. One subclass per class."""
    if cls in _WITH_TOKEN_WEIGHTS:
        return _WITH_TOKEN_WEIGHTS[cls]

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class WithTokenWeights(cls):  # type: ignore[valid-type, misc]  # a class built at run time
        token_weights: Tensor | None = None  # (B, T), detached

        def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
            terms: Surrogate = super().surrogate(log_ratio, batch, mask)
            if self.token_weights is None:
                return terms
            return dataclasses.replace(terms, loss=terms.loss * self.token_weights.to(terms.loss.dtype))

    WithTokenWeights.__name__ = WithTokenWeights.__qualname__ = f"{cls.__name__}WithTokenWeights"
    _WITH_TOKEN_WEIGHTS[cls] = WithTokenWeights
    return WithTokenWeights


def policy_loss(
    name: str,
    *,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """rlguard objective ``name`` with verl's calling convention. All tensors ``(B, T)``.

    Returns:
        ``(loss, metrics)``: the 0-dim loss of this micro-batch (its share of the mini-batch loss under
        ``config.global_batch_info``) and verl-named plus ``rlguard/``-prefixed canonical metrics, as floats.
    """
    if config is None:
        raise ValueError(f"policy loss {loss_mode(name)!r} needs verl's actor config; got config=None.")
    hyperparameters = objective_hyperparameters(name, config, loss_agg_mode)
    cls = objective_class(name)
    aggregation = hyperparameters.get("aggregation", _field_default(cls, "aggregation"))
    norm = normalisers(_get(config, "global_batch_info") or {}, loss_agg_mode, aggregation)
    if norm.max_length is not None and "max_length" not in hyperparameters:
        hyperparameters["max_length"] = norm.max_length
    if rollout_is_weights is not None:
        # padding may hold anything; 1 keeps a NaN there from reaching the loss through 0 * NaN
        weights = torch.where(response_mask.bool(), rollout_is_weights.detach(), torch.ones_like(rollout_is_weights))
        objective = _with_token_weights(cls)(token_weights=weights, **hyperparameters)
    else:
        objective = cls(**hyperparameters)
    batch = PolicyBatch(logprobs=log_prob, advantages=advantages, mask=response_mask, old_logprobs=old_log_prob)
    out = objective(batch, num_tokens=norm.num_tokens, num_sequences=norm.num_sequences)
    return out.loss, _verl_metrics(out.metrics, old_log_prob, log_prob, response_mask)


def _field_default(cls: type[Objective], name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


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


def _loss_fn(name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """The function verl calls for ``rlguard.<name>``, with the exact keyword signature of verl's own losses."""

    def loss_fn(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        loss = policy_loss
        if getattr(_get(config, "policy_loss"), "rlguard_guarded", False):  # verl_guard.GuardedPolicyLossConfig
            from rlguard.adapters.verl_guard import guarded_policy_loss as loss
        return loss(
            name,
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )

    loss_fn.__name__ = loss_fn.__qualname__ = f"rlguard_{name}"
    loss_fn.__doc__ = f"rlguard objective {name!r} as a verl policy loss; see rlguard.adapters.verl."
    loss_fn.rlguard_objective = name  # type: ignore[attr-defined]  # marks our registrations
    return loss_fn


def register() -> list[str]:
    """Register every rlguard objective (built-in and from plugins) as ``rlguard.<name>``; returns the modes.

    Idempotent. A different function already registered under an ``rlguard.`` name raises ``ValueError``
    (verl's ``register_policy_loss`` would overwrite it silently).
    """
    modes = []
    for name in list_objectives():
        mode = loss_mode(name)
        existing = core_algos.POLICY_LOSS_REGISTRY.get(mode)
        if existing is None:
            core_algos.register_policy_loss(mode)(_loss_fn(name))
        elif getattr(existing, "rlguard_objective", None) != name:
            raise ValueError(
                f"verl's policy-loss registry already holds {mode!r} ({existing!r}), not rlguard's objective "
                f"{name!r}: another package registered it. Remove that registration or rename the objective."
            )
        modes.append(mode)
    return modes


_VALUE_HEAD_MODULES = ("trl.experimental.ppo", "trl")


def _trl_value_head_available() -> bool:
    """True when TRL is installed and still has ``AutoModelForCausalLMWithValueHead`` where verl imports it."""
    from verl.utils.import_utils import is_trl_available

    if not is_trl_available():
        return False
    for module in _VALUE_HEAD_MODULES:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
            try:
                if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                    return True
            except ImportError:
                continue
    return False


def patch_verl_trl_value_head_check() -> None:
    """Let verl 0.9.1's ``apply_monkey_patch`` run with TRL >= 1.0 installed.

    ``apply_monkey_patch`` (verl/models/transformers/monkey_patch.py), called for every model verl's FSDP engine
    builds, imports ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo`` or ``trl`` whenever TRL
    is installed, only to replace that class's ``state_dict``; TRL 1.x removed the class, so the import raises and
    the engine fails. This rebinds the ``is_trl_available`` name in that one module to "TRL is installed and has
    the class": the patch still runs wherever the class exists, and is skipped where no model of that class can
    exist. Nothing else in verl or TRL changes. Idempotent.
    """
    from verl.models.transformers import monkey_patch

    # verl's module imports the name without re-exporting it, and types it as functools.cache's wrapper
    monkey_patch.is_trl_available = _trl_value_head_available  # type: ignore[attr-defined, assignment]


def _on_import() -> None:
    # verl loads entry points with `except Exception: logger.debug(...)`, which would hide a failure here and
    # leave users with "Unsupported loss mode: rlguard.gspo"; say why at WARNING first.
    try:
        register()
        patch_verl_trl_value_head_check()
    except Exception:
        logger.warning("rlguard could not register its losses with verl", exc_info=True)
        raise


_on_import()
