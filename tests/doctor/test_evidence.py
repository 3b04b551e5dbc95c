"""New evidence in the doctor (issue 36, class 3 and items 3-4): the three collapses the doctor did not read (a mode
collapse with reward_std at 0 and one completion length; a policy locked into one action, loss 0 and the eval
frozen; a warm start destroyed), the eval metric read beside the reward with its direction said, and a sparse log
of 21 records judged by the new detectors."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import diagnose
from rlguard.doctor.keys import eval_direction

runner = CliRunner()


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _critical(path: Path) -> dict[str, int]:
    """detector -> onset of each critical finding."""
    return {f.detector: f.step for f in diagnose(path).findings if f.severity == "critical"}


def test_a_mode_collapse_with_reward_std_at_zero_is_critical(tmp_path: Path) -> None:
    """TRL's keys; one identical 9-token answer from step 7 (short answers from the start, so length_collapse, at
    0.1x its early baseline, does not fire): reward_std 0, one length. Before: no finding."""
    rng = random.Random(0)
    records = []
    for i in range(60):
        healthy = i < 6
        records.append(
            {
                "step": i + 1,
                "reward": 0.3 + rng.gauss(0, 0.05) if healthy else 0.25,
                "reward_std": 0.35 + rng.gauss(0, 0.03) if healthy else 0.0,
                "completions/mean_length": 12 + rng.gauss(0, 1.5) if healthy else 9.0,
                "loss": rng.gauss(0, 0.02) if healthy else 0.0,
                "grad_norm": 0.5 * math.exp(rng.gauss(0, 0.2)),
            }
        )
    found = _critical(_write(tmp_path / "mode.jsonl", records))
    # 6 healthy records: (6 + k) / C(k + 7, 7) <= 1/370 first at k = 8 zeros (step 14); length likewise
    assert found.get("advantage_collapse") == 14 and "frozen_values" in found, found
    assert found["frozen_values"] <= 15, found


def test_a_policy_locked_into_one_action_is_critical(tmp_path: Path) -> None:
    """A hand-written loop's JSONL: loss exactly 0 from record 21, the eval accuracy (logged with 4 decimals)
    frozen at one value for 20 records. Before: "could not judge" (exit 3)."""
    rng = random.Random(1)
    records = [
        {
            "step": 10 * (i + 1),
            "loss": rng.gauss(0, 0.05) if i < 20 else 0.0,
            "eval_accuracy": round(0.3 + 0.01 * i + rng.gauss(0, 0.02), 4) if i < 20 else 0.4375,
        }
        for i in range(40)
    ]
    d = diagnose(_write(tmp_path / "lock.jsonl", records))
    assert d.keys.auto_mapped == {"eval_accuracy": "eval_score"}
    frozen = next(f for f in d.findings if f.detector == "frozen_values")
    assert frozen.severity == "critical" and d.exit_code == 1, frozen
    assert 210 <= frozen.step <= 260 and "eval_score has been 0.4375 exactly" in frozen.message, frozen


def test_a_warm_start_destroyed_is_critical(tmp_path: Path) -> None:
    """Eval accuracy 0.99 for 6 records (logged every 20 steps), then 0.64 and frozen. Before: "could not judge"."""
    rng = random.Random(2)
    records = [
        {"step": 20 * (i + 1), "loss": rng.gauss(0, 0.05), "eval/accuracy": 0.99 if i < 6 else 0.64} for i in range(25)
    ]
    found = _critical(_write(tmp_path / "warm.jsonl", records))
    # the EWMA is 10% below the level at 160; the onset is the fall, at step 140 (its least-squares change point)
    assert found.get("eval_drop") == 140, found


def test_the_eval_key_and_its_direction_are_said_and_refusable(tmp_path: Path) -> None:
    records = [
        {"step": i + 1, "loss": 0.1 * math.sin(i), "eval_loss": 1.0 + 0.01 * i, "eval_accuracy": 0.5 + 0.001 * i}
        for i in range(30)
    ]
    path = _write(tmp_path / "run.jsonl", records)
    out = runner.invoke(app, ["doctor", str(path)]).stdout
    assert "eval_accuracy: an evaluation key, higher is better (inferred from accuracy" in " ".join(out.split())
    doc = json.loads(runner.invoke(app, ["doctor", str(path), "--json", "--map", "eval_accuracy="]).stdout)
    assert doc["auto_mapped_keys"] == {"eval_loss": "eval_loss"}  # refused: the next one, lower is better
    assert "lower is better" in doc["auto_map_evidence"]["eval_loss"]
    doc = json.loads(runner.invoke(app, ["doctor", str(path), "--json", "--map", "eval_loss=eval_score"]).stdout)
    assert doc["mapped_keys"]["eval_loss"] == "eval_score" and "eval_accuracy" not in doc["auto_mapped_keys"]


def test_eval_direction_from_the_words_of_the_key() -> None:
    up = ("eval_accuracy", "val-core/openai/gsm8k/reward/mean@1", "test_score/openai/gsm8k", "val/pass@1", "accuracy")
    down = ("eval_loss", "eval/perplexity", "val/error_rate")
    assert all(eval_direction(k) == "eval_score" for k in up), [eval_direction(k) for k in up]
    assert all(eval_direction(k) == "eval_loss" for k in down), [eval_direction(k) for k in down]
    # a spread, a cost, no direction, or not an evaluation at all
    for key in ("val-aux/aime/reward/worst@4/std", "eval_runtime", "eval_samples_per_second", "val/foo", "reward"):
        assert eval_direction(key) is None, key


def test_a_log_of_21_records_is_judged_by_the_new_detectors(tmp_path: Path) -> None:
    """21 records logged every 20-25 steps (issue 36, class 4): each new detector's warm-up is fitted to the log (a
    quarter of its observations, at least 5) and it judges the rest; a collapse at record 8 is found."""
    rng = random.Random(3)
    step, records = 0, []
    for i in range(21):
        step += rng.choice((20, 25))
        collapsed = i >= 7
        records.append(
            {
                "step": step,
                "reward": 0.25 if collapsed else 0.3 + rng.gauss(0, 0.05),
                "reward_std": 0.0 if collapsed else 0.3 + rng.gauss(0, 0.03),
                "eval_accuracy": 0.64 if collapsed else 0.9 + rng.gauss(0, 0.01),
            }
        )
    d = diagnose(_write(tmp_path / "sparse.jsonl", records))
    for name in ("advantage_collapse", "frozen_values", "eval_drop"):
        checked, why = d.coverage[name]
        assert checked and "warm-up 5" in why, (name, why)
    assert {"advantage_collapse", "eval_drop"} <= {f.detector for f in d.findings if f.severity == "critical"}


def test_trl_evaluation_rows_are_read_beside_the_reward(tmp_path: Path) -> None:
    """TRL's trainer_state.json writes each evaluation as its own row of log_history (eval_* keys at the step of a
    training row): its metrics join that step and the eval accuracy is read beside the reward. The same warm start
    destroyed as above, in TRL's layout: eval accuracy 0.99, then 0.64 from step 140 while the training reward holds.
    Before: the evaluation rows were dropped, eval_accuracy never read."""
    rng = random.Random(3)
    history: list[dict[str, Any]] = []
    for i in range(1, 501):
        history.append({"step": i, "epoch": i / 500, "loss": rng.gauss(0, 0.05), "reward": 0.8 + rng.gauss(0, 0.02)})
        if i % 20 == 0:
            accuracy = 0.99 + rng.gauss(0, 0.003) if i < 140 else 0.64 + rng.gauss(0, 0.003)
            history.append({"step": i, "epoch": i / 500, "eval_loss": 0.3 + 0.001 * i, "eval_accuracy": accuracy})
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 500, "log_history": history}), encoding="utf-8")
    d = diagnose(path)
    assert d.keys.auto_mapped == {"eval_accuracy": "eval_score"}, d.keys.auto_mapped
    assert sum(math.isfinite(v) for v in d.series["eval_score"]) == 25
    assert "evaluation rows" not in d.read.dropped and d.read.overwritten == 0, d.read.to_dict()
    (drop,) = [f for f in d.findings if f.detector == "eval_drop"]
    assert drop.severity == "critical" and 140 <= drop.step <= 160, drop
