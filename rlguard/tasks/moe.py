"""A tiny mixture-of-experts language model for :class:`~rlguard.tasks.tiny.CharTokenizer`.

:class:`TinyMoELM` is :class:`~rlguard.tasks.tiny.TinyLM` with a top-1 routed expert layer between the GRU and
the head, so it works with :func:`~rlguard.tasks.tiny.sample_rollouts` and
:func:`~rlguard.tasks.tiny.sequence_logprobs` unchanged. Its routing is discrete: a small change of the router
(another engine's numerics, or one optimizer step) flips the expert of tokens near a routing boundary, which is
the source of the volatile token ratios of MoE models in GRPO (GSPO, arXiv 2507.18071, sec. 5.3).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlguard.tasks.tiny import CharTokenizer, TinyLM


class TinyMoELM(TinyLM):
    """Embedding, GRU, a top-1 mixture of ``num_experts`` MLP experts (residual), linear head.

    ``forward``: ids ``(B, S)`` -> logits ``(B, S, V)``; the chosen experts ``(B, S)`` are kept in
    :attr:`last_routing` for inspection. The output of the chosen expert is scaled by its gate probability,
    so the router is trained through the gate, as in Switch Transformers (Fedus et al. 2021, eq. 2).
    """

    def __init__(self, vocab_size: int, hidden: int = 32, num_experts: int = 4) -> None:
        super().__init__(vocab_size, hidden)
        if num_experts < 2:
            raise ValueError(f"num_experts must be >= 2 for routing to exist; got {num_experts}.")
        self.router = nn.Linear(hidden, num_experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden)) for _ in range(num_experts)
        )
        self.last_routing: Tensor | None = None

    def forward(self, ids: Tensor) -> Tensor:
        h, _ = self.rnn(self.embed(ids))  # (B, S, H)
        gates = torch.softmax(self.router(h), dim=-1)  # (B, S, E)
        top_gate, top = gates.max(dim=-1)  # (B, S)
        # every expert on every token, then keep the chosen one: cheaper than gathering tokens for tiny experts
        outs = torch.stack([expert(h) for expert in self.experts], dim=-2)  # (B, S, E, H)
        index = top[..., None, None].expand(*top.shape, 1, h.shape[-1])  # (B, S, 1, H)
        mixed = outs.gather(-2, index).squeeze(-2)  # (B, S, H)
        self.last_routing = top.detach()
        return self.head(h + top_gate.unsqueeze(-1) * mixed)  # type: ignore[no-any-return]


def make_tiny_moe_model(seed: int = 0, hidden: int = 32, num_experts: int = 4) -> TinyMoELM:
    """A randomly initialised :class:`TinyMoELM` for :class:`CharTokenizer`, reproducible from ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return TinyMoELM(CharTokenizer().vocab_size, hidden, num_experts)
