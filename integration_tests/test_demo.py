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
    assert doctor.exit_code in (0, 1), doctor.output  # a readable log; not bad input
    assert json.loads(doctor.stdout)["findings"] is not None


def test_warm_start_teaches_sums_that_a_random_model_does_not_know() -> None:
    model = make_tiny_llama(0)
    before = addition_accuracy(model)
    losses = warm_start(model, steps=60, seed=0)
    after = addition_accuracy(model)
    assert len(losses) == 60 and losses[-1] < 0.6 * losses[0]
    # 100 sums: a random model gets almost none, 60 steps of cross-entropy on the answers a tenth or more
    assert before <= 0.05 and after >= 0.1, (before, after)
