"""Float64 inputs through verl's policy-loss registry, for the guarded loss (``rlguard.gspo`` under
``GuardedPolicyLossConfig``) and verl's own losses on the same data and config. Imports verl: import it after
``pytest.importorskip("verl")``."""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from rlguard.adapters.verl import GuardedPolicyLossConfig

B, T = 4, 6

GLOBAL = {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": 8, "loss_scale_factor": None}


def actor(policy_loss: Any = None, **overrides: Any) -> ActorConfig:
    values: dict[str, Any] = {
        "strategy": "fsdp",
        "rollout_n": 1,
        "ppo_micro_batch_size_per_gpu": 1,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "loss_agg_mode": "seq-mean-token-mean",
        **overrides,
    }
    if policy_loss is not None:
        values["policy_loss"] = policy_loss
    config = ActorConfig(**values)
    config.global_batch_info.update(GLOBAL)
    return config


def guarded(**kwargs: Any) -> ActorConfig:
    return actor(GuardedPolicyLossConfig(loss_mode="rlguard.gspo", **kwargs))


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Per-sequence advantages; sequence log-ratios 0.18, -0.15, 0.25, -0.2 (plus noise) put rows 0 and 3
    inside verl's clip range [0.8, 1.28] and outside the halved one [0.9, 1.14]."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    offset = torch.tensor([0.18, -0.15, 0.25, -0.2], dtype=torch.float64).unsqueeze(1)
    log_prob = (old + offset + 0.01 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    lengths = torch.tensor([6, 4, 5, 3])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.tensor([1.0, -0.5, 0.8, -1.2], dtype=torch.float64).unsqueeze(1).expand(B, T) * mask
    return {"old_log_prob": old, "log_prob": log_prob, "advantages": adv.clone(), "response_mask": mask}


def run(
    mode: str, data: dict[str, torch.Tensor], config: ActorConfig
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    log_prob = data["log_prob"].detach().clone().requires_grad_()
    fn = core_algos.get_policy_loss_fn(mode)
    loss, metrics = fn(
        **{**data, "log_prob": log_prob}, loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None
    )
    loss.backward()
    assert log_prob.grad is not None
    return loss.detach(), log_prob.grad, metrics


def poison(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Row 1: NaN advantages (a NaN score); row 2: one Inf old log-prob."""
    bad = {key: value.detach().clone() for key, value in data.items()}
    bad["advantages"][1] = float("nan")
    bad["old_log_prob"][2, 1] = float("inf")
    return bad
