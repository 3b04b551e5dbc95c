"""``rlguard_metrics.jsonl``: every record a guarded or monitored TRL run logs, written by ``StabilityCallback`` in the
output folder so that ``rlguard doctor``, ``watch`` and ``report`` read a run that saved no checkpoint; its lifecycle
on a fresh run and on a resume (``rlguard.adapters.trl.metrics_file``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from transformers import TrainerControl, TrainerState, TrainingArguments

from rlguard.adapters.trl import StabilityCallback
from rlguard.doctor.readers import find_log, read_log
from rlguard.guards.events import METRICS_FILE


def _run(folder: Path, steps: range, *, resume: int = 0, **kw: Any) -> StabilityCallback:
    """A monitoring callback through ``on_train_begin``, one ``on_log`` per step and ``on_train_end``."""
    args = TrainingArguments(output_dir=str(folder), use_cpu=True, report_to="none", logging_steps=1)
    state, control = TrainerState(), TrainerControl()
    state.global_step = resume
    callback = StabilityCallback(**kw)
    callback.on_train_begin(args, state, control)
    for step in steps:
        state.global_step = step
        callback.on_log(args, state, control, logs={"loss": 0.5 + step, "reward": step / 10, "grad_norm": 1.0})
        if step % 3 == 0:
            callback.on_log(args, state, control, logs={"eval_accuracy": step / 100})
    callback.on_log(args, state, control, logs={"train_runtime": 1.0, "train_loss": 0.5})  # the summary: not a step
    callback.on_train_end(args, state, control)
    return callback


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_logged_record_is_written_and_the_doctor_reads_the_folder(tmp_path: Path) -> None:
    _run(tmp_path, range(1, 8))
    records = _records(tmp_path / METRICS_FILE)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 8))
    assert [(r["step"], r["eval_accuracy"]) for r in records if "eval_accuracy" in r] == [(3, 0.03), (6, 0.06)]
    assert not any("train_runtime" in r for r in records)
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 1.0}]}))
    assert find_log(tmp_path) == tmp_path / METRICS_FILE  # written at every step: before a checkpoint's state
    rows = dict(read_log(tmp_path).rows)
    assert sorted(rows) == list(range(1, 8)) and rows[5]["loss"] == 5.5 and rows[6]["eval_accuracy"] == 0.06


def test_a_fresh_run_moves_an_old_file_aside(tmp_path: Path) -> None:
    _run(tmp_path, range(1, 5))
    _run(tmp_path, range(1, 3))
    assert [r["step"] for r in _records(tmp_path / METRICS_FILE) if "loss" in r] == [1, 2]
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith(METRICS_FILE + ".")]
    assert [r["step"] for r in _records(old) if "loss" in r] == [1, 2, 3, 4]


def test_a_resumed_run_continues_the_file_without_the_stretch_it_repeats(tmp_path: Path) -> None:
    _run(tmp_path, range(1, 7))  # checkpointed at 4, killed after 6
    with open(tmp_path / METRICS_FILE, "a") as fh:
        fh.write('{"step": 7, "loss": 1')  # a line torn by the kill
    _run(tmp_path, range(5, 10), resume=4)
    records = _records(tmp_path / METRICS_FILE)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 10))  # each step once
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith(METRICS_FILE + ".")]
    assert old.read_text().endswith('{"step": 7, "loss": 1')  # the killed stretch kept whole beside it


def test_a_resume_at_the_files_end_continues_it_in_place(tmp_path: Path) -> None:
    _run(tmp_path, range(1, 5))
    _run(tmp_path, range(5, 7), resume=4)
    assert [r["step"] for r in _records(tmp_path / METRICS_FILE) if "loss" in r] == list(range(1, 7))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(METRICS_FILE + ".")]


def test_no_file_when_asked_for_none(tmp_path: Path) -> None:
    _run(tmp_path, range(1, 4), metrics_file=None)
    assert not (tmp_path / METRICS_FILE).exists()
