"""Staleness as a first-class stat (issue 38, part 3): the metric table's staleness rows map TRL's
``AsyncGRPOTrainer`` keys and verl's fully async keys whose meaning is the canonical one, and the doctor reads them
from a log; the gap-by-age buckets are a fixed set."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlguard.doctor.diagnose import read_canonical
from rlguard.metrics import METRICS, REDUCTIONS, STALENESS_BUCKETS, TRL_TO_CANONICAL, VERL_TO_CANONICAL, WEIGHTS


def _trl_async_log(path: Path, steps: int = 30) -> Path:
    """What ``AsyncGRPOTrainer.log`` writes (``trainer_state.json``-style records under wandb's ``train/``): its
    ``sample/*`` keys beside GRPO's own, with ages cycling 0..3 as under ``max_staleness=3``."""
    records = []
    for i in range(steps):
        age = i % 4
        records.append(
            {
                "step": i + 1,
                "train/reward": 0.3 + 0.01 * i,
                "train/entropy": 1.0 - 0.005 * i,
                "train/sample/staleness_mean": age / 2,
                "train/sample/staleness_max": float(age),
                "train/sample/dropped_stale_total": float(i % 3 == 0),
                "train/sample/rollout_queue_size": 12.0,
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_doctor_reads_trl_async_staleness_keys(tmp_path: Path) -> None:
    """Each step's canonical staleness stats are the values TRL logged under its own keys."""
    log = read_canonical(_trl_async_log(tmp_path / "run.jsonl"))
    assert log.keys.mapped["train/sample/staleness_mean"] == "staleness_mean"
    assert log.keys.mapped["train/sample/staleness_max"] == "staleness_max"
    assert log.keys.mapped["train/sample/dropped_stale_total"] == "stale_dropped"
    assert "train/sample/rollout_queue_size" not in log.keys.mapped  # a queue's size is no age
    by_step = dict(log.rows)
    assert by_step[4]["staleness_max"] == 3.0 and by_step[4]["staleness_mean"] == 1.5
    assert by_step[1]["stale_dropped"] == 1.0 and by_step[2]["stale_dropped"] == 0.0


def test_reductions_follow_trls_own() -> None:
    """TRL reduces a logging window's values by the key's words (``_reduce_metric``: ``total`` sums, ``max`` takes
    the largest, else the mean); ranks and micro-batches combine the canonical stat the same way."""
    assert (REDUCTIONS["staleness_mean"], WEIGHTS["staleness_mean"]) == ("mean", "samples")
    assert REDUCTIONS["staleness_max"] == "max"
    assert REDUCTIONS["stale_dropped"] == "sum"
    assert TRL_TO_CANONICAL["sample/dropped_stale_total"] == "stale_dropped"


def test_only_verl_keys_of_the_same_meaning_are_mapped() -> None:
    """verl's ``count/staleness_samples`` counts samples generated since the last weight sync (no age),
    ``count/dropped_stale_samples`` is a running total of samples evicted from a full queue (no age bound), and
    ``static/staleness_threshold`` is a fraction of a batch of extra samples (no version count): none is mapped;
    ``count/current_param_version`` is the trainer's version."""
    assert VERL_TO_CANONICAL["fully_async/count/current_param_version"] == "policy_version"
    for key in (
        "fully_async/count/staleness_samples",
        "fully_async/count/dropped_stale_samples",
        "fully_async/static/staleness_threshold",
    ):
        assert key not in VERL_TO_CANONICAL


def test_age_buckets_cover_every_age_once() -> None:
    """Every whole age from 0 to 64 falls in exactly one bucket, the buckets are in order and the last is open."""
    for age in range(65):
        hits = [name for name, low, high in STALENESS_BUCKETS if low <= age <= high]
        assert len(hits) == 1, (age, hits)
    assert [low for _, low, _ in STALENESS_BUCKETS] == [0, 1, 2, 4]
    assert STALENESS_BUCKETS[-1][2] == math.inf
    rows = {m.name: m for m in METRICS}
    for name, _, _ in STALENESS_BUCKETS:
        assert (rows[name].reduction, rows[name].weight) == ("mean", "tokens")


def test_the_doctor_reads_the_ages_in_optimizer_steps(tmp_path: Path) -> None:
    """rlguard's adapters log the ages in optimizer steps as ``rlguard/staleness_steps_*`` (TRL's log under
    ``train/``, verl's as they are): the doctor maps both beside TRL's ages in versions."""
    records = [
        {"step": i + 1, "train/reward": 0.5, "train/sample/staleness_max": 1.0,
         "train/rlguard/staleness_steps_mean": 2.5, "train/rlguard/staleness_steps_max": float(3 + i % 2)}
        for i in range(12)
    ]  # fmt: skip
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    log = read_canonical(path)
    assert log.keys.mapped["train/rlguard/staleness_steps_mean"] == "staleness_steps_mean"
    assert log.keys.mapped["train/rlguard/staleness_steps_max"] == "staleness_steps_max"
    by_step = dict(log.rows)
    assert (by_step[2]["staleness_steps_max"], by_step[2]["staleness_max"]) == (4.0, 1.0)
    assert (REDUCTIONS["staleness_steps_mean"], WEIGHTS["staleness_steps_mean"]) == ("mean", "samples")
    assert REDUCTIONS["staleness_steps_max"] == "max"
