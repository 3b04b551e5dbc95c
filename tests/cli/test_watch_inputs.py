"""`rlguard watch` on inputs that go bad while it watches: a log deleted or made unreadable, an ``--interval``
that is not a positive finite number."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.watch import watch
from tests.helpers.synthetic import healthy_stream


def _capture() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=200, color_system=None), buffer


def _healthy_log(path: Path, steps: int = 80) -> None:
    path.write_text(
        "".join(json.dumps({"step": s, **stats}) + "\n" for s, stats in enumerate(healthy_stream(steps, 0), 1))
    )


def _append_failure(path: Path, first: int) -> None:
    """Rows the watch must not miss: a NaN loss, then a grad norm of 1e9."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": first, "grad_norm": 1.0, "loss": "NaN"}) + "\n")
        fh.write(json.dumps({"step": first + 1, "grad_norm": 1e9, "loss": 0.1}) + "\n")


def _then(action: Callable[[], None]) -> Callable[[float], None]:
    """A ``sleep`` for the watch that does ``action`` once, at its first poll."""
    done: list[bool] = []

    def sleep(_: float) -> None:
        if not done:
            done.append(True)
            action()

    return sleep


def test_a_log_deleted_while_watched_is_a_read_error_not_a_clean_bill(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    _healthy_log(log)
    console, buffer = _capture()

    def grow_then_delete() -> None:
        _append_failure(log, 81)
        log.unlink()

    result = watch(tmp_path, console=console, interval=0.01, idle=0.05, sleep=_then(grow_then_delete))
    out = buffer.getvalue()
    assert result.exit_code == 2, out
    assert result.error is not None and "no training log" in result.error
    assert "no finding" not in out
    assert "could not be read" in out and "exit code 2" in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_log_made_unreadable_while_watched_exits_2(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    _healthy_log(log)
    console, buffer = _capture()

    def grow_then_lock() -> None:
        _append_failure(log, 81)
        log.chmod(0)

    try:
        result = watch(log, console=console, interval=0.01, idle=0.05, sleep=_then(grow_then_lock))
    finally:
        log.chmod(0o644)
    assert result.exit_code == 2 and "no finding" not in buffer.getvalue()


def test_a_read_error_at_the_end_exits_2_even_as_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is there but cannot be read (EACCES, as ``chmod 000`` gives a user that is not root)."""
    log = tmp_path / "metrics.jsonl"
    _healthy_log(log)
    console, buffer = _capture()
    real_open = Path.open

    def refuse(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == log:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    def grow_then_lock() -> None:
        _append_failure(log, 81)
        monkeypatch.setattr(Path, "open", refuse)

    result = watch(log, console=console, interval=0.01, idle=0.05, sleep=_then(grow_then_lock))
    out = buffer.getvalue()
    assert result.exit_code == 2, out
    assert "Permission denied" in out and "no finding" not in out


def test_a_log_that_stays_readable_still_ends_with_the_doctor_s_code(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    _healthy_log(log)
    console, _ = _capture()
    result = watch(log, console=console, interval=0.01, idle=0.05, sleep=_then(lambda: _append_failure(log, 81)))
    assert result.error is None and result.exit_code == 1  # the NaN loss and the 1e9 grad norm were read


@pytest.mark.parametrize("interval", ["inf", "nan", "0", "-1", "-inf"])
def test_interval_must_be_a_positive_finite_number(tmp_path: Path, interval: str) -> None:
    _healthy_log(tmp_path / "metrics.jsonl")
    result = CliRunner().invoke(app, ["watch", "--interval", interval, str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "interval" in result.output


@pytest.mark.parametrize("interval", [float("inf"), float("nan"), 0.0, -1.0])
def test_watch_refuses_a_bad_interval_from_python(tmp_path: Path, interval: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        watch(tmp_path, console=_capture()[0], interval=interval)


@pytest.mark.parametrize("idle", [float("nan"), -1.0])
def test_watch_refuses_a_bad_idle(tmp_path: Path, idle: float) -> None:
    with pytest.raises(ValueError, match="idle"):
        watch(tmp_path, console=_capture()[0], idle=idle)


@pytest.mark.parametrize("pid", ["0", "-1", str(2**31), "999999999999999999999"])
def test_watch_refuses_a_pid_that_names_no_process(tmp_path: Path, pid: str) -> None:
    """0 and -1 name a process group and every process (always "alive"); 2**31 and more overflow os.kill."""
    _healthy_log(tmp_path / "metrics.jsonl")
    result = CliRunner().invoke(app, ["watch", "--once", "--pid", pid, str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--pid" in result.output and "Traceback" not in result.output
