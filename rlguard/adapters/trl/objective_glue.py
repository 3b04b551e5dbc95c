"""What ``GuardedGRPOTrainer`` and ``GuardedAsyncGRPOTrainer`` share: their ``StabilityCallback``s attached, the
objective's metrics of each micro-batch reduced and logged (and handed to the guard), the guard's controls.

One copy for both trainers (:mod:`rlguard.adapters.trl.trainer`, :mod:`rlguard.adapters.trl.async_trainer`); each
supplies only how its loss reaches the objective.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlguard.adapters.trl.callback import StabilityCallback
from rlguard.adapters.trl.compat import logged_metrics
from rlguard.adapters.trl.trl_metrics import trl_metric_parts
from rlguard.core_losses import LossOutput, Objective, PolicyBatch
from rlguard.guards import Guard, GuardConfig, StepStats, collect_step_stats
from rlguard.guards.guard import make_guard
from rlguard.guards.interventions.entropy_coef import AdaptiveEntropy
from rlguard.guards.registry import detector_registry
from rlguard.guards.stats.collect import add_metric_values
from rlguard.guards.stats.reduction import reduce_rows
from rlguard.guards.stats.staleness import add_gap_by_age, add_step_ages
from rlguard.metrics import STALENESS_BUCKETS

__all__ = ["ObjectiveGlue"]


class ObjectiveGlue:
    """Mixed into a transformers ``Trainer`` whose loss is an rlguard objective (``self.rlguard_objective``), with
    ``self.rlguard_guard`` and ``self._rlguard_step_stats`` set by the trainer's ``__init__``."""

    accelerator: Any
    callback_handler: Any
    rlguard_objective: Objective
    rlguard_guard: Guard | None
    _rlguard_step_stats: StepStats

    if TYPE_CHECKING:

        def add_callback(self, callback: Any) -> None:
            """transformers' ``Trainer.add_callback``."""

    def _attach_stability_callbacks(
        self, spec: str | GuardConfig | None, adaptive: AdaptiveEntropy | None
    ) -> tuple[Guard | None, bool]:
        """Attach every ``StabilityCallback`` to this trainer; ``spec`` gives the first one a guard (a callback
        is added if there is none). ``adaptive`` (``use_adaptive_entropy``) joins the acting guard's interventions;
        without one, a guard that runs only it. Returns the acting guard, if any, and whether the user configured
        it."""
        callbacks = [cb for cb in self.callback_handler.callbacks if isinstance(cb, StabilityCallback)]
        configured = spec is not None or any(cb.guard is not None for cb in callbacks)
        if (spec is not None or adaptive is not None) and not any(cb.guard is not None for cb in callbacks):
            if not callbacks:
                callbacks.append(StabilityCallback())
                self.add_callback(callbacks[0])
            # with no guard configured: no detector, and observe-only, so no snapshot (only adaptive_entropy acts)
            only_adaptive = GuardConfig(detectors=dict.fromkeys(detector_registry()), observe_only=True)
            callbacks[0].guard = make_guard(only_adaptive if spec is None else spec)
        for cb in callbacks:
            cb.attach(self)
        guard = next((cb.guard for cb in callbacks if cb.guard is not None), None)
        if guard is not None and adaptive is not None:
            _add_adaptive_entropy(guard, adaptive)
        return guard, configured

    def rlguard_take_step_stats(self) -> StepStats:
        """The objective's stats of the micro-batches since the last call (this rank's share; not reduced)."""
        stats, self._rlguard_step_stats = self._rlguard_step_stats, StepStats()
        return stats

    def _log_rlguard_metrics(
        self,
        mode: str,
        out: LossOutput,
        batch: PolicyBatch,
        accumulation: int,
        *,
        guard: bool,
        age_gap: Tensor | None = None,
        step_ages: Tensor | None = None,
    ) -> None:
        """Reduce the objective's metrics and TRL's (:func:`trl_metric_parts`) over processes (one gather, one
        transfer to the host) and log them: the objective's as ``rlguard/<name>``, TRL's under TRL's keys with TRL's
        meaning. With ``guard`` and a guard, this process's row of the same transfer goes to the guard's stats
        (:func:`~rlguard.guards.stats.collect.add_metric_values`).

        ``age_gap`` (``(2, K)``, :func:`~rlguard.guards.stats.staleness.gap_by_age_parts`; the asynchronous trainer's)
        rides in the same gather: each bucket is logged as ``rlguard/<bucket>``, a ``(gap sum, tokens)`` pair over
        all processes (TRL's async trainer logs a pair as the ratio of its window's sums), and this process's share
        goes to the guard's stats, weighted by its tokens. ``step_ages`` (``(B,)``, each sample's age in optimizer
        steps) rides in it too, as ``(sum, count, max)``: logged as ``rlguard/staleness_steps_mean`` (a pair) and
        ``rlguard/staleness_steps_max`` over all processes, this process's to the guard's stats."""
        metrics, mask = out.metrics, batch.mask
        names = sorted(metrics)
        tokens = mask.sum().to(torch.float64)
        sequences = (mask != 0).any(dim=-1).sum().to(torch.float64)
        trl = trl_metric_parts(self.rlguard_objective, batch)
        local = torch.stack(
            [*(metrics[n].detach().to(torch.float64) for n in names), tokens, sequences]
            + [out.loss.detach().to(torch.float64)]
            + [t.to(torch.float64) for t in trl.parts()]
            + ([] if age_gap is None else list(age_gap.to(torch.float64).reshape(-1).unbind()))
            + ([] if step_ages is None else list(_age_parts(step_ages).unbind()))
        )
        # (W, K + 3 + len(trl.parts())): the only device -> host transfer of the micro-batch's metrics
        gathered = self.accelerator.gather(local.unsqueeze(0)).cpu().numpy()
        k = len(names)
        values = reduce_rows(names, gathered[:, :k], gathered[:, k], gathered[:, k + 1]).tolist()
        reduced = dict(zip(names, values, strict=True))
        reduced["loss"] = reduced["loss"] * accumulation  # the micro-batch's share at the scale of one step
        logged = logged_metrics(self, mode)
        for name, value in reduced.items():
            logged[f"rlguard/{name}"].append(value)
        end = k + 3 + len(trl.parts())
        for key, value in trl.reduce(gathered[:, k + 3 : end]).items():
            logged[key].append(value)
        gap_end = end + (0 if age_gap is None else age_gap.numel())
        if step_ages is not None:
            _log_step_ages(logged, gathered[:, gap_end:])
        if age_gap is not None:
            sums, tokens = gathered[:, end:gap_end].sum(axis=0).reshape(2, -1).tolist()  # (W, 2K) -> all processes
            for (name, _, _), total, count in zip(STALENESS_BUCKETS, sums, tokens, strict=True):
                if count > 0:
                    logged[f"rlguard/{name}"].append((float(total), float(count)))
        if guard and self.rlguard_guard is not None:
            row = gathered[self.accelerator.process_index].tolist()
            stats = self._rlguard_step_stats
            add_metric_values(stats, names, row[:k], tokens=row[k], sequences=row[k + 1], loss=row[k + 2])
            if batch.rollout_logprobs is not None:  # the trainer-vs-engine probability moments
                collect_step_stats(batch=batch, stats=stats)
            if age_gap is not None:
                add_gap_by_age(stats, gathered[self.accelerator.process_index, end:gap_end].reshape(2, -1).tolist())
            if step_ages is not None:
                add_step_ages(stats, step_ages.cpu())  # its values reached the host with the gather


