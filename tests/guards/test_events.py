"""``events.jsonl``'s lifecycle (``rlguard.guards.events.EventsLog``, ``Guard.open_events``): a run that starts
afresh moves an old file aside and shows its own events only; a resume continues the file and loses no event; each
event is one whole line, on disk once its step is recorded (a process killed with SIGKILL keeps them); a write
error is a warning and training goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.events import Event, EventsLog, read_events
from tests.helpers.synthetic import failing_stream


def run(guard: Guard, stream: list[dict[str, float]], start: int = 0) -> None:
    for step, stats in enumerate(stream, start=start):
        guard.observe(step, stats)


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_second_run_in_the_same_folder_writes_its_own_events_only(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first = Guard(GuardConfig(events_path=str(path)))
    run(first, failing_stream("grad_spike", 60, 40, seed=6))
    assert first.events and lines(path) == [e.to_dict() for e in first.events]

    second = Guard(GuardConfig(events_path=str(path)))
    run(second, failing_stream("grad_spike", 10, 100, seed=7)[:10])  # a healthy start: no event yet
    assert second.events == [] and path.read_text() == ""  # not the first run's critical events
    log = second.events_log
    assert log is not None and log.moved_to is not None and log.moved_to.name.startswith("events.jsonl.")
    assert lines(log.moved_to) == [e.to_dict() for e in first.events]  # kept beside it
    assert not log.moved_to.name.endswith(".jsonl")  # the doctor's *.jsonl metrics-log search skips it

    third = Guard(GuardConfig(events_path=str(path)))
    run(third, failing_stream("grad_spike", 60, 40, seed=6))
    assert lines(path) == [e.to_dict() for e in third.events]  # an empty file is not moved aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", log.moved_to.name]


def test_a_resume_continues_the_file_and_loses_no_event(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    stream = failing_stream("grad_spike", 80, 40, seed=6)
    whole = Guard(GuardConfig())
    run(whole, stream)

    first = Guard(GuardConfig(events_path=str(path)))
    run(first, stream[:50])
    saved = json.loads(json.dumps(first.state_dict()))  # the checkpoint at step 49
    run(first, stream[50:60], start=50)  # a stretch after the checkpoint, then the process dies
    resumed = Guard(GuardConfig(events_path=str(path)))
    resumed.load_state_dict(saved)
    run(resumed, stream[50:], start=50)
    assert lines(path) == [e.to_dict() for e in whole.events]  # every event once, as an uninterrupted run
    assert [e.to_dict() for e in resumed.events] == [e.to_dict() for e in whole.events]


def test_a_resume_moves_a_repeated_stretch_aside_whole(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    old = [Event(3, "nonfinite", "critical", 1.0, "a"), Event(7, "grad_norm_spike", "warn", 9.0, "b")]
    path.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in old))
    log = EventsLog(path, resume_step=5)  # resumed from step 5 without the guard's state: the file is the record
    assert read_events(path).events == old[:1]
    assert log.moved_to is not None and read_events(log.moved_to).events == old  # step 7, to be repeated, kept
    log.write([Event(6, "nonfinite", "critical", 2.0, "c")])
    assert [e.step for e in read_events(path).events] == [3, 6]

    same = tmp_path / "same.jsonl"
    same.write_text(json.dumps(old[0].to_dict()) + "\n")
    log = EventsLog(same, resume_step=5, history=old[:1])
    assert log.moved_to is None  # the file is the checkpoint's record: appended to as it is


def test_a_torn_last_line_is_dropped_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(Event(3, "nonfinite", "critical", 1.0, "a").to_dict()) + '\n{"step": 4, "det')
    EventsLog(path, resume_step=4).write([Event(5, "nonfinite", "warn", 1.0, "b")])
    read = read_events(path)
    assert [e.step for e in read.events] == [3, 5] and read.warnings == []


class FullDisk:
    """A file that refuses every write, as a full disk does."""

    def __init__(self, real: object) -> None:
        self.real = real

    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    def fileno(self) -> int:
        return self.real.fileno()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.real.close()  # type: ignore[attr-defined]


def test_a_write_error_is_a_warning_and_the_guard_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    guard = Guard(GuardConfig(events_path=str(path)))
    guard.open_events(path)
    log = guard.events_log
    assert log is not None
    log._fh = FullDisk(log._fh)  # type: ignore[assignment]
    stream = failing_stream("nonfinite", 50, 30, seed=0)
    with pytest.warns(RuntimeWarning, match=r"could not write 2 event\(s\) of step 30 to .*No space left on device"):
        run(guard, stream)
    assert [e.step for e in guard.events] == [30, 30]  # the events stay in the guard's state
    assert log.failed == 2 and path.read_text() == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full is Linux's")
def test_dev_full(tmp_path: Path) -> None:
    log = EventsLog(Path("/dev/full"), resume_step=0)
    with pytest.warns(RuntimeWarning, match=r"could not write 1 event\(s\) of step 1 to /dev/full"):
        log.write([Event(1, "nonfinite", "critical", 1.0, "x")])
    assert log.failed == 1


def test_events_of_a_step_are_on_disk_when_the_process_is_killed(tmp_path: Path) -> None:
    """SIGKILL right after a step's events: no buffer is lost (one unbuffered write per line, fsync per step)."""
    path = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import os, signal
        from rlguard.guards import Guard, GuardConfig
        from tests.helpers.synthetic import failing_stream
        guard = Guard(GuardConfig(events_path={str(path)!r}))
        for step, stats in enumerate(failing_stream("nonfinite", 50, 30, seed=0)):
            guard.observe(step, stats)
            if guard.events:
                os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == -9, proc.stderr
    read = read_events(path)
    assert [(e.step, e.detector) for e in read.events] == [(30, "nonfinite"), (30, "action:skip_step")]
    assert read.warnings == []


def test_ranks_other_than_the_first_write_no_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    guard = Guard(GuardConfig(events_path=str(path)))
    guard.open_events(None)
    run(guard, failing_stream("nonfinite", 40, 30, seed=0))
    assert guard.events and not path.exists()
