"""GuardedAsyncGRPOTrainer's train-inference gap by age bucket: each sample's policy version carried through TRL's own
rollout path (its ``RolloutQueueDataset`` over rlguard's ``DiscardingQueue``, its ``FixedCountBatcher`` and its
``DataCollatorForRollout``, wrapped), the gap computed in the guarded loss, and ``staleness_remedy`` diagnosing from
it and lowering the bound that TRL's dataset applies. The trainer is built without TRL's ``__init__`` (no model, no
server); the policy is a stand-in whose log-prob of each target token is a fixed table."""

from __future__ import annotations

import math
import queue
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

pytest.importorskip("trl")

from rlguard.adapters.trl.async_ages import POLICY_VERSION_KEY, PolicyVersionCollator
from rlguard.adapters.trl.async_compat import install_rollout_collator, trainer_module, worker_module
from rlguard.adapters.trl.async_config import GuardedAsyncGRPOConfig
from rlguard.adapters.trl.async_queue import DiscardingQueue
from rlguard.adapters.trl.async_trainer import GuardedAsyncGRPOTrainer, RolloutSyncActuator
from rlguard.guards import Guard, GuardConfig, StepStats
from rlguard.guards.stats.staleness import PublishedSteps
from rlguard.metrics import STALENESS_BUCKETS

VERSION = 9  # the trainer's model_version while the samples are taken (not a multiple of TRL's trace interval)
SYNCS = 8  # the weight syncs the trainer counted by then (a resumed run: model_version started above 0)
SYNC_EVERY = 3  # weight_sync_steps: sync v was made at optimizer step 3 v
STEP = SYNC_EVERY * SYNCS + 2  # the trainer's optimizer step: two updates ahead of the last sync
PROMPT = 3  # prompt tokens of each sample; completions of COMPLETION tokens
COMPLETION = 4


class _Policy(torch.nn.Module):
    """Log-prob of each packed position's target token (``shift_labels``) from ``table``; entropy 0.5."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, *, shift_labels: torch.Tensor, **kwargs: Any) -> SimpleNamespace:
        logprobs = self.table[shift_labels.clamp(min=0)]  # (1, N)
        return SimpleNamespace(log_probs=logprobs, entropy=torch.full_like(logprobs, 0.5))


class _Unhealthy(Exception):
    pass


def _empty(stale_after_s: float) -> None:
    raise _Unhealthy  # TRL's health check when the queue stays empty


def _trainer(guard: Guard | None, max_staleness: int = 8) -> Any:
    """A GuardedAsyncGRPOTrainer with what its loss and its staleness bound read, on one process."""
    trainer: Any = object.__new__(GuardedAsyncGRPOTrainer)
    args = GuardedAsyncGRPOConfig(output_dir="unused", use_cpu=True, max_staleness=max_staleness)
    metrics: Any = defaultdict(list)
    trainer.__dict__.update(
        accelerator=SimpleNamespace(num_processes=1, process_index=0, gather=lambda t: t),
        current_gradient_accumulation_steps=1, aux_loss_enabled=False,
        _metrics={"train": metrics, "eval": defaultdict(list)},
        _step_forward_tokens=0.0, _step_trained_tokens=0.0, _step_seq_len_weighted=0.0, _step_samples=0.0,
        _step_forward_s=0.0,
        rlguard_mapping=args.rlguard_mapping, rlguard_guard=guard, _rlguard_step_stats=StepStats(),
        rlguard_configured_objective=args.rlguard_mapping.build(),
        rlguard_configured_staleness=max_staleness, rlguard_staleness_bound=max_staleness,
        _rlguard_step_bound=max_staleness, model_version=VERSION, rlguard_weight_syncs=SYNCS,
        rlguard_published=_published(), state=SimpleNamespace(global_step=STEP),
    )  # fmt: skip
    trainer.rlguard_objective = trainer.rlguard_configured_objective
    trainer.rlguard_queue = DiscardingQueue(queue.Queue(), metrics, trainer._rlguard_stamp)
    # TRL's get_train_dataloader, on the main process, fixed-count micro-batches (token_budget=0)
    trainer._rollout_dataset = trainer_module.RolloutQueueDataset(
        rollout_queue=trainer.rlguard_queue, model_version_fn=lambda: trainer.model_version,
        check_health_fn=_empty, stale_after_s=1.0, metrics=metrics, max_staleness=max_staleness, poll_interval_s=0.01,
    )  # fmt: skip
    return trainer


def _published() -> PublishedSteps:
    """Syncs 0 ... SYNCS, made every SYNC_EVERY optimizer steps."""
    published = PublishedSteps()
    for version in range(SYNCS + 1):
        published.publish(version, SYNC_EVERY * version)
    return published


def _loader(trainer: Any, microbatch: int, *, dispatch: bool = False) -> Any:
    """TRL's batcher and collator over the trainer's rollout dataset, the collator wrapped as the trainer does; with
    ``dispatch``, prepared by accelerate as TRL's config asks (``split_batches`` and ``dispatch_batches``)."""
    from accelerate import Accelerator  # type: ignore[import-untyped]  # no py.typed
    from accelerate.utils import DataLoaderConfiguration  # type: ignore[import-untyped]  # no py.typed

    batcher = trainer_module.FixedCountBatcher(trainer._rollout_dataset, 1, microbatch)
    collator = trainer_module.DataCollatorForRollout(0, 1, metrics=trainer._metrics["train"])
    loader = torch.utils.data.DataLoader(batcher, batch_size=1, collate_fn=collator)
    if dispatch:
        config = DataLoaderConfiguration(split_batches=True, dispatch_batches=True)
        loader = Accelerator(cpu=True, dataloader_config=config).prepare(loader)
    install_rollout_collator(loader, PolicyVersionCollator)
    return loader


