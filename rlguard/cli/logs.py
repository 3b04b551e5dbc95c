"""The commands about logs: ``rlguard doctor``, ``watch`` and ``report`` (no torch, no training framework)."""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlguard.cli.app import app, bad_input, console
from rlguard.terminal import safe_text

if TYPE_CHECKING:
    from rlguard.doctor import Diagnosis
    from rlguard.doctor.alerts import LogAlerts

__all__ = ["EXIT_INTERNAL"]


#: exit status of an internal error (a bug, not the input): ``rlguard.doctor.EXIT_INTERNAL``, written out so that the
#: command line starts without importing the doctor (tests/doctor/test_exit_codes_doc.py checks they agree)
EXIT_INTERNAL = 4


@contextlib.contextmanager
def _internal_errors(command: str, debug: bool) -> Iterator[None]:
    """An exception that is not the input's (a bug): one line on stderr and exit code 4; the traceback with
    ``--debug``."""
    try:
        yield
    except (typer.Exit, typer.Abort, typer.TyperException, KeyboardInterrupt, ImportError):
        raise  # a missing extra's module: the console script names the extra (rlguard._extras)
    except Exception as err:
        if debug:
            traceback.print_exc(file=sys.stderr)
        else:
            typer.echo(
                f"rlguard {command}: internal error ({type(err).__name__}: {safe_text(err, markup=False)}); rerun "
                "with --debug for the traceback, and report it",
                err=True,
            )
        raise typer.Exit(EXIT_INTERNAL) from None


#: ``--debug`` of the commands that read a log
DebugOption = Annotated[bool, typer.Option("--debug", help="On an internal error (exit code 4), print the traceback.")]


#: ``--map KEY=CANONICAL`` of the commands that read a log
KeyMapOption = Annotated[
    list[str] | None,
    typer.Option(
        "--map",
        help="KEY=CANONICAL: read the log's column KEY as the canonical stat (repeatable), "
        "e.g. --map reward_avg=reward_mean --map entropy_avg=entropy.",
    ),
]


#: where the steps are and which run to judge, for the commands that read a log
StepKeyOption = Annotated[
    str | None, typer.Option("--step-key", help="Read this column as the step (e.g. --step-key iteration).")
]
RowStepsOption = Annotated[
    bool, typer.Option("--row-steps", help="Number the rows 1, 2, ... as steps (a log without a step column).")
]
RunOption = Annotated[
    str | None, typer.Option("--run", help="Judge this run of a file that holds several (the error names them).")
]


#: ``--alerts SPEC`` of the doctor and the watch (rlguard.doctor.alerts)
AlertsOption = Annotated[
    str | None,
    typer.Option(
        "--alerts",
        metavar="SPEC",
        help="Send the critical findings and the guard's events to a webhook, as the in-process guard's alerts do: "
        'a JSON object of AlertConfig\'s fields, e.g. \'{"webhook_env": "SLACK_WEBHOOK_URL", "format": "slack"}\' '
        "(the URL and any headers_env values read from those environment variables), or a .json file holding one.",
    ),
]


def _log_alerts(command: str, spec: str | None, source: Path) -> LogAlerts | None:
    """The alerts ``--alerts SPEC`` asks for, or None; a bad spec, or one that could send nothing, is bad input."""
    if spec is None:
        return None
    from rlguard.doctor.alerts import log_alerts, parse_alert_spec

    try:
        return log_alerts(parse_alert_spec(spec), str(source))
    except (ValueError, OSError) as err:
        raise bad_input(command, err) from None


