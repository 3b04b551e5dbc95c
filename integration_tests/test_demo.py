"""`rlguard demo --quick` end to end through the command line: real TRL runs, the summary, report.html and its PNGs,
the run folders that `rlguard doctor` reads; and the warm start that gives RL something to reinforce."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

pytest.importorskip("trl")

from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.guards import Event
from rlguard.tasks.hf import addition_accuracy, make_tiny_llama, warm_start

pytestmark = pytest.mark.slow
runner = CliRunner()


def test_quick_demo_writes_the_report_and_summarises_both_runs(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = runner.invoke(app, ["demo", "--quick", "--json", "--out", str(out), "--objectives", "grpo,gspo+guard"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)  # the progress display went to stderr
    runs = {r["run"]: r for r in summary["runs"]}
    assert list(runs) == ["grpo", "gspo+default"]
    for run in runs.values():
        assert run["steps"] == 6
        assert all(math.isfinite(run["reward_mean"][k]) for k in ("start", "end")), run
        assert 0 <= run["reward_mean"]["start"] <= 1 and 0 <= run["accuracy"]["after"] <= 1
        assert (Path(run["folder"]) / "trainer_state.json").is_file()
    assert runs["grpo"]["guard"] is None and runs["grpo"]["guard_events"] == []
    # the guarded run lists exactly the events its guard wrote to the run folder
    events_file = Path(runs["gspo+default"]["folder"]) / "events.jsonl"
    lines = events_file.read_text().splitlines() if events_file.is_file() else []
    written = [Event.from_dict(json.loads(line)) for line in lines]
    assert [Event.from_dict(e) for e in runs["gspo+default"]["guard_events"]] == written

    html = (out / "report.html").read_text(encoding="utf-8")
    images = re.findall(r'src="(demo_[a-z_]+\.png)"', html)
    assert sorted(images) == sorted(f"demo_{s}.png" for s in ("reward_mean", "entropy", "kl_ref", "clip_frac"))
    for name in images:
        assert (out / name).read_bytes().startswith(b"\x89PNG"), name
    assert "gspo+default" in html and "grpo" in html
    for event in written:
        assert event.detector in html  # the guard's events table
    for run in runs.values():  # each run's own `rlguard report` page, linked from the demo's
        page = Path(run["folder"]) / "report.html"
        assert page.is_file() and str(page.relative_to(out)) in html

    doctor = runner.invoke(app, ["doctor", runs["gspo+default"]["folder"], "--json"])
    assert doctor.exit_code in (0, 1, 3), doctor.output  # a readable log (3: 6 steps, too few to judge); not 2
    assert json.loads(doctor.stdout)["findings"] is not None


def test_warm_start_teaches_sums_that_a_random_model_does_not_know() -> None:
    model = make_tiny_llama(0)
    before = addition_accuracy(model)
    losses = warm_start(model, steps=60, seed=0)
    after = addition_accuracy(model)
    assert len(losses) == 60 and losses[-1] < 0.6 * losses[0]
    # 100 sums: a random model gets almost none, 60 steps of cross-entropy on the answers a tenth or more
    assert before <= 0.05 and after >= 0.1, (before, after)


def test_quick_stressed_pair_gets_the_same_lr_spike_with_and_without_the_guard(tmp_path: Path) -> None:
    """``OBJECTIVE@lr_spike``: the learning rate of one optimizer step (a third of the way in, step 2 of 6 here) is
    1000x the schedule's, the same in the unguarded and the guarded run; every other step keeps the schedule's."""
    out = tmp_path / "demo"
    runs_arg = "grpo@lr_spike,grpo+strict@lr_spike"
    result = runner.invoke(app, ["demo", "--quick", "--json", "--out", str(out), "--objectives", runs_arg])
    assert result.exit_code == 0, result.output
    runs = {r["run"]: r for r in json.loads(result.stdout)["runs"]}
    assert list(runs) == ["grpo@lr_spike", "grpo+strict@lr_spike"]
    assert (runs["grpo@lr_spike"]["guard"], runs["grpo+strict@lr_spike"]["guard"]) == (None, "strict")
    for run in runs.values():
        state = json.loads((Path(run["folder"]) / "trainer_state.json").read_text())
        lrs = {r["step"]: r["learning_rate"] for r in state["log_history"] if "learning_rate" in r}
        assert lrs == {s: 5e-4 * (1000.0 if s == 2 else 1.0) for s in range(1, 7)}, lrs
