"""How verl's actor config translates into an rlguard objective and its normalisers: pure, imports no framework.

See :mod:`rlguard.adapters.verl` for the table of every key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlguard.core_losses import GMPO, GSPO, SAPO, Objective
from rlguard.core_losses.aggregation import AGGREGATIONS, Normaliser
from rlguard.core_losses.registry import objective_class

__all__ = [
    "LOSS_MODE_PREFIX",
    "ROLLOUT_KEYS",
    "VERL_LOSS_AGG_MODES",
    "Normalisers",
    "config_get",
    "loss_mode",
    "normalisers",
    "objective_hyperparameters",
]

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
ROLLOUT_KEYS = ("rollout_is", "rollout_is_cap", "rollout_mask", "rollout_mask_low", "rollout_mask_high")


def loss_mode(name: str) -> str:
    """verl's ``loss_mode`` of objective ``name``: ``"rlguard.<name>"``."""
    return LOSS_MODE_PREFIX + name


def config_get(config: Any, key: str, default: Any = None) -> Any:
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
    clip_ratio = config_get(config, "clip_ratio", 0.2)
    low, high = config_get(config, "clip_ratio_low"), config_get(config, "clip_ratio_high")
    mapped: dict[str, Any] = {
        "clip_low": clip_ratio if low is None else low,
        "clip_high": clip_ratio if high is None else high,
        "tau_pos": config_get(config, "tau_pos", 1.0),
        "tau_neg": config_get(config, "tau_neg", 1.05),
    }
    if not issubclass(cls, GSPO):  # verl applies the dual clip in `vanilla` only, not in `gspo`
        mapped["clip_c"] = config_get(config, "clip_ratio_c", 3.0)
    mapped["is_cap"] = config_get(config, "clip_ratio_c", 20.0)  # DPPO's truncation of the IS weight
    policy = config_get(config, "policy_loss")
    for theirs, ours in _POLICY_LOSS_KEYS.items():
        if config_get(policy, theirs) is not None:
            mapped[ours] = config_get(policy, theirs)
    if name == "dro" and "tau" not in mapped and "tau" not in dict(config_get(policy, "objective_kwargs") or {}):
        raise ValueError("policy_loss.dro_beta must be set (> 0) for rlguard.dro, as for verl's dro; got None.")
    aggregation = config_get(policy, "aggregation")
    if aggregation is None and not issubclass(cls, _OWN_AGGREGATION):
        if loss_agg_mode not in VERL_LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {list(VERL_LOSS_AGG_MODES)}; got {loss_agg_mode!r}.")
        aggregation = "token-mean" if loss_agg_mode == "token-sum" else loss_agg_mode
    if aggregation is not None:
        mapped["aggregation"] = aggregation
    for key in _PASSED_THROUGH:
        if config_get(policy, key) is not None:
            mapped[key] = config_get(policy, key)
    hyperparameters = {key: value for key, value in mapped.items() if key in accepted}
    overrides = dict(config_get(policy, "objective_kwargs") or {})
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