def _sample(index: int, age: int, engine: list[float]) -> Any:
    """A rollout sample of policy ``VERSION - age`` whose completion tokens are ``100 + 10 index + j`` (distinct
    across samples: no two share a packed position) with the engine's log-probs ``engine``."""
    completion = [100 + 10 * index + j for j in range(COMPLETION)]
    return worker_module.RolloutSample(
        prompt=[], completion=[], input_ids=np.array([1 + index, 2, 3, *completion]),
        completion_mask=np.array([0] * PROMPT + [1] * COMPLETION), old_log_probs=np.array([0.0] * PROMPT + engine),
        advantage=1.0 if index % 2 else -1.0, model_version=VERSION - age, group_id=index, metrics={"reward": 0.5},
    )  # fmt: skip


def _engine(index: int, gap: float) -> list[float]:
    """Engine log-probs of sample ``index``: the trainer's (``_table``) shifted by +-gap (alternating signs), all
    dyadic so float32 holds them exactly."""
    return [_trainer_logprob(100 + 10 * index + j) + (gap if j % 2 else -gap) for j in range(COMPLETION)]


def _trainer_logprob(token: int) -> float:
    return -0.25 - (token % 8) / 16


def _table() -> torch.Tensor:
    return torch.tensor([_trainer_logprob(t) for t in range(200)])


def _micro_batch(trainer: Any, samples: list[Any], size: int | None = None) -> dict[str, Any]:
    """Put ``samples`` in the rollout queue and take one micro-batch of ``size`` (all of them) through TRL's path."""
    for sample in samples:
        trainer.rlguard_queue.queue.put(sample)
    return next(iter(_loader(trainer, size or len(samples))))


