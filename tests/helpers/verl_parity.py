"""Float64 (B, T) inputs and verl's ``ActorConfig`` for parity with verl's own policy losses, and the data-parallel
split verl's engine makes (2 ranks x 2 micro-batches, ``global_batch_info``). Imports verl: import it after
``pytest.importorskip("verl")``."""

from __future__ import annotations

from typing import Any

import torch
from verl.workers.config import ActorConfig, PolicyLossConfig

RTOL, ATOL = 1e-6, 1e-9
VERL_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
B, T = 8, 9  # global batch: 2 ranks x 2 micro-batches x 2 sequences
DP, MICRO = 2, 2
LOSS_SCALE_FACTOR = 16


def actor_config(policy_loss: PolicyLossConfig | None = None, **overrides: Any) -> ActorConfig:
    """verl's ActorConfig with the GSPO-like clip range our data exercise on both sides."""
    values: dict[str, Any] = {
        "strategy": "fsdp",
        "rollout_n": 1,
        "ppo_micro_batch_size_per_gpu": 1,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 3.0,
        "tau_pos": 1.0,
        "tau_neg": 1.05,
    }
    values.update(overrides)
    if policy_loss is not None:
        values["policy_loss"] = policy_loss
    return ActorConfig(**values)


def make_inputs(token_advantages: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """Float64 (B, T) inputs: ragged right-padded masks with one empty row, garbage in the padding of the
    log-probs, log-ratios wide enough (std 0.7) for PPO's clip and the dual clip (ratio > 3) to act.

    The garbage is finite: verl's gspo and seq-mean aggregations multiply by the mask, so NaN there would
    turn verl's own loss into NaN."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 3, 7, 1, 5, 0, 9, 4])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T) bool, as verl's ppo_loss passes it
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3  # (B, T)
    log_prob = old + 0.7 * torch.randn(B, T, generator=g, dtype=torch.float64)
    scores = torch.randn(B, 1, generator=g, dtype=torch.float64)
    log_prob[:, 0] = torch.where(scores[:, 0] < 0, old[:, 0] + 1.6, log_prob[:, 0])  # ratio 4.95 > clip_ratio_c
    log_prob = torch.where(mask, log_prob, torch.full_like(log_prob, 5.0))
    noise = torch.randn(B, T, generator=g, dtype=torch.float64) if token_advantages else 0.0
    advantages = (scores + noise) * mask  # (B, T): verl broadcasts sequence advantages over the response
    return {"old_log_prob": old, "log_prob": log_prob, "advantages": advantages, "response_mask": mask}


def dp_info(inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What verl's engine writes into config.global_batch_info on each of DP ranks: global counts."""
    return {
        "dp_size": DP,
        "batch_num_tokens": int(inputs["response_mask"].sum()),
        "global_batch_size": B,
        "loss_scale_factor": LOSS_SCALE_FACTOR,
    }


def micro_batches() -> list[slice]:
    """Rank r holds rows [4r, 4r + 4), in micro-batches of 2."""
    return [slice(start, start + MICRO) for start in range(0, B, MICRO)]
