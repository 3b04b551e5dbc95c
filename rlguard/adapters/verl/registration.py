"""Every rlguard objective in verl's policy-loss registry as ``rlguard.<name>``, plain or guarded by its config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor
from verl.trainer.ppo import core_algos

from rlguard.adapters.verl.guarded import GuardedPolicyLossConfig, guarded_policy_loss
from rlguard.adapters.verl.loss import VerlLossInputs, policy_loss
from rlguard.adapters.verl.mapping import config_get, loss_mode
from rlguard.core_losses import list_objectives

__all__ = ["register"]


def _loss_fn(name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """The function verl calls for ``rlguard.<name>``, with the exact signature of verl's own losses (the only
    place rlguard writes it): its arguments as :class:`VerlLossInputs`, to the guarded or the plain loss."""

    def loss_fn(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        inputs = VerlLossInputs(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
        )
        guarded = isinstance(config_get(config, "policy_loss"), GuardedPolicyLossConfig)
        return (guarded_policy_loss if guarded else policy_loss)(name, inputs)

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
