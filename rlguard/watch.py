"""``rlguard watch RUN_DIR``: the doctor's diagnosis of a running job, kept live in the terminal.

Polls the run's log (:func:`rlguard.doctor.find_log`: TRL's ``trainer_state.json`` or that of its latest
``checkpoint-*``, verl's file-logger JSONL, a flat JSONL, a wandb CSV, TensorBoard files) and the live guard's
``events.jsonl``; whenever one of them changed it re-reads and re-judges the whole log with
:func:`rlguard.doctor.diagnose`, so the findings are exactly what ``rlguard doctor`` would say of the log so far
(the consequence rule needs the whole history). A refresh costs one read and one replay of the log: time linear in
its steps, memory that of one diagnosis.

The watch ends when the job does, as far as its files tell: TRL wrote its end-of-training summary or its last
checkpoint (``global_step`` reached ``max_steps``), the live guard
halted the run (an ``action:halt`` event), the process ``--pid`` exited, or nothing changed for ``--idle`` seconds;
or on Ctrl-C. It returns the doctor's exit code for the log at that moment: 0 no critical finding, 1 a critical
finding, 2 no readable log, 3 too little to judge. A log deleted or turned unreadable by then is never judged by
the last good read: the read error is printed and the exit code is 2 (1 if that last good read was critical).

TRL writes ``trainer_state.json`` only when it saves a checkpoint (``save_steps``); verl's file logger and
``events.jsonl`` are written at every step.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape

from rlguard.doctor import EXIT_BAD_INPUT, EXIT_CRITICAL, Diagnosis, LogInputError, diagnose, find_log
from rlguard.doctor.readers import events_file
from rlguard.terminal import diagnosis_renderables, events_table, findings_table, latest_stats_table, summary_line

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
    """

    exit_code: int
    ended: str
    diagnosis: Diagnosis | None
    error: str | None = None
    refreshes: list[int] = field(default_factory=list)


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


def job_ended(d: Diagnosis | None, pid: int | None) -> str | None:
    """Why the job is over, from what its files and ``pid`` say, or None while it runs."""
    if d is not None:
        if any(e.detector == "action:halt" for e in d.live_events):
            return "the guard halted the run"
        if d.log.format == "trl":
            finished = _trl_finished(d.log.path)
            if finished is not None:
                return finished
    if pid is not None and not _alive(pid):
        return f"process {pid} exited"
    return None


def _trl_finished(path: Path) -> str | None:
    """How TRL's ``trainer_state.json`` says training ended: the summary ``Trainer.train`` logs at its end, or the
    checkpoint transformers saves at the last step (``global_step`` reached ``max_steps``); None while it runs."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        history = state.get("log_history") or []
        step, last = int(state.get("global_step") or 0), int(state.get("max_steps") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if history and isinstance(history[-1], dict) and "train_runtime" in history[-1]:
        return "TRL wrote its end-of-training summary"
    if 0 < last <= step:
        return f"TRL saved its last checkpoint (step {step} of {last})"
    return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and, where ``/proc`` tells, has not exited unreaped (a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _read(run_dir: Path, options: Mapping[str, Any]) -> tuple[Diagnosis | None, str | None]:
    try:
        return diagnose(run_dir, **options), None
    except (LogInputError, ValueError) as err:  # a log not there yet, or caught mid-write
        return None, str(err)


def live_view(run_dir: Path, d: Diagnosis | None, error: str | None, status: str) -> RenderableType:
    """The live display: the state of the watch, the latest stats, the findings and the last live events."""
    parts: list[RenderableType] = [f"[bold]rlguard watch[/bold] {escape(str(run_dir))}: {escape(status)}"]
    if error is not None:
        parts.append(f"[yellow]{escape(error)}[/yellow]" + ("" if d is None else " (showing the last good read)"))
    if d is None:
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
) -> WatchResult:
    """Follow ``run_dir`` (module docstring) until the job ends or Ctrl-C; with ``once``, judge it once.

    ``interval``: seconds between polls; ``pid``: end when this process exits; ``idle``: end after this many
    seconds without a change to the run's files; ``key_map``, ``step_key``, ``row_steps``, ``run``: as
    :func:`~rlguard.doctor.diagnose`'s. The final diagnosis is printed as ``rlguard doctor`` prints it.
    """
    run_dir = Path(run_dir)
    options: dict[str, Any] = {"key_map": dict(key_map or {}), "step_key": step_key, "row_steps": row_steps, "run": run}
    signature = files_signature(run_dir)  # before the read: a write during it shows as a change
    d, error = _read(run_dir, options)
    result = WatchResult(EXIT_BAD_INPUT, "once", d, error, [len(d.steps)] if d is not None else [])
    if not once:
        if not console.is_terminal:  # no live display on a pipe or a file: say that the watch runs
            console.print(f"rlguard watch {escape(str(run_dir))}: following its files (Ctrl-C to stop)")
        result.ended = _follow(run_dir, result, signature, console, interval, pid, idle, options, sleep)
        d, result.error = _read(run_dir, options)  # the files as the job left them
        if d is not None:
            result.diagnosis = d
    _finish(result, console)
    return result


def _follow(
    run_dir: Path,
    result: WatchResult,
    signature: tuple[tuple[str, int, int], ...],
    console: Console,
    interval: float,
    pid: int | None,
    idle: float | None,
    options: Mapping[str, Any],
    sleep: Callable[[float], None],
) -> str:
    """Poll until the job ends; keep ``result`` up to date; return why it ended."""
    changed_at = time.monotonic()
    view = live_view(run_dir, result.diagnosis, result.error, "watching (Ctrl-C to stop)")
    with Live(view, console=console, refresh_per_second=4, transient=True) as live:
        try:
            while True:
                ended = job_ended(result.diagnosis, pid)
                if ended is None and idle is not None and time.monotonic() - changed_at >= idle:
                    ended = f"no change for {idle:g} s"
                if ended is not None:
                    return ended
                sleep(interval)
                now = files_signature(run_dir)
                if now == signature:
                    continue
                signature, changed_at = now, time.monotonic()
                d, result.error = _read(run_dir, options)
                if d is not None:
                    result.diagnosis = d
                    result.refreshes.append(len(d.steps))
                status = f"watching (Ctrl-C to stop); updated {time.strftime('%H:%M:%S')}"
                live.update(live_view(run_dir, result.diagnosis, result.error, status))
        except KeyboardInterrupt:
            return "interrupted"


def _finish(result: WatchResult, console: Console) -> None:
    """Print the final diagnosis (as the doctor does) and set the exit code from it."""
    d = result.diagnosis
    if result.error is not None and d is None:
        console.print(f"rlguard watch: {escape(result.error)}")
        result.exit_code = EXIT_BAD_INPUT
        return
    assert d is not None
    for renderable in diagnosis_renderables(d):
        console.print(renderable)
    result.exit_code = d.exit_code
    if result.error is not None:  # the log as the job left it could not be read: the last good read is not it
        console.print(
            f"[yellow]rlguard watch: {escape(result.error)}[/yellow] (the findings above are the last good read)"
        )
        result.exit_code = EXIT_CRITICAL if d.critical else EXIT_BAD_INPUT
    if result.ended != "once":
        console.print(f"watch ended: {escape(result.ended)} (exit code {result.exit_code})")
