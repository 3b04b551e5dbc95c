"""The gap by age bucket in verl's bypass mode, measured in the workers' loss (``rlguard.adapters.verl.bypass_gap``):
verl's own ``ppo_loss`` on a micro-batch in verl's layout (unpadded log-probs, ``no_padding_2_padding``), verl's
``Metric`` aggregation over 2 data-parallel ranks x 2 micro-batches, against a reference written per token with
Python floats; and verl's fully async and one-step-off trainers in bypass mode sending the loss and each row's age."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl")

from verl.utils import tensordict_utils as tu
from verl.utils.metric.utils import Metric
from verl.workers.utils.losses import ppo_loss

from rlguard.adapters.verl.async_trainers import AGE_KEYS, guarded_async_trainer_class
from rlguard.adapters.verl.bypass_gap import AGE_COLUMN, gap_by_age_from_metrics, part_keys, ppo_loss_with_gap_by_age
from rlguard.adapters.verl.fully_async import guarded_fully_async_trainer_class
from rlguard.metrics import STALENESS_BUCKETS
from tests.adapters.verl.fully_async_stand_in import FakeFullyAsyncTrainer
from tests.helpers.verl_async_stand_in import FakeOneStepOffTrainer
from tests.helpers.verl_parity import actor_config
from tests.helpers.verl_stand_in import poisoned_run, trainer_config

PROMPT, RESPONSE = 2, 3
LENGTHS = [3, 2, 3, 1, 2, 3, 0, 3]  # response tokens of each row; rank r holds rows 4r ... 4r + 3
AGES = [0.0, 1.0, 3.0, 5.0, 0.0, 2.0, 4.0, 1.0]
AGE1 = STALENESS_BUCKETS[1][0]
TRAINER = [[-0.5 - 0.1 * b - 0.03 * t for t in range(RESPONSE)] for b in range(8)]
ENGINE = [[TRAINER[b][t] + (0.01 + 0.02 * b) * (-1) ** t for t in range(RESPONSE)] for b in range(8)]


def _micro_batch(rows: list[int]) -> tuple[dict[str, Any], Any]:
    """``(model_output, data)`` as verl's engine passes them to the loss for these rows: the model's log-probs
    unpadded (prompt then response tokens of each row, shifted left by one), the rest padded ``(B, T)``."""
    mask = torch.tensor([[t < LENGTHS[b] for t in range(RESPONSE)] for b in rows])  # (B, T)
    attention = torch.cat([torch.ones(len(rows), PROMPT, dtype=torch.bool), mask], dim=1)  # (B, P + T)
    flat: list[float] = []
    for b in rows:  # P - 1 prompt positions, the response's log-probs, the last token's (unused)
        flat += [0.0] * (PROMPT - 1) + TRAINER[b][: LENGTHS[b]] + [9.0]
    tensors: dict[str, Any] = {
        "prompts": torch.ones(len(rows), PROMPT, dtype=torch.long),
        "responses": torch.ones(len(rows), RESPONSE, dtype=torch.long),
        "attention_mask": attention.long(),
        "response_mask": mask.long(),
        "old_log_probs": torch.tensor([ENGINE[b] for b in rows], dtype=torch.float64),  # bypass: the engine's
        "advantages": torch.tensor([[1.0 if b % 2 else -1.0] * RESPONSE for b in rows], dtype=torch.float64),
        AGE_COLUMN: torch.tensor([AGES[b] for b in rows], dtype=torch.float32),
    }
    info: dict[str, Any] = {"dp_size": 2, "batch_num_tokens": sum(LENGTHS), "global_batch_size": 8}
    data = tu.get_tensordict(tensor_dict=tensors, non_tensor_dict=info)
    return {"log_probs": torch.tensor(flat, dtype=torch.float64)}, data


def test_the_loss_is_verls_and_the_gap_parts_add_up_to_each_buckets_token_mean() -> None:
    config = actor_config(loss_agg_mode="token-mean")
    per_rank: list[dict[str, Metric]] = []
    for rank in range(2):
        gathered: dict[str, Metric] = {}
        for first in (4 * rank, 4 * rank + 2):
            output, data = _micro_batch([first, first + 1])
            loss, metrics = ppo_loss_with_gap_by_age(config, output, data)
            own_loss, own_metrics = ppo_loss(config, output, _micro_batch([first, first + 1])[1])
            assert torch.equal(loss, own_loss)  # verl's loss, untouched
            assert set(own_metrics) < set(metrics)
            for key, metric in metrics.items():
                gathered.setdefault(key, metric.init_list()).extend(metric)
        per_rank.append(gathered)
    # verl's update_actor: each metric over the ranks (Metric.aggregate_dp), then the trainer's "actor/" prefix
    step = {f"actor/{key}": Metric.aggregate_dp([r[key] for r in per_rank]) for key in per_rank[0]}
    gaps = gap_by_age_from_metrics(step)
    assert not any("_gap_" in key for key in step)  # the parts are taken out
    for name, low, high in STALENESS_BUCKETS:
        tokens = [
            abs(TRAINER[b][t] - ENGINE[b][t]) for b in range(8) if low <= AGES[b] <= high for t in range(LENGTHS[b])
        ]
        assert gaps[f"rlguard/{name}"] == pytest.approx(sum(tokens) / len(tokens), rel=1e-12, abs=0), name
    # the arithmetic of one bucket, written out: age 0 is rows 0 (3 tokens, 0.01) and 4 (2 tokens, 0.09)
    assert gaps["rlguard/mismatch_logp_abs_mean_age0"] == pytest.approx((3 * 0.01 + 2 * 0.09) / 5, rel=1e-12)


def test_a_batch_without_ages_is_verls_loss_alone() -> None:
    config = actor_config(loss_agg_mode="token-mean")
    output, data = _micro_batch([0, 1])
    del data[AGE_COLUMN]
    _, metrics = ppo_loss_with_gap_by_age(config, output, data)
    assert not any(key in metrics for name, _, _ in STALENESS_BUCKETS for key in part_keys(name))
    assert gap_by_age_from_metrics(dict(metrics)) == {}


def test_the_fully_async_trainer_in_bypass_mode_sends_the_measuring_loss_and_each_rows_age(tmp_path: Path) -> None:
    from omegaconf import open_dict

    config = trainer_config(tmp_path, save_freq=-1)
    with open_dict(config):
        config.algorithm.rollout_correction = {"bypass_mode": True}
    Trainer = guarded_fully_async_trainer_class(FakeFullyAsyncTrainer)
    trainer = Trainer(config, [{"actor/pg_loss": 0.1}] * 3)
    asyncio.run(trainer.set_rollouter(trainer.rollouter))
    (sent,) = trainer.actor_rollout_wg.loss_fns  # at set_rollouter, before the first step
    assert isinstance(sent, partial) and sent.func is ppo_loss_with_gap_by_age
    assert sent.keywords["config"].policy_loss.loss_mode == trainer.rlguard.loss_mode
    batch = trainer._fit_compute_log_prob(_batch(versions=[0, 0]))
    assert batch.batch[AGE_COLUMN].tolist() == [0.0, 0.0] and batch.batch[AGE_COLUMN].dtype == torch.float32
    # what verl's _fit_update_actor puts in the step's metrics becomes the gap by bucket before the step is logged
    trainer.metrics = {"actor/" + key: value for key, value in zip(part_keys(AGE1), (0.3, 2.0), strict=True)}
    trainer.metrics_aggregator.reset()
    trainer._fit_postprocess_step()
    aggregated = trainer.metrics_aggregator.get_aggregated_metrics()
    assert aggregated["rlguard/mismatch_logp_abs_mean_age1"] == pytest.approx(0.15)
    assert not any("_gap_" in key for key in aggregated)


def _one_step_off(tmp_path: Path, bypass: bool) -> Any:
    """The guarded one-step-off trainer (stand-in) run through a rollback: 5 healthy steps, 4 poisoned (three skips,
    then back to step 5), 3 healthy; each step's actor metrics carry the workers' parts of the age-1 bucket."""
    from omegaconf import open_dict

    config = trainer_config(tmp_path, save_freq=1)
    with open_dict(config):
        config.algorithm.rollout_correction = {"bypass_mode": bypass}
    parts = {"actor/" + key: value for key, value in zip(part_keys(AGE1), (0.3, 2.0), strict=True)}
    trainer = guarded_async_trainer_class(FakeOneStepOffTrainer)(
        config, [{**step, **parts} for step in poisoned_run(5, 4) + poisoned_run(3, 0)]
    )
    asyncio.run(trainer.fit())
    return trainer


def test_the_one_step_off_trainer_in_bypass_mode_sends_the_measuring_loss_and_each_batchs_age(
    tmp_path: Path, logged: list[tuple[int, dict[str, Any]]]
) -> None:
    trainer = _one_step_off(tmp_path, bypass=True)
    (sent,) = trainer.actor_rollout_wg.loss_fns  # before the first step (the skips change no control)
    assert isinstance(sent, partial) and sent.func is ppo_loss_with_gap_by_age
    assert sent.keywords["config"].policy_loss.loss_mode == trainer.rlguard.loss_mode
    by_step = dict(logged)
    assert by_step[9]["rlguard/guard/rollback_to"] == 5.0
    # every row of a step's actor batch has the batch's age: 0 for the first and for the replacement after the
    # rollback (step 10), 1 for the others; the same age the trainer logs as staleness_mean
    ages = {step: batch.batch[AGE_COLUMN] for step, batch in trainer.actor_batches.items()}
    assert all(age.dtype == torch.float32 and age.shape == (4,) for age in ages.values())
    assert [ages[s].tolist() for s in range(1, 13)] == [[a] * 4 for a in [0.0] + [1.0] * 8 + [0.0, 1.0, 1.0]]
    assert all(ages[s][0].item() == by_step[s][AGE_KEYS[0]] for s in range(1, 13))
    # the workers' parts become the bucket's gap (sum / tokens) before the step is logged, and leave the record
    assert all(by_step[s]["rlguard/mismatch_logp_abs_mean_age1"] == pytest.approx(0.15) for s in range(1, 13))
    assert not any("_gap_" in key for _, record in logged for key in record)


def test_the_one_step_off_trainer_recomputing_pi_old_keeps_verls_loss_and_batch(tmp_path: Path) -> None:
    trainer = _one_step_off(tmp_path, bypass=False)
    assert trainer.actor_rollout_wg.loss_fns == []  # the workers keep the loss verl built them with
    assert not any(AGE_COLUMN in batch.batch.keys() for batch in trainer.actor_batches.values())  # noqa: SIM118


def test_staleness_remedy_diagnoses_the_one_step_off_trainer_in_bypass_mode(tmp_path: Path) -> None:
    """The gap the workers measure (here their parts, in each step's bucket: age 0 at step 1, age 1 after) reaches
    ``staleness_remedy`` (``stable``), which diagnoses stale samples and sends the kept gradient (pi_old being the
    engine's) in the measuring loss; the same run with the gap at age 1 no wider than at age 0 is left alone."""
    from omegaconf import open_dict

    from rlguard.guards.events import read_events

    def run(folder: Path, age1_gap: float) -> tuple[Any, list[str]]:
        config = trainer_config(folder, save_freq=1)
        with open_dict(config):
            config.algorithm.rollout_correction = {"bypass_mode": True}
        steps = []
        for step, healthy in enumerate(poisoned_run(6, 0), start=1):
            bucket, gap = (STALENESS_BUCKETS[0][0], 0.01) if step == 1 else (AGE1, age1_gap)
            steps.append({**healthy, **{"actor/" + k: v for k, v in zip(part_keys(bucket), (gap, 1.0), strict=True)}})
        trainer = guarded_async_trainer_class(FakeOneStepOffTrainer)(config, steps, guard="stable")
        asyncio.run(trainer.fit())
        events = read_events(trainer.rlguard.events_path).events
        return trainer, [str(e.to_dict()["message"]) for e in events]

    trainer, reasons = run(tmp_path / "stale", age1_gap=0.3)
    stale = [r for r in reasons if r.startswith("stale samples: mismatch_logp_abs_mean_age1 gap 0.3 vs 0.01 at age 0")]
    assert len(stale) == 1 and "kept_gradient on" in stale[0], reasons
    last = trainer.actor_rollout_wg.loss_fns[-1]
    assert last.func is ppo_loss_with_gap_by_age and last.keywords["config"].policy_loss.controls["kept_gradient"]
    _, reasons = run(tmp_path / "fresh", age1_gap=0.015)
    assert not any(r.startswith("stale samples") for r in reasons), reasons


def _batch(versions: list[int]) -> Any:
    from types import SimpleNamespace

    import numpy as np

    return SimpleNamespace(non_tensor_batch={"max_global_steps": np.array(versions)}, batch={})
