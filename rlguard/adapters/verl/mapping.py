"""How verl's actor config translates into an rlguard objective and its normalisers, and the guard's rollout
correction into verl's ``algorithm.rollout_correction``: pure, imports no framework.

Which of verl's keys set which fields is the objective's own declaration (``Objective.verl``: ``docs/design.md``,
"Objectives describe themselves"); this module resolves verl's keys as verl does (``clip_ratio`` where
``clip_ratio_low``/``_high`` are null, verl's defaults where a key is absent) and adds rlguard's own
``policy_loss`` keys. See :mod:`rlguard.adapters.verl` for the table of every key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlguard.core_losses.aggregation import AGGREGATIONS, Normaliser
from rlguard.core_losses.controls import Controls
from rlguard.core_losses.registry import objective_class

__all__ = [
    "LOSS_MODE_PREFIX",
    "ROLLOUT_KEYS",
    "VERL_LOSS_AGG_MODES",
    "Normalisers",
    "config_get",
    "engine_log_probs_beside_pi_old",
    "loss_mode",
    "normalisers",
    "objective_hyperparameters",
    "rollout_correction_fields",
]

#: verl's loss_mode of objective ``name`` is ``LOSS_MODE_PREFIX + name``.
LOSS_MODE_PREFIX = "rlguard."

#: The values verl's ActorConfig accepts for ``loss_agg_mode``.
VERL_LOSS_AGG_MODES: tuple[str, ...] = (*AGGREGATIONS, "token-sum")

#: verl's defaults of the actor keys objectives read, where a config (a plain dict) lacks them
_VERL_DEFAULTS = {"clip_ratio": 0.2, "clip_ratio_c": 3.0, "tau_pos": 1.0, "tau_neg": 1.05}
_POLICY_PREFIX = "policy_loss."

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


def verl_setting(config: Any, key: str, loss_agg_mode: str) -> Any:
    """verl's value of ``key`` (an actor key, ``loss_agg_mode`` or ``policy_loss.<key>``) as verl resolves it:
    ``clip_ratio`` where ``clip_ratio_low``/``_high`` are null, ``token-sum`` as ``token-mean`` (its normaliser is
    :func:`normalisers`'), verl's default where a key is absent; None where unset."""
    if key.startswith(_POLICY_PREFIX):
        return config_get(config_get(config, "policy_loss"), key[len(_POLICY_PREFIX) :])
    if key == "loss_agg_mode":
        if loss_agg_mode not in VERL_LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {list(VERL_LOSS_AGG_MODES)}; got {loss_agg_mode!r}.")
        return "token-mean" if loss_agg_mode == "token-sum" else loss_agg_mode
    if key in ("clip_ratio_low", "clip_ratio_high"):
        value = config_get(config, key)
        return config_get(config, "clip_ratio", _VERL_DEFAULTS["clip_ratio"]) if value is None else value
    return config_get(config, key, _VERL_DEFAULTS.get(key))


def objective_hyperparameters(name: str, config: Any, loss_agg_mode: str) -> dict[str, Any]:
    """Constructor arguments of objective ``name`` from verl's actor ``config`` and ``loss_agg_mode``: the keys its
    ``Objective.verl`` declares, then rlguard's ``policy_loss`` keys (``aggregation`` replaces ``loss_agg_mode``),
    then ``policy_loss.objective_kwargs``. Unset keys keep the objective's defaults."""
    cls = objective_class(name)
    accepted = set(cls.hyperparameters())
    policy = config_get(config, "policy_loss")
    overrides = dict(config_get(policy, "objective_kwargs") or {})
    aggregation = config_get(policy, "aggregation")
    mapped: dict[str, Any] = {}
    for field, key in cls.verl.fields.items():
        if field == "aggregation" and aggregation is not None:
            continue  # rlguard's policy_loss.aggregation replaces loss_agg_mode (and is not validated against it)
        value = verl_setting(config, key, loss_agg_mode)
        if value is None and key in cls.verl.required and field not in overrides:
            raise ValueError(f"{key} must be set for {loss_mode(name)}, as verl's own loss requires; got None.")
        if value is not None:
            mapped[field] = value
    if aggregation is not None:
        mapped["aggregation"] = aggregation
    for key in _PASSED_THROUGH:
        if config_get(policy, key) is not None:
            mapped[key] = config_get(policy, key)
    unknown = sorted(set(overrides) - accepted)
    if unknown:
        raise ValueError(
            f"policy_loss.objective_kwargs has {unknown}, which objective {name!r} does not take; "
            f"it accepts: {', '.join(sorted(accepted))}."
        )
    return {**mapped, **overrides}


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


# -- the guard's rollout correction as verl's algorithm.rollout_correction ------------------------------------
def engine_log_probs_beside_pi_old(config: Any) -> bool:
    """Whether verl's batches hold the engine's log-probs (``rollout_log_probs``, returned by the rollout where
    ``actor_rollout_ref.rollout.calculate_log_probs``) beside a pi_old the actor recomputed (verl's default: not
    ``algorithm.rollout_correction.bypass_mode``, which makes pi_old the engine's). Then, and only then, verl's
    trainers compute ``algorithm.rollout_correction`` on each batch."""
    rollout = config_get(config_get(config, "actor_rollout_ref"), "rollout")
    correction = config_get(config_get(config, "algorithm"), "rollout_correction")
    return bool(config_get(rollout, "calculate_log_probs", False)) and not config_get(correction, "bypass_mode", False)


def rollout_correction_fields(controls: Controls, configured: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of verl's ``algorithm.rollout_correction`` that carry the guard's ``controls`` over the run's
    ``configured`` one (None: the run has none); empty where they change nothing.

    ``rollout_is_cap = C`` is verl's token-level TIS, ``rollout_is="token"`` at ``rollout_is_threshold=C``, without
    batch normalisation: ``min(pi_old / mu, C)`` per token, rlguard's ``truncated_is_weights(..., "token", C)``,
    reaching the loss as ``rollout_is_weights``. As in :meth:`~rlguard.core_losses.Objective.with_controls`, a run
    that configured its own ``rollout_is`` keeps it. ``rollout_mask_high`` has no exact counterpart in verl 0.9.1:
    ``rollout_rs="seq_mean_k1"`` rejects on the same geometric mean and bounds ``[1/C, C]``, but it removes the
    rejected tokens from ``response_mask``, hence from the loss's normalisers (``batch_num_tokens``), where
    rlguard's mask keeps them in the count (and its mean divides by the token count plus 1e-8); it is not mapped.
    """
    if controls.rollout_is_cap is None or config_get(configured, "rollout_is") is not None:
        return {}
    return {
        "rollout_is": "token",
        "rollout_is_threshold": float(controls.rollout_is_cap),
        "rollout_is_batch_normalize": False,
    }