def test_a_batch_of_known_ages_yields_each_buckets_gap() -> None:
    """Ages 0, 0, 1, 2, 3, 5, 7: the gap of each bucket over its samples' completion tokens, against a float64
    reference written from the samples themselves; the ages are TRL's own, as its dataset counted them."""
    ages = [0, 0, 1, 2, 3, 5, 7]
    gaps = [1 / 64, 3 / 64, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8]  # per token, each sample its own
    samples = [_sample(i, age, _engine(i, gap)) for i, (age, gap) in enumerate(zip(ages, gaps, strict=True))]
    trainer = _trainer(Guard(GuardConfig(detectors={}, interventions={"staleness_remedy": {}})))
    inputs = _micro_batch(trainer, samples)
    assert trainer._metrics["train"]["sample/staleness_max"] == [float(a) for a in ages]  # TRL's ages
    assert inputs[POLICY_VERSION_KEY].tolist() == [[float(SYNCS - a) for a in ages]]
    GuardedAsyncGRPOTrainer.compute_loss(trainer, _Policy(_table()), inputs)

    reference: dict[str, float] = {}
    for name, low, high in STALENESS_BUCKETS:
        tokens = [
            abs(_trainer_logprob(int(t)) - float(e))
            for s, age in zip(samples, ages, strict=True)
            if low <= age <= high
            for t, e, m in zip(s.input_ids, s.old_log_probs, s.completion_mask, strict=True)
            if m
        ]
        reference[name] = sum(tokens) / len(tokens)
    assert reference["mismatch_logp_abs_mean_age0"] == 2 / 64  # (1/64 + 3/64) / 2: the arithmetic, written out
    judged = trainer.rlguard_take_step_stats().reduce()
    logged = trainer._metrics["train"]
    for name, value in reference.items():
        assert judged[name] == pytest.approx(value, rel=1e-12, abs=0)
        ((total, count),) = logged[f"rlguard/{name}"]  # TRL logs a (sum, count) pair as its window's ratio
        assert total / count == pytest.approx(value, rel=1e-12, abs=0)
    assert [logged[f"rlguard/{n}"][0][1] for n, _, _ in STALENESS_BUCKETS] == [8.0, 4.0, 8.0, 8.0]  # tokens
    # the ages in optimizer steps: version v = SYNCS - age was made at step 3 v, the trainer is at 3 SYNCS + 2
    in_steps = [SYNC_EVERY * age + 2 for age in ages]
    assert in_steps == [2, 2, 5, 8, 11, 17, 23]
    assert logged["rlguard/staleness_steps_mean"] == [(float(sum(in_steps)), 7.0)]
    assert logged["rlguard/staleness_steps_max"] == [23.0]
    assert judged["staleness_steps_mean"] == pytest.approx(sum(in_steps) / 7, rel=1e-12)
    assert judged["staleness_steps_max"] == 23.0


def test_a_weight_sync_between_the_take_and_the_loss_ages_the_samples() -> None:
    """accelerate's dispatcher (TRL's ``dispatch_batches``) fetches one micro-batch ahead: the second is taken
    before the step's weight sync and trained after it, by weights one version newer than the policy TRL counted
    its age against."""
    trainer = _trainer(Guard(GuardConfig(detectors={}, interventions={"staleness_remedy": {}})))
    for i, (age, gap) in enumerate([(0, 1 / 64), (1, 1 / 32), (0, 1 / 16), (1, 1 / 4)]):
        trainer.rlguard_queue.queue.put(_sample(i, age, _engine(i, gap)))
    batches = iter(_loader(trainer, 2, dispatch=True))
    first = next(batches)  # the second is taken here too, under VERSION
    assert trainer._metrics["train"]["sample/staleness_max"] == [0.0, 1.0, 0.0, 1.0]  # all four taken
    GuardedAsyncGRPOTrainer.compute_loss(trainer, _Policy(_table()), first)
    judged = trainer.rlguard_take_step_stats().reduce()
    assert judged["mismatch_logp_abs_mean_age0"] == pytest.approx(1 / 64, rel=1e-12)
    assert judged["mismatch_logp_abs_mean_age1"] == pytest.approx(1 / 32, rel=1e-12)
    trainer.model_version += 1  # the step's sync, as TRL's _sync_weight bumps it
    trainer.rlguard_weight_syncs += 1  # and as GuardedAsyncGRPOTrainer._sync_weight counts it
    trainer.state.global_step += 1
    trainer.rlguard_published.publish(trainer.rlguard_weight_syncs, trainer.state.global_step)
    for i in (4, 5):  # what the dispatcher fetches ahead of the second: samples of the new version
        trainer.rlguard_queue.queue.put(_sample(i, -1, _engine(i, 0.0)))
    second = next(batches)  # samples 2 and 3: TRL counted ages 0 and 1 as it took them
    assert trainer._metrics["train"]["sample/staleness_max"][4:] == [0.0, 0.0]
    GuardedAsyncGRPOTrainer.compute_loss(trainer, _Policy(_table()), second)
    judged = trainer.rlguard_take_step_stats().reduce()
    assert judged["mismatch_logp_abs_mean_age1"] == pytest.approx(1 / 16, rel=1e-12)
    assert judged["mismatch_logp_abs_mean_age2_3"] == pytest.approx(1 / 4, rel=1e-12)
    assert "mismatch_logp_abs_mean_age0" not in judged
    # in optimizer steps: versions SYNCS and SYNCS - 1, made at 3 SYNCS and 3 SYNCS - 3, at step 3 SYNCS + 3
    assert judged["staleness_steps_mean"] == 4.5 and judged["staleness_steps_max"] == 6.0


