"""The train-inference gap by age bucket in verl's bypass mode, measured in the actor workers' loss.

In bypass mode (``algorithm.rollout_correction.bypass_mode``, the default of verl's asynchronous yamls) pi_old is
the engine's log-probs and the trainer never computes log-probs of its own before the update: the only place where
the trainer's log-probs meet the engine's is the workers' loss. verl's ``ppo_loss`` (``workers/utils/losses.py``)
passes the registered policy loss a fixed set of fields (``response_mask``, ``old_log_probs``, ``advantages``,
``rollout_is_weights``), so a ``rlguard.<name>`` loss cannot see a row's age. The worker's loss function itself is
public, though: ``ActorRolloutRefWorker.set_loss_fn`` (``workers/engine_workers.py:529-531``, a ``ONE_TO_ALL``
worker call), through which the driver already sends ``ppo_loss`` with the guard's controls, and the worker hands
the loss the micro-batch's whole ``TensorDict``, extra columns included.

So the trainer adds each row's age in policy versions to the batch (:data:`AGE_COLUMN`) and the driver sends
:func:`ppo_loss_with_gap_by_age`: verl's ``ppo_loss``, called as it is, plus each bucket's
``(sum of |log pi_theta - log pi_old|, tokens)`` (:func:`~rlguard.guards.stats.staleness.gap_by_age_parts`) as verl
``SUM`` metrics. verl sums them over micro-batches, averages over data-parallel ranks and then over mini-batches,
each the same for both parts, so their ratio (:func:`gap_by_age_from_metrics`) is the token-weighted gap of the
step. pi_theta is the weights of the mini-batch being trained: the first mini-batch of the first epoch is the
trainer's weights at the step, later ones have had the step's earlier updates.

:class:`BypassGapDriver` is the driver of both asynchronous trainers (fully async and one-step-off): in bypass mode
its ``push_controls`` sends the measuring loss; each trainer adds the ages it knows and calls
:func:`gap_by_age_from_metrics` before its step is logged.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from functools import partial
from typing import Any

from rlguard.adapters.verl.driver import VerlGuardDriver
from rlguard.adapters.verl.mapping import config_get
from rlguard.guards.stats.staleness import gap_by_age_parts
from rlguard.metrics import RLGUARD_PREFIX, STALENESS_BUCKETS

__all__ = ["AGE_COLUMN", "BypassGapDriver", "gap_by_age_from_metrics", "part_keys", "ppo_loss_with_gap_by_age"]

#: the batch column of each row's age in policy versions, ``(B,)`` float32, added by the trainer
AGE_COLUMN = "rlguard_policy_age"


def part_keys(bucket: str) -> tuple[str, str]:
    """The workers' metric names of ``bucket``'s gap sum and its tokens."""
    return f"{RLGUARD_PREFIX}_gap_sum/{bucket}", f"{RLGUARD_PREFIX}_gap_tokens/{bucket}"


def ppo_loss_with_gap_by_age(config: Any, model_output: Any, data: Any, dp_group: Any = None) -> tuple[Any, Any]:
    """verl's ``ppo_loss(config, model_output, data, dp_group)``, and where ``data`` carries :data:`AGE_COLUMN`,
    each age bucket's gap parts as ``SUM`` metrics (:func:`part_keys`), every bucket in every micro-batch (verl's
    data-parallel aggregation needs the same metrics on every rank).

    Args:
        config: the actor config (``ActorConfig``), as ``ppo_loss`` takes it.
        model_output: the engine's output; ``log_probs`` unpadded, as ``ppo_loss`` reads it.
        data: the micro-batch (``TensorDict``): ``old_log_probs`` and ``response_mask`` ``(B, T)``, the age ``(B,)``.
        dp_group: passed on to ``ppo_loss``.
    """
    from verl.utils.metric.utils import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    if AGE_COLUMN not in data.keys():  # noqa: SIM118  # a TensorDict refuses `in` itself
        return loss, metrics
    log_prob = no_padding_2_padding(model_output["log_probs"], data)  # (B, T)
    padded = data.select("response_mask", "old_log_probs").to_padded_tensor()
    parts = gap_by_age_parts(data[AGE_COLUMN], log_prob, padded["old_log_probs"], padded["response_mask"])  # (2, K)
    for (name, _, _), total, tokens in zip(STALENESS_BUCKETS, parts[0], parts[1], strict=True):
        sum_key, tokens_key = part_keys(name)
        metrics[sum_key] = Metric(AggregationType.SUM, total)
        metrics[tokens_key] = Metric(AggregationType.SUM, tokens)
    return loss, metrics


def gap_by_age_from_metrics(metrics: MutableMapping[str, Any], prefix: str = "actor/") -> dict[str, float]:
    """Take the gap parts out of the trainer's step metrics (``prefix``: verl's name for the actor's) and return
    ``rlguard/<bucket>``, the gap of each bucket with tokens (sum / tokens)."""
    out: dict[str, float] = {}
    for name, _, _ in STALENESS_BUCKETS:
        sum_key, tokens_key = (prefix + key for key in part_keys(name))
        if sum_key not in metrics or tokens_key not in metrics:
            continue
        total, tokens = float(metrics.pop(sum_key)), float(metrics.pop(tokens_key))
        if tokens > 0:
            out[f"{RLGUARD_PREFIX}{name}"] = total / tokens
    return out


class BypassGapDriver(VerlGuardDriver):
    """:class:`~rlguard.adapters.verl.driver.VerlGuardDriver` of verl's asynchronous trainers: in bypass mode the
    workers' loss is :func:`ppo_loss_with_gap_by_age` with the guard's controls, so that it measures the gap of
    each row's age that the trainer adds (:data:`AGE_COLUMN`)."""

    @property
    def bypass_mode(self) -> bool:
        """Whether pi_old is the engine's (verl's ``algorithm.rollout_correction.bypass_mode``): the gap by age is
        then measured in the workers' loss."""
        correction = config_get(self.trainer.config.algorithm, "rollout_correction", None)
        return bool(config_get(correction, "bypass_mode", False))

    def push_controls(self) -> None:
        """The synchronous driver's ``ppo_loss`` with the guard's controls; in bypass mode wrapped so that it also
        measures the gap by age bucket (:func:`ppo_loss_with_gap_by_age`)."""
        if not self.bypass_mode:
            super().push_controls()
            return
        self.trainer.actor_rollout_wg.set_loss_fn(partial(ppo_loss_with_gap_by_age, config=self.actor_config()))
