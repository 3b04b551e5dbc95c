"""The batch an objective consumes (and the same without the policy's log-probs), its result, and input
validation.

Shapes: B sequences (completions), T completion positions (padded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

NonFinitePolicy = Literal["raise", "mask"]
NONFINITE_POLICIES: tuple[str, ...] = ("raise", "mask")

_TOKEN_FIELDS = ("old_logprobs", "ref_logprobs", "rollout_logprobs", "entropies", "token_weights")
#: the (B, T) inputs known before the policy's forward: all but entropies (RolloutBatch)
_ROLLOUT_FIELDS = ("old_logprobs", "ref_logprobs", "rollout_logprobs", "token_weights")


@dataclass(frozen=True)
class PolicyBatch:
    """One (micro-)batch of completions for a policy-gradient objective.

    Attributes:
        logprobs: ``(B, T)`` log-probs of the sampled tokens under the current policy; gradients flow here.
        advantages: ``(B,)`` or ``(B, 1)`` per sequence, or ``(B, T)`` per token.
        mask: ``(B, T)`` 1 (or True) for completion tokens that count, 0 for padding.
        old_logprobs: ``(B, T)`` behaviour policy pi_old; ``None`` means on-policy (``logprobs.detach()``).
        ref_logprobs: ``(B, T)`` reference policy, for the KL term (``beta > 0``) and the ``kl_ref`` metric.
        rollout_logprobs: ``(B, T)`` log-probs reported by the inference engine that sampled the batch,
            for mismatch correction and the ``mismatch_*`` metrics.
        entropies: ``(B, T)`` per-token entropy of the current policy, for the entropy bonus and metric.
        token_weights: ``(B, T)`` weights (float, or bool as 0/1) multiplying each token's policy term, detached:
            after the surrogate, before rollout IS weights, KL, entropy and aggregation, and without changing the
            normalisers. That is where verl applies ``rollout_is_weights`` and TRL its ``top_entropy_quantile``
            mask. None: 1 everywhere.

    Shapes and dtypes are checked on construction; values (NaN/Inf) are checked by the objective,
    which knows its ``on_nonfinite`` policy.
    """

    logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    entropies: Tensor | None = None
    token_weights: Tensor | None = None

    def __post_init__(self) -> None:
        lp = self.logprobs
        _check_tensor("logprobs", lp)
        if lp.dim() != 2:
            raise ValueError(
                f"logprobs must have shape (B, T) (batch, completion tokens); got shape {tuple(lp.shape)}. "
                "Gather the log-prob of each sampled token first (e.g. with rlguard.core_losses.logprobs_from_logits)."
            )
        _check_float("logprobs", lp)
        shape = tuple(lp.shape)
        _check_not_empty(shape)
        _check_tensor("mask", self.mask)
        if tuple(self.mask.shape) != shape:
            raise ValueError(f"mask must have the shape of logprobs {shape}; got {tuple(self.mask.shape)}.")
        _check_mask_values(self.mask)
        _check_tensor("advantages", self.advantages)
        adv_shape = tuple(self.advantages.shape)
        if adv_shape not in {(shape[0],), (shape[0], 1), shape}:
            raise ValueError(
                f"advantages must have shape (B,) or (B, 1) per sequence, or (B, T) per token, with B={shape[0]}, "
                f"T={shape[1]}; got {adv_shape}."
            )
        _check_float("advantages", self.advantages)
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            _check_tensor(name, value)
            if tuple(value.shape) != shape:
                raise ValueError(f"{name} must have the shape of logprobs {shape}; got {tuple(value.shape)}.")
            if not (name == "token_weights" and value.dtype == torch.bool):
                _check_float(name, value)
            if value.device != lp.device:
                raise ValueError(f"{name} is on {value.device} but logprobs is on {lp.device}; move it with .to().")
        for name in ("mask", "advantages"):
            if getattr(self, name).device != lp.device:
                raise ValueError(
                    f"{name} is on {getattr(self, name).device} but logprobs is on {lp.device}; move it with .to()."
                )

    @property
    def sequence_level_advantages(self) -> bool:
        """True when advantages hold one value per sequence, ``(B,)`` or ``(B, 1)``."""
        return self.advantages.dim() == 1 or self.advantages.shape[-1] == 1


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
        token_weights: ``(B, T)`` weights of each token's policy term (:class:`PolicyBatch`).
    """

    advantages: Tensor
    mask: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    token_weights: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mask, Tensor) or self.mask.dim() != 2:
            shape = tuple(self.mask.shape) if isinstance(self.mask, Tensor) else type(self.mask).__name__
            raise ValueError(f"mask must be a (B, T) tensor; got {shape}.")
        for name in _ROLLOUT_FIELDS:
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
            token_weights=cut(self.token_weights),
        )


@dataclass(frozen=True)
class LossOutput:
    """What an objective returns.

    Attributes:
        loss: 0-dim differentiable tensor; with explicit normalisers, the local share of the global loss.
        metrics: canonical metric names (:mod:`rlguard.metrics`, docs/design.md) to detached 0-dim tensors;
            never ``.item()``-ed here.
    """

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


def _check_not_empty(shape: tuple[int, ...]) -> None:
    """An empty batch has no token to learn from (and no maximum or mean to take): say which dimension is empty."""
    empty = [
        f"{dim}=0 ({what})"
        for dim, what, n in zip("BT", ("sequences", "completion tokens"), shape, strict=False)
        if n == 0
    ]
    if empty:
        raise ValueError(
            f"the batch is empty: logprobs has shape {shape}, {' and '.join(empty)}. An objective needs at least one "
            "sequence of at least one token: drop an empty micro-batch before calling the objective."
        )


