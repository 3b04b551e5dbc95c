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


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """``sum_v a_cv b_cv`` ``(c,)`` of two ``(c, V)`` tensors, without the ``(c, V)`` product that
    ``torch.linalg.vecdot`` allocates (128 MiB per default chunk)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(-1)).view(-1)


class _ChunkedLogprobs(torch.autograd.Function):
    """log-probs and entropies of target tokens from hidden states without the ``(N, V)`` logits.

    Forward goes over chunks of rows and keeps only each row's log-partition ``log Z`` and entropy ``H``.
    Backward recomputes the logits one vocabulary tile at a time, for all rows: with ``log Z`` known, a tile's
    probabilities ``p = exp(logit - log Z)`` need no other tile, so each tile's LM-head gradient is written once
    (a row-chunked backward would read and write the whole ``(V, H)`` gradient once per chunk) and only the
    ``(N, H)`` hidden-state gradient accumulates. This is the memory/compute trade of Liger-Kernel's fused linear
    losses; TRL's chunked kernel tiles the vocabulary too. Extra memory: one ``(c, V)`` chunk forward, one
    ``(N, v)`` tile backward, of about the same size.
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
        ctx.set_materialize_grads(False)  # an unused output (e.g. the entropy) costs no backward work
        acc = torch.promote_types(hidden.dtype, torch.float32)
        w = weight.to(acc)
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=acc, device=hidden.device)
        log_z = torch.empty(n, dtype=acc, device=hidden.device)
        entropy = torch.zeros(n, dtype=acc, device=hidden.device)
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            logits = hidden[rows].to(acc) @ w.T  # (c, V)
            top = logits.amax(-1, keepdim=True)  # (c, 1)
            logits.sub_(top)  # shifted in place: exp cannot overflow; one (c, V) buffer plus exp's
            e = logits.exp()  # (c, V) unnormalised probabilities
            sum_e = e.sum(-1)  # (c,)
            lz_shifted = sum_e.log()
            log_z[rows] = lz_shifted + top.squeeze(-1)
            logprobs[rows] = logits.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1) - lz_shifted
            if compute_entropy:  # H = log Z - E_p[logit], with the same shift on both terms
                entropy[rows] = lz_shifted - _row_dot(e, logits) / sum_e
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy)
        # the backward tile: about as many logits as a forward chunk
        ctx.tile_cols = max(1, -(-chunk_rows * weight.shape[0] // max(n, 1)))  # type: ignore[attr-defined]
        ctx.compute_entropy = compute_entropy  # type: ignore[attr-defined]
        return logprobs, entropy

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        hidden, weight, targets, log_z, entropy = ctx.saved_tensors  # type: ignore[attr-defined]
        tile: int = ctx.tile_cols  # type: ignore[attr-defined]
        acc = log_z.dtype
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        use_entropy = ctx.compute_entropy and grad_entropy is not None  # type: ignore[attr-defined]
        if grad_logprobs is None and not use_entropy:
            return None, None, None, None, None
        h = hidden.to(acc)  # (N, H)
        grad_h = torch.zeros_like(h) if need_h else None
        grad_w = torch.empty(weight.shape, dtype=acc, device=weight.device) if need_w else None
        g = None if grad_logprobs is None else grad_logprobs.to(acc).unsqueeze(-1)  # (N, 1)
        g_ent = None if not use_entropy else grad_entropy.to(acc).unsqueeze(-1)  # type: ignore[union-attr]
        row_ids = torch.arange(h.shape[0], device=h.device)
        for v0 in range(0, weight.shape[0], tile):
            w = weight[v0 : v0 + tile].to(acc)  # (v, H)
            logp = h @ w.T  # (N, v) logits, recomputed
            logp.sub_(log_z.unsqueeze(-1))  # log-softmax, in place
            d_logits = logp.exp()  # p
            # d logp_target / d logits = onehot - p ; d H / d logits = -p (log p + H); so
            # d_logits = onehot g - p (g + g_H (log p + H)), built in place in the two (N, v) buffers
            if g_ent is not None:
                coef = logp.add_(entropy.unsqueeze(-1)).mul_(-g_ent)  # -(g_H (log p + H) + g)
                if g is not None:
                    coef.sub_(g)
                d_logits.mul_(coef)
            else:
                assert g is not None  # the early return covers both None
                d_logits.mul_(-g)
            if g is not None:
                hit = (targets >= v0) & (targets < v0 + w.shape[0])  # (N,) rows whose target is in this tile
                d_logits[row_ids[hit], targets[hit] - v0] += g[hit, 0]
            if grad_h is not None:
                grad_h.addmm_(d_logits, w)
            if grad_w is not None:
                torch.mm(d_logits.T, h, out=grad_w[v0 : v0 + tile])
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
