"""Hypothesis strategies for :class:`rlguard.core_losses.PolicyBatch` inputs and objective hyper-parameters.

A strategy draws :class:`BatchData` (plain float64 numpy arrays), not tensors: a test builds as many fresh
batches from one draw as it needs (``data.batch(torch.bfloat16)`` and the same values upcast to float32,
``data.batch(torch.bfloat16, upcast_to=torch.float32)``), each with its own leaf tensors for the gradient.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlguard.core_losses import AGGREGATIONS, KL_ESTIMATORS, PolicyBatch, objective_class

MAX_B = 5
MAX_T = 6

#: Values a padding position may hold: anything, including NaN and Inf (they must not reach the loss).
GARBAGE = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30)


@dataclass(frozen=True)
class BatchData:
    """The values of one batch. ``None`` for absent optional tensors; every array is float64 ``(B, T)``
    except ``advantages`` (``(B,)``, ``(B, 1)`` or ``(B, T)``) and ``mask`` (0/1 float64, cast on build)."""

    logprobs: np.ndarray
    advantages: np.ndarray
    mask: np.ndarray
    mask_dtype: torch.dtype | None  # None: the dtype of logprobs
    old_logprobs: np.ndarray | None = None
    ref_logprobs: np.ndarray | None = None
    rollout_logprobs: np.ndarray | None = None
    entropies: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.logprobs.shape

    def batch(self, dtype: torch.dtype, *, upcast_to: torch.dtype | None = None) -> PolicyBatch:
        """A fresh batch in ``dtype`` (then cast to ``upcast_to`` if given, so that both hold the same values).

        ``logprobs`` and ``entropies`` are leaves with ``requires_grad``; read their ``.grad`` after backward.
        """

        def tensor(values: np.ndarray | None, grad: bool = False) -> torch.Tensor | None:
            if values is None:
                return None
            t = torch.tensor(values, dtype=torch.float64).to(dtype)
            if upcast_to is not None:
                t = t.to(upcast_to)
            return t.requires_grad_(grad)

        mask_dtype = self.mask_dtype or (upcast_to or dtype)
        logprobs = tensor(self.logprobs, grad=True)
        advantages = tensor(self.advantages)
        assert logprobs is not None and advantages is not None
        return PolicyBatch(
            logprobs=logprobs,
            advantages=advantages,
            mask=torch.tensor(self.mask).to(mask_dtype),
            old_logprobs=tensor(self.old_logprobs),
            ref_logprobs=tensor(self.ref_logprobs),
            rollout_logprobs=tensor(self.rollout_logprobs),
            entropies=tensor(self.entropies, grad=True),
        )

    def masked(self, drop: np.ndarray) -> BatchData:
        """The same values with the positions where ``drop`` is True masked out."""
        return dataclasses.replace(self, mask=np.where(drop, 0.0, self.mask))


def _floats(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(low, high, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def masks(draw: st.DrawFn, b: int, t: int) -> np.ndarray:
    """``(B, T)`` 0/1 masks; each row is empty, full, a left-aligned completion, or arbitrary."""
    rows = []
    for _ in range(b):
        kind = draw(st.sampled_from(["empty", "full", "prefix", "random"]))
        if kind == "empty":
            row = [0.0] * t
        elif kind == "full":
            row = [1.0] * t
        elif kind == "prefix":
            n = draw(st.integers(1, t))
            row = [1.0] * n + [0.0] * (t - n)
        else:
            row = [float(v) for v in draw(st.lists(st.booleans(), min_size=t, max_size=t))]
        rows.append(row)
    return np.array(rows, dtype=np.float64).reshape(b, t)


@st.composite
def batch_data(
    draw: st.DrawFn,
    *,
    max_b: int = MAX_B,
    max_t: int = MAX_T,
    logprob_range: float = 30.0,
    offset_range: float = 25.0,
    adv_range: float = 3.0,
    garbage_padding: bool = True,
    optional: bool = True,
    all_masked: bool = False,
) -> BatchData:
    """A batch of finite values at unmasked positions.

    Args:
        logprob_range: logprobs lie in ``[-logprob_range, 0]``.
        offset_range: old/ref/rollout log-probs differ from logprobs by at most this (beyond the +-20 clamp of
            the log-ratio by default; keep it small for float16, whose gradients overflow at 65504).
        garbage_padding: padding positions may hold NaN, Inf or huge values.
        optional: draw old/ref/rollout log-probs and entropies (each present or not).
        all_masked: every mask entry is 0.
    """
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    mask = np.zeros((b, t)) if all_masked else draw(masks(b, t))

    def token_values(low: float, high: float) -> np.ndarray:
        return draw(hnp.arrays(np.float64, (b, t), elements=_floats(low, high)))

    logprobs = token_values(-logprob_range, 0.0)

    def near_logprobs() -> np.ndarray | None:
        if optional and draw(st.booleans()):
            # log-probabilities: never above 0 (DPPO reads them as probabilities and rejects more)
            return np.minimum(logprobs + token_values(-offset_range, offset_range), 0.0)
        return None

    adv_shape = draw(st.sampled_from([(b,), (b, 1), (b, t)]))
    advantages = draw(hnp.arrays(np.float64, adv_shape, elements=_floats(-adv_range, adv_range)))
    entropies = token_values(0.0, 5.0) if optional and draw(st.booleans()) else None
    mask_dtype = draw(st.sampled_from([None, torch.bool, torch.int64, torch.float32]))
    data = BatchData(
        logprobs=logprobs,
        advantages=advantages,
        mask=mask,
        mask_dtype=mask_dtype,
        old_logprobs=near_logprobs(),
        ref_logprobs=near_logprobs(),
        rollout_logprobs=near_logprobs(),
        entropies=entropies,
    )
    if garbage_padding and draw(st.booleans()):
        data = _fill_padding(draw, data)
    return data


def _fill_padding(draw: st.DrawFn, data: BatchData) -> BatchData:
    """Put garbage at the padding positions of the (B, T) tensors (and of per-token advantages)."""
    pad = data.mask == 0
    changes: dict[str, Any] = {}
    for f in ("logprobs", "old_logprobs", "ref_logprobs", "rollout_logprobs", "entropies", "advantages"):
        values = getattr(data, f)
        if values is None:
            continue
        # per-sequence advantages are padding only where the whole row is
        where = pad if values.shape == pad.shape else pad.all(axis=1).reshape(values.shape)
        junk = draw(hnp.arrays(np.float64, where.shape, elements=st.sampled_from(GARBAGE)))
        changes[f] = np.where(where, junk, values)
    return dataclasses.replace(data, **changes)


@st.composite
def objective_kwargs(draw: st.DrawFn, name: str, data: BatchData) -> dict[str, Any]:
    """Valid hyper-parameters of objective ``name`` that use the optional tensors ``data`` has."""
    accepted = objective_class(name).hyperparameters()
    kw: dict[str, Any] = {}
    if draw(st.booleans()):
        kw["aggregation"] = draw(st.sampled_from(AGGREGATIONS))
    if draw(st.booleans()):
        kw["max_length"] = data.shape[1] + draw(st.integers(0, 4))
    if data.ref_logprobs is not None:
        kw["beta"] = draw(st.sampled_from([0.0, 0.04, 1.0]))
        kw["kl_estimator"] = draw(st.sampled_from(KL_ESTIMATORS))
        kw["kl_unbiased"] = draw(st.booleans())
    if data.entropies is not None:
        kw["entropy_coef"] = draw(st.sampled_from([0.0, 0.01]))
    if data.rollout_logprobs is not None:
        kw["rollout_is"] = draw(st.sampled_from([None, "token", "sequence"]))
        kw["rollout_mask"] = draw(st.sampled_from([None, "token", "sequence", "geometric"]))
    if draw(st.booleans()):
        kw["off_policy_mask_delta"] = draw(st.sampled_from([0.0, 0.5]))
    if "clip_c" in accepted and draw(st.booleans()):
        kw["clip_c"] = draw(st.sampled_from([1.5, 3.0, 10.0]))
    return {k: v for k, v in kw.items() if k in accepted}