def _check_tensor(name: str, value: object) -> None:
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor; got {type(value).__name__}.")


def _check_float(name: str, value: Tensor) -> None:
    if not value.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor (float16, bfloat16, float32 or float64); got {value.dtype}."
        )


def _check_mask_values(mask: Tensor) -> None:
    if mask.dtype == torch.bool:
        return
    if mask.is_complex():
        raise ValueError(f"mask must be bool or hold only 0 and 1; got dtype {mask.dtype}.")
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"mask must hold only 0 and 1 (or be bool); got {int(bad.sum())} other values, first "
            f"{mask[idx].item()!r} at {idx}. Pass a boolean mask or weight tokens through the advantages instead."
        )


@dataclass(frozen=True)
class PreparedBatch:
    """A validated batch in the compute dtype with non-finite and padded entries replaced by 0.

    ``mask`` is the float mask of the caller's tokens less those dropped for non-finite values (they leave the
    sums and the default counts alike, as if masked by the caller); ``advantages`` is broadcast to ``(B, T)``.
    """

    logprobs: Tensor  # (B, T)
    old_logprobs: Tensor  # (B, T), detached
    advantages: Tensor  # (B, T)
    mask: Tensor  # (B, T) float, 0/1
    ref_logprobs: Tensor | None  # (B, T)
    rollout_logprobs: Tensor | None  # (B, T), detached
    entropies: Tensor | None  # (B, T)
    token_weights: Tensor | None  # (B, T), detached
    nonfinite: Tensor  # () count of non-finite values at unmasked positions
    sequence_level: bool


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs, float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def prepare_batch(batch: PolicyBatch, on_nonfinite: NonFinitePolicy = "raise") -> PreparedBatch:
    """Upcast, broadcast advantages to ``(B, T)`` and handle NaN/Inf at unmasked positions.

    Padding (mask 0) may hold anything: it is replaced by 0 so that it cannot reach the loss or its gradient.
    ``on_nonfinite="raise"`` raises ``ValueError`` naming the tensor; ``"mask"`` drops the token and counts it.
    """
    if on_nonfinite not in NONFINITE_POLICIES:
        raise ValueError(f"on_nonfinite must be one of {NONFINITE_POLICIES}; got {on_nonfinite!r}.")
    dtype = compute_dtype(batch.logprobs.dtype)
    keep = batch.mask.bool()  # (B, T)
    seq_level = batch.sequence_level_advantages
    adv = batch.advantages.to(dtype)
    adv = adv.reshape(-1, 1).expand_as(batch.logprobs) if seq_level else adv  # (B, T)

    tensors: dict[str, Tensor | None] = {
        "logprobs": batch.logprobs.to(dtype),
        "advantages": adv,
        **{name: None if getattr(batch, name) is None else getattr(batch, name).to(dtype) for name in _TOKEN_FIELDS},
    }
    finite = torch.ones_like(keep)
    nonfinite = torch.zeros((), dtype=dtype, device=keep.device)
    for name, value in tensors.items():
        if value is None:
            continue
        bad = ~torch.isfinite(value.detach()) & keep
        if on_nonfinite == "raise":
            # report positions in the tensor the caller gave: a per-sequence advantage is one value per row
            given, given_bad = (
                (batch.advantages.reshape(-1), bad.any(dim=-1)) if name == "advantages" and seq_level else (value, bad)
            )
            _raise_if_nonfinite(name, given, given_bad)
        finite = finite & ~bad
        # a per-sequence advantage is one value, however many tokens it was broadcast to
        counted = bad.any(dim=-1) if name == "advantages" and seq_level else bad
        nonfinite = nonfinite + counted.sum().to(dtype)
    valid = keep & finite
    mask = valid.to(dtype)

    def clean(value: Tensor | None) -> Tensor | None:
        # torch.where routes no gradient to the dropped entries, so NaN there cannot reach the weights.
        return None if value is None else torch.where(valid, value, torch.zeros((), dtype=dtype, device=value.device))

    logprobs = clean(tensors["logprobs"])
    old = tensors["old_logprobs"]
    assert logprobs is not None
    old_clean = logprobs.detach() if old is None else clean(old.detach())
    assert old_clean is not None
    adv_clean = clean(tensors["advantages"])
    assert adv_clean is not None
    rollout, weights = tensors["rollout_logprobs"], tensors["token_weights"]
    return PreparedBatch(
        logprobs=logprobs,
        old_logprobs=old_clean,
        advantages=adv_clean,
        mask=mask,
        ref_logprobs=clean(tensors["ref_logprobs"]),
        rollout_logprobs=None if rollout is None else clean(rollout.detach()),
        entropies=clean(tensors["entropies"]),
        token_weights=None if weights is None else clean(weights.detach()),
        nonfinite=nonfinite,
        sequence_level=seq_level,
    )


def _raise_if_nonfinite(name: str, value: Tensor, bad: Tensor) -> None:
    count = int(bad.sum())
    if count == 0:
        return
    v = value.detach()
    n_nan, n_inf = int((torch.isnan(v) & bad).sum()), int((torch.isinf(v) & bad).sum())
    kinds = ", ".join(f"{n} {k}" for n, k in ((n_nan, "NaN"), (n_inf, "Inf")) if n)
    first = tuple(int(i) for i in bad.nonzero()[0])
    raise ValueError(
        f"{name} contains {kinds} value{'s' if count > 1 else ''} at unmasked positions, first at {first}. "
        "Fix the producer of this tensor, set mask=0 there, or pass on_nonfinite='mask' to drop those tokens "
        "from the loss and count them in the 'nonfinite' metric."
    )
