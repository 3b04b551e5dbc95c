"""The objective fused into the LM-head pass: loss, metrics and both gradients in one pass over the vocabulary.

:func:`~rlguard.core_losses.logprobs_from_hidden` keeps memory flat by recomputing the logits in backward: four
matrix products where the full-logits path does three. Here the per-token loss gradient is known inside the
forward chunk loop, because everything the objective needs besides the current log-probs (old, reference and
rollout log-probs, advantages, mask, normalisers) is known before the forward. So each chunk's gradients for the
hidden states and the LM-head weight are computed while its logits are live: three matrix products, the floor.
This is Liger-Kernel's fused linear PPO loss (``chunked_loss/fused_linear_ppo.py``, Triton, GPU only), in pure
torch and for any registered objective.

The objective's math is not repeated here. For each chunk its log-probs ``lp`` and entropies ``H`` become autograd
leaves, the objective runs on the chunk's sequences with the whole batch's normalisers, and autograd gives
``g = dL/dlp`` and ``g_H = dL/dH``. The chain rule through the log-softmax finishes the job:
``dL/dz_v = g [v = y] - p_v (g + g_H (log p_v + H))`` for the logits ``z`` (``p = softmax(z)``, ``y`` the target).
The loss and metrics returned are those of one objective call on the whole batch with the computed log-probs.

Chunks: the loss is a sum over sequences once its normalisers are fixed (what makes micro-batches add up), so a
chunk of whole sequences gets its exact gradient. Objectives whose token gradient depends only on that token
(GRPO, Dr. GRPO, DAPO, CISPO, SAPO, without off-policy sequence masking) also split a sequence: the chunk's
objective call sees the full rows with the other tokens' log-probs as placeholders, whose values cannot reach the
chunk's gradient. The others (GSPO, GSPO-token, GMPO, off-policy sequence masking, third-party objectives) chunk
by whole sequences, so one long sequence is one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import Normaliser, check_normaliser, default_normalisers
from rlguard.core_losses.batch import LossOutput, PolicyBatch, prepare_batch
from rlguard.core_losses.logprobs import _default_chunk_rows, _row_dot
from rlguard.core_losses.objective import Objective
from rlguard.core_losses.objectives import CISPO, DAPO, GRPO, SAPO, DrGRPO

__all__ = ["RolloutBatch", "objective_from_hidden"]

#: objectives whose per-token loss gradient depends on that token's log-prob and entropy only (exact types: a
#: subclass may override ``surrogate``)
_TOKEN_LOCAL: frozenset[type[Objective]] = frozenset({GRPO, DrGRPO, DAPO, CISPO, SAPO})
_TOKEN_FIELDS = ("old_logprobs", "ref_logprobs", "rollout_logprobs")


@dataclass(frozen=True)
class RolloutBatch:
    """A :class:`~rlguard.core_losses.PolicyBatch` without ``logprobs`` and ``entropies``: what is known before
    the policy's forward. :func:`objective_from_hidden` computes the other two.

    Attributes:
        advantages: ``(B,)`` or ``(B, 1)`` per sequence, or ``(B, T)`` per token.
        mask: ``(B, T)`` 1 (or True) for completion tokens that count, 0 for padding.
        old_logprobs: ``(B, T)`` behaviour policy; ``None`` means on-policy.
        ref_logprobs: ``(B, T)`` reference policy, for the KL term and the ``kl_ref`` metric.
        rollout_logprobs: ``(B, T)`` the inference engine's log-probs, for mismatch correction and metrics.
    """

    advantages: Tensor
    mask: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    rollout_logprobs: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mask, Tensor) or self.mask.dim() != 2:
            shape = tuple(self.mask.shape) if isinstance(self.mask, Tensor) else type(self.mask).__name__
            raise ValueError(f"mask must be a (B, T) tensor; got {shape}.")
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if isinstance(value, Tensor) and value.shape != self.mask.shape:
                raise ValueError(
                    f"{name} must have the shape of mask {tuple(self.mask.shape)}; got {tuple(value.shape)}."
                )
        self.policy_batch(torch.zeros(self.mask.shape, device=self.mask.device))  # PolicyBatch's checks

    def policy_batch(self, logprobs: Tensor, entropies: Tensor | None = None, rows: slice = slice(None)) -> PolicyBatch:
        """The :class:`PolicyBatch` of sequences ``rows`` with these ``logprobs`` and ``entropies`` ``(b, T)``."""

        def cut(value: Tensor | None) -> Tensor | None:
            return None if value is None else value[rows]

        return PolicyBatch(
            logprobs=logprobs,
            advantages=self.advantages[rows],
            mask=self.mask[rows],
            old_logprobs=cut(self.old_logprobs),
            ref_logprobs=cut(self.ref_logprobs),
            rollout_logprobs=cut(self.rollout_logprobs),
            entropies=entropies,
        )


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
) -> LossOutput:
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
        chunk_size: rows (tokens) per chunk; default about 2**25 logits per chunk. Objectives that need whole
            sequences take as many whole sequences as fit, and at least one.
    Returns:
        :class:`LossOutput`: the 0-dim loss (its backward scales the precomputed gradients) and the metrics.
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
    token_local = type(objective) in _TOKEN_LOCAL and objective.off_policy_mask_delta is None
    chunk_rows = chunk_size or _default_chunk_rows(lm_head_weight.shape[0])
    bounds = _chunk_bounds(rows_cpu, t, chunk_rows, token_local)

    with torch.no_grad():
        h_flat = hidden.reshape(b * t, -1)
        w = lm_head_weight.to(acc)  # (V, H)
        targets = target_ids.reshape(-1)
        logprobs = torch.zeros(b * t, dtype=acc, device=hidden.device)
        entropies = torch.zeros(b * t, dtype=acc, device=hidden.device)
        grad_h = torch.zeros(h_flat.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=acc, device=w.device) if need_w else None
        for start, stop in bounds:
            idx = rows[start:stop]
            h = h_flat[idx].to(acc)  # (c, H)
            logits = h @ w.T  # (c, V)
            logits.sub_(logits.amax(-1, keepdim=True))  # shifted in place: exp cannot overflow
            e = logits.exp()  # (c, V) unnormalised probabilities
            sum_e = e.sum(-1)  # (c,)
            log_z = sum_e.log()  # (c,) of the shifted logits
            y = targets[idx]
            lp = logits.gather(-1, y.unsqueeze(-1)).squeeze(-1) - log_z  # (c,)
            ent = log_z - _row_dot(e, logits) / sum_e  # (c,) H = log Z - E_p[z]
            logprobs[idx], entropies[idx] = lp, ent
            if grad_h is None and grad_w is None:
                continue
            first, last = int(rows_cpu[start]) // t, int(rows_cpu[stop - 1]) // t + 1
            if objective.on_nonfinite == "raise":
                _raise_if_nonfinite(lp, ent, rows_cpu[start:stop], t)
            g, g_ent = _token_grads(objective, batch, lp, ent, idx - first * t, slice(first, last), normalisers)
            if g is None and g_ent is None:
                continue
            d = _logit_grads(logits, e, sum_e, log_z, ent, y, g, g_ent)  # (c, V), in the buffer of e
            if grad_h is not None:
                grad_h[idx] = d @ w
            if grad_w is not None:
                grad_w.addmm_(d.T, h)

    out = objective(
        batch.policy_batch(logprobs.view(b, t), entropies.view(b, t)),
        num_tokens=num_tokens,
        num_sequences=num_sequences,
    )
    if grad_h is None and grad_w is None:
        return out
    loss = _PrecomputedGrad.apply(out.loss.detach(), hidden, lm_head_weight, grad_h, grad_w)  # type: ignore[no-untyped-call]
    return LossOutput(loss=loss, metrics=out.metrics)


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


def _token_grads(
    objective: Objective,
    batch: RolloutBatch,
    lp: Tensor,
    ent: Tensor,
    positions: Tensor,
    seqs: slice,
    normalisers: tuple[Normaliser, Normaliser],
) -> tuple[Tensor | None, Tensor | None]:
    """``dL/dlp`` and ``dL/dH`` ``(c,)`` of the chunk's tokens at flat ``positions`` of the sequences ``seqs``,
    by autograd through the objective (None where the loss does not depend on them)."""
    with torch.enable_grad():
        lp_leaf, ent_leaf = lp.detach().requires_grad_(), ent.detach().requires_grad_()
        n_seq = seqs.stop - seqs.start
        t = batch.mask.shape[1]
        # the other tokens of these sequences hold placeholders (pi = pi_old): they cannot reach this chunk's gradient
        old = batch.old_logprobs
        base = lp.new_zeros(n_seq * t) if old is None else old[seqs].reshape(-1).to(lp.dtype)
        lp_rows = base.index_put((positions,), lp_leaf).view(n_seq, t)
        ent_rows = ent.new_zeros(n_seq * t).index_put((positions,), ent_leaf).view(n_seq, t)
        out = objective(
            batch.policy_batch(lp_rows, ent_rows, seqs), num_tokens=normalisers[0], num_sequences=normalisers[1]
        )
        if not out.loss.requires_grad:
            return None, None
        g, g_ent = torch.autograd.grad(out.loss, (lp_leaf, ent_leaf), allow_unused=True)
    return g, g_ent


def _logit_grads(
    shifted: Tensor,
    e: Tensor,
    sum_e: Tensor,
    log_z: Tensor,
    ent: Tensor,
    targets: Tensor,
    g: Tensor | None,
    g_ent: Tensor | None,
) -> Tensor:
    """``dL/dz = g onehot(y) - p (g + g_H (log p + H))`` ``(c, V)``, built in place in ``e`` (and ``shifted``).

    ``d log p_y / dz = onehot(y) - p``; ``dH/dz = -p (log p + H)``.
    """
    g = torch.zeros_like(sum_e) if g is None else g
    if g_ent is None:
        d = e.mul_((-g / sum_e).unsqueeze(-1))
    else:  # p * coef with coef = -(g + g_H (log p + H)), log p = shifted - log Z, p = e / sum_e
        coef = shifted.sub_((log_z - ent).unsqueeze(-1)).mul_((-g_ent / sum_e).unsqueeze(-1))
        d = e.mul_(coef.sub_((g / sum_e).unsqueeze(-1)))
    d[torch.arange(d.shape[0], device=d.device), targets] += g
    return d


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
        # in place: a (V, H) copy would raise the peak by the size of the weight
        gh = None if grad_h is None else grad_h.mul_(scale.to(grad_h.dtype)).to(h_dtype).view(ctx.shape)  # type: ignore[attr-defined]
        gw = None if grad_w is None else grad_w.mul_(scale.to(grad_w.dtype)).to(w_dtype)
        return None, gh, gw, None, None
