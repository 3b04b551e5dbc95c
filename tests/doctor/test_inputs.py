"""Bad and partial input: the doctor never gives a clean bill for a log it only half read, every error exits 2
with the file, the record and the fix (no traceback), events are validated when read and written, and nothing
read from a file reaches HTML unescaped."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import diagnose, read_log
from rlguard.doctor.html import doctor_html
from rlguard.guards import Event, Guard, GuardConfig
from rlguard.guards.events import EventsFileError, parse_events, read_events
from tests.helpers.doctor_logs import write_log, write_trainer_state
from tests.helpers.synthetic import failing_stream, healthy_stream

runner = CliRunner()


def _exit_2(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    return line


# -- errors: exit 2, naming the file, the record and the fix -------------------------------------------------------
def test_log_history_null_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text('{"log_history": null}', encoding="utf-8")
    line = _exit_2(["doctor", str(path)])
    assert str(path) in line and "log_history is null" in line


@pytest.mark.parametrize("step", ["Infinity", "NaN", "1.5", '"abc"', "-3"])
def test_a_step_that_is_not_a_whole_number_is_bad_input_naming_the_line(tmp_path: Path, step: str) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": i, "data": {"critic/score/mean": 0.5}}) for i in range(3)]
    lines.append('{"step": ' + step + ', "data": {"critic/score/mean": 0.5}}')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = _exit_2(["doctor", str(path)])
    assert "line 4" in line and "not a whole number" in line


def test_fractional_steps_are_refused_not_merged(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"step": i / 2, "reward": 0.5}) + "\n" for i in range(6)), encoding="utf-8")
    assert "line 2" in _exit_2(["doctor", str(path)])


def test_deeply_nested_json_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n", encoding="utf-8")
    assert "nested too deeply" in _exit_2(["doctor", str(path)])
    state = tmp_path / "run" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text('{"log_history": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    assert "nested too deeply" in _exit_2(["doctor", str(state)])


def test_nested_objects_are_read_as_outer_inner_keys(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": i, "train": {"reward": s["reward_mean"], "kl": s["kl_ref"]}}
        for i, s in enumerate(healthy_stream(30, 0))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert {"train/reward", "train/kl"} <= read_log(path).keys


def test_a_truncated_trainer_state_names_line_and_column(tmp_path: Path) -> None:
    path = write_trainer_state(healthy_stream(30, 0), tmp_path / "trainer_state.json")
    path.write_text(path.read_text()[:-200], encoding="utf-8")
    line = _exit_2(["doctor", str(path)])
    assert "not valid JSON" in line and "column" in line and "truncated" in line


def test_non_utf8_bytes_are_bad_input_in_doctor_and_report(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.jsonl").write_bytes(b'{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.5, "note": "\xff\xfe"}\n')
    for command in (["doctor", str(run)], ["report", str(run)]):
        line = _exit_2(command)
        assert "line 2" in line and "not UTF-8" in line
    (run / "history.jsonl").write_text("".join(json.dumps({"step": i, "reward": 0.5}) + "\n" for i in range(30)))
    (run / "events.jsonl").write_bytes(b'{"step": 1, "detector": "x\xff"}\n')
    for command in (["doctor", str(run)], ["report", str(run)]):
        assert "not UTF-8" in _exit_2(command)


def test_a_multi_run_wandb_export_is_refused_naming_the_runs(tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    rows = ["Step,runA - train/reward,runA - train/grad_norm,runB - train/reward,runB - train/grad_norm"]
    rows += [f"{i},0.5,1.0,0.4,{1.0 if i != 20 else 1e6}" for i in range(40)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    line = _exit_2(["doctor", str(path)])
    assert "2 runs (runA, runB)" in line and "export one run" in line


def test_a_tensorboard_folder_of_two_runs_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    write_log("tensorboard", healthy_stream(20, 0), tmp_path / "runs" / "a")
    write_log("tensorboard", healthy_stream(20, 1), tmp_path / "runs" / "b")
    assert "2 TensorBoard runs" in _exit_2(["doctor", str(tmp_path / "runs")])


# -- partial reads: never a clean bill ---------------------------------------------------------------------------
def _tb_file(folder: Path) -> Path:
    (file,) = folder.rglob("events.out.tfevents.*")
    return file


def test_a_tensorboard_file_damaged_in_the_middle_is_a_partial_read(tmp_path: Path) -> None:
    """NaN losses after the damage: the intact file is critical; the damaged one is read up to the damage, says
    how many bytes of how many were read, and exits 3 (could not judge the whole log), never 0."""
    pytest.importorskip("tensorboard")
    stream = healthy_stream(120, 0, "plateau")
    for s in stream[80:]:
        s["loss"] = math.nan
    folder = write_log("tensorboard", stream, tmp_path / "tb")
    assert diagnose(folder).exit_code == 1
    file = _tb_file(folder)
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = b"\x00" * 8
    file.write_bytes(bytes(data))
    d = diagnose(folder)
    assert d.read.partial and d.exit_code == 3 and not d.critical
    assert d.read.bytes_total == len(data) and d.read.bytes_read is not None and d.read.bytes_read < middle + 1
    assert "not read" in d.read.damage[0] and "re-copy" in d.read.damage[0]
    result = runner.invoke(app, ["doctor", str(folder)])
    assert result.exit_code == 3 and "partial read" in result.stdout and "damaged" in result.stdout
    assert json.loads(runner.invoke(app, ["doctor", str(folder), "--json"]).stdout)["read"]["partial"] is True


def test_a_tensorboard_file_cut_short_at_its_end_is_a_partial_read(tmp_path: Path) -> None:
    """A last record cut short is lost, so the log is not read whole: damage, exit 3."""
    pytest.importorskip("tensorboard")
    folder = write_log("tensorboard", healthy_stream(60, 0, "plateau"), tmp_path / "tb")
    file = _tb_file(folder)
    file.write_bytes(file.read_bytes()[:-7])
    d = diagnose(folder)
    assert d.read.partial and "cut short" in d.read.damage[0]
    assert d.exit_code == 3


def test_nan_strings_and_numeric_nan_in_any_judged_stat_are_nonfinite(tmp_path: Path) -> None:
    for stat, value in (
        ("reward", "NaN"),
        ("kl", float("nan")),
        ("entropy", float("inf")),
        ("completions/mean_length", "nan"),
    ):
        stream = healthy_stream(40, 0, "plateau")
        path = write_trainer_state(stream, tmp_path / stat.replace("/", "_") / "trainer_state.json")
        data = json.loads(path.read_text())
        data["log_history"][25][stat] = value
        path.write_text(json.dumps(data), encoding="utf-8")
        d = diagnose(path)
        (nf,) = [f for f in d.findings if f.detector == "nonfinite"]
        assert nf.severity == "critical" and nf.step == 26, (stat, nf)
        assert d.exit_code == 1


def test_what_was_not_read_is_said(tmp_path: Path) -> None:
    """All-null rows, text values and a repeated step are counted in the read report, not dropped silently."""
    path = tmp_path / "history.jsonl"
    rows = [{"step": i, "reward": 0.5, "grad_norm": 1.0, "run": "abc"} for i in range(1, 31)]
    rows[10] = {"step": 11, "reward": None, "grad_norm": None}
    rows.append({"step": 30, "reward": 0.6, "grad_norm": 1.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 32, "rew', encoding="utf-8")
    report = read_log(path).report
    assert report.records == 32 and report.rows == 30
    assert report.dropped["records with no numeric value (all null, text or step counters only)"] == 1
    assert report.dropped["torn last line"] == 1 and "torn last line" in report.damage[0] and report.partial
    assert report.non_numeric["run"] == 29 and report.nulls == 2 and report.overwritten == 1
    doc = json.loads(runner.invoke(app, ["doctor", str(path), "--json"]).stdout)
    assert doc["read"]["records"] == 32 and doc["read"]["non_numeric"] == {"run": 29}
    out = runner.invoke(app, ["doctor", str(path)]).stdout
    assert "read 30 training rows from 32 records" in out and "not numbers" in out


# -- events.jsonl: validated when read and when written -----------------------------------------------------------
def _event(**changes: object) -> dict[str, object]:
    return {**Event(3, "grad_norm_spike", "critical", 9.0, "spike", 5.0).to_dict(), **changes}


def test_events_severity_is_read_case_insensitively_and_unknown_fields_are_kept() -> None:
    read = parse_events([json.dumps(_event(severity="CRITICAL", run_id="r1")) + "\n"])
    (e,) = read.events
    assert e.severity == "critical" and e.extra == {"run_id": "r1"}
    assert e.to_dict()["run_id"] == "r1" and Event.from_dict(e.to_dict()) == e


def test_a_torn_last_line_of_events_jsonl_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(_event()) + "\n" + '{"step": 4, "detec', encoding="utf-8")
    read = read_events(path)
    assert len(read.events) == 1 and "torn last line" in read.warnings[0] and "line 2" in read.warnings[0]
    path.write_text('{"step": 4, "detec\n' + json.dumps(_event()) + "\n", encoding="utf-8")
    with pytest.raises(EventsFileError, match="line 1: not JSON"):
        read_events(path)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"severity": "<script>alert(1)</script>"}, "severity"),
        ({"severity": "info"}, "severity"),
        ({"step": "3"}, "step"),
        ({"step": 2.5}, "step"),
        ({"value": "big"}, "value"),
        ({"detector": 7}, "detector"),
        ({"threshold": [1]}, "threshold"),
    ],
)
def test_a_malformed_event_is_refused_naming_the_field(changes: dict[str, object], match: str) -> None:
    with pytest.raises(EventsFileError, match=f"line 1: not a guard event .*{match}"):
        parse_events([json.dumps(_event(**changes))])  # the last line, but JSON: not a torn write


def test_a_malformed_event_cannot_be_built_or_written() -> None:
    with pytest.raises(ValueError, match="severity"):
        Event(1, "x", "CRITICAL", 1.0, "m")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step"):
        Event("1", "x", "warn", 1.0, "m")  # type: ignore[arg-type]
    assert Event(1, "x", "warn", 2, "m").value == 2.0  # an int value is a number


def test_a_bad_events_jsonl_in_a_run_folder_is_exit_2_naming_the_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_trainer_state(healthy_stream(40, 0), run / "trainer_state.json")
    (run / "events.jsonl").write_text(json.dumps(_event(severity="bad")) + "\n" + json.dumps(_event()) + "\n")
    for command in (["doctor", str(run)], ["report", str(run)]):
        line = _exit_2(command)
        assert "events.jsonl, line 1" in line and "severity" in line


def test_the_guard_writes_events_that_read_back(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    guard = Guard(GuardConfig.preset("default", events_path=str(path)))
    for step, s in enumerate(failing_stream("kl_ref_blowup", 80, 40, 0)):
        guard.observe(step, s)
    assert read_events(path).events == guard.events and guard.events


# -- HTML: every field of every event and every log value escaped ----------------------------------------------
SCRIPT = "<script>alert(1)</script>"


def test_no_field_read_from_a_file_reaches_html_unescaped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stream = failing_stream("kl_ref_blowup", 80, 40, 0)
    path = write_trainer_state(stream, run / "trainer_state.json")
    data = json.loads(path.read_text())
    for record in data["log_history"]:
        record[f"train/{SCRIPT}"] = 1.0  # a key
        record["note"] = SCRIPT  # a text value
    path.write_text(json.dumps(data), encoding="utf-8")
    event = _event(detector=f"grad_norm_spike{SCRIPT}", message=SCRIPT, **{SCRIPT: SCRIPT})
    (run / "events.jsonl").write_text(json.dumps(event) + "\n", encoding="utf-8")
    html = tmp_path / "doctor.html"
    assert runner.invoke(app, ["doctor", str(run), "--html", str(html)]).exit_code == 1
    report_out = tmp_path / "report"
    assert runner.invoke(app, ["report", str(run), "--out", str(report_out)]).exit_code == 0
    for page in (html.read_text(), (report_out / "report.html").read_text(), doctor_html(diagnose(run))):
        assert "<script" not in page.lower() and "&lt;script&gt;" in page
