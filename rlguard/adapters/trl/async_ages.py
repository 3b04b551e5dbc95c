"""Each sample's policy version carried into ``GuardedAsyncGRPOTrainer``'s packed batches, for the gap by age.

TRL 1.16's ``RolloutQueueDataset`` computes a sample's age as it takes it from the rollout queue (the trainer's
``model_version`` minus the sample's) and yields fixed keys without it; its batchers pack those into rows and
``DataCollatorForRollout`` keeps, per loss token, only the index of its completion in its row (``segment_id``).
Three pieces carry the version through TRL's own path, on the main process, which alone takes and packs samples:

- :func:`stamp_policy_version` (called by :class:`~rlguard.adapters.trl.async_queue.DiscardingQueue` as the dataset
  takes a sample, just before TRL reads ``model_version`` for its own age): the sample's policy version counted in
  the trainer's weight syncs (:attr:`GuardedAsyncGRPOTrainer.rlguard_weight_syncs`, which every process counts
  alike), ``syncs - (model_version - sample.model_version)``. It rides in the one per-sample object TRL passes
  through by reference, the sample's ``metrics`` dict, as an attribute of a dict subclass (:class:`StampedMetrics`):
  no key is added, so TRL's collator logs the same rewards as before;
- :class:`PolicyVersionCollator` wraps TRL's collator and adds :data:`POLICY_VERSION_KEY`, ``(W, S)`` float32 (one
  row per process, one column per sample of the row in ``segment_id`` order, NaN past the row's samples), which
  accelerate's dispatcher slices with the rest of the batch;
- :func:`sample_ages`, in the loss on every process: ``syncs now - version``, the age of the weights whose
  log-probs the loss takes against the engine's. It is TRL's age at the take plus the syncs since: accelerate's
  dispatcher fetches one micro-batch ahead, so the micro-batch after a step boundary is taken before that step's
  sync and trained after it (TRL's ``sample/staleness_*`` count it one version younger than the policy it trains).
  This is verl's age (the trainer's version when pi_old is computed, minus the sample's);
- :func:`sample_step_ages`, likewise: the age in optimizer steps, ``state.global_step`` minus the step each version
  was published at (:class:`~rlguard.guards.stats.staleness.PublishedSteps`, recorded at each sync). With
  ``weight_sync_steps = k`` it is ``k`` times the age in versions plus the trainer's lead over the last version
  (0 ... k - 1 steps); with ``k = 1`` the two are equal.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor

from rlguard.guards.stats.staleness import PublishedSteps

__all__ = [
    "POLICY_VERSION_KEY",
    "PolicyVersionCollator",
    "StampedMetrics",
    "sample_ages",
    "sample_step_ages",
    "sample_versions",
    "stamp_policy_version",
]

#: the batch key of each sample's policy version, counted in the trainer's weight syncs
POLICY_VERSION_KEY = "rlguard_policy_version"


class StampedMetrics(dict[str, float]):
    """A sample's ``metrics`` (its rewards, as TRL's rollout worker wrote them) with its policy version, counted in
    the trainer's weight syncs, as an attribute: iterated, it is the same dict."""

    policy_version: float


def stamp_policy_version(sample: Any, trainer_version: int, syncs: int) -> Any:
    """A shallow copy of ``sample`` (TRL's ``RolloutSample``) whose ``metrics`` carry its policy version counted in
    weight syncs: ``syncs - (trainer_version - sample.model_version)``, where ``trainer_version`` is the trainer's
    ``model_version`` as TRL's dataset reads it for the same sample."""
    age = int(trainer_version) - int(sample.model_version)
    if age < 0:
        raise ValueError(
            f"a rollout sample of model_version {sample.model_version} is newer than the trainer's {trainer_version}: "
            "the rollout worker's versions and the trainer's disagree (TRL's AsyncGRPOTrainer numbers both)."
        )
    metrics = StampedMetrics(sample.metrics)
    metrics.policy_version = float(syncs - age)
    stamped = copy.copy(sample)
    stamped.metrics = metrics
    return stamped


class PolicyVersionCollator:
    """TRL's ``DataCollatorForRollout`` (``collate``) plus :data:`POLICY_VERSION_KEY` (see the module).

    Args:
        collate: the collator TRL built; called first, its batch returned with the versions added.
    """

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, examples: list[Any]) -> dict[str, Any]:
        batch: dict[str, Any] = self.collate(examples)
        (rows,) = examples  # one micro-batch: a row (TRL's TreeRow) per process
        versions = [[_version_of(sample) for sample in row.samples] for row in rows]
        width = max(len(v) for v in versions)
        table = torch.full((len(rows), width), math.nan, dtype=torch.float32)  # (W, S)
        for i, row in enumerate(versions):
            table[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        batch[POLICY_VERSION_KEY] = table
        return batch


def _version_of(sample: dict[str, Any]) -> float:
    version = getattr(sample.get("metrics"), "policy_version", None)
    if version is None:
        raise RuntimeError(
            "a packed rollout sample has no policy version: TRL's RolloutQueueDataset no longer passes the sample's "
            "metrics dict through as rlguard's DiscardingQueue stamped it. Install trl 1.16."
        )
    return float(version)


def sample_ages(inputs: dict[str, Any], syncs: int, completions: int) -> Tensor | None:
    """``(B,)`` float64 the age of each of the micro-batch's first ``completions`` samples (the rows of
    :func:`~rlguard.adapters.trl.async_queue.unpack_completions`): ``syncs`` (the trainer's weight syncs now) minus
    its policy version; None where the batch carries no versions (not built by the guarded trainer's loader)."""
    versions = sample_versions(inputs, completions)
    return None if versions is None else float(syncs) - versions


def sample_step_ages(inputs: dict[str, Any], published: PublishedSteps, step: int, completions: int) -> Tensor | None:
    """``(B,)`` float64 the same samples' ages in optimizer steps: ``step`` (the updates in the weights the loss
    runs with, TRL's ``state.global_step``) minus the step each one's version was published at (``published``,
    recorded at each weight sync); None where the batch carries no versions."""
    versions = sample_versions(inputs, completions)
    return None if versions is None else published.ages(versions, step)


def sample_versions(inputs: dict[str, Any], completions: int) -> Tensor | None:
    """``(B,)`` float64 the policy version, in weight syncs, of each of the micro-batch's first ``completions``
    samples on this process; None where the batch carries no versions."""
    versions: Tensor | None = inputs.get(POLICY_VERSION_KEY)
    if versions is None:
        return None
    return versions[0, :completions].to(torch.float64)  # this process's row
