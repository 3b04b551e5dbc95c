"""The objective fused into the LM-head pass: loss, metrics and both gradients in one pass over the vocabulary.

:func:`~rlguard.core_losses.logprobs_from_hidden` keeps memory flat by recomputing the logits in backward: four
matrix products where the full-logits path does three. Here the per-token loss gradient is known inside the
forward chunk loop, because everything the objective needs besides the current log-probs (old, reference and
rollout log-probs, advantages, mask, normalisers) is known before the forward. So each chunk's gradients for the
hidden states and the LM-head weight are computed while its logits are live: three matrix products, the floor
(``z = h W^T``, ``p @ W``, ``p^T h``; with an entropy gradient four, as ``p log p`` needs its own product). One
``(c, V)`` buffer serves all chunks: the logits are exponentiated in place, and the entropy comes from ``p @ W``
(see :func:`_head_chunk`). This is Liger-Kernel's fused linear PPO loss (``chunked_loss/fused_linear_ppo.py``,
Triton, GPU only), in pure torch and for any registered objective.

The objective's math is not repeated here. For each chunk its log-probs ``lp`` and entropies ``H`` become autograd
leaves, the objective runs on the chunk's sequences with the whole batch's normalisers, and autograd gives
``g = dL/dlp`` and ``g_H = dL/dH``. The chain rule through the log-softmax finishes the job:
``dL/dz_v = g [v = y] - p_v (g + g_H (log p_v + H))`` for the logits ``z`` (``p = softmax(z)``, ``y`` the target).
The loss and metrics returned are those of one objective call on the whole batch with the computed log-probs.

Chunks: the loss is a sum over sequences once its normalisers are fixed (what makes micro-batches add up), so a
chunk of whole sequences gets its exact gradient. Objectives that declare their token gradient local to the token
(``Objective.token_local``: GRPO, Dr. GRPO, DAPO, CISPO, SAPO, a plugin that says so; never with off-policy
sequence masking, :meth:`~rlguard.core_losses.Objective.is_token_local`) also split a sequence: the chunk's
objective call sees the full rows with the other tokens' log-probs as placeholders, whose values cannot reach the
chunk's gradient. The others (GSPO, GSPO-token, GMPO, ...) chunk by whole sequences, so one long sequence is one
chunk. Objectives that need statistics of the whole batch (``Objective.needs_whole_batch``) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import Normaliser, check_normaliser, default_normalisers
from rlguard.core_losses.batch import LossOutput, RolloutBatch, prepare_batch
from rlguard.core_losses.objective import Objective

__all__ = ["FusedLossOutput", "RolloutBatch", "objective_from_hidden"]

#: logits per chunk by default: one float32 buffer of 256 MiB (logprobs_from_hidden's two buffers of 128 MiB)
_CHUNK_LOGITS = 1 << 26


@dataclass(frozen=True)
class FusedLossOutput(LossOutput):
    """:class:`LossOutput` plus what the fused pass computed on the way, detached: ``logprobs`` and
    ``entropies`` ``(B, T)`` in the accumulation dtype, 0 at masked positions (for logging, or as the next
    iteration's old log-probs)."""

    logprobs: Tensor = field(default_factory=lambda: torch.empty(0))
    entropies: Tensor = field(default_factory=lambda: torch.empty(0))


def objective_from_hidden(
    objective: Objective,
    hidden: Tensor,
    lm_head_weight: Tensor,
    target_ids: Tensor,
    batch: RolloutBatch,
    *,
    num_tokens: Normaliser | None = None,
    num_sequences: Normaliser | None = None,
    chunk_size: int | None = None,
) -> FusedLossOutput:
    """Loss and metrics of ``objective`` on the log-probs of ``target_ids`` under ``softmax(hidden W^T)``, with the
    gradients for ``hidden`` and ``lm_head_weight`` computed in the same pass over the vocabulary.

    Equal to ``objective(PolicyBatch(logprobs, entropies, ...))`` with ``logprobs, entropies =
    logprobs_from_hidden(hidden, lm_head_weight, target_ids)`` (loss, metrics and gradients), without the
    ``(B, T, V)`` logits and without recomputing them in backward (Liger-Kernel's fused linear PPO loss,
    arXiv 2410.10989, for any objective). Only unmasked tokens go through the LM head. Accumulation is in float32
    (float64 stays float64) whatever the input dtype; the gradients are returned in the inputs' dtypes. The
    gradients are computed in forward when grad mode is on and ``hidden`` or ``lm_head_weight`` requires grad,
    and held until ``loss.backward()``: an ``(N, H)`` and a ``(V, H)`` buffer in the accumulation dtype.

    Args:
        objective: any registered objective (``get_objective(...)``); its ``entropy`` metric is always reported.
        hidden: ``(B, T, H)`` final hidden states at the positions that predict ``target_ids`` (divided by the
            sampling temperature beforehand).
        lm_head_weight: ``(V, H)`` output embedding, without bias.
        target_ids: ``(B, T)`` integer ids of the sampled tokens.
        batch: advantages, mask and the other policies' log-probs, ``(B, T)``.
        num_tokens: as for ``objective(...)``: the step's token count (divided by the data-parallel size).
        num_sequences: as for ``objective(...)``: the step's sequence count, likewise.
        chunk_size: rows (tokens) per chunk; default about 2**26 logits per chunk. Objectives that need whole
            sequences take as many whole sequences as fit, and at least one.
    Returns:
        :class:`FusedLossOutput`: the 0-dim loss (its backward scales the precomputed gradients), the metrics, and
        the detached per-token log-probs and entropies ``(B, T)`` (0 at masked positions).
    """
    _check_inputs(objective, hidden, lm_head_weight, target_ids, batch, chunk_size)
    check_normaliser("num_tokens", num_tokens)
    check_normaliser("num_sequences", num_sequences)
    b, t, _ = hidden.shape
    acc = torch.promote_types(torch.promote_types(hidden.dtype, lm_head_weight.dtype), torch.float32)
    need_h = hidden.requires_grad and torch.is_grad_enabled()
    need_w = lm_head_weight.requires_grad and torch.is_grad_enabled()
    # the chunk calls' normalisers: the caller's, or the whole batch's counts as the objective takes them by default
    counted = prepare_batch(
        batch.policy_batch(torch.zeros(b, t, dtype=acc, device=hidden.device)), objective.on_nonfinite
    )
    default_tokens, default_sequences = (n.clamp(min=1).to(acc) for n in default_normalisers(counted.mask))
    normalisers = (
        default_tokens if num_tokens is None else num_tokens,
        default_sequences if num_sequences is None else num_sequences,
    )

    rows = batch.mask.reshape(-1).nonzero().squeeze(-1)  # (N,) flat indices of the unmasked tokens
    rows_cpu = rows.cpu()
    token_local = objective.is_token_local()
    chunk_rows = chunk_size or max(16, _CHUNK_LOGITS // max(lm_head_weight.shape[0], 1))
    bounds = _chunk_bounds(rows_cpu, t, chunk_rows, token_local)

    with torch.no_grad():
        h_flat = hidden.reshape(b * t, -1)
        w = lm_head_weight.to(acc)  # (V, H)
        targets = target_ids.reshape(-1)
        logprobs = torch.zeros(b * t, dtype=acc, device=hidden.device)
        entropies = torch.zeros(b * t, dtype=acc, device=hidden.device)
        grad_h = torch.zeros(h_flat.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = torch.empty(w.shape, dtype=acc, device=w.device) if need_w else None
        w_written = False
        # one (c, V) buffer for all chunks: a fresh allocation per chunk costs its page faults every time
        longest = max((stop - start for start, stop in bounds), default=0)
        buffer = w.new_empty(longest, w.shape[0])
        for start, stop in bounds:
            idx = rows[start:stop]
            h = h_flat[idx].to(acc)  # (c, H)
            y = targets[idx]
            head = _head_chunk(h, w, y, buffer)
            logprobs[idx], entropies[idx] = head.logprobs, head.entropies
            if grad_h is None and grad_w is None:
                continue
            first, last = int(rows_cpu[start]) // t, int(rows_cpu[stop - 1]) // t + 1
            if objective.on_nonfinite == "raise":
                _raise_if_nonfinite(head.logprobs, head.entropies, rows_cpu[start:stop], t)
            g, g_ent = _token_grads(objective, batch, head, idx - first * t, slice(first, last), normalisers)
            if g is None and g_ent is None:
                continue
            chunk_h, d_w = _chunk_grads(head, h, w, y, torch.zeros_like(head.logprobs) if g is None else g, g_ent)
            if grad_h is not None:
                grad_h[idx] = chunk_h
            if grad_w is not None:
                if w_written:
                    grad_w.addmm_(d_w[0].T, d_w[1])
                else:
                    torch.mm(d_w[0].T, d_w[1], out=grad_w)
                    w_written = True
                grad_w.index_add_(0, y, d_w[2])  # the one-hot part: g h onto each target's row
        if grad_w is not None and not w_written:
            grad_w.zero_()

    out = objective(
        batch.policy_batch(logprobs.view(b, t), entropies.view(b, t)),
        num_tokens=num_tokens,
        num_sequences=num_sequences,
    )
    loss = out.loss
    if grad_h is not None or grad_w is not None:
        loss = _PrecomputedGrad.apply(loss.detach(), hidden, lm_head_weight, grad_h, grad_w)  # type: ignore[no-untyped-call]
    return FusedLossOutput(loss=loss, metrics=out.metrics, logprobs=logprobs.view(b, t), entropies=entropies.view(b, t))


def _check_inputs(
    objective: Objective,
    hidden: Tensor,
    weight: Tensor,
    target_ids: Tensor,
    batch: RolloutBatch,
    chunk_size: int | None,
) -> None:
    if not isinstance(objective, Objective):
        raise ValueError(
            f"objective must be an rlguard Objective (get_objective(name)); got {type(objective).__name__}."
        )
    if objective.needs_whole_batch:
        raise ValueError(
            f"objective {objective.name!r} selects tokens by statistics of the whole batch (needs_whole_batch; "
            "Clip-Cov's and KL-Cov's covariance of log-prob and advantage), which the fused path, evaluating the "
            "objective chunk by chunk, cannot reproduce. Use logprobs_from_hidden, then the objective."
        )
    if not isinstance(batch, RolloutBatch):
        raise ValueError(
            f"batch must be a RolloutBatch (advantages, mask, old/ref/rollout log-probs); got {type(batch).__name__}."
        )
    if hidden.dim() != 3 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(
            "hidden must be (B, T, H) and lm_head_weight (V, H) with the same H; got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}."
        )
    if not (hidden.is_floating_point() and weight.is_floating_point()):
        raise ValueError(f"hidden and lm_head_weight must be floating point; got {hidden.dtype} and {weight.dtype}.")
    if target_ids.shape != hidden.shape[:2] or target_ids.is_floating_point():
        raise ValueError(
            f"target_ids must be integer (B, T) = {tuple(hidden.shape[:2])}; "
            f"got {target_ids.dtype} {tuple(target_ids.shape)}."
        )
    if batch.mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"batch.mask must have the (B, T) = {tuple(hidden.shape[:2])} of hidden; got {tuple(batch.mask.shape)}."
        )
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive number of rows; got {chunk_size!r}.")


def _chunk_bounds(rows: Tensor, t: int, chunk_rows: int, token_local: bool) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges over the unmasked rows: any split when ``token_local``, else whole sequences."""
    n = rows.numel()
    if token_local:
        return [(s, min(s + chunk_rows, n)) for s in range(0, n, chunk_rows)]
    # rows are sorted; a sequence's rows are contiguous: split where the sequence changes
    seq = rows // t
    starts = [0, *(torch.nonzero(seq[1:] != seq[:-1]).squeeze(-1) + 1).tolist()]
    bounds: list[tuple[int, int]] = []
    begin = 0
    for s, s_next in zip(starts, [*starts[1:], n], strict=True):
        if s > begin and s_next - begin > chunk_rows:
            bounds.append((begin, s))
            begin = s
    if n:
        bounds.append((begin, n))
    return bounds


@dataclass(frozen=True)
class _HeadChunk:
    """One chunk's softmax: ``exp`` ``(c, V)`` = ``exp(z - max z)`` in the shared buffer; ``sum_exp``,
    ``logprobs``, ``entropies`` ``(c,)``; ``p_w`` ``(c, H)`` = ``p @ W``, the probability-weighted head rows."""

    exp: Tensor
    sum_exp: Tensor
    logprobs: Tensor
    entropies: Tensor
    p_w: Tensor


def _head_chunk(h: Tensor, w: Tensor, targets: Tensor, buffer: Tensor) -> _HeadChunk:
    """Log-probs of ``targets`` and entropies under ``p = softmax(z)``, ``z = h W^T``; h ``(c, H)``, W ``(V, H)``.

    ``E_p[z] = h . (p @ W)``: the product ``p @ W`` is the one the gradients need anyway (``dz`` is ``p`` times a
    per-row factor plus a one-hot), so the entropy costs no pass over the ``(c, V)`` logits, and they are
    exponentiated in place: one ``(c, V)`` buffer.
    """
    z = torch.mm(h, w.T, out=buffer[: h.shape[0]])  # (c, V)
    top = z.amax(-1)  # (c,)
    z_target = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (c,)
    e = z.sub_(top.unsqueeze(-1)).exp_()  # (c, V) exp(z - max z), in place
    sum_e = e.sum(-1)
    log_z = sum_e.log() + top  # (c,) log-partition
    p_w = (e @ w).div_(sum_e.unsqueeze(-1))  # (c, H)
    entropies = log_z - torch.linalg.vecdot(h, p_w)  # H = log Z - E_p[z]
    return _HeadChunk(e, sum_e, z_target - log_z, entropies, p_w)


def _token_grads(
    objective: Objective,
    batch: RolloutBatch,
    head: _HeadChunk,
    positions: Tensor,
    seqs: slice,
    normalisers: tuple[Normaliser, Normaliser],
) -> tuple[Tensor | None, Tensor | None]:
    """``dL/dlp`` and ``dL/dH`` ``(c,)`` of the chunk's tokens at flat ``positions`` of the sequences ``seqs``,
    by autograd through the objective (None where the loss does not depend on them)."""
    lp = head.logprobs
    with torch.enable_grad():
        lp_leaf, ent_leaf = lp.detach().requires_grad_(), head.entropies.detach().requires_grad_()
        n_seq = seqs.stop - seqs.start
        t = batch.mask.shape[1]
        # the other tokens of these sequences hold placeholders (pi = pi_old): they cannot reach this chunk's gradient
        old = batch.old_logprobs
        base = lp.new_zeros(n_seq * t) if old is None else old[seqs].reshape(-1).to(lp.dtype)
        lp_rows = base.index_put((positions,), lp_leaf).view(n_seq, t)
        ent_rows = lp.new_zeros(n_seq * t).index_put((positions,), ent_leaf).view(n_seq, t)
        out = objective(
            batch.policy_batch(lp_rows, ent_rows, seqs), num_tokens=normalisers[0], num_sequences=normalisers[1]
        )
        if not out.loss.requires_grad:
            return None, None
        g, g_ent = torch.autograd.grad(out.loss, (lp_leaf, ent_leaf), allow_unused=True)
    return g, g_ent


def _chunk_grads(
    head: _HeadChunk, h: Tensor, w: Tensor, targets: Tensor, g: Tensor, g_ent: Tensor | None
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """The chunk's hidden-state gradient ``(c, H)`` and its LM-head gradient as ``(D, X, R)``: ``D^T X`` plus the
    rows ``R`` ``(c, H)`` added at the targets.

    ``dL/dz = g onehot(y) - p (g + g_H (log p + H))``, from ``d log p_y / dz = onehot(y) - p`` and
    ``dH/dz = -p (log p + H)``. Without an entropy gradient ``dz = g onehot(y) - g p``, so ``dz @ W = g W_y - g
    (p @ W)`` and ``dz^T h = p^T (-g h) + onehot^T (g h)``: no pass over ``(c, V)`` besides the product. With one,
    ``p log p`` is built in the buffer (``xlogy``, 0 where ``p`` underflows) and both products read it.
    """
    g_col = g.unsqueeze(-1)  # (c, 1)
    one_hot_rows = g_col * h  # (c, H)
    if g_ent is None:
        grad_h = torch.addcmul(-g_col * head.p_w, g_col, w[targets])  # g (W_y - p @ W)
        return grad_h, (head.exp, h * (-g_col / head.sum_exp.unsqueeze(-1)), one_hot_rows)
    # -p (g + g_H (log p + H)) = -(e / s) (g + g_H (H - log s)) - (g_H / s) e log e, with p = e / s
    s = head.sum_exp
    a = ((g + g_ent * (head.entropies - s.log())) / s).unsqueeze(-1)
    d = torch.xlogy(head.exp, head.exp).mul_((-g_ent / s).unsqueeze(-1)).sub_(head.exp.mul_(a))  # (c, V)
    grad_h = torch.addcmul(d @ w, g_col, w[targets])
    return grad_h, (d, h, one_hot_rows)


def _raise_if_nonfinite(lp: Tensor, ent: Tensor, flat_rows: Tensor, t: int) -> None:
    bad = ~(torch.isfinite(lp) & torch.isfinite(ent))
    if bool(bad.any()):
        first = int(flat_rows[bad.nonzero()[0, 0].cpu()])
        raise ValueError(
            f"the log-probs or entropies computed from hidden and lm_head_weight are NaN/Inf at {int(bad.sum())} "
            f"unmasked tokens, first at {(first // t, first % t)}: check hidden and lm_head_weight for NaN/Inf, or "
            "pass on_nonfinite='mask' to the objective to drop those tokens and count them in 'nonfinite'."
        )


class _PrecomputedGrad(torch.autograd.Function):
    """Identity on the loss value whose backward returns the gradients computed in forward, times ``grad_out``."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        loss: Tensor,
        hidden: Tensor,
        weight: Tensor,
        grad_h: Tensor | None,
        grad_w: Tensor | None,
    ) -> Tensor:
        ctx.grads = (grad_h, grad_w)  # type: ignore[attr-defined]
        ctx.dtypes = (hidden.dtype, weight.dtype)  # type: ignore[attr-defined]
        ctx.shape = hidden.shape  # type: ignore[attr-defined]
        return loss.clone()

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor
    ) -> tuple[None, Tensor | None, Tensor | None, None, None]:
        if ctx.grads is None:  # type: ignore[attr-defined]
            raise RuntimeError(
                "objective_from_hidden's loss can be backpropagated once: its gradients were computed in forward "
                "and are consumed (scaled in place) by the first backward. Call objective_from_hidden again."
            )
        grad_h, grad_w = ctx.grads  # type: ignore[attr-defined]
        ctx.grads = None  # type: ignore[attr-defined]
        h_dtype, w_dtype = ctx.dtypes  # type: ignore[attr-defined]
        scale = grad_out.detach()
        if scale.device.type != "cpu" or float(scale) != 1.0:  # a pass over (V, H) saved in the common case
            for grad in (grad_h, grad_w):  # in place: a copy would raise the peak by the size of the weight
                if grad is not None:
                    grad.mul_(scale.to(grad.dtype))
        gh = None if grad_h is None else grad_h.to(h_dtype).view(ctx.shape)  # type: ignore[attr-defined]
        gw = None if grad_w is None else grad_w.to(w_dtype)
        return None, gh, gw, None, None
