"""GuardedAsyncGRPOTrainer's loss against TRL's own ``AsyncGRPOTrainer.compute_loss`` on the same packed batch, and
the config's translation (the one of ``GRPOConfig``, as ``loss_type="dapo"``)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from rlguard.adapters.trl.async_compat import trainer_module
from rlguard.adapters.trl.async_trainer import (
    GuardedAsyncGRPOConfig,
    GuardedAsyncGRPOTrainer,
    map_async_config,
)
from rlguard.guards import StepStats
from rlguard.guards.stats.staleness import PublishedSteps


class _Policy(torch.nn.Module):
    """Returns fixed per-position log-probs (a parameter, so the loss has a gradient) and entropies."""

    def __init__(self, logprobs: torch.Tensor) -> None:
        super().__init__()
        self.logprobs = torch.nn.Parameter(logprobs.clone())

    def forward(self, **kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(log_probs=self.logprobs.unsqueeze(0), entropy=torch.full_like(self.logprobs, 0.5))


def _packed_inputs() -> dict[str, torch.Tensor]:
    """One row of 9 packed positions; 6 loss tokens from 2 completions (4 and 2 tokens), TRL's layout."""
    torch.manual_seed(0)
    n = 9
    return {
        "attention_mask": torch.ones(1, n, dtype=torch.long),
        "input_ids": torch.arange(n).unsqueeze(0),
        "position_ids": torch.arange(n).unsqueeze(0),
        "shift_labels": torch.arange(n).unsqueeze(0),
        "token_index": torch.tensor([[2, 3, 4, 5, 7, 8, -1]]),
        "old_log_probs": torch.tensor([[-1.0, -2.0, -0.5, -1.5, -1.2, -0.7, 0.0]]),
        "advantages": torch.tensor([[1.0, 1.0, 1.0, 1.0, -0.5, -0.5, 0.0]]),
        "segment_id": torch.tensor([[0, 0, 0, 0, 1, 1, -1]]),
        "tree_kv_index": torch.arange(n).unsqueeze(0),
        "tree_cu_seqlens_q": torch.tensor([[0, 9]]),
        "tree_cu_seqlens_k": torch.tensor([[0, 9]]),
        "tree_max_seqlens": torch.tensor([[9, 9]]),
        "global_n_tokens": torch.tensor([10.0]),  # of the whole step (two micro-batches)
        "global_n_forward_tokens": torch.tensor([9.0]),
        "mean_seq_len": torch.tensor([4.5]),
    }


def _fake_trainer(cls: type, args: Any, accumulation: int) -> Any:
    """The attributes both compute_loss methods read, on one process."""
    fake = SimpleNamespace(
        accelerator=SimpleNamespace(
            num_processes=1, process_index=0, reduce=lambda t, reduction: t, gather=lambda t: t
        ),
        epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        current_gradient_accumulation_steps=accumulation,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
        _step_forward_tokens=0.0, _step_trained_tokens=0.0, _step_seq_len_weighted=0.0, _step_samples=0.0,
        _step_forward_s=0.0,
        rlguard_guard=None,
        rlguard_weight_syncs=0, rlguard_published=PublishedSteps(), state=SimpleNamespace(global_step=0),
        _rlguard_step_stats=StepStats(),
        rlguard_mapping=args.rlguard_mapping,
        rlguard_objective=args.rlguard_mapping.build(),
    )  # fmt: skip
    for name in ("rlguard_policy_logprobs", "_normalisers", "_log_rlguard_metrics"):
        setattr(fake, name, getattr(GuardedAsyncGRPOTrainer, name).__get__(fake))
    return fake


@pytest.mark.parametrize("epsilon_high", [None, 0.28])
def test_the_default_objective_is_trls_own_loss(epsilon_high: float | None) -> None:
    """Same packed batch, same policy: TRL's compute_loss and the guarded one (its default objective, dapo) give
    the same loss and the same gradient, on log-probs far enough from pi_old that both clip bounds bind."""
    args = GuardedAsyncGRPOConfig(output_dir="unused", use_cpu=True, epsilon=0.2, epsilon_high=epsilon_high)
    logprobs = torch.tensor([0.0, 0.0, -0.2, -2.5, -1.0, -1.6, 0.0, -1.9, -0.1])
    results = []
    for cls in (trainer_module.AsyncGRPOTrainer, GuardedAsyncGRPOTrainer):
        policy = _Policy(logprobs)
        fake = _fake_trainer(cls, args, accumulation=2)
        loss = cls.compute_loss(fake, policy, _packed_inputs())
        loss.backward()
        assert policy.logprobs.grad is not None
        results.append((loss.detach(), policy.logprobs.grad.clone()))
        assert fake._step_forward_tokens == 9.0 and fake._step_trained_tokens == 10.0  # TRL's accounting kept
    (trl_loss, trl_grad), (ours, our_grad) = results
    torch.testing.assert_close(ours, trl_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(our_grad, trl_grad, rtol=1e-6, atol=1e-7)
    assert trl_grad.abs().sum() > 0 and (trl_grad == 0).sum() > 3  # clipped tokens and unused positions


def test_config_maps_through_the_grpo_translation() -> None:
    args = GuardedAsyncGRPOConfig(output_dir="unused", use_cpu=True, epsilon=0.1, epsilon_high=0.3)
    assert args.rlguard_mapping.objective == "dapo"
    kwargs = args.rlguard_mapping.kwargs
    assert (kwargs["clip_low"], kwargs["clip_high"], kwargs["aggregation"]) == (0.1, 0.3, "token-mean")
    assert args.rlguard_mapping.normaliser == "global_tokens"
    gspo = GuardedAsyncGRPOConfig(
        output_dir="unused", use_cpu=True, objective="gspo", objective_kwargs='{"aggregation": "seq-mean-token-mean"}'
    )
    assert gspo.rlguard_mapping.objective == "gspo" and gspo.rlguard_mapping.normaliser == "sequences"
    assert map_async_config(gspo).kwargs == gspo.rlguard_mapping.kwargs
    assert GuardedAsyncGRPOConfig(output_dir="unused", use_cpu=True, guard="strict").guard == "strict"
    with pytest.raises(ValueError, match="guard"):
        GuardedAsyncGRPOConfig(output_dir="unused", use_cpu=True, guard="nope")