def test_every_process_counts_the_weight_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock of the ages: each sync counted where TRL's own sync returned (on every process, TRL's
    ``model_version`` on the main one only)."""
    monkeypatch.setattr(trainer_module.AsyncGRPOTrainer, "_sync_weight", lambda self: None)
    trainer = _trainer(None)
    trainer._rlguard_resync = True
    GuardedAsyncGRPOTrainer._sync_weight(trainer)
    assert trainer.rlguard_weight_syncs == SYNCS + 1 and not trainer._rlguard_resync
    assert trainer.rlguard_published.step_of(SYNCS + 1) == STEP  # and the optimizer step each was made at


def test_a_rollback_counts_the_kept_versions_from_the_restored_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the guard acts, before the optimizer step (``global_step`` one below the step judged): a snapshot at step
    STEP (weights of STEP - 1 updates), a rollback at step STEP + 1; when that step ends the restored weights are
    pushed at step STEP + 1. The syncs made after the snapshot are forgotten; a sample of the last kept sync
    (made at STEP - 2) is one update older than the snapshot, a sample of the pushed weights none."""
    monkeypatch.setattr(trainer_module.AsyncGRPOTrainer, "_sync_weight", lambda self: None)
    trainer = _trainer(None)
    trainer.rlguard_queue, trainer._rlguard_snapshot_version = None, None
    trainer.state.global_step = STEP - 1  # judging step STEP
    GuardedAsyncGRPOTrainer.rlguard_on_snapshot(trainer)
    trainer.state.global_step = STEP  # judging step STEP + 1
    GuardedAsyncGRPOTrainer.rlguard_on_restore(trainer)
    trainer.state.global_step = STEP + 1  # the step ended
    GuardedAsyncGRPOTrainer._sync_weight(trainer)  # the restored weights pushed
    published = trainer.rlguard_published
    last_kept = SYNCS  # made at 3 SYNCS = STEP - 2
    ages = published.ages(torch.tensor([float(last_kept), float(SYNCS + 1)]), STEP + 1)
    assert ages.tolist() == [1.0, 0.0]


def test_a_batch_not_from_the_guarded_loader_is_refused_clearly() -> None:
    from trl.experimental.async_grpo.packing import TreeRow

    sample = _sample(0, 0, _engine(0, 0.0))
    row = TreeRow()
    row.add({"input_ids": sample.input_ids, "completion_mask": sample.completion_mask, "group_id": 0,
             "old_log_probs": sample.old_log_probs, "advantage": 1.0, "metrics": {}})  # fmt: skip
    collate = PolicyVersionCollator(trainer_module.DataCollatorForRollout(0, 1, metrics=defaultdict(list)))
    with pytest.raises(RuntimeError, match=r"no policy version.*trl 1\.16"):
        collate([[row]])
    with pytest.raises(RuntimeError, match=r"DataCollatorForRollout.*Install trl 1\.16"):
        install_rollout_collator(torch.utils.data.DataLoader(TensorDataset(torch.arange(2))), PolicyVersionCollator)


def _stale_guard() -> GuardConfig:
    """Only the staleness remedy with its bounds, escalating at once on a non-finite step, restoring the bound after
    3 clean steps."""
    remedy = {"remedies": ("lower_bound", "drop_stale"), "escalate_on": ("nonfinite",), "trial_steps": 1,
              "recovery_steps": 3}  # fmt: skip
    off = dict.fromkeys(("clip_controller", "halt", "lr_backoff", "rollback", "skip_no_signal", "skip_step"))
    return GuardConfig.preset("default", interventions={**off, "staleness_remedy": remedy})


