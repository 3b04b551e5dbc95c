"""`rlguard report RUN_DIR`: a plot per canonical stat, the guard's events marked on the plots of their stats."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import write_report
from rlguard.guards import Guard, GuardConfig
from tests.helpers.doctor_logs import write_flat_jsonl, write_trainer_state
from tests.helpers.synthetic import failing_stream, healthy_stream

runner = CliRunner()
ONSET = 120
LOGGED = ("reward_mean", "entropy", "grad_norm", "kl_ref", "ratio_max")


def guarded_run(run_dir: Path, mode: str = "grad_spike") -> list[str]:
    """A run folder as a guarded TRL run leaves it: checkpoints' trainer_state.json and the guard's events.jsonl."""
    stream = failing_stream(mode, 200, ONSET, seed=0)
    guard = Guard(GuardConfig.preset("default", events_path=str(run_dir / "events.jsonl")))
    for step, stats in enumerate(stream, start=1):
        guard.observe(step, stats)
    logged = [{k: s[k] for k in LOGGED} for s in stream]  # fewer stats than the guard saw: fewer plots to draw
    write_trainer_state(logged[:100], run_dir / "checkpoint-100" / "trainer_state.json")
    write_trainer_state(logged, run_dir / "checkpoint-200" / "trainer_state.json")  # the latest, read
    write_trainer_state(logged[:20], run_dir / "checkpoint-best" / "trainer_state.json")  # not a step number
    return [e.detector for e in guard.events]


def test_report_plots_each_stat_and_marks_events_on_their_stats(tmp_path: Path) -> None:
    detectors = guarded_run(tmp_path)
    assert "grad_norm_spike" in detectors
    result = write_report(tmp_path)
    assert result.log_path == tmp_path / "checkpoint-200" / "trainer_state.json"
    assert result.html == tmp_path / "report.html"
    assert sorted(result.images) == sorted(LOGGED)
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in result.images.values())
    assert ONSET + 1 in result.marked["grad_norm"]  # the spike's event, on the gradient-norm plot
    assert ONSET + 1 not in result.marked["entropy"]  # and not on an unrelated stat's
    html = result.html.read_text(encoding="utf-8")
    assert set(re.findall(r'src="(report_[a-z_]+\.png)"', html)) == {p.name for p in result.images.values()}
    assert "grad_norm_spike" in html and "action:" in html  # the default guard acted: skip_step


def test_report_cli_writes_into_out(tmp_path: Path) -> None:
    run = tmp_path / "run"
    guarded_run(run, "entropy_collapse")
    out = tmp_path / "plots"
    result = runner.invoke(app, ["report", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "report.html").is_file() and (out / "report_entropy.png").is_file()
    assert not (run / "report.html").exists()
    assert "entropy_collapse" in (out / "report.html").read_text(encoding="utf-8")


def test_report_without_events_reads_a_metrics_jsonl(tmp_path: Path) -> None:
    stream = [{k: s[k] for k in ("reward_mean", "entropy", "lr")} for s in healthy_stream(30, 0)]
    write_flat_jsonl(stream, tmp_path / "metrics.jsonl")
    (tmp_path / "events.jsonl").unlink(missing_ok=True)
    result = write_report(tmp_path)
    assert result.events == [] and result.log_path.name == "metrics.jsonl"
    assert "No events.jsonl" in result.html.read_text(encoding="utf-8")
    assert sorted(result.marked) == ["entropy", "lr", "reward_mean"]
    assert all(not steps for steps in result.marked.values())


def test_report_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for path, words in ((tmp_path / "missing", "no such run folder"), (empty, "no training log in folder")):
        result = runner.invoke(app, ["report", str(path)])
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and words in result.stderr
    noise = tmp_path / "noise"
    noise.mkdir()
    (noise / "m.jsonl").write_text(json.dumps({"step": 1, "fps": 3}) + "\n")
    result = runner.invoke(app, ["report", str(noise)])
    assert result.exit_code == 2 and "no usable metric" in result.stderr


def test_report_reads_a_log_from_stdin_into_out(tmp_path: Path) -> None:
    """``cat metrics.jsonl | rlguard report - --out DIR``: the log read once and whole, as the doctor reads ``-``."""
    stream = [{k: s[k] for k in ("reward_mean", "entropy")} for s in healthy_stream(30, 0)]
    log = write_flat_jsonl(stream, tmp_path / "metrics.jsonl")
    out = tmp_path / "plots"
    result = runner.invoke(app, ["report", "-", "--out", str(out)], input=log.read_bytes())
    assert result.exit_code == 0, result.output
    assert "2 plots from <stdin>" in result.stdout
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "log <code>&lt;stdin&gt;</code>" in html and (out / "report_entropy.png").is_file()


def test_report_from_stdin_without_out_names_the_argument_and_the_fix(tmp_path: Path) -> None:
    """A stream has no run folder to write into: refused (exit 2) before stdin is read, naming ``-`` and
    ``--out``; before, "no such run folder or log file: -"."""
    result = runner.invoke(app, ["report", "-"], input=b'{"step": 1, "reward": 0.5}\n')
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1
    assert "-: a log read from standard input has no run folder" in result.stderr
    assert "--out" in result.stderr and "rlguard report - --out report/" in result.stderr
