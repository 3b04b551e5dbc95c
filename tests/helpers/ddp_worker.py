"""Worker of tests/core_losses/test_ddp.py, run under ``torchrun --nproc_per_node 2`` on CPU (gloo).

Each rank computes an objective on its unequal share of one global batch with the global normalisers divided by
the world size; DistributedDataParallel averages the gradients. Rank 0 compares that gradient with the gradient
of the whole batch computed in one process without DDP, and writes the differences to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rlguard.core_losses import AGGREGATIONS, PolicyBatch, get_objective

VOCAB, HIDDEN = 11, 8
LENGTHS = [6, 1, 3, 0, 5, 2, 6]  # completion lengths; row 3 is empty
T = max(LENGTHS)
# rows of each rank: 2 rows / 7 tokens and 5 rows (one empty) / 16 tokens
SHARES = [slice(0, 2), slice(2, len(LENGTHS))]
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("grpo", {"beta": 0.04}),
    ("dapo", {}),
    ("gspo", {"clip_low": 0.05, "clip_high": 0.05}),
    ("dr_grpo", {"max_length": 8}),
]


class TinyPolicy(nn.Module):
    """Embedding and linear head over a small vocabulary: log pi(target_t | input_t)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.tanh(self.embed(inputs)))  # (B, T, V)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)


def global_batch(model: nn.Module) -> dict[str, torch.Tensor]:
    """The same batch on every rank (fixed seed); behaviour/reference log-probs perturb the model's."""
    g = torch.Generator().manual_seed(1234)
    b = len(LENGTHS)
    inputs = torch.randint(VOCAB, (b, T), generator=g)
    targets = torch.randint(VOCAB, (b, T), generator=g)
    with torch.no_grad():
        logprobs = model(inputs, targets)
    return {
        "inputs": inputs,
        "targets": targets,
        "mask": (torch.arange(T) < torch.tensor(LENGTHS)[:, None]).to(torch.float64),
        "advantages": torch.randn(b, generator=g, dtype=torch.float64),
        "old_logprobs": logprobs + 0.15 * torch.randn(b, T, generator=g, dtype=torch.float64),
        "ref_logprobs": logprobs + 0.3 * torch.randn(b, T, generator=g, dtype=torch.float64),
    }


def loss_on(model: nn.Module, data: dict[str, torch.Tensor], rows: slice, objective: Any, **norm: Any) -> torch.Tensor:
    batch = PolicyBatch(
        logprobs=model(data["inputs"][rows], data["targets"][rows]),
        advantages=data["advantages"][rows],
        mask=data["mask"][rows],
        old_logprobs=data["old_logprobs"][rows],
        ref_logprobs=data["ref_logprobs"][rows],
    )
    return objective(batch, **norm).loss


def gradient(model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == len(SHARES), world
    torch.manual_seed(0)
    model = TinyPolicy().to(torch.float64)
    reference = copy.deepcopy(model)  # the single-process model, same weights
    ddp = DistributedDataParallel(model)
    data = global_batch(reference)
    rows = SHARES[rank]

    # the step's counts, as an adapter would all-reduce them: the local counts summed over ranks
    local_mask = data["mask"][rows]
    counts = torch.stack([local_mask.sum(), (local_mask.sum(dim=-1) > 0).sum().to(torch.float64)])
    dist.all_reduce(counts)
    num_tokens, num_sequences = counts[0] / world, counts[1] / world

    results = []
    for name, kwargs in CONFIGS:
        for aggregation in AGGREGATIONS:
            objective = get_objective(name, aggregation=aggregation, **kwargs)
            local_loss = loss_on(ddp, data, rows, objective, num_tokens=num_tokens, num_sequences=num_sequences)
            ddp_grad = gradient(ddp, local_loss)
            loss_sum = local_loss.detach().clone()
            dist.all_reduce(loss_sum)  # sum of the ranks' shares = world * loss of the whole batch
            # the same step with each rank's own counts: wrong when the shares differ, as they do here
            naive_grad = gradient(ddp, loss_on(ddp, data, rows, objective))
            if rank == 0:
                full_loss = loss_on(reference, data, slice(None), objective)
                full_grad = gradient(reference, full_loss)
                results.append(
                    {
                        "objective": name,
                        "aggregation": aggregation,
                        "grad_max_abs_diff": (ddp_grad - full_grad).abs().max().item(),
                        "naive_grad_max_abs_diff": (naive_grad - full_grad).abs().max().item(),
                        "grad_max_abs": full_grad.abs().max().item(),
                        "loss": full_loss.detach().item(),
                        "loss_abs_diff": abs(loss_sum.item() / world - full_loss.detach().item()),
                    }
                )

    tokens = [torch.zeros((), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(tokens, local_mask.sum())
    if rank == 0:
        summary = {"world_size": world, "tokens_per_rank": [t.item() for t in tokens], "results": results}
        with open(args.out, "w") as f:
            json.dump(summary, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
