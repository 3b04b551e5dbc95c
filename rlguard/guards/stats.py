"""Monitors: the canonical stats of one optimizer step, reduced across data-parallel ranks in one collective.

Every stat has a fixed reduction (:data:`STAT_REDUCTIONS`): ``mean`` (a weighted mean, e.g. over tokens),
``sum``, ``max`` or ``min``. A rank accumulates its local share in a :class:`StepStats`; :meth:`StepStats.reduce`
packs all of them into one tensor, ``all_gather``-s it once and reduces locally in a fixed order, so every rank
ends with bit-identical numbers and therefore takes identical decisions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from rlguard.core_losses.advantages import group_advantages
from rlguard.core_losses.batch import LossOutput, PolicyBatch
from rlguard.metrics import REDUCTIONS, WEIGHTS, Reduction

#: Canonical stats and how ranks combine them, from the one metric table (:mod:`rlguard.metrics`). Internal
#: moments (prefix ``_``) let ``reward_std`` and ``mismatch_prob_corr`` be computed exactly from the combined data.
STAT_REDUCTIONS: dict[str, Reduction] = dict(REDUCTIONS)
_ORDER = tuple(STAT_REDUCTIONS)
_INDEX = {name: i for i, name in enumerate(_ORDER)}
#: the weight of each objective metric of ``LossOutput.metrics``: unmasked tokens, live sequences, or 1
_TOKEN_WEIGHTED = frozenset(name for name, w in WEIGHTS.items() if w == "tokens")
_SEQUENCE_WEIGHTED = frozenset(name for name, w in WEIGHTS.items() if w == "sequences")


class StepStats:
    """Local accumulators of one step's stats; :meth:`reduce` combines them across ranks.

    Tensor values stay on their device (no host-device sync per stat); the only sync is in :meth:`reduce`.
    """

    def __init__(self) -> None:
        # weighted sum, sum, max or min: Python floats while every input is one (no tensor op per stat), else a
        # tensor on the inputs' device
        self._value: list[Tensor | float | None] = [None] * len(_ORDER)
        self._weight: list[Tensor | float] = [0.0] * len(_ORDER)  # total weight of a mean; 1 once seen otherwise
        self._device: torch.device | None = None

    def _as_tensor(self, x: float | Tensor) -> Tensor:
        if isinstance(x, Tensor):
            if self._device is None:
                self._device = x.device
            return x.detach().to(device=self._device, dtype=torch.float64).reshape(())
        return torch.tensor(float(x), dtype=torch.float64, device=self._device)

    def add(self, name: str, value: float | Tensor, weight: float | Tensor = 1.0) -> None:
        """Add a local observation of ``name``; ``weight`` matters for ``mean`` stats only."""
        if name not in _INDEX:
            raise ValueError(f"unknown stat {name!r}; known stats: {', '.join(n for n in _ORDER if n[0] != '_')}.")
        i, kind = _INDEX[name], STAT_REDUCTIONS[name]
        prev, prev_w = self._value[i], self._weight[i]
        if not any(isinstance(x, Tensor) for x in (value, weight, prev, prev_w)):
            self._add_float(i, kind, float(value), float(weight))
            return
        v = self._as_tensor(value)
        prev_t = None if prev is None else self._as_tensor(prev)
        if kind == "mean":
            w = self._as_tensor(weight)
            self._value[i] = v * w if prev_t is None else prev_t + v * w
            self._weight[i] = w + prev_w
            return
        if prev_t is None:
            self._value[i] = v
        elif kind == "sum":
            self._value[i] = prev_t + v
        else:  # torch.maximum/minimum propagate NaN, as they should here
            self._value[i] = torch.maximum(prev_t, v) if kind == "max" else torch.minimum(prev_t, v)
        self._weight[i] = 1.0

    def _add_float(self, i: int, kind: str, v: float, w: float) -> None:
        """:meth:`add` in Python floats, with the same semantics (NaN propagates through max and min)."""
        prev = self._value[i]
        assert not isinstance(prev, Tensor) and not isinstance(self._weight[i], Tensor)
        if kind == "mean":
            self._value[i] = v * w if prev is None else prev + v * w
            self._weight[i] = w + self._weight[i]
            return
        if prev is None:
            self._value[i] = v
        elif kind == "sum":
            self._value[i] = prev + v
        elif math.isnan(prev) or math.isnan(v):
            self._value[i] = math.nan
        else:
            self._value[i] = max(prev, v) if kind == "max" else min(prev, v)
        self._weight[i] = 1.0

    def _packed(self) -> Tensor:
        """``(2, n)`` float64: values and weights; unseen stats have weight 0. Tensors are gathered with one
        ``stack`` per row, floats with one ``tensor`` (a handful of ops, whatever the number of stats)."""
        dev = self._device or torch.device("cpu")
        out = torch.zeros((2, len(_ORDER)), dtype=torch.float64, device=dev)
        rows: list[list[Tensor | float | None]] = [self._value, list(self._weight)]
        for row, items in enumerate(rows):
            tensors = [(i, x) for i, x in enumerate(items) if isinstance(x, Tensor)]
            floats = [(i, x) for i, x in enumerate(items) if x is not None and not isinstance(x, Tensor)]
            if tensors:
                out[row, [i for i, _ in tensors]] = torch.stack([x.to(dev) for _, x in tensors])
            if floats:
                out[row, [i for i, _ in floats]] = torch.tensor([x for _, x in floats], dtype=torch.float64, device=dev)
        return out

    def reduce(self, group: dist.ProcessGroup | None = None) -> dict[str, float]:
        """Combine across the ranks of ``group`` with one ``all_gather``; identical result on every rank.

        Without an initialised process group (or with one rank) this is the local result.
        """
        packed = self._packed()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            if dist.get_backend(group) == "gloo":
                packed = packed.cpu()
            gathered = [torch.empty_like(packed) for _ in range(dist.get_world_size(group))]
            dist.all_gather(gathered, packed, group=group)
            parts = torch.stack(gathered)  # (W, 2, n)
        else:
            parts = packed.unsqueeze(0)
        return _combine(parts.cpu().numpy())


_KIND = np.array([STAT_REDUCTIONS[name] for name in _ORDER])
_IS_MEAN, _IS_SUM, _IS_MAX, _IS_MIN = (np.equal(_KIND, kind) for kind in ("mean", "sum", "max", "min"))


def _combine(parts: np.ndarray) -> dict[str, float]:
    """``parts`` (W, 2, n): per-rank values and weights -> final stats, in a fixed order (vectorised over stats)."""
    values, weights = parts[:, 0, :], parts[:, 1, :]  # (W, n)
    seen = weights > 0
    summed = np.where(seen, values, 0.0).sum(0)  # (n,)
    total_weight = np.where(seen, weights, 0.0).sum(0)
    mean = summed / np.where(total_weight > 0, total_weight, 1.0)
    high = np.where(seen, values, -np.inf).max(0)
    low = np.where(seen, values, np.inf).min(0)
    combined = np.select([_IS_MEAN, _IS_SUM, _IS_MAX, _IS_MIN], [mean, summed, high, low])
    # an extreme over values one of which is NaN is NaN (a mean or sum of them is NaN already)
    combined = np.where((_IS_MAX | _IS_MIN) & (np.isnan(values) & seen).any(0), np.nan, combined)
    out = {name: float(combined[i]) for i, name in enumerate(_ORDER) if seen[:, i].any()}
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


def repetition_flags(
    completions: Sequence[Sequence[int]], *, max_period: int = 20, min_repeats: int = 3, min_span: int = 12
) -> list[bool]:
    """True for completions that end in an n-gram loop: a suffix of at least ``max(min_repeats * p, min_span)``
    tokens that repeats with some period ``p <= max_period`` (``"the the the ..."``, ``"a b c a b c ..."``).

    This is the degenerate repetition that precedes length explosion and truncation in collapsing GRPO runs.
    """
    flags = []
    for seq in completions:
        ids = np.asarray(seq, dtype=np.int64)
        looping = False
        for p in range(1, min(max_period, len(ids) // min_repeats) + 1):
            need = max(min_repeats * p, min_span)
            if len(ids) < need:
                break
            tail = ids[-need:]
            if np.array_equal(tail[p:], tail[:-p]):
                looping = True
                break
        flags.append(looping)
    return flags


def collect_step_stats(
    *,
    batch: PolicyBatch | None = None,
    output: LossOutput | None = None,
    grad_norm: float | Tensor | None = None,
    lr: float | None = None,
    rewards: Tensor | None = None,
    group_ids: Tensor | None = None,
    lengths: Tensor | None = None,
    truncated: Tensor | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
    stats: StepStats | None = None,
) -> StepStats:
    """Accumulate this rank's share of the canonical stats; call once per micro-batch, then ``reduce()``.

    Args:
        batch: the objective's input; gives the trainer-vs-engine probability correlation and non-finite counts.
        output: the objective's ``LossOutput``; its metrics are token-weighted by ``batch.mask``.
        grad_norm: total gradient norm before clipping (identical on every rank after the all-reduce).
        lr: current learning rate.
        rewards: ``(N,)`` rewards; group_ids ``(N,)`` prompt ids, for the zero-variance-group fraction.
        lengths: ``(N,)`` completion lengths in tokens; truncated ``(N,)`` bool, hit the generation budget.
        completion_ids: token ids of each completion, for the repetition rate.
        stats: accumulator to add to (micro-batches of one step); a new one if None.
    """
    st = StepStats() if stats is None else stats
    tokens: float | Tensor = 1.0
    sequences: float | Tensor = 1.0
    if batch is not None:
        mask = batch.mask.detach()
        tokens = mask.double().sum()
        sequences = (mask != 0).any(dim=-1).double().sum() if mask.dim() > 1 else 1.0
        _add_prob_moments(st, batch)
    if output is not None:
        for name, value in output.metrics.items():
            if name not in STAT_REDUCTIONS:
                continue
            weight = tokens if name in _TOKEN_WEIGHTED else sequences if name in _SEQUENCE_WEIGHTED else 1.0
            st.add(name, value, weight=weight)
        st.add("nonfinite", (~torch.isfinite(output.loss.detach())).double())
    if grad_norm is not None:
        g = grad_norm if isinstance(grad_norm, Tensor) else torch.tensor(float(grad_norm))
        st.add("grad_norm", g)
        st.add("nonfinite", (~torch.isfinite(g.detach())).double())
    if lr is not None:
        st.add("lr", lr)
    if rewards is not None:
        _add_reward_stats(st, rewards, group_ids)
    if lengths is not None:
        lf = lengths.detach().double()
        if lf.numel():
            st.add("length_mean", lf.mean(), weight=lf.numel())
            st.add("length_max", lf.max())
    if truncated is not None and truncated.numel():
        st.add("truncated_frac", truncated.detach().double().mean(), weight=truncated.numel())
    if completion_ids is not None and len(completion_ids) > 0:
        flags = repetition_flags(completion_ids)
        st.add("repetition_rate", sum(flags) / len(flags), weight=len(flags))
    return st


def _add_prob_moments(st: StepStats, batch: PolicyBatch) -> None:
    """Moments of the trainer's and the engine's token probabilities, for their Pearson correlation."""
    if batch.rollout_logprobs is None:
        return
    trainer = batch.logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs.detach()
    keep = batch.mask.bool() & torch.isfinite(trainer) & torch.isfinite(batch.rollout_logprobs)
    x = trainer[keep].double().exp()
    y = batch.rollout_logprobs.detach()[keep].double().exp()
    for name, value in (
        ("_p_n", x.numel()),
        ("_p_x", x.sum()),
        ("_p_y", y.sum()),
        ("_p_xx", (x * x).sum()),
        ("_p_yy", (y * y).sum()),
        ("_p_xy", (x * y).sum()),
    ):
        st.add(name, value)


def _add_reward_stats(st: StepStats, rewards: Tensor, group_ids: Tensor | None) -> None:
    r = rewards.detach().double().reshape(-1)
    if r.numel() == 0:
        return
    st.add("reward_mean", r.mean(), weight=r.numel())
    st.add("_reward_sq_mean", (r * r).mean(), weight=r.numel())
    if group_ids is not None:
        ga = group_advantages(r, group_ids.reshape(-1))
        n_groups = int(torch.unique(group_ids).numel())
        st.add("frac_zero_std_groups", ga.frac_zero_std_groups, weight=n_groups)
        st.add("frac_zero_std_solved", ga.frac_zero_std_solved, weight=n_groups)


def stats_from_mapping(values: Mapping[str, float]) -> StepStats:
    """A :class:`StepStats` holding already-reduced values (e.g. from a log), each with weight 1."""
    st = StepStats()
    for name, value in values.items():
        if name in STAT_REDUCTIONS:
            st.add(name, value)
    return st
