"""Per-token log-probs and entropies from logits (the plain path; a chunked path will share its contract)."""

from __future__ import annotations

import torch
from torch import Tensor


def logprobs_from_logits(
    logits: Tensor, target_ids: Tensor, *, compute_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """log pi(target) and optionally the entropy of pi, per position, in float32 or wider.

    Args:
        logits: ``(B, T, V)``.
        target_ids: ``(B, T)`` integer ids of the sampled tokens.
        compute_entropy: also return ``H = -sum_v p_v log p_v``, ``(B, T)``.
    Returns:
        ``(logprobs (B, T), entropies (B, T) or None)``.
    """
    if logits.dim() != 3 or target_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be (B, T, V) and target_ids (B, T); got {tuple(logits.shape)} and {tuple(target_ids.shape)}."
        )
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # (B, T, V)
    logprobs = logp_all.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    entropies = -(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None
    return logprobs, entropies


def _default_chunk_rows(vocab_size: int) -> int:
    # about 2**25 float32 logits (128 MiB) per chunk, at least 16 rows
    return max(16, (1 << 25) // max(vocab_size, 1))


class _ChunkedLogprobs(torch.autograd.Function):
    """log-probs and entropies of target tokens from hidden states, one chunk of rows at a time.

    Forward keeps only the per-row log-partition and entropy; backward recomputes each chunk's logits
    (the memory/compute trade of Liger-Kernel's fused linear losses).
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        chunk_rows: int,
        compute_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        acc = torch.promote_types(hidden.dtype, torch.float32)
        w = weight.to(acc)
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=acc, device=hidden.device)
        log_z = torch.empty(n, dtype=acc, device=hidden.device)
        entropy = torch.zeros(n, dtype=acc, device=hidden.device)
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            logits = hidden[rows].to(acc) @ w.T  # (c, V)
            lz = torch.logsumexp(logits, dim=-1)  # (c,)
            log_z[rows] = lz
            logprobs[rows] = logits.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1) - lz
            if compute_entropy:
                p = torch.softmax(logits, dim=-1)
                entropy[rows] = lz - (p * logits).sum(-1)  # H = log Z - E_p[logit]
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy)
        ctx.chunk_rows = chunk_rows  # type: ignore[attr-defined]
        ctx.compute_entropy = compute_entropy  # type: ignore[attr-defined]
        return logprobs, entropy

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        hidden, weight, targets, log_z, entropy = ctx.saved_tensors  # type: ignore[attr-defined]
        chunk_rows: int = ctx.chunk_rows  # type: ignore[attr-defined]
        acc = log_z.dtype
        w = weight.to(acc)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        grad_h = torch.zeros_like(hidden, dtype=acc) if need_h else None
        grad_w = torch.zeros_like(w) if need_w else None
        use_entropy = ctx.compute_entropy and grad_entropy is not None  # type: ignore[attr-defined]
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            h = hidden[rows].to(acc)
            logp = h @ w.T - log_z[rows].unsqueeze(-1)  # (c, V) log-softmax, recomputed
            p = torch.exp(logp)
            # d logp_target / d logits = onehot - p ; d H / d logits = -p (log p + H)
            d_logits = torch.zeros_like(logp)
            if grad_logprobs is not None:
                g = grad_logprobs[rows].to(acc).unsqueeze(-1)
                d_logits = -g * p
                d_logits.scatter_add_(-1, targets[rows].unsqueeze(-1), g)
            if use_entropy:
                assert grad_entropy is not None
                d_logits = d_logits - grad_entropy[rows].to(acc).unsqueeze(-1) * p * (
                    logp + entropy[rows].unsqueeze(-1)
                )
            if grad_h is not None:
                grad_h[rows] = d_logits @ w
            if grad_w is not None:
                grad_w += d_logits.T @ h
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None,
            None,
            None,
        )


def logprobs_from_hidden(
    hidden: Tensor,
    lm_head_weight: Tensor,
    target_ids: Tensor,
    *,
    chunk_size: int | None = None,
    compute_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (and entropies) of ``target_ids`` without materialising the ``(B, T, V)`` logits.

    Rows (tokens) are processed ``chunk_size`` at a time: forward keeps the log-partition and entropy of each
    row, backward recomputes the chunk's logits (as Liger-Kernel's chunked losses do), so the extra memory is
    ``chunk_size x V`` instead of ``B x T x V``. Accumulation is in float32 (float64 stays float64) whatever the
    input dtype; the results feed the same objectives as :func:`logprobs_from_logits`.

    Args:
        hidden: ``(B, T, H)`` final hidden states at the positions that predict ``target_ids``.
        lm_head_weight: ``(V, H)`` output embedding (no bias; divide ``hidden`` by a temperature beforehand).
        target_ids: ``(B, T)`` integer ids.
        chunk_size: rows per chunk; default about 2**25 logits per chunk.
        compute_entropy: also return the entropy of each position's distribution.
    Returns:
        ``(logprobs (B, T), entropies (B, T) or None)`` in the accumulation dtype.
    """
    if hidden.dim() != 3 or lm_head_weight.dim() != 2 or hidden.shape[-1] != lm_head_weight.shape[-1]:
        raise ValueError(
            "hidden must be (B, T, H) and lm_head_weight (V, H) with the same H; got "
            f"{tuple(hidden.shape)} and {tuple(lm_head_weight.shape)}."
        )
    if target_ids.shape != hidden.shape[:2] or target_ids.is_floating_point():
        raise ValueError(
            f"target_ids must be integer (B, T) = {tuple(hidden.shape[:2])}; "
            f"got {target_ids.dtype} {tuple(target_ids.shape)}."
        )
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of rows; got {chunk_size}.")
    b, t, h = hidden.shape
    rows = chunk_size or _default_chunk_rows(lm_head_weight.shape[0])
    logprobs, entropy = _ChunkedLogprobs.apply(  # type: ignore[no-untyped-call]
        hidden.reshape(b * t, h), lm_head_weight, target_ids.reshape(-1), rows, compute_entropy
    )
    return logprobs.reshape(b, t), entropy.reshape(b, t) if compute_entropy else None
