"""``rlguard watch RUN_DIR``: the doctor's diagnosis of a running job, kept live in the terminal.

Polls the run's log (:func:`rlguard.doctor.find_log`: TRL's ``trainer_state.json`` or that of its latest
``checkpoint-*``, verl's file-logger JSONL, a flat JSONL, a wandb CSV, TensorBoard files) and the live guard's
``events.jsonl``; whenever one of them changed it reads what changed and judges the log with the doctor's own
functions (:func:`rlguard.doctor.diagnose`), so the findings are exactly what ``rlguard doctor`` would say of the
log so far (the consequence rule judges a finding by what followed it). A JSONL log is read by what was appended
(:class:`rlguard.doctor.stream.JsonlFollower`: offsets kept, truncation and rotation read again from the start, and
said), each appended record parsed and merged once (:class:`rlguard.doctor.steps.RunMerger`) and its step fed once
to the doctor's own judgement (:class:`rlguard.doctor.fold.DoctorFold`, whose verdict equals ``rlguard
doctor``'s on the log so far), on a schedule (:data:`REJUDGE_GROWTH`, :data:`REJUDGE_EVERY`); other logs are read
whole at each change. What a judgement does again over the whole log (the fold's docstring): the mapping of keys,
and the reward's peak where a reward finding is critical; the table is a snapshot that shares the follower's arrays
(:meth:`rlguard.doctor.columns.Columns.copy`), the steps with a stat are those of the last judgement and the rows
appended since, the consequence rule's hindsight reads the steps added since the last judgement and the findings
(:mod:`rlguard.guards.consequence.index`), and the live view reads each stat's last values, not its series.

The watch ends when the job does, as far as its files tell: TRL wrote its end-of-training summary or its last
checkpoint (``global_step`` reached ``max_steps``), the live guard
halted the run (an ``action:halt`` event), the process ``--pid`` exited, or nothing changed for ``--idle`` seconds;
or on Ctrl-C. It returns the doctor's exit code for the log at that moment: 0 no critical finding, 1 a critical
finding, 2 no readable log (a log that could not be read at the end is never judged from the last good read), 3 too
little to judge.

A run folder with the guard's ``events.jsonl`` and no training log yet (a TRL run before its first checkpoint, a
job whose logger writes elsewhere) is followed by its events, as ``rlguard doctor`` reports them
(:mod:`rlguard.doctor.events_only`): shown and sent (``on_events``) as they are recorded, a halt ends the watch, and
the log is judged once it appears; without a log at the end the exit code is 1 with a critical event, else 2.

TRL writes ``trainer_state.json`` only when it saves a checkpoint (``save_steps``); verl's file logger and
``events.jsonl`` are written at every step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.live import Live

from rlguard.doctor import (
    EXIT_BAD_INPUT,
    EXIT_CANNOT_JUDGE,
    EXIT_CRITICAL,
    EXIT_OK,
    Diagnosis,
    LogInputError,
    diagnose,
    find_log,
)
from rlguard.doctor.events_only import EventsOnly, events_only
from rlguard.doctor.fold import DoctorFold
from rlguard.doctor.job import job_ended
from rlguard.doctor.readers import detect_format, events_file
from rlguard.doctor.steps import StepRule
from rlguard.doctor.stream import JsonlFollower
from rlguard.terminal import (
    diagnosis_renderables,
    events_table,
    findings_table,
    latest_stats_table,
    safe_text,
    summary_line,
)

__all__ = ["WatchResult", "files_signature", "job_ended", "watch"]

#: the live guard's events shown in the live view (the doctor's final view shows them all)
LIVE_EVENTS_SHOWN = 8


@dataclass
class WatchResult:
    """What a watch saw.

    Attributes:
        exit_code: the doctor's exit code for the log when the watch ended (2: no readable log).
        ended: why the watch ended (the job's end, as its files tell, or ``interrupted``).
        diagnosis: the last diagnosis, or None if no log could be read.
        error: the last reading error, if the last read failed.
        refreshes: the number of steps judged at each refresh, in order (how the log grew under the watch).
        bytes_read: bytes of a JSONL log read in all (each appended byte once, but after a truncation or a
            rotation); None for logs read whole.
        restarts: each time a JSONL log was read again from the start (truncated, or rotated), and why.
        events_only: the guard's events of a run folder that held no training log at the last read, or None.
    """

    exit_code: int
    ended: str
    diagnosis: Diagnosis | None
    error: str | None = None
    refreshes: list[int] = field(default_factory=list)
    bytes_read: int | None = None
    restarts: list[str] = field(default_factory=list)
    events_only: EventsOnly | None = None


def files_signature(run_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """``(path, size, mtime_ns)`` of the run's log file(s) and ``events.jsonl``: a change means a refresh."""
    paths: list[Path] = []
    try:
        log = find_log(run_dir) if run_dir.is_dir() else run_dir
        paths += sorted(log.rglob("events.out.tfevents.*")) if log.is_dir() else [log]
        events = events_file(run_dir, log)  # as the doctor finds it: up from a checkpoint or TensorBoard folder
        paths += [events] if events is not None else []
    except LogInputError:  # no log yet: the events beside it still count
        folder = run_dir if run_dir.is_dir() else run_dir.parent
        paths += [p for p in (folder / "events.jsonl",) if p.is_file()]
    out = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue  # replaced between listing and stat (a checkpoint being written)
        out.append((str(p), st.st_size, st.st_mtime_ns))
    return tuple(out)


#: a growing JSONL log is judged again when it grew by this share of its steps, or when the time since the last
#: judgement is this many times what that judgement took: judging costs at most about 1/REJUDGE_EVERY of the
#: watch's time and, amortised, a constant time per appended record
REJUDGE_GROWTH, REJUDGE_EVERY = 0.1, 20.0


class _Reader:
    """The run's log as the watch reads it: a JSONL log (verl's file logger, a flat metrics JSONL) by what was
    appended (:class:`~rlguard.doctor.stream.JsonlFollower`), judged again on the schedule above; other logs
    (TRL's ``trainer_state.json``, rewritten whole at each checkpoint; TensorBoard; a CSV) read whole."""

    def __init__(self, run_dir: Path, key_map: Mapping[str, str], steps: StepRule, run: str | None) -> None:
        self.run_dir = run_dir
        self.key_map = key_map
        self.steps, self.run = steps, run
        self.follower: JsonlFollower | None = None
        #: the guard's events while the run folder holds no training log (module docstring), else None
        self.events_only: EventsOnly | None = None
        #: the doctor's judgement of the followed log, fed the steps appended since the last judgement
        self.fold: DoctorFold | None = None
        self._judged_steps = 0
        self._judged_at = 0.0
        self._cost = 0.0

    @property
    def bytes_read(self) -> int | None:
        """Bytes of a JSONL log read in all (None for another log)."""
        return None if self.follower is None else self.follower.bytes_read

    def read(self, *, final: bool = False) -> tuple[Diagnosis | None, str | None]:
        """A new diagnosis (None when not due, or on an error) and the reading error, if any."""
        self.events_only = None
        try:
            return self._read(final), None
        except (LogInputError, ValueError) as err:  # a log not there yet, or caught mid-write
            self.events_only = events_only(self.run_dir)
            return None, str(err)
        except OSError as err:  # made unreadable, or removed between the listing and the read
            return None, f"{err.filename or self.run_dir}: cannot be read ({err.strerror or err})"

    def _read(self, final: bool) -> Diagnosis | None:
        log_path = find_log(self.run_dir) if self.run_dir.is_dir() else self.run_dir
        if log_path.suffix != ".jsonl" or not log_path.is_file() or detect_format(log_path) not in ("verl", "jsonl"):
            self.follower, self.fold = None, None
            return diagnose(
                self.run_dir,
                key_map=self.key_map,
                step_key=self.steps.key,
                row_steps=self.steps.row_steps,
                run=self.run,
            )
        if self.follower is None or self.follower.path != log_path:
            self.follower, self.fold = JsonlFollower(log_path, self.steps, self.run), None
            self._judged_steps = 0
        restarts = len(self.follower.restarts)
        self.follower.poll()
        if self.fold is None or len(self.follower.restarts) != restarts:  # a new log, or read again from its start
            self.fold = DoctorFold(self.run_dir, key_map=self.key_map)
        steps = self.follower.steps
        grown = steps - self._judged_steps >= max(1.0, REJUDGE_GROWTH * self._judged_steps)
        waited = time.monotonic() - self._judged_at >= REJUDGE_EVERY * self._cost
        if not (final or self._judged_steps == 0 or (steps != self._judged_steps and (grown or waited))):
            return None
        start = time.monotonic()
        d = self.fold.judge(self.follower.log(), final=False)  # its last step may still be merged with a record
        self._judged_at, self._judged_steps = time.monotonic(), steps
        self._cost = self._judged_at - start
        return d


def live_view(
    run_dir: Path, d: Diagnosis | None, error: str | None, status: str, found: EventsOnly | None = None
) -> RenderableType:
    """The live display: the state of the watch, the latest stats, the findings and the last live events (or,
    before the run has a log, the events it recorded: ``found``)."""
    parts: list[RenderableType] = [f"[bold]rlguard watch[/bold] {safe_text(run_dir)}: {safe_text(status)}"]
    if error is not None:
        parts.append(f"[yellow]{safe_text(error)}[/yellow]" + ("" if d is None else " (showing the last good read)"))
    if d is None:
        if found is not None:
            shown = found.events[-LIVE_EVENTS_SHOWN:]
            parts += [
                safe_text(found.summary),
                events_table(shown, f"the live guard's last {len(shown)} of {len(found.events)} events"),
            ]
        return Group(*parts)
    parts += [summary_line(d), latest_stats_table(d)]
    findings = findings_table(d)
    parts.append(findings if findings is not None else "[green]no finding so far[/green]")
    if d.live_events:
        shown = d.live_events[-LIVE_EVENTS_SHOWN:]
        parts.append(events_table(shown, f"the live guard's last {len(shown)} of {len(d.live_events)} events"))
    return Group(*parts)


def watch(
    run_dir: str | Path,
    *,
    console: Console,
    once: bool = False,
    interval: float = 2.0,
    pid: int | None = None,
    idle: float | None = None,
    key_map: Mapping[str, str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    step_key: str | None = None,
    row_steps: bool = False,
    run: str | None = None,
    on_diagnosis: Callable[[Diagnosis], object] | None = None,
    on_events: Callable[[EventsOnly], object] | None = None,
) -> WatchResult:
    """Follow ``run_dir`` (module docstring) until the job ends or Ctrl-C; with ``once``, judge it once.

    ``interval``: seconds between polls; ``pid``: end when this process exits; ``idle``: end after this many
    seconds without a change to the run's files; ``key_map``, ``step_key``, ``row_steps``, ``run``: as
    :func:`~rlguard.doctor.diagnose`'s; ``on_diagnosis``: called with each new diagnosis, the last included
    (``--alerts``: :class:`rlguard.doctor.alerts.LogAlerts`); ``on_events``: called with the guard's events while
    the run folder has no training log (module docstring). The final diagnosis is printed as ``rlguard doctor``
    prints it.
    """
    _check_period("interval", interval, allow_inf=False)
    if idle is not None:
        _check_period("idle", idle, allow_inf=True)
    run_dir = Path(run_dir)
    reader = _Reader(run_dir, dict(key_map or {}), StepRule(step_key, row_steps), run)
    signature = files_signature(run_dir)  # before the read: a write during it shows as a change
    tell = on_diagnosis or (lambda d: None)

    def notify(d: Diagnosis | None) -> None:
        if d is not None:
            tell(d)
        elif reader.events_only is not None and on_events is not None:
            on_events(reader.events_only)

    d, error = reader.read(final=True)
    notify(d)
    result = WatchResult(EXIT_BAD_INPUT, "once", d, error, [len(d.steps)] if d is not None else [])
    result.events_only = reader.events_only
    if not once:
        if not console.is_terminal:  # no live display on a pipe or a file: say that the watch runs
            console.print(f"rlguard watch {safe_text(run_dir)}: following its files (Ctrl-C to stop)")
        result.ended = _follow(run_dir, result, signature, console, interval, pid, idle, reader, sleep, notify)
        d, result.error = reader.read(final=True)  # the files as the job left them
        result.events_only = reader.events_only
        notify(d)
        if d is not None:
            result.diagnosis = d
            if result.refreshes[-1:] != [len(d.steps)]:
                result.refreshes.append(len(d.steps))
    if reader.follower is not None:
        result.bytes_read, result.restarts = reader.follower.bytes_read, list(reader.follower.restarts)
    _finish(result, console)
    return result


def _check_period(name: str, seconds: float, *, allow_inf: bool) -> None:
    """A number of seconds must be positive, and finite unless ``allow_inf`` (NaN never is)."""
    if not (seconds > 0 and (allow_inf or math.isfinite(seconds))):
        accepted = "a positive number of seconds" + ("" if allow_inf else ", finite")
        raise ValueError(f"{name}: expected {accepted}; got {seconds!r}")


def _follow(
    run_dir: Path,
    result: WatchResult,
    signature: tuple[tuple[str, int, int], ...],
    console: Console,
    interval: float,
    pid: int | None,
    idle: float | None,
    reader: _Reader,
    sleep: Callable[[float], None],
    notify: Callable[[Diagnosis | None], object],
) -> str:
    """Poll until the job ends; keep ``result`` up to date; return why it ended."""
    changed_at = time.monotonic()
    polled = False  # idle counts only once a poll has seen the files unchanged (not a slow start)
    view = live_view(run_dir, result.diagnosis, result.error, "watching (Ctrl-C to stop)", reader.events_only)
    with Live(view, console=console, refresh_per_second=4, transient=True) as live:
        try:
            while True:
                ended = job_ended(result.diagnosis, pid)
                if result.diagnosis is None and _halted(reader.events_only):
                    ended = "the guard halted the run (no training log yet)"
                if ended is None and idle is not None and polled and time.monotonic() - changed_at >= idle:
                    ended = f"no change for {idle:g} s"
                if ended is not None:
                    return ended
                sleep(interval)
                now = files_signature(run_dir)
                if now == signature:
                    polled = True
                    continue
                polled = False
                # the live guard's events (a halt ends the watch) are judged at once, the log on its schedule
                events = _events_entries(now) != _events_entries(signature)
                signature, changed_at = now, time.monotonic()
                d, result.error = reader.read(final=events)
                notify(d)
                if d is not None:
                    result.diagnosis = d
                    result.refreshes.append(len(d.steps))
                status = f"watching (Ctrl-C to stop); updated {time.strftime('%H:%M:%S')}"
                if reader.follower is not None and reader.follower.restarts:
                    status += f"; {reader.follower.restarts[-1]}"
                live.update(live_view(run_dir, result.diagnosis, result.error, status, reader.events_only))
        except KeyboardInterrupt:
            return "interrupted"


def _halted(found: EventsOnly | None) -> bool:
    return found is not None and any(e.detector == "action:halt" for e in found.events)


def _events_entries(signature: tuple[tuple[str, int, int], ...]) -> set[tuple[str, int, int]]:
    return {entry for entry in signature if entry[0].endswith("events.jsonl")}


#: the watch's exit codes in words, said beside the code at its end (never to be read as the job's own)
_EXIT_MEANINGS = {
    EXIT_OK: "no critical finding",
    EXIT_CRITICAL: "a critical finding",
    EXIT_BAD_INPUT: "no readable log",
    EXIT_CANNOT_JUDGE: "could not judge",
}


def _finish(result: WatchResult, console: Console) -> None:
    """Print the final diagnosis (as the doctor does) and set the exit code from it."""
    d = result.diagnosis
    if result.error is not None and d is None:
        console.print(f"rlguard watch: {safe_text(result.error)}")
        result.exit_code = EXIT_BAD_INPUT
        if (found := result.events_only) is not None:  # no log, but the guard's events: as the doctor reports them
            console.print(f"rlguard watch: {safe_text(found.summary)}")
            console.print(events_table(found.events, "the live guard's events"))
            result.exit_code = found.exit_code
        if result.ended != "once":
            meaning = _EXIT_MEANINGS.get(result.exit_code, "")
            console.print(f"watch ended: {safe_text(result.ended)}; rlguard watch exits {result.exit_code} ({meaning})")
        return
    assert d is not None
    if result.error is not None:
        # the log as the job left it could not be read: what the last good read saw is no verdict on the rest
        console.print(
            f"[bold yellow]rlguard watch: the log could not be read at the end[/bold yellow]: {safe_text(result.error)}"
        )
        console.print(
            f"the last good read ({len(d.steps)} steps) is shown; the records after it were not judged "
            f"(exit code {EXIT_CRITICAL if d.critical else EXIT_BAD_INPUT})"
        )
    for renderable in diagnosis_renderables(d, final=result.error is None):
        console.print(renderable)
    result.exit_code = d.exit_code if result.error is None else EXIT_CRITICAL if d.critical else EXIT_BAD_INPUT
    for line in result.restarts:
        console.print(f"[yellow]rlguard watch[/yellow]: {safe_text(line)}")
    if result.ended != "once":
        meaning = _EXIT_MEANINGS.get(result.exit_code, "")
        console.print(f"watch ended: {safe_text(result.ended)}; rlguard watch exits {result.exit_code} ({meaning})")