def test_the_staleness_remedy_diagnoses_from_the_gap_and_lowers_the_bound_through_trls_dataset() -> None:
    """Each step takes fresh samples (age 0, the engine's gap 1/64) and samples 4 versions old whose gap grows by
    1/16 a step: staleness is diagnosed from the logged gap alone, the non-finite step 5 halves the bound (4 -> 2)
    and TRL's dataset then drops the age-4 samples; 3 clean steps restore it."""
    guard = Guard(_stale_guard())
    trainer = _trainer(guard, max_staleness=4)
    model = torch.nn.Linear(2, 1)
    actuator = RolloutSyncActuator(model, torch.optim.SGD(model.parameters(), lr=0.1), owns_step=False,
                                   trainer=trainer)  # fmt: skip
    bounds, taken_ages = [], []
    for step in range(1, 11):
        stale = [_sample(i, 4, _engine(i, step / 16)) for i in range(2)]
        fresh = [_sample(i, 0, _engine(i, 1 / 64)) for i in range(2, 4)]
        before = len(trainer._metrics["train"]["sample/staleness_max"])
        # the stale samples first: under a lowered bound TRL's dataset drops them before it takes the fresh ones
        inputs = _micro_batch(trainer, stale + fresh, 2 if trainer._rollout_dataset.max_staleness < 4 else 4)
        assert trainer.rlguard_queue.queue.empty()
        taken_ages.append(trainer._metrics["train"]["sample/staleness_max"][before:])
        GuardedAsyncGRPOTrainer.compute_loss(trainer, _Policy(_table()), inputs)
        stats = trainer.rlguard_take_step_stats()
        if step == 5:
            stats.add("nonfinite", 1.0)  # a NaN in the step, as the callback would count it
        guard.apply(guard.observe(step, stats.reduce()), actuator)
        bounds.append(trainer._rollout_dataset.max_staleness)
    remedy: Any = guard.interventions["staleness_remedy"]
    # the age-4 bucket's running gap (1/16 a step) passes the age-0 one (1/64) by 0.08 at step 4
    assert remedy._s_stale_step == 4, remedy.gap_by_age()
    assert math.isnan(remedy.gap_by_age()["mismatch_logp_abs_mean_age1"])  # no age-1 samples here
    assert bounds == [4, 4, 4, 4, 2, 2, 2, 4, 4, 4], bounds
    assert taken_ages[5:8] == [[0.0, 0.0]] * 3  # under the lowered bound
    assert trainer._metrics["train"]["sample/dropped_stale_total"] == [1.0] * 6  # dropped and counted by TRL
    assert taken_ages[8] == [4.0, 4.0, 0.0, 0.0]  # the bound restored


def test_a_gap_that_does_not_grow_with_age_is_not_staleness() -> None:
    """The same run with the older samples' gap the engine's own (1/64 at ages 0 and 4): no diagnosis, and the
    non-finite step leaves the bound as configured."""
    guard = Guard(_stale_guard())
    trainer = _trainer(guard, max_staleness=4)
    model = torch.nn.Linear(2, 1)
    actuator = RolloutSyncActuator(model, torch.optim.SGD(model.parameters(), lr=0.1), owns_step=False,
                                   trainer=trainer)  # fmt: skip
    for step in range(1, 8):
        samples = [_sample(i, 4 * (i % 2), _engine(i, 1 / 64)) for i in range(4)]
        GuardedAsyncGRPOTrainer.compute_loss(trainer, _Policy(_table()), _micro_batch(trainer, samples))
        stats = trainer.rlguard_take_step_stats()
        assert stats.reduce()["mismatch_logp_abs_mean_age4plus"] == pytest.approx(1 / 64, rel=1e-12)
        if step == 5:
            stats.add("nonfinite", 1.0)
        guard.apply(guard.observe(step, stats.reduce()), actuator)
    assert guard.interventions["staleness_remedy"]._s_stale_step is None  # type: ignore[attr-defined]
    assert trainer._rollout_dataset.max_staleness == 4
