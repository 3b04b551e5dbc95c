"""A small decoder-only transformer in plain torch, dense or with top-k mixture-of-experts MLPs, and KV-cache sampling.

Pre-LayerNorm blocks (GPT-2, Radford et al. 2019), learned positions, causal multi-head attention through
``F.scaled_dot_product_attention``. The MoE variant replaces every MLP by ``num_experts`` experts of which the
router picks ``top_k`` per token, gates renormalised over the chosen ones (Mixtral, Jiang et al. 2024, eq. 1);
its routing is discrete, so a small change of the router's numerics (a bf16 engine, one optimizer step) sends
tokens near a routing boundary to other experts: the source of the volatile token ratios of MoE models in GRPO
(GSPO, arXiv 2507.18071, sec. 5.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

KVCache = list[tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class ModelConfig:
    """Shape of :class:`TinyTransformer`.

    Attributes:
        vocab_size: ids ``0 .. vocab_size - 1``.
        max_len: longest sequence (prompt plus completion).
        d_model, n_layers, n_heads, d_ff: width, depth, attention heads, MLP (or expert) hidden width.
        num_experts: 0 for dense MLPs, else experts per MoE layer.
        top_k: experts per token (MoE only).
    """

    vocab_size: int = 64
    max_len: int = 72
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    num_experts: int = 0
    top_k: int = 2

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}).")
        if self.num_experts and not 1 <= self.top_k < self.num_experts:
            raise ValueError(f"top_k must lie in [1, num_experts); got {self.top_k} of {self.num_experts}.")


class Attention(nn.Module):
    """Causal multi-head self-attention with an optional KV cache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor, cache: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x ``(B, S, D)`` -> ``(B, S, D)`` and the keys/values ``(B, H, S_past + S, D / H)``.

        Without a cache the S positions attend causally; with one, S must be 1 (a decoding step).
        """
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, H, S, d_h)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None and s > 1)  # (B, H, S, d_h)
        return self.out(y.transpose(1, 2).reshape(b, s, d)), (k, v)


class MoE(nn.Module):
    """Top-k routed experts (GELU MLPs). ``router_dtype`` rounds the router's input, weights and logits (an
    engine's bf16 router); :attr:`last_routing` keeps the chosen experts ``(B, S, top_k)``, sorted."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.d_model, cfg.num_experts, bias=False)
        scale_in, scale_out = 1 / math.sqrt(cfg.d_model), 1 / math.sqrt(cfg.d_ff)
        self.w_in = nn.Parameter(torch.randn(cfg.num_experts, cfg.d_model, cfg.d_ff) * scale_in)
        self.w_out = nn.Parameter(torch.randn(cfg.num_experts, cfg.d_ff, cfg.d_model) * scale_out)
        self.router_dtype: torch.dtype | None = None
        self.last_routing: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x ``(B, S, D)`` -> ``sum_{e in top-k} softmax_top-k(router logits)_e * expert_e(x)``, ``(B, S, D)``."""
        if self.router_dtype is None:
            logits = self.router(x)  # (B, S, E)
        else:
            logits = F.linear(x.to(self.router_dtype), self.router.weight.to(self.router_dtype)).float()
        top_logits, top = logits.topk(self.top_k, dim=-1)  # (B, S, k)
        gates = torch.softmax(top_logits, dim=-1)  # (B, S, k)
        # every expert on every token, then keep the chosen ones: cheaper than gathering tokens for tiny experts
        hidden = F.gelu(torch.einsum("bsd,edf->bsef", x, self.w_in))  # (B, S, E, F)
        outs = torch.einsum("bsef,efd->bsed", hidden, self.w_out)  # (B, S, E, D)
        chosen = outs.gather(2, top.unsqueeze(-1).expand(*top.shape, x.shape[-1]))  # (B, S, k, D)
        self.last_routing = top.detach().sort(dim=-1).values
        return (gates.unsqueeze(-1) * chosen).sum(dim=2)


class Block(nn.Module):
    """``x + attn(ln(x))`` then ``x + mlp(ln(x))`` (pre-LayerNorm)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp: nn.Module = (
            MoE(cfg)
            if cfg.num_experts
            else nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))
        )

    def forward(self, x: Tensor, cache: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x ``(B, S, D)`` -> ``(B, S, D)`` and this layer's keys/values."""
        a, kv = self.attn(self.ln1(x), cache)
        x = x + a
        return x + self.mlp(self.ln2(x)), kv


class TinyTransformer(nn.Module):
    """Decoder-only language model. ``forward``: ids ``(B, S)`` -> logits ``(B, S, V)`` (float32)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, ids: Tensor) -> Tensor:
        """ids ``(B, S)`` -> logits ``(B, S, V)``, causal."""
        return self.step(ids, None)[0]

    def step(self, ids: Tensor, cache: KVCache | None) -> tuple[Tensor, KVCache]:
        """Logits ``(B, S, V)`` of ``ids`` ``(B, S)`` following the ``cache``'s positions, and the grown cache.

        ``cache=None`` runs the whole prefix (S positions from 0); with a cache, ``S`` must be 1.
        """
        start = 0 if cache is None else cache[0][0].shape[2]
        if start + ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence of {start + ids.shape[1]} ids exceeds max_len={self.cfg.max_len}.")
        x = self.embed(ids) + self.pos(torch.arange(start, start + ids.shape[1]))  # (B, S, D)
        new_cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if cache is None else cache[i])
            new_cache.append(kv)
        return self.head(self.ln_f(x)), new_cache

    def routing(self) -> Tensor | None:
        """Experts chosen in the last forward, ``(B, S, n_layers, top_k)``; None for a dense model."""
        moes = [b.mlp for b in self.blocks if isinstance(b.mlp, MoE)]
        if not moes or any(m.last_routing is None for m in moes):
            return None
        return torch.stack([m.last_routing for m in moes if m.last_routing is not None], dim=2)


def make_model(cfg: ModelConfig, seed: int) -> TinyTransformer:
    """A randomly initialised :class:`TinyTransformer`, reproducible from ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return TinyTransformer(cfg)


@dataclass(frozen=True)
class Generation:
    """Sampled completions of a batch of prompts.

    Attributes:
        completions: ``(B, T)`` sampled ids, ``<pad>`` (0) after ``<eos>``.
        mask: ``(B, T)`` 1 for completion tokens up to and including ``<eos>``.
        logprobs: ``(B, T)`` log-probs of the sampled tokens under the sampler, as it computed them.
        routing: ``(B, T, n_layers, top_k)`` experts the sampler chose for each completion token's input; None
            for a dense model.
    """

    completions: Tensor
    mask: Tensor
    logprobs: Tensor
    routing: Tensor | None


@torch.no_grad()
def generate(
    model: TinyTransformer,
    prompts: Tensor,
    max_new_tokens: int,
    gen: torch.Generator,
    *,
    eos_id: int,
    pad_id: int = 0,
    logits_dtype: torch.dtype | None = None,
) -> Generation:
    """Sample at temperature 1 with a KV cache: prompts ``(B, P)`` -> :class:`Generation` with ``T =
    max_new_tokens``. ``logits_dtype`` rounds the logits before the softmax (an engine's bf16 logits)."""
    b = prompts.shape[0]
    logits, cache = model.step(prompts, None)
    last = logits[:, -1]  # (B, V)
    route = model.routing()
    routes = [] if route is None else [route[:, -1]]
    done = torch.zeros(b, dtype=torch.bool)
    ids, mask, logps = [], [], []
    for t in range(max_new_tokens):
        if logits_dtype is not None:
            last = last.to(logits_dtype)
        logp = torch.log_softmax(last.float(), dim=-1)  # (B, V)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)  # (B,)
        logps.append(torch.where(done, 0.0, logp.gather(-1, nxt[:, None]).squeeze(-1)))
        mask.append((~done).float())
        nxt = torch.where(done, pad_id, nxt)
        ids.append(nxt)
        done = done | (nxt == eos_id)
        if t + 1 == max_new_tokens or bool(done.all()):
            break
        logits, cache = model.step(nxt[:, None], cache)
        last = logits[:, -1]
        route = model.routing()
        if route is not None:
            routes.append(route[:, -1])
    width = max_new_tokens - len(ids)  # stopped early: every row ended, pad the rest
    pad = [torch.zeros(b)] * width
    routing = None
    if routes:
        routes += [torch.zeros_like(routes[0])] * (max_new_tokens - len(routes))
        routing = torch.stack(routes, dim=1)
    return Generation(
        completions=torch.stack(ids + [torch.full((b,), pad_id)] * width, dim=1),
        mask=torch.stack(mask + pad, dim=1),
        logprobs=torch.stack(logps + pad, dim=1),
        routing=routing,
    )
