"""The rollout engine: samples completions with a KV cache from a copy of the policy whose numerics may differ
from the trainer's, and measures how far they differ.

A real engine (vLLM, SGLang) holds its own copy of the weights in bf16, computes the router and the logits in bf16
and batches differently, so the log-probs it reports are not the trainer's and, in an MoE model, tokens near a
routing boundary go to other experts ("When Speed Kills Stability", Yao et al. 2025; GSPO, arXiv 2507.18071,
sec. 5.3). :class:`EngineNumerics` reproduces those causes: bf16-rounded weights, a bf16 router, bf16 logits and,
to set the strength, Gaussian noise on the weights (all, or the routers only).
:func:`~rlguard.bench.collapse.loop.mismatch_stats` measures how far the engine is from the trainer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.bench.collapse.spec import TrainerPass
from rlguard.bench.collapse_long.model import MoE, TinyTransformer, generate
from rlguard.bench.collapse_long.task import EOS, PAD, ReverseShiftTask
from rlguard.core_losses import logprobs_from_logits


@dataclass(frozen=True)
class EngineNumerics:
    """How the engine's copy of the policy differs from the trainer's (all off: an exact copy).

    Attributes:
        bf16: weights rounded to bfloat16, router logits and output logits computed in bfloat16.
        weight_noise: Gaussian noise on every weight, times each tensor's RMS, drawn afresh per rollout batch.
        router_noise: Gaussian noise on the routers' weights only, times their RMS (MoE), drawn afresh.
    """

    bf16: bool = False
    weight_noise: float = 0.0
    router_noise: float = 0.0

    def __post_init__(self) -> None:
        for name in ("weight_noise", "router_noise"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)!r}.")

    @property
    def exact(self) -> bool:
        """The engine computes what the trainer computes."""
        return not (self.bf16 or self.weight_noise or self.router_noise)


def engine_copy(model: TinyTransformer, numerics: EngineNumerics, gen: torch.Generator) -> TinyTransformer:
    """A copy of ``model`` with ``numerics`` applied (``model`` itself when they are exact)."""
    if numerics.exact:
        return model
    engine = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in engine.named_parameters():
            noise = numerics.weight_noise + (numerics.router_noise if ".router." in name else 0.0)
            if noise:
                p.add_(torch.randn(p.shape, generator=gen) * (noise * p.pow(2).mean().sqrt()))
            if numerics.bf16:
                p.copy_(p.to(torch.bfloat16).float())
    if numerics.bf16:
        for m in engine.modules():
            if isinstance(m, MoE):
                m.router_dtype = torch.bfloat16
    return engine


@dataclass(frozen=True)
class Rollouts:
    """One rollout batch: ``B = num_prompts * group_size`` completions, prompt-major.

    Attributes:
        prompts: ``(B, P)`` prompt ids. completions: ``(B, T)``; mask ``(B, T)`` 1 up to and including ``<eos>``.
        rewards: ``(B,)`` the verifier's. group_ids: ``(B,)`` prompt index.
        engine_logprobs: ``(B, T)`` log-probs the engine reported for its samples.
        engine_routing: ``(B, T, n_layers, top_k)`` experts the engine chose; None for a dense model.
    """

    prompts: Tensor
    completions: Tensor
    mask: Tensor
    rewards: Tensor
    group_ids: Tensor
    engine_logprobs: Tensor
    engine_routing: Tensor | None

    def select(self, idx: Tensor) -> Rollouts:
        """The completions ``idx`` ``(b,)`` of the batch."""
        routing = None if self.engine_routing is None else self.engine_routing[idx]
        return Rollouts(
            self.prompts[idx],
            self.completions[idx],
            self.mask[idx],
            self.rewards[idx],
            self.group_ids[idx],
            self.engine_logprobs[idx],
            routing,
        )


def sample_rollouts(
    engine: TinyTransformer,
    task: ReverseShiftTask,
    *,
    num_prompts: int,
    group_size: int,
    seed: int,
    bf16_logits: bool = False,
) -> Rollouts:
    """Sample ``group_size`` completions of ``num_prompts`` prompts (prompt seed and sampling seed ``seed``)."""
    prompts = task.prompts(num_prompts, seed).repeat_interleave(group_size, dim=0)  # (B, P)
    gen = torch.Generator().manual_seed(seed)
    out = generate(
        engine,
        prompts,
        task.max_new_tokens,
        gen,
        eos_id=EOS,
        pad_id=PAD,
        logits_dtype=torch.bfloat16 if bf16_logits else None,
    )
    rewards = task.rewards(out.completions, task.answers(prompts))
    group_ids = torch.arange(num_prompts).repeat_interleave(group_size)
    return Rollouts(prompts, out.completions, out.mask, rewards, group_ids, out.logprobs, out.routing)


def trainer_pass(model: TinyTransformer, rollouts: Rollouts) -> TrainerPass:
    """Recompute the sampled tokens' log-probs with ``model`` in float32 (one causal forward)."""
    ids = torch.cat([rollouts.prompts, rollouts.completions], dim=1)  # (B, P + T)
    p = rollouts.prompts.shape[1]
    logits = model(ids[:, :-1])[:, p - 1 :]  # (B, T, V)
    logprobs, entropies = logprobs_from_logits(logits, rollouts.completions, compute_entropy=True)
    assert entropies is not None
    routing = model.routing()
    return TrainerPass(logprobs, entropies, None if routing is None else routing[:, p - 1 :])
