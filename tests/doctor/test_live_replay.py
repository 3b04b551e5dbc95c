"""``rlguard doctor --live PRESET LOG`` (issue 36, part 6): the log replayed record by record through a live guard of
the preset, and the decisions it would have made (outcomes other than ``step``, changes of controls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import diagnose
from rlguard.doctor.replay import non_neutral, replay_live
from rlguard.guards import Guard, GuardConfig
from rlguard.guards.decision import Controls
from tests.helpers.synthetic import failing_stream, healthy_stream

runner = CliRunner()


def _write(path: Path, stream: list[dict[str, float]], rename: dict[str, str] | None = None) -> Path:
    names = rename or {}
    lines = [json.dumps({"step": i + 1, **{names.get(k, k): v for k, v in s.items()}}) for i, s in enumerate(stream)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_healthy_log_is_let_through(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", healthy_stream(120, 0, "rising"))
    replay = replay_live(path, "default")
    assert replay.replayed == 120 and replay.judged
    assert replay.count("rollback") == replay.count("halt") == 0 and replay.exit_code == 0
    result = runner.invoke(app, ["doctor", "--live", "default", str(path)])
    assert result.exit_code == 0, result.output
    # the terminal wraps the line where the temporary path's length puts it: compare with whitespace collapsed
    assert "120 of 120 records replayed through the live guard of preset default" in " ".join(result.stdout.split())


def test_decisions_are_the_guards_own_on_the_same_stats(tmp_path: Path) -> None:
    """The replay's decisions are exactly those of a Guard observing the stats the doctor reads (one reading)."""
    stream = failing_stream("entropy_collapse", 200, 100, 0)
    path = _write(tmp_path / "run.jsonl", stream)
    replay = replay_live(path, "default")
    guard, expected = Guard(GuardConfig.preset("default")), []
    previous: dict[str, object] = {}
    for step, stats in diagnose(path).log.rows:
        decision = guard.observe(step, {k: float(v) for k, v in stats.items()})
        controls = non_neutral(decision.controls)
        if decision.outcome != "step" or controls != previous:
            expected.append((step, decision.outcome, controls))
        previous = controls
        if decision.outcome == "halt":
            break
    assert [(d.step, d.outcome, d.controls) for d in replay.decisions] == expected
    assert replay.count("rollback") >= 1 and replay.exit_code == 1


def test_json_lists_the_decisions(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", failing_stream("kl_ref_blowup", 200, 100, 0))
    result = runner.invoke(app, ["doctor", "--live", "default", "--json", str(path)])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["decisions"] and all(set(d) >= {"step", "outcome", "controls", "reason"} for d in doc["decisions"])
    assert {d["outcome"] for d in doc["decisions"]} <= {"step", "skip", "rollback", "halt"}
    assert any(d["outcome"] in ("rollback", "halt") and d["step"] >= 100 for d in doc["decisions"])
    assert all(d["reason"] for d in doc["decisions"])
    neutral = vars(Controls())
    assert all(neutral[k] != v for d in doc["decisions"] for k, v in d["controls"].items())


def test_a_halt_ends_the_replay(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", failing_stream("kl_ref_blowup", 300, 100, 0))
    replay = replay_live(path, "default")  # default: three rollbacks, then a halt (Rollback.max_rollbacks)
    assert replay.count("rollback") == 3 and replay.count("halt") == 1
    assert replay.decisions[-1].outcome == "halt" and replay.decisions[-1].step == replay.replayed < 300


def test_own_names_are_read_as_the_doctor_reads_them(tmp_path: Path) -> None:
    rename = {"reward_mean": "reward_avg", "entropy": "entropy_avg"}
    path = _write(tmp_path / "run.jsonl", failing_stream("entropy_collapse", 200, 100, 0), rename)
    replay = replay_live(path, "stable")
    assert replay.read.keys.auto_mapped == {"entropy_avg": "entropy", "reward_avg": "reward_mean"}
    refused = replay_live(path, "stable", {"entropy_avg": ""})
    assert "entropy_avg" not in refused.read.keys.mapped


@pytest.mark.parametrize("preset", ["nonsense", ""])
def test_an_unknown_preset_is_bad_input(tmp_path: Path, preset: str) -> None:
    path = _write(tmp_path / "run.jsonl", healthy_stream(30, 0, "plateau"))
    result = runner.invoke(app, ["doctor", "--live", preset, str(path)])
    assert result.exit_code == 2 and "unknown guard preset" in result.stderr, result.output


def test_a_log_inside_the_warmups_cannot_be_judged(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", healthy_stream(8, 0, "plateau"))
    replay = replay_live(path, "default")
    assert not replay.judged and replay.exit_code == 3


def test_a_log_already_read_is_replayed_as_the_file(tmp_path: Path) -> None:
    """``replay_live(log=...)``: the rows given (here every 2nd record of a file, as a sparser cadence logs them)
    are replayed as the same rows written to a file are."""
    from dataclasses import replace

    from rlguard.doctor.readers import read_log

    stream = failing_stream("kl_ref_blowup", 120, 60, seed=0)
    whole = _write(tmp_path / "whole.jsonl", stream)
    sparse = tmp_path / "sparse.jsonl"
    sparse.write_text("".join(json.dumps({"step": i + 1, **s}) + "\n" for i, s in enumerate(stream) if i % 2 == 0))
    log = read_log(whole)
    given = replay_live(whole, "default", log=replace(log, rows=[(s, dict(raw)) for s, raw in log.rows][::2]))
    written = replay_live(sparse, "default")
    assert given.replayed == written.replayed and any(d.outcome != "step" for d in given.decisions)
    assert [(d.step, d.outcome, d.reason) for d in given.decisions] == [
        (d.step, d.outcome, d.reason) for d in written.decisions
    ]
    # and not the file at ``path``: the whole log is decided otherwise
    assert [d.step for d in replay_live(whole, "default").decisions] != [d.step for d in given.decisions]
