"""Monitors: the canonical stats of one optimizer step, reduced across data-parallel ranks in one collective.

Every stat has a fixed reduction (:data:`STAT_REDUCTIONS`): ``mean`` (a weighted mean, e.g. over tokens),
``sum``, ``max`` or ``min``. A rank accumulates its local share in a :class:`StepStats`; :meth:`StepStats.reduce`
packs all of them into one tensor, ``all_gather``-s it once and reduces locally in a fixed order, so every rank
ends with bit-identical numbers and therefore takes identical decisions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from rlguard.core_losses.advantages import group_advantages
from rlguard.core_losses.batch import LossOutput, PolicyBatch
from rlguard.guards.stats.reduction import INDEX as _INDEX
from rlguard.guards.stats.reduction import ORDER as _ORDER
from rlguard.guards.stats.reduction import STAT_REDUCTIONS as STAT_REDUCTIONS
from rlguard.guards.stats.reduction import NDArray
from rlguard.guards.stats.reduction import combine as _combine
from rlguard.guards.stats.reduction import combine_local as _combine_local
from rlguard.guards.stats.reduction import kinds as _kinds
from rlguard.metrics import WEIGHTS

#: the weight of each objective metric of ``LossOutput.metrics``: unmasked tokens, live sequences, or 1
_TOKEN_WEIGHTED = frozenset(name for name, w in WEIGHTS.items() if w == "tokens")
_SEQUENCE_WEIGHTED = frozenset(name for name, w in WEIGHTS.items() if w == "sequences")


class StepStats:
    """Local accumulators of one step's stats; :meth:`reduce` combines them across ranks.

    Python floats, and scalars in CPU tensors (read at once, which costs no sync), accumulate in Python (no tensor
    op per stat); tensors on an accelerator accumulate in four dense ``(n,)`` float64 tensors on their device
    (weighted sums, weights, maxima, minima), so :meth:`add_many` takes a whole stacked vector of metrics in a
    handful of ops and there is no host-device sync before :meth:`reduce`. Values already on the host as a vector
    (the objective's metrics after the adapter's one transfer) go through :meth:`add_floats`.
    """

    def __init__(self) -> None:
        # Python part: weighted sum, sum, max or min per stat; total weight of a mean, 1 once seen otherwise
        self._value: list[float | None] = [None] * len(_ORDER)
        self._weight: list[float] = [0.0] * len(_ORDER)
        self._dense: Tensor | None = None  # (4, n): weighted sums, weights, maxima, minima of tensor inputs

    def _dense_on(self, device: torch.device) -> Tensor:
        if self._dense is None:
            inf = math.inf
            self._dense = torch.tensor([[0.0] * len(_ORDER), [0.0] * len(_ORDER), [-inf] * len(_ORDER),
                                        [inf] * len(_ORDER)], dtype=torch.float64, device=device)  # fmt: skip
        return self._dense

    def add(self, name: str, value: float | Tensor, weight: float | Tensor = 1.0) -> None:
        """Add a local observation of ``name``; ``weight`` matters for ``mean`` stats only."""
        if name not in _INDEX:
            raise ValueError(f"unknown stat {name!r}; known stats: {', '.join(n for n in _ORDER if n[0] != '_')}.")
        i, kind = _INDEX[name], STAT_REDUCTIONS[name]
        if isinstance(value, Tensor) and value.device.type == "cpu":
            value = float(value.detach().reshape(()))  # a scalar on the host: Python's float64, no tensor ops
        if isinstance(weight, Tensor) and weight.device.type == "cpu":
            weight = float(weight.detach().reshape(()))
        if not (isinstance(value, Tensor) or isinstance(weight, Tensor)):
            self._add_float(i, kind, float(value), float(weight))
            return
        d = self._dense_on(value.device if isinstance(value, Tensor) else cast(Tensor, weight).device)
        v = torch.as_tensor(value, dtype=d.dtype, device=d.device).detach().reshape(())
        if kind == "mean":
            w = torch.as_tensor(weight, dtype=d.dtype, device=d.device).detach().reshape(())
            d[0, i] += v * w
            d[1, i] += w
            return
        if kind == "sum":
            d[0, i] += v
        elif kind == "max":  # torch.maximum/minimum propagate NaN, as they should here
            d[2, i] = torch.maximum(d[2, i], v)
        else:
            d[3, i] = torch.minimum(d[3, i], v)
        d[1, i] += 1.0

    def add_many(self, names: Sequence[str], values: Tensor, weights: Tensor) -> None:
        """Add one observation of each of ``names`` (distinct) at once: ``values``, ``weights`` ``(K,)`` on one
        device. A dozen tensor ops whatever ``K`` (the objective's metrics arrive as one stacked vector)."""
        kinds = _kinds(tuple(names), values.device)
        d = self._dense_on(values.device)
        # spread over all n stats; absent ones get v = 0 and never reach a row their masks do not select
        v = torch.zeros_like(d[0]).index_copy_(0, kinds.index, values.detach().to(d.dtype))
        w = torch.zeros_like(d[0]).index_copy_(0, kinds.index, weights.detach().to(d.dtype))
        # mean: sums of v w and of w; sum: sum of v; max/min: running extremes; the weight row counts the others
        d[:2] += torch.stack([torch.where(kinds.mean, v * w, v), torch.where(kinds.mean, w, kinds.present)])
        d[2:] = torch.where(kinds.extremes, torch.stack([torch.maximum(d[2], v), torch.minimum(d[3], v)]), d[2:])

    def add_floats(self, names: Sequence[str], values: Sequence[float], weights: Sequence[float]) -> None:
        """:meth:`add` of each of ``names`` with its value and weight, all Python floats already on the host."""
        for name, v, w in zip(names, values, weights, strict=True):
            i = _INDEX.get(name)
            if i is None:
                self.add(name, v, w)  # raises, naming the known stats
                return
            self._add_float(i, STAT_REDUCTIONS[name], v, w)

    def _add_float(self, i: int, kind: str, v: float, w: float) -> None:
        """:meth:`add` in Python floats, with the same semantics (NaN propagates through max and min)."""
        prev = self._value[i]
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

    def _host_packed(self) -> NDArray:
        """``(2, n)`` float64 of the Python part: values and weights; unseen stats have weight 0."""
        return np.array([[0.0 if x is None else x for x in self._value], self._weight], dtype=np.float64)

    def _packed(self) -> Tensor:
        """``(2, n)`` float64: values and weights; unseen stats have weight 0 (a few ops, whatever ``n``)."""
        if self._dense is None:
            return torch.from_numpy(self._host_packed())
        d, kinds = self._dense, _kinds(_ORDER, self._dense.device)
        value, weight = torch.from_numpy(self._host_packed()).to(d.device).unbind()
        py_seen = torch.tensor([x is not None for x in self._value], device=d.device)
        extreme = torch.where(
            kinds.extremes[0],
            torch.maximum(torch.where(py_seen, value, -math.inf), d[2]),
            torch.minimum(torch.where(py_seen, value, math.inf), d[3]),
        )
        value = torch.where(kinds.mean | kinds.sum, value + d[0], extreme)
        weight = torch.where(kinds.mean, weight + d[1], (py_seen | (d[1] > 0)).to(weight.dtype))
        return torch.stack([torch.where(weight > 0, value, 0.0), weight])

    def reduce(self, group: dist.ProcessGroup | None = None) -> dict[str, float]:
        """Combine across the ranks of ``group`` with one ``all_gather``; identical result on every rank.

        Without an initialised process group (or with one rank) this is the local result.
        """
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
        if not distributed and self._dense is None:
            return _combine_local(self._value, self._weight)  # everything on the host already: no array at all
        packed = self._packed()
        if distributed:
            if dist.get_backend(group) == "gloo":
                packed = packed.cpu()
            gathered = [torch.empty_like(packed) for _ in range(dist.get_world_size(group))]
            dist.all_gather(gathered, packed, group=group)
            parts = torch.stack(gathered)  # (W, 2, n)
        else:
            parts = packed.unsqueeze(0)
        return _combine(parts.cpu().numpy())


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
        _add_metrics(st, output, tokens, sequences)
    if grad_norm is not None:
        if isinstance(grad_norm, Tensor) and grad_norm.device.type != "cpu":  # stays on its device until reduce
            st.add("grad_norm", grad_norm)
            st.add("nonfinite", (~torch.isfinite(grad_norm.detach())).double())
        else:
            g = float(grad_norm)
            st.add("grad_norm", g)
            st.add("nonfinite", float(not math.isfinite(g)))
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


def _add_metrics(st: StepStats, output: LossOutput, tokens: float | Tensor, sequences: float | Tensor) -> None:
    """The objective's metrics as one stacked vector, weighted by tokens, sequences or 1 (a few ops in all); a
    non-finite loss adds to ``nonfinite``."""
    names = tuple(name for name in output.metrics if name in STAT_REDUCTIONS)
    loss = output.loss.detach()
    if "nonfinite" not in names:
        st.add("nonfinite", (~torch.isfinite(loss)).double())
        if not names:
            return
    try:
        values = torch.stack([output.metrics[name] for name in names]).detach()  # (K,)
    except RuntimeError:  # mixed dtypes or devices
        values = torch.stack([output.metrics[name].detach().to(loss) for name in names])
    values = values.double()
    weight_of, unweighted, nonfinite_at = _metric_layout(names, values.device)
    if "nonfinite" in names:
        values = values + nonfinite_at * (~torch.isfinite(loss)).double()
    basis = torch.stack([torch.as_tensor(x, dtype=torch.float64, device=values.device) for x in (tokens, sequences)])
    st.add_many(names, values, torch.addmv(unweighted, weight_of, basis))


def add_metric_values(
    stats: StepStats, names: Sequence[str], values: Sequence[float], *, tokens: float, sequences: float, loss: float
) -> None:
    """:func:`collect_step_stats` of an objective's output whose metrics were already read to the host: ``values``
    of ``names`` (``LossOutput.metrics``), the batch's unmasked ``tokens`` and live ``sequences``, and the loss.
    Same weights (tokens, sequences or 1, from the metric table) and the same count of a non-finite loss; the
    adapters that read the metrics for logging anyway hand them over here, so the guard adds no transfer."""
    weight = {"tokens": tokens, "sequences": sequences}
    kept = [(n, v) for n, v in zip(names, values, strict=True) if n in STAT_REDUCTIONS]
    bad_loss = float(not math.isfinite(loss))
    if "nonfinite" not in names:
        stats.add("nonfinite", bad_loss)
    stats.add_floats(
        [n for n, _ in kept],
        [v + bad_loss if n == "nonfinite" else v for n, v in kept],
        [weight.get(WEIGHTS.get(n, ""), 1.0) for n, _ in kept],  # 1 for the unweighted
    )


@functools.lru_cache(maxsize=64)
def _metric_layout(names: tuple[str, ...], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """``(K, 2)`` 0/1: whether each metric is weighted by tokens or by sequences; ``(K,)`` 1 for the others
    (weight 1); ``(K,)`` one-hot of ``nonfinite``."""
    weight_of = [[float(n in _TOKEN_WEIGHTED), float(n in _SEQUENCE_WEIGHTED)] for n in names]
    unweighted = [float(n not in _TOKEN_WEIGHTED and n not in _SEQUENCE_WEIGHTED) for n in names]
    nonfinite_at = [float(n == "nonfinite") for n in names]
    return tuple(torch.tensor(x, dtype=torch.float64, device=device) for x in (weight_of, unweighted, nonfinite_at))  # type: ignore[return-value]


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
