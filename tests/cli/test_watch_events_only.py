"""`rlguard watch` on a run folder with the guard's ``events.jsonl`` and no training log yet: it follows the events
(shown and sent as they are recorded), a halt ends it with exit code 1, and the log is judged once it appears."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor.events_only import EventsOnly
from rlguard.watch import watch
from tests.helpers.logs_extra import jsonl_text, rows

SPIKE = {"step": 3, "detector": "grad_norm_spike", "severity": "warn", "value": 9.0, "message": "spike"}
HALT = {"step": 5, "detector": "action:halt", "severity": "critical", "value": 1.0, "message": "halted"}


def _capture() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=200, color_system=None), buffer


def _record(folder: Path, *events: dict[str, object]) -> None:
    with (folder / "events.jsonl").open("a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in events)


def _polls(*actions: Callable[[], None]) -> Callable[[float], None]:
    """A ``sleep`` for the watch that does one action at each poll, in order."""
    queue = list(actions)

    def sleep(_: float) -> None:
        if queue:
            queue.pop(0)()

    return sleep


def test_a_halt_recorded_before_any_log_ends_the_watch_with_exit_1_and_is_sent(tmp_path: Path) -> None:
    _record(tmp_path, SPIKE)
    seen: list[EventsOnly] = []
    console, buffer = _capture()
    result = watch(
        tmp_path,
        console=console,
        interval=0.01,
        idle=5.0,
        sleep=_polls(lambda: _record(tmp_path, HALT)),
        on_events=seen.append,
    )
    assert result.ended.startswith("the guard halted the run"), buffer.getvalue()
    assert result.exit_code == 1 and result.diagnosis is None
    assert [[e.detector for e in found.events] for found in seen] == [
        ["grad_norm_spike"],
        ["grad_norm_spike", "action:halt"],
        ["grad_norm_spike", "action:halt"],  # the final read, as the job left its files
    ]
    assert "action:halt" in buffer.getvalue() and "exits 1" in buffer.getvalue()


def test_the_log_that_appears_later_is_judged(tmp_path: Path) -> None:
    _record(tmp_path, SPIKE)
    console, buffer = _capture()

    def write_log() -> None:
        (tmp_path / "metrics.jsonl").write_text(jsonl_text(rows(60, nan_at=50)))

    result = watch(tmp_path, console=console, interval=0.01, idle=0.05, sleep=_polls(write_log))
    assert result.diagnosis is not None and result.exit_code == 1, buffer.getvalue()
    assert any(f.detector == "nonfinite" for f in result.diagnosis.findings)


def test_watch_once_on_events_without_a_log_exits_as_the_doctor(tmp_path: Path) -> None:
    _record(tmp_path, SPIKE)
    runner = CliRunner()
    warn_only = runner.invoke(app, ["watch", "--once", str(tmp_path)])
    assert warn_only.exit_code == 2 == runner.invoke(app, ["doctor", str(tmp_path)]).exit_code
    assert "grad_norm_spike" in warn_only.stdout and "none critical" in warn_only.stdout
    _record(tmp_path, HALT)
    halted = runner.invoke(app, ["watch", "--once", str(tmp_path)])
    assert halted.exit_code == 1 == runner.invoke(app, ["doctor", str(tmp_path)]).exit_code, halted.output
