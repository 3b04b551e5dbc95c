"""How the stats of one step combine across micro-batches and ranks: the order and reduction of every stat (from
the metric table, :mod:`rlguard.metrics`), where a tuple of names goes in the dense accumulators, and the final
combination of per-rank values and weights in a fixed order (:class:`rlguard.guards.StepStats` uses these).
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

from rlguard.metrics import REDUCTIONS, Reduction

__all__ = ["INDEX", "ORDER", "STAT_REDUCTIONS", "Kinds", "NDArray", "combine", "combine_local", "kinds"]

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


_KIND = np.array([STAT_REDUCTIONS[name] for name in ORDER])
_IS_MAX, _IS_MIN = (np.equal(_KIND, kind) for kind in ("max", "min"))
_IS_MEAN_LIST = [kind == "mean" for kind in _KIND.tolist()]
#: per stat, its row in the stack of the four reductions (mean, sum, max, min) that :func:`combine` computes
_KIND_ROW = np.array([("mean", "sum", "max", "min").index(kind) for kind in _KIND])
_COLUMN = np.arange(len(ORDER))


def combine(parts: np.ndarray) -> dict[str, float]:
    """``parts`` (W, 2, n): per-rank values and weights -> final stats, in a fixed order (vectorised over stats)."""
    values, weights = parts[:, 0, :], parts[:, 1, :]  # (W, n)
    seen = weights > 0
    summed = np.where(seen, values, 0.0).sum(0)  # (n,)
    total_weight = np.where(seen, weights, 0.0).sum(0)
    mean = summed / np.where(total_weight > 0, total_weight, 1.0)
    high = np.where(seen, values, -np.inf).max(0)
    low = np.where(seen, values, np.inf).min(0)
    combined = np.stack([mean, summed, high, low])[_KIND_ROW, _COLUMN]  # (n,): each stat's own reduction
    # an extreme over values one of which is NaN is NaN (a mean or sum of them is NaN already)
    combined = np.where((_IS_MAX | _IS_MIN) & (np.isnan(values) & seen).any(0), np.nan, combined)
    any_seen: list[bool] = np.any(seen, axis=0).tolist()
    out = {name: x for name, x, on in zip(ORDER, combined.tolist(), any_seen, strict=True) if on}
    _finish(out)
    return out


def combine_local(values: Sequence[float | None], weights: Sequence[float]) -> dict[str, float]:
    """:func:`combine` of one rank's Python part, in Python (numpy's calls on these short arrays cost 0.3-0.4 ms
    per step of the tiny TRL benchmark, this 0.06): a mean is the weighted sum over the weight, the others are
    their value; the same floats."""
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