@app.command()
def doctor(
    path: Annotated[
        Path,
        typer.Argument(
            help="A training log: trainer_state.json, a .jsonl, a wandb .csv, a TensorBoard folder, or a run folder "
            "holding one (and the guard's events.jsonl); - reads stdin (a pipe or a FIFO is read whole too)."
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write an HTML report with a plot per finding.")
    ] = None,
    no_auto_map: Annotated[
        bool,
        typer.Option(
            "--no-auto-map", help="Do not map keys automatically (a key matching exactly one canonical stat)."
        ),
    ] = False,
    key_map: KeyMapOption = None,
    live: Annotated[
        str | None,
        typer.Option(
            "--live",
            metavar="PRESET",
            help="Replay the log through the live guard of PRESET; print its decisions (exit 1: rollback or halt).",
        ),
    ] = None,
    step_key: StepKeyOption = None,
    row_steps: RowStepsOption = False,
    run: RunOption = None,
    alerts: AlertsOption = None,
    debug: DebugOption = False,
) -> None:
    """Diagnose a training log offline with the live guard's detectors, each finding judged by its consequence.

    Exit code 0: every record read and no critical finding in what could be checked; 1: a critical finding (or a
    critical event in the run's events.jsonl that the log confirms, or a halt the live guard recorded there); 2:
    bad input (missing file, a device file, unknown format, a bad record, no step column, two runs in one file, no
    usable metric, a malformed or unmatched --map, an unwritable --html), with the file, the line or record and the
    fix; 3: could not judge (no critical finding, and no detector but nonfinite had enough steps of its stats to get
    past its warm-up, or part of the log could not be read): map the log's own names with --map, log more steps, or
    re-copy a damaged file; 4: an internal error (--debug prints its traceback).
    """
    with _internal_errors("doctor", debug):
        if live is not None:
            raise typer.Exit(
                _doctor_live(
                    path, live, as_json, key_map or [], no_auto_map, step_key=step_key, row_steps=row_steps, run=run
                )
            )
        _doctor(path, as_json, html, not no_auto_map, key_map or [], step_key, row_steps, run, alerts)


def _doctor(
    path: Path,
    as_json: bool,
    html: Path | None,
    auto_map: bool,
    key_map: list[str],
    step_key: str | None,
    row_steps: bool,
    run: str | None,
    alerts_spec: str | None,
) -> None:
    from rlguard.doctor import LogInputError, diagnose
    from rlguard.doctor.keys import parse_key_map

    try:
        mapping = parse_key_map(key_map)
    except ValueError as err:  # a malformed --map
        raise bad_input("doctor", err) from None
    alerts = _log_alerts("doctor", alerts_spec, path)
    try:
        diagnosis = diagnose(path, key_map=mapping, auto_map=auto_map, step_key=step_key, row_steps=row_steps, run=run)
    except LogInputError as err:  # any other exception is ours: exit 4 (_internal_errors)
        _events_without_log(path, as_json, alerts)
        raise bad_input("doctor", err) from None
    if alerts is not None:
        alerts.observe(diagnosis)
        typer.echo(safe_text(alerts.close(), markup=False), err=True)
    if html is not None:
        from rlguard.doctor.html import doctor_html
        from rlguard.doctor.plots import plots_missing

        try:
            html.parent.mkdir(parents=True, exist_ok=True)
            html.write_text(doctor_html(diagnosis), encoding="utf-8")
        except OSError as err:
            why = f"--html {html}: cannot write the report there ({err.strerror or err})"
            raise bad_input("doctor", LogInputError(why)) from None
    if as_json:
        typer.echo(json.dumps(diagnosis.to_dict(), indent=2))
    else:
        _print_diagnosis(diagnosis)
        if html is not None:
            console.print(f"wrote {safe_text(html)}")
            if diagnosis.findings and (missing := plots_missing()) is not None:
                console.print(safe_text(missing))
    if diagnosis.exit_code:
        raise typer.Exit(diagnosis.exit_code)


def _events_without_log(path: Path, as_json: bool, alerts: LogAlerts | None) -> None:
    """A run folder with no training log whose ``events.jsonl`` holds events: those events (sent with
    ``--alerts``), and exit 1 when one is critical (rlguard.doctor.events_only); returns when there are none."""
    from rlguard.doctor.events_only import events_only
    from rlguard.terminal import events_table, safe_text

    found = events_only(path)
    if found is None:
        return
    if alerts is not None:
        alerts.observe_events(found)
        typer.echo(safe_text(alerts.close(), markup=False), err=True)
    if as_json:
        typer.echo(json.dumps(found.to_dict(), indent=2))
    else:
        style = "bold red" if found.critical else "bold yellow"
        console.print(f"[{style}]rlguard doctor[/{style}]: {safe_text(found.summary)}")
        console.print(safe_text(found.no_log))
        for line in found.warnings:
            console.print(f"[yellow]{safe_text(line)}[/yellow]")
        console.print(events_table(found.events, "the live guard's events"))
    raise typer.Exit(found.exit_code)


def _doctor_live(path: Path, preset: str, as_json: bool, key_map: list[str], no_auto_map: bool, **read: Any) -> int:
    """``rlguard doctor --live PRESET``: the live guard's decisions on the log; the replay's exit code."""
    from rlguard.doctor import LogInputError, parse_key_map
    from rlguard.doctor.replay import replay_live
    from rlguard.terminal import replay_renderables

    try:
        replay = replay_live(path, preset, parse_key_map(key_map), auto_map=not no_auto_map, **read)
    except (LogInputError, ValueError, OSError) as err:
        raise bad_input("doctor", err) from None
    if as_json:
        typer.echo(json.dumps(replay.to_dict(), indent=2, default=str))
    else:
        console.print(*replay_renderables(replay), sep="\n")
    return replay.exit_code


def _print_diagnosis(d: Diagnosis) -> None:
    """The doctor's summary line, unrecognised keys, findings, what it could not check, and live events."""
    from rlguard.terminal import diagnosis_renderables

    for renderable in diagnosis_renderables(d):
        console.print(renderable)


@app.command()
def watch(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A running job's output folder (TRL's output_dir, a folder with verl's file-logger JSONL or a flat "
            "metrics .jsonl, and the guard's events.jsonl) or a log file."
        ),
    ],
    once: Annotated[bool, typer.Option("--once", help="Judge the log once and exit (for scripts).")] = False,
    interval: Annotated[
        float, typer.Option(help="Seconds between looks at the run's files (finite, at least 0.05).", min=0.05)
    ] = 2.0,
    pid: Annotated[
        int | None,
        typer.Option(
            help="End the watch when this process (the training job) exits (a process id: 1 to 2**31 - 1).",
            min=1,
            max=2**31 - 1,  # pid_t: a larger number is no process (and os.kill overflows on it)
        ),
    ] = None,
    idle: Annotated[
        float | None, typer.Option(help="End the watch after this many seconds without a change to the files.")
    ] = None,
    key_map: KeyMapOption = None,
    step_key: StepKeyOption = None,
    row_steps: RowStepsOption = False,
    run: RunOption = None,
    alerts: AlertsOption = None,
    debug: DebugOption = False,
) -> None:
    """Follow a running job's log and the guard's events: the doctor's findings and the latest stats, live.

    Ends when the job does (TRL's end-of-training summary, a halt by the guard, --pid exited, --idle reached) or
    on Ctrl-C, with the doctor's exit code for the log at that moment: 0 no critical finding, 1 a critical finding,
    2 no readable log, 3 could not judge, 4 an internal error (--debug prints its traceback).
    """
    from rlguard.doctor.keys import parse_key_map

    try:
        mapping = parse_key_map(key_map or [])
    except ValueError as err:
        raise bad_input("watch", err) from None
    sender = _log_alerts("watch", alerts, run_dir)
    with _internal_errors("watch", debug):
        from rlguard import watch as watching
        from rlguard.doctor.inputs import is_stream

        if not once and is_stream(run_dir):  # a second read would wait for another writer, for ever
            console.print(f"rlguard watch: {safe_text(run_dir)} is a stream (a pipe or FIFO): read once and whole")
            once = True

        try:
            result = watching.watch(
                run_dir,
                console=console,
                once=once,
                interval=interval,
                pid=pid,
                idle=idle,
                key_map=mapping,
                step_key=step_key,
                row_steps=row_steps,
                run=run,
                on_diagnosis=None if sender is None else sender.observe,
                on_events=None if sender is None else sender.observe_events,
            )
        except ValueError as err:  # --interval inf or nan, --idle nan (typer's range lets them through)
            raise bad_input("watch", err) from None
        finally:
            if sender is not None:
                typer.echo(safe_text(sender.close(), markup=False), err=True)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


