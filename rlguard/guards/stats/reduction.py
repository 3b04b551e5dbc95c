"""How stats combine across micro-batches and ranks, from the metric table (:mod:`rlguard.metrics`): the order
and reduction of every stat, where a tuple of names goes in the dense accumulators, and the one combination of
per-rank values and weights (:func:`reduce_columns`), which :class:`rlguard.guards.StepStats` (:func:`combine`)
and the TRL adapter's logging of each micro-batch (:func:`reduce_rows`) share.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray as _NDArray
from torch import Tensor

from rlguard.metrics import REDUCTIONS, WEIGHTS, Reduction

__all__ = [
    "INDEX",
    "ORDER",
    "STAT_REDUCTIONS",
    "Kinds",
    "NDArray",
    "combine",
    "combine_local",
    "kinds",
    "reduce_columns",
    "reduce_rows",
]

NDArray = _NDArray[Any]

#: Canonical stats and how ranks combine them, from the one metric table (:mod:`rlguard.metrics`). Internal
#: moments (prefix ``_``) let ``reward_std`` and ``mismatch_prob_corr`` be computed exactly from the combined data.
STAT_REDUCTIONS: dict[str, Reduction] = dict(REDUCTIONS)
ORDER = tuple(STAT_REDUCTIONS)
INDEX = {name: i for i, name in enumerate(ORDER)}


@dataclass(frozen=True)
class Kinds:
    """Where the stats of a tuple of names go: ``index`` ``(K,)`` into the ``n`` stats, and ``(n,)`` masks of the
    named ones (``present``, as float) by reduction; ``extremes`` ``(2, n)``: the max ones, the min ones."""

    index: Tensor
    present: Tensor
    mean: Tensor
    sum: Tensor
    extremes: Tensor


@functools.lru_cache(maxsize=64)
def kinds(names: tuple[str, ...], device: torch.device) -> Kinds:
    """The :class:`Kinds` of ``names``, cached per names and device."""
    unknown = [n for n in names if n not in INDEX]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"stats must be distinct known names; got unknown {unknown} in {list(names)}.")
    named = set(names)

    def mask(kind: str) -> Tensor:
        return torch.tensor([n in named and STAT_REDUCTIONS[n] == kind for n in ORDER], device=device)

    return Kinds(
        index=torch.tensor([INDEX[n] for n in names], device=device),
        present=torch.tensor([float(n in named) for n in ORDER], dtype=torch.float64, device=device),
        mean=mask("mean"),
        sum=mask("sum"),
        extremes=torch.stack([mask("max"), mask("min")]),
    )


_REDUCTION_ROW = {"mean": 0, "sum": 1, "max": 2, "min": 3}  # rows of the stack reduce_columns computes
_KIND = np.array([STAT_REDUCTIONS[name] for name in ORDER])
_IS_MEAN_LIST = [kind == "mean" for kind in _KIND.tolist()]
_KIND_ROW = np.array([_REDUCTION_ROW[kind] for kind in _KIND])


def reduce_columns(values: NDArray, weights: NDArray, rows: NDArray) -> NDArray:
    """Each column's reduction over the ``W`` rows (ranks, micro-batches) of ``values`` and ``weights`` ``(W, K)``:
    ``rows`` ``(K,)`` picks mean (0), sum (1), max (2) or min (3). A mean's values are its weighted sums, so the
    mean is ``sum(values) / sum(weights)``; rows of weight 0 take no part; an extreme over a NaN is NaN.
    Returns ``(K,)`` (0 for a column no row saw)."""
    seen = weights > 0
    summed = np.where(seen, values, 0.0).sum(0)  # (K,)
    total_weight = np.where(seen, weights, 0.0).sum(0)
    mean = summed / np.where(total_weight > 0, total_weight, 1.0)
    high = np.where(seen, values, -np.inf).max(0)
    low = np.where(seen, values, np.inf).min(0)
    combined = np.stack([mean, summed, high, low])[rows, np.arange(rows.size)]  # (K,): each column's own reduction
    # an extreme over values one of which is NaN is NaN (a mean or sum of them is NaN already)
    extreme = rows >= _REDUCTION_ROW["max"]
    return np.where(extreme & (np.isnan(values) & seen).any(0), np.nan, combined)


def combine(parts: np.ndarray) -> dict[str, float]:
    """``parts`` (W, 2, n): per-rank values and weights -> final stats, in a fixed order (vectorised over stats)."""
    values, weights = parts[:, 0, :], parts[:, 1, :]  # (W, n)
    combined = reduce_columns(values, weights, _KIND_ROW)
    any_seen: list[bool] = np.any(weights > 0, axis=0).tolist()
    out = {name: x for name, x, on in zip(ORDER, combined.tolist(), any_seen, strict=True) if on}
    _finish(out)
    return out


def reduce_rows(names: Sequence[str], values: NDArray, tokens: NDArray, sequences: NDArray) -> NDArray:
    """The metric table's reduction of one value per row (rank) of each of ``names``: values ``(W, K)`` (a mean's
    is the row's own mean), each row's unmasked ``tokens`` and live ``sequences`` ``(W,)``, which weight the means
    (samples as tokens; equally weighted ones count each row once). Names outside the table are token-weighted
    means. Float64 on the host; returns ``(K,)``."""
    rows, basis = _layout(tuple(names))
    weights = np.stack([tokens, sequences, np.ones_like(tokens)])[basis].T  # (W, K)
    mean = rows == _REDUCTION_ROW["mean"]
    return reduce_columns(np.where(mean, values * weights, values), np.where(mean, weights, 1.0), rows)


@functools.lru_cache(maxsize=64)
def _layout(names: tuple[str, ...]) -> tuple[NDArray, NDArray]:
    """Per name: its reduction's row in :func:`reduce_columns` and its weight's row in :func:`reduce_rows`'s basis."""
    basis = {"tokens": 0, "samples": 0, "sequences": 1, "equal": 2}
    rows = np.array([_REDUCTION_ROW[REDUCTIONS.get(name, "mean")] for name in names], dtype=np.int64)
    return rows, np.array([basis[WEIGHTS.get(name, "tokens")] for name in names], dtype=np.int64)


def combine_local(values: Sequence[float | None], weights: Sequence[float]) -> dict[str, float]:
    """:func:`combine` of one rank's Python part, in Python (numpy's per-call overhead dominates on these short
    arrays; ``benchmarks/guard_overhead.py`` times the guard's step): a mean is the weighted sum over the weight,
    the others are their value; the same floats."""
    out = {
        name: v / w if mean else v
        for name, mean, v, w in zip(ORDER, _IS_MEAN_LIST, values, weights, strict=True)
        if w > 0 and v is not None
    }
    _finish(out)
    return out


def _finish(out: dict[str, float]) -> None:
    """Derived stats from the combined moments; internal entries are removed."""
    if "reward_mean" in out and "_reward_sq_mean" in out:
        out["reward_std"] = math.sqrt(max(out["_reward_sq_mean"] - out["reward_mean"] ** 2, 0.0))
    n = out.get("_p_n", 0.0)
    if n > 1:
        vx = out["_p_xx"] - out["_p_x"] ** 2 / n
        vy = out["_p_yy"] - out["_p_y"] ** 2 / n
        cov = out["_p_xy"] - out["_p_x"] * out["_p_y"] / n
        out["mismatch_prob_corr"] = cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else 1.0
    for name in [k for k in out if k.startswith("_")]:
        del out[name]
