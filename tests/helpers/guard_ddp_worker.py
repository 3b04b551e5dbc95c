"""Worker of tests/guards/stats/test_reduction_ddp.py: 2 ranks with different local data reduce stats once per step
and decide."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from rlguard.core_losses import PolicyBatch, get_objective
from rlguard.guards import Guard, GuardConfig, StepStats, collect_step_stats
from rlguard.guards.decision import decision_action


def local_batch(step: int, rank: int) -> tuple[PolicyBatch, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    rows, cols = (3, 9) if rank == 0 else (5, 4)  # unequal shapes and token counts on the two ranks
    lp = -torch.rand(rows, cols, generator=g, dtype=torch.float64)
    old = lp + 0.05 * torch.randn(rows, cols, generator=g, dtype=torch.float64)
    if step == 40 and rank == 1:
        lp[0, 1] = float("nan")  # poison only rank 1's data
    mask = torch.ones(rows, cols, dtype=torch.float64)
    adv = torch.randn(rows, generator=g, dtype=torch.float64)
    rewards = torch.rand(rows, generator=g, dtype=torch.float64)
    lengths = torch.full((rows,), cols)
    return PolicyBatch(logprobs=lp, advantages=adv, mask=mask, old_logprobs=old), rewards, lengths


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    objective = get_objective("grpo", on_nonfinite="mask")
    guard = Guard(GuardConfig.preset("default"))
    log = []
    for step in range(60):
        batch, rewards, lengths = local_batch(step, rank)
        out = objective(batch)
        st: StepStats = collect_step_stats(
            batch=batch, output=out, rewards=rewards, lengths=lengths, grad_norm=1.0 + 0.01 * (step % 7)
        )
        stats = st.reduce()
        decision = guard.observe(step, stats)
        log.append(
            {
                "stats": stats,
                "action": decision_action(decision),
                "lr_scale": decision.controls.lr_scale,
                "events": [e.to_dict() for e in decision.events],
            }
        )
    with open(f"{out_path}.{rank}", "w") as fh:
        json.dump(log, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