@app.command()
def report(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A run folder: trainer_state.json (or checkpoint-*/), a metrics "
            ".jsonl or TensorBoard files, and events.jsonl if the guard wrote one; or a log file; or - to read a "
            "log from stdin (with --out)."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Folder for report.html and its PNGs (default RUN_DIR, or the log file's folder; needed for -).",
        ),
    ] = None,
    step_key: StepKeyOption = None,
    row_steps: RowStepsOption = False,
    run: RunOption = None,
    debug: DebugOption = False,
) -> None:
    """Plot a run's canonical metrics with the guard's events marked, into report.html.

    Exit code 2: bad input (as the doctor's) or a folder that cannot be written; 4: an internal error (--debug prints
    its traceback)."""
    with _internal_errors("report", debug):
        import rlguard.doctor as doctor

        try:
            result = doctor.write_report(run_dir, out, step_key=step_key, row_steps=row_steps, run=run)
        except doctor.LogInputError as err:
            raise bad_input("report", err) from None
        except OSError as err:  # the report's folder: not writable, or the disk full
            why = f"{err.filename or out or run_dir}: cannot write the report there ({err.strerror or err})"
            raise bad_input("report", OSError(why)) from None
        console.print(
            f"wrote {safe_text(result.html)}: {len(result.images)} plots from {safe_text(result.log_path)}, "
            f"{len(result.events)} guard events"
        )
        if result.plots_missing is not None:
            console.print(safe_text(result.plots_missing))