def _add_adaptive_entropy(guard: Guard, adaptive: AdaptiveEntropy) -> None:
    """``use_adaptive_entropy``'s controller joins ``guard``'s interventions (an observe-only guard's too: TRL's flag
    asks for it), refused where the guard already sets ``entropy_coef`` another way."""
    if adaptive.name in guard.interventions:
        raise ValueError(
            "use_adaptive_entropy=True and the guard's own adaptive_entropy intervention are one controller "
            "configured twice: keep TRL's use_adaptive_entropy (with entropy_coef, entropy_coef_min/max/delta, "
            "entropy_target) or the guard's, not both."
        )
    if "entropy_coef" in guard.config.schedules:
        raise ValueError(
            "use_adaptive_entropy=True sets entropy_coef each step, and the guard schedules entropy_coef too: drop "
            "one of them (GuardConfig.schedules['entropy_coef'] or use_adaptive_entropy)."
        )
    guard.interventions[adaptive.name] = adaptive


def _age_parts(ages: Tensor) -> Tensor:
    """``(3,)`` float64 ``(sum, count, max)`` of ``ages`` ``(B,)`` (max 0 where there are none), on their device."""
    ages = ages.detach().to(torch.float64).reshape(-1)
    largest = ages.max() if ages.numel() else ages.new_zeros(())
    return torch.stack([ages.sum(), ages.new_tensor(float(ages.numel())), largest])


def _log_step_ages(logged: Any, parts: Any) -> None:
    """Log ``(W, 3)`` processes' ``(sum, count, max)`` of the ages in optimizer steps, refusing a version with no
    recorded step (a NaN age, :meth:`~rlguard.guards.stats.staleness.PublishedSteps.ages`)."""
    total, count, largest = float(parts[:, 0].sum()), float(parts[:, 1].sum()), float(parts[:, 2].max())
    if not (math.isfinite(total) and math.isfinite(largest)) or min(total, largest) < 0:
        raise RuntimeError(
            "a sample's policy version has no recorded weight sync, or one after the trainer's step (ages in "
            f"optimizer steps: sum {total}, max {largest}): the trainer's sync count and its samples' versions "
            "disagree. Report it with the TRL version."
        )
    if count > 0:
        logged["rlguard/staleness_steps_mean"].append((total, count))
        logged["rlguard/staleness_steps_max"].append(largest)
