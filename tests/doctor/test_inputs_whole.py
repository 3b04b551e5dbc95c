"""Partial input is never judged as if whole (issue 37): a pipe, a FIFO or stdin is read whole, a device file is
refused, a byte-order mark is read, a log without a step column is refused (``--step-key``, ``--row-steps``), two
runs in one file are refused (``--run``), a truncated TensorBoard record or a ragged CSV row is reported, a run's
``events.jsonl`` is found from its subfolders, ``--map`` is checked against the log, and exit codes hold (4: an
internal error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import diagnose, read_log
from tests.helpers.logs_extra import csv_text, jsonl_text, rows, write_events

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
#: a log of 200 steps, about 40 KB: a NaN loss (and a 1e6 gradient norm) at step 150, far beyond the first 8 KB
NAN_AT = 150


def _cli(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``rlguard ARGS`` in a fresh interpreter (a real pipe or FIFO needs a real process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "rlguard.cli", *args],
        input=None if stdin is None else stdin.decode(),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _bad_input(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    return line


@pytest.fixture
def nan_log(tmp_path: Path) -> Path:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(200, nan_at=NAN_AT)), encoding="utf-8")
    assert path.stat().st_size > 4 * 8192
    assert diagnose(path).exit_code == 1
    return path


# -- 1. pipes, stdin, FIFOs and device files ------------------------------------------------------------------
def test_a_process_substitution_is_read_whole(nan_log: Path) -> None:
    result = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m rlguard.cli doctor --json <(cat "{nan_log}")'],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
    )
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert out["steps"] == 200 and out["read"]["records"] == 200
    assert any(f["detector"] == "nonfinite" and f["step"] == NAN_AT for f in out["findings"])


def test_stdin_is_read_whole_as_dash(nan_log: Path) -> None:
    result = runner.invoke(app, ["doctor", "-", "--json"], input=nan_log.read_bytes())
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    assert out["steps"] == 200 and out["path"] == "<stdin>"
    csv_log = csv_text(rows(200, nan_at=NAN_AT)).encode()
    assert runner.invoke(app, ["doctor", "-"], input=csv_log).exit_code == 1  # the format from the same bytes


def test_a_fifo_is_read_as_a_pipe(nan_log: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with fifo.open("wb") as fh:
            fh.write(nan_log.read_bytes())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    result = _cli("doctor", str(fifo), timeout=60)
    writer.join(5)
    assert result.returncode == 1, result.stderr
    assert "nonfinite" in result.stdout


def test_watch_reads_a_fifo_or_stdin_once_instead_of_waiting_for_another_writer(nan_log: Path, tmp_path: Path) -> None:
    """Read once, a stream holds nothing more: a second read of a FIFO waits for a writer that never comes."""
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with fifo.open("wb") as fh:
            fh.write(nan_log.read_bytes())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    result = _cli("watch", str(fifo), "--interval", "0.05", "--idle", "0.5", timeout=60)
    writer.join(5)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "is a stream (a pipe or FIFO): read once and whole" in result.stdout and "nonfinite" in result.stdout
    piped = runner.invoke(app, ["watch", "-", "--idle", "0.5"], input=nan_log.read_bytes())
    assert piped.exit_code == 1, piped.output


def test_a_device_file_is_refused_naming_it() -> None:
    result = _cli("doctor", "/dev/zero", timeout=60)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "/dev/zero" in line and "device" in line


def test_an_endless_stream_stops_at_the_byte_limit(monkeypatch: pytest.MonkeyPatch, nan_log: Path) -> None:
    import rlguard.doctor.inputs as inputs

    monkeypatch.setattr(inputs, "STREAM_LIMIT_BYTES", 10_000)
    result = runner.invoke(app, ["doctor", "-"], input=nan_log.read_bytes())
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "<stdin>" in line and "10000 bytes" in line and "save it to a file" in line


# -- 2. a byte-order mark --------------------------------------------------------------------------------------
def test_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    records = rows(60, first=100)
    jsonl = tmp_path / "log.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + jsonl_text(records).encode())
    assert read_log(jsonl).rows[0][0] == 100
    table = tmp_path / "log.csv"
    table.write_bytes(b"\xef\xbb\xbf" + csv_text(records).encode())
    log = read_log(table)
    assert log.rows[0][0] == 100 and "\ufeffstep" not in log.keys


# -- 3. the step column ----------------------------------------------------------------------------------------
def test_no_step_column_is_refused_naming_the_columns_and_the_flags(tmp_path: Path) -> None:
    records = [{"iteration": r["step"] * 10, **{k: v for k, v in r.items() if k != "step"}} for r in rows(60)]
    path = tmp_path / "log.csv"
    path.write_text(csv_text(records), encoding="utf-8")
    line = _bad_input(["doctor", str(path)])
    assert "no step column" in line and "iteration" in line and "--step-key" in line and "--row-steps" in line
    assert read_log(path, step_key="iteration").rows[0][0] == 10
    assert "iteration" not in read_log(path, step_key="iteration").keys
    result = runner.invoke(app, ["doctor", str(path), "--row-steps"])
    assert result.exit_code in (0, 3), result.output
    assert "row numbers" in result.stdout
    assert read_log(path, row_steps=True).rows[0][0] == 1


def test_a_step_key_the_log_lacks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(30)), encoding="utf-8")
    line = _bad_input(["doctor", str(path), "--step-key", "iteration"])
    assert "--step-key iteration" in line and "line 1" in line


@pytest.mark.parametrize("key", ["step", "global_step", "_step", "training/global_step", "train/global_step", "Step"])
def test_the_step_synonyms_stay_accepted(tmp_path: Path, key: str) -> None:
    records = [{key: r["step"] + 99, **{k: v for k, v in r.items() if k != "step"}} for r in rows(40)]
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(records), encoding="utf-8")
    assert [s for s, _ in read_log(path).rows][:2] == [100, 101]


# -- 4. two runs in one file -----------------------------------------------------------------------------------
def test_two_runs_appended_to_one_jsonl_are_refused_and_each_can_be_judged(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(60, 0, nan_at=30)) + jsonl_text(rows(60, 1)), encoding="utf-8")
    line = _bad_input(["doctor", str(path)])
    assert "2 runs" in line and "line 61" in line and "--run 1" in line
    assert runner.invoke(app, ["doctor", str(path), "--run", "1"]).exit_code == 1  # the NaN at step 30
    assert runner.invoke(app, ["doctor", str(path), "--run", "2"]).exit_code in (0, 3)
    assert "no run 3" in _bad_input(["doctor", str(path), "--run", "3"])


def test_a_csv_with_a_run_column_is_refused_naming_the_runs(tmp_path: Path) -> None:
    a, b = rows(60, 0, nan_at=30), rows(60, 1)
    interleaved = [{"run": name, **r} for pair in zip(a, b, strict=True) for name, r in zip("ab", pair, strict=True)]
    path = tmp_path / "log.csv"
    text = csv_text(interleaved).replace("'a'", "a").replace("'b'", "b")
    path.write_text(text, encoding="utf-8")
    line = _bad_input(["doctor", str(path)])
    assert "2 runs" in line and "a, b" in line and "--run" in line
    assert runner.invoke(app, ["doctor", str(path), "--run", "a"]).exit_code == 1


# -- 5. truncated TensorBoard records, negative steps, ragged CSV rows -------------------------------------------
def _tb_rows(n: int) -> list[tuple[int, dict[str, float]]]:
    return [(int(r.pop("step")), r) for r in rows(n)]


def test_a_tensorboard_file_cut_short_cannot_be_judged_whole(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    file = write_events(tmp_path / "tb" / "events.out.tfevents.1.host", _tb_rows(80))
    file.write_bytes(file.read_bytes()[:-7])
    result = runner.invoke(app, ["doctor", str(tmp_path / "tb")])
    assert result.exit_code == 3, result.output
    assert "cut short" in result.stdout


def test_a_negative_tensorboard_step_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    records = _tb_rows(40)
    records[10] = (-5, records[10][1])
    write_events(tmp_path / "tb" / "events.out.tfevents.1.host", records)
    line = _bad_input(["doctor", str(tmp_path / "tb")])
    assert "-5" in line and "record 12" in line


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tensorboard", "trl"])
@pytest.mark.parametrize("step", [2**53 + 1, 10**30])
def test_a_step_beyond_2_53_is_bad_input_naming_the_record(tmp_path: Path, fmt: str, step: int) -> None:
    """A step no trainer counts (an int64 overflows at 10**30; beyond 2**53 a float step is no longer exact): exit 2
    naming the record, not an internal error."""
    records = rows(40)
    records[10]["step"] = step
    if fmt == "tensorboard":
        pytest.importorskip("tensorboard")
        if step > 2**63 - 1:
            pytest.skip("an event's step is an int64")
        path = tmp_path / "tb"
        write_events(path / "events.out.tfevents.1.host", [(int(r.pop("step")), r) for r in records[:11]])
    elif fmt == "trl":
        path = tmp_path / "trainer_state.json"
        path.write_text(json.dumps({"log_history": records}), encoding="utf-8")
    else:
        path = tmp_path / f"log.{fmt}"
        path.write_text(jsonl_text(records) if fmt == "jsonl" else csv_text(records), encoding="utf-8")
    line = _bad_input(["doctor", str(path)])
    assert "2**53" in line and ("record" in line or "line" in line or "log_history" in line), line


def test_ragged_csv_rows_are_reported(tmp_path: Path) -> None:
    lines = csv_text(rows(80)).splitlines()
    lines[20] += ",0.5"  # one cell more than the header: its values may have shifted
    path = tmp_path / "log.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["doctor", str(path)])
    assert result.exit_code == 3, result.output
    assert "more cells" in result.stdout and "line 21" in result.stdout


# -- 6. a run folder from its subfolders -------------------------------------------------------------------------
HALT = {"step": 20, "detector": "action:halt", "severity": "critical", "value": 1.0, "message": "halted"}


@pytest.mark.parametrize("given", ["out/runs", "out/runs/run1", "out/runs/run1/events.out.tfevents.1.host"])
def test_a_halted_tensorboard_run_is_found_from_its_subfolders(tmp_path: Path, given: str) -> None:
    pytest.importorskip("tensorboard")
    write_events(tmp_path / "out/runs/run1/events.out.tfevents.1.host", _tb_rows(80))
    (tmp_path / "out/events.jsonl").write_text(json.dumps(HALT) + "\n", encoding="utf-8")
    d = diagnose(tmp_path / given)
    assert d.live_events_path == tmp_path / "out/events.jsonl"
    assert d.exit_code == 1


def test_a_halted_trl_run_is_found_from_its_checkpoint_folder(tmp_path: Path) -> None:
    history = [{"step": r["step"], "reward": r["reward_mean"], "grad_norm": r["grad_norm"]} for r in rows(80)]
    state = tmp_path / "out/checkpoint-80/trainer_state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"log_history": history}), encoding="utf-8")
    (tmp_path / "out/events.jsonl").write_text(json.dumps(HALT) + "\n", encoding="utf-8")
    assert diagnose(state.parent).exit_code == 1


# -- 7. --map checked against the log; report on a file ----------------------------------------------------------
def test_a_map_of_a_key_the_log_lacks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(40)), encoding="utf-8")
    line = _bad_input(["doctor", str(path), "--map", "score=reward_mean"])
    assert "score" in line and "no key" in line


def test_a_map_onto_a_stat_the_log_has_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text({**r, "score": 0.1} for r in rows(40)), encoding="utf-8")
    line = _bad_input(["doctor", str(path), "--map", "score=reward_mean"])
    assert "score=reward_mean" in line and "already" in line and "reward_mean" in line


def test_report_on_a_log_file_works(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(40)), encoding="utf-8")
    result = runner.invoke(app, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.html").is_file()


# -- 8. exit codes ------------------------------------------------------------------------------------------------
def test_an_integer_of_over_4300_digits_is_bad_input_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(5)) + '{"step": 6, "loss": ' + "9" * 5000 + "}\n", encoding="utf-8")
    line = _bad_input(["doctor", str(path)])
    assert str(path) in line and "line 6" in line


def test_an_integer_of_over_4300_digits_in_a_trainer_state_names_its_line(tmp_path: Path) -> None:
    history = [{"step": r["step"], "loss": 1} for r in rows(5)]
    text = json.dumps({"log_history": history}, indent=2).replace('"loss": 1', '"loss": ' + "9" * 5000, 3)
    path = tmp_path / "trainer_state.json"
    path.write_text(text, encoding="utf-8")
    line = _bad_input(["doctor", str(path)])
    assert f"{path}, line {text[: text.index('9' * 5000)].count(chr(10)) + 1} column" in line, line


def test_a_401_digit_integer_in_events_jsonl_is_bad_input_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(40)), encoding="utf-8")
    event = {"step": 3, "detector": "grad_norm_spike", "severity": "warn", "value": 1, "message": "m"}
    text = json.dumps(event).replace('"value": 1', '"value": ' + "9" * 401)
    (tmp_path / "events.jsonl").write_text(json.dumps(event) + "\n" + text + "\n", encoding="utf-8")
    line = _bad_input(["doctor", str(path)])
    assert "events.jsonl" in line and "line 2" in line


def test_html_into_a_folder_or_an_unwritable_path_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(40)), encoding="utf-8")
    assert "cannot write" in _bad_input(["doctor", str(path), "--html", str(tmp_path)])
    assert "cannot write" in _bad_input(["doctor", str(path), "--html", str(path / "report.html")])


@pytest.mark.parametrize(
    ("command", "target"),
    [
        ("doctor", "rlguard.doctor.diagnose"),
        ("report", "rlguard.doctor.write_report"),
        ("watch", "rlguard.watch.watch"),
    ],
)
def test_an_internal_error_is_exit_4_in_one_line_and_a_traceback_only_with_debug(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str, target: str
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(
        sys.modules[module] if module in sys.modules else __import__(module, fromlist=[name]), name, broken
    )
    args = [command, str(tmp_path)] + (["--once"] if command == "watch" else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 4, (result.exit_code, result.output)
    (line,) = result.stderr.strip().splitlines()
    assert "internal error" in line and "boom" in line and "--debug" in line
    result = runner.invoke(app, [*args, "--debug"])
    assert result.exit_code == 4 and "Traceback" in result.stderr


def test_watch_follows_the_events_of_a_tensorboard_run_given_by_its_runs_folder(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from rlguard.watch import files_signature

    write_events(tmp_path / "out/runs/run1/events.out.tfevents.1.host", _tb_rows(40))
    (tmp_path / "out/events.jsonl").write_text(json.dumps(HALT) + "\n", encoding="utf-8")
    assert str(tmp_path / "out/events.jsonl") in {p for p, _, _ in files_signature(tmp_path / "out/runs")}
    result = runner.invoke(app, ["watch", str(tmp_path / "out/runs"), "--once"])
    assert result.exit_code == 1, result.output


def test_a_fifo_inside_a_run_folder_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "metrics.jsonl")
    result = _cli("doctor", str(tmp_path), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "not a regular file" in result.stderr and "metrics.jsonl" in result.stderr


def test_report_on_an_auto_mapped_log_plots_its_stats(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "log.csv"
    path.write_text(
        csv_text([{"step": r["step"], "reward_avg": r["reward_mean"], "entropy_avg": r["entropy"]} for r in rows(40)]),
        encoding="utf-8",
    )
    result = runner.invoke(app, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report_reward_mean.png").is_file() and (tmp_path / "report_entropy.png").is_file()


def test_watch_and_report_take_the_step_and_run_flags_their_errors_name(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(60, 0, nan_at=30)) + jsonl_text(rows(60, 1)), encoding="utf-8")
    assert runner.invoke(app, ["watch", str(path), "--once"]).exit_code == 2
    assert runner.invoke(app, ["watch", str(path), "--once", "--run", "1"]).exit_code == 1
    assert "--run 1" in _bad_input(["report", str(path)])
    assert runner.invoke(app, ["report", str(path), "--run", "2"]).exit_code == 0
    no_step = tmp_path / "no_step.jsonl"
    no_step.write_text(jsonl_text({k: v for k, v in r.items() if k != "step"} for r in rows(40)), encoding="utf-8")
    assert runner.invoke(app, ["watch", str(no_step), "--once", "--row-steps"]).exit_code in (0, 3)
    assert runner.invoke(app, ["report", str(no_step), "--row-steps"]).exit_code == 0


def test_a_binary_stream_is_refused_at_its_first_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlguard.doctor.inputs as inputs

    monkeypatch.setattr(inputs, "STREAM_LIMIT_BYTES", 1 << 40)  # not the limit: the first chunk decides
    line = _bad_input_with(["doctor", "-"], b"\0" * 3_000_000)
    assert "<stdin>" in line and "binary" in line


def _bad_input_with(args: list[str], stdin: bytes) -> str:
    result = runner.invoke(app, args, input=stdin)
    assert result.exit_code == 2, (result.exit_code, result.output)
    (line,) = result.stderr.strip().splitlines()
    return line
