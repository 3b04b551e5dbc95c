"""The ``rlguard`` command line (typer + rich)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from rlguard.doctor import Diagnosis

app = typer.Typer(
    name="rlguard",
    help="Exact GRPO-family objectives and stability guards for RL on LLMs.",
    no_args_is_help=True,
    add_completion=False,
)
# Piped output (CI logs, files) gets a fixed width instead of rich's 80-column default.
console = Console() if sys.stdout.isatty() else Console(width=150)


#: the demo's default runs as its --help shows them: ``rlguard.demo.DEFAULT_RUNS`` (tests/test_cli.py checks they
#: agree), written out so that the command line starts without importing the demo, torch or the objectives
_DEMO_RUNS = "grpo,gspo+guard,grpo@lr_spike,grpo+strict@lr_spike"


def _print_version(value: bool) -> None:
    if value:
        from rlguard import __version__

        console.print(f"rlguard {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print rlguard's version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    """Exact GRPO-family objectives and stability guards for RL on LLMs."""


def _format_default(value: object) -> str:
    return (
        "None"
        if value is None
        else repr(value)
        if isinstance(value, str)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


@app.command()
def losses(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the registered objectives, their defaults and their papers."""
    from rlguard.core_losses import list_objectives, objective_class
    from rlguard.core_losses.objective import Objective

    shared = set(Objective.hyperparameters())
    rows: list[dict[str, Any]] = []
    for name in list_objectives():
        cls = objective_class(name)
        params = cls.hyperparameters()
        own = {k: v for k, v in params.items() if k not in shared}
        rows.append(
            {
                "name": name,
                "paper": cls.paper,
                "aggregation": params["aggregation"],
                "defaults": own,
                "summary": cls.summary,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="rlguard objectives", caption="shared options: " + ", ".join(sorted(shared - {"aggregation"})))
    for col in ("name", "paper", "default aggregation", "own defaults", "what it does"):
        table.add_column(col)
    for r in rows:
        own_text = ", ".join(f"{k}={_format_default(v)}" for k, v in r["defaults"].items())
        table.add_row(r["name"], r["paper"], r["aggregation"], escape(own_text), escape(r["summary"]))
    console.print(table)


@app.command()
def detectors(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """List the guard's detectors and interventions with their default thresholds and sources, and which presets
    run each intervention (``stable`` adds the trust region, clip-higher on entropy collapse, the remedy of a
    train-inference gap and rollbacks that learn), and which remedy answers which cause."""
    from rlguard.guards import PRESETS, Guard, GuardConfig
    from rlguard.guards.interventions.causes import CAUSES
    from rlguard.guards.registry import detector_registry, intervention_registry

    dets, acts = detector_registry(), intervention_registry()
    running = {p: set(Guard(GuardConfig.preset(p)).interventions) for p in PRESETS}
    in_presets = {n: [p for p in PRESETS if n in running[p]] for n in acts}
    if as_json:
        data = {
            "detectors": [
                {"name": n, "summary": c.summary, "source": c.source, "defaults": c.defaults()} for n, c in dets.items()
            ],
            "interventions": [
                {"name": n, "summary": c.summary, "presets": in_presets[n], "defaults": c.defaults()}
                for n, c in acts.items()
            ],
            "presets": list(PRESETS),
            "remedies": [
                {"cause": c.diagnosis, "diagnosed_by": c.diagnosed_by, "remedies": c.remedies, "intervention": c.answer}
                for c in CAUSES
            ],
        }
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    table = Table(title="rlguard detectors (default preset)")
    for col in ("detector", "fires when", "source"):
        table.add_column(col)
    for n, det in dets.items():
        table.add_row(n, escape(det.summary), escape(det.source))
    console.print(table)
    table = Table(title="rlguard interventions", caption=f"guard presets: {', '.join(PRESETS)} (monitor only observes)")
    table.add_column("intervention")
    table.add_column("what it does")
    table.add_column("presets")
    for n, act in acts.items():
        table.add_row(n, escape(act.summary), ", ".join(in_presets[n]) or "opt-in")
    console.print(table)
    table = Table(title="remedies by cause", caption="each next remedy only when the one before did not help")
    for col in ("cause", "diagnosed by", "remedies, in order", "intervention"):
        table.add_column(col)
    for c in CAUSES:
        table.add_row(*map(escape, (c.diagnosis, c.diagnosed_by, c.remedies, c.answer)))
    console.print(table)


@app.command()
def demo(
    steps: Annotated[int | None, typer.Option(help="Optimizer steps per run (default 60; 6 with --quick).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the model, the warm start, the prompts and the sampling.")] = 0,
    objectives: Annotated[
        str | None,
        typer.Option(
            # the presets are not listed here: importing rlguard.guards for its PRESETS would double the CPU time of
            # importing the command line, so of `rlguard --version` (benchmarks/cli_startup.py); a wrong one gets
            # the list
            help="Runs, comma-separated: OBJECTIVE, then optionally +PRESET, the guard preset acting in that run "
            "(+guard is +default; `rlguard detectors` lists the presets), and @FAULT, a fault injected "
            "into that run (@lr_spike: the LR x1000 for one step, a third of the way in). `rlguard losses` lists the "
            "objectives.",
            show_default=_DEMO_RUNS,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for report.html and the runs (default: a new folder rlguard-demo-YYYYmmdd-HHMMSS)."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="A short demo for smoke tests: 6 steps per run, a shorter warm start, fewer prompts per step.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead of a table.")] = False,
) -> None:
    """Train a tiny model with TRL's GRPOTrainer on the embedded addition task, once per objective, and compare.

    A tiny random Llama (no download) is warm-started on correct sums for a few seconds, then trained with each
    run's objective (rlguard's GuardedGRPOTrainer, a real trl.GRPOTrainer) on CPU. Prints a summary per run and
    writes OUT/report.html with the runs' curves overlaid and the guard's events marked; each run's folder
    OUT/<run> works with `rlguard report` and `rlguard doctor`.
    """
    from rlguard.demo import DEFAULT_RUNS, DemoConfig, parse_runs

    try:
        runs = parse_runs(DEFAULT_RUNS if objectives is None else objectives)
        changes: dict[str, Any] = {"runs": runs, "seed": seed}
        if steps is not None:
            changes["steps"] = steps
        config = DemoConfig.quick(**changes) if quick else DemoConfig(**changes)
    except ValueError as err:
        raise _bad_input("demo", err) from None
    out_dir = out if out is not None else Path(time.strftime("rlguard-demo-%Y%m%d-%H%M%S"))
    from rlguard.demo.console import print_summary, run_with_progress

    command = "rlguard demo " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["demo"] else ""
    result = run_with_progress(config, out_dir, console=console, quiet=as_json, command=command)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    print_summary(result, console)


def _bad_input(command: str, err: Exception) -> typer.Exit:
    """One line on stderr, exit code 2."""
    typer.echo(f"rlguard {command}: {err}", err=True)
    return typer.Exit(2)


#: exit status of an internal error (a bug, not the input): ``rlguard.doctor.EXIT_INTERNAL``, written out so that the
#: command line starts without importing the doctor (tests/doctor/test_exit_codes_doc.py checks they agree)
EXIT_INTERNAL = 4


@contextlib.contextmanager
def _internal_errors(command: str, debug: bool) -> Iterator[None]:
    """An exception that is not the input's (a bug): one line on stderr and exit code 4; the traceback with
    ``--debug``."""
    try:
        yield
    except (typer.Exit, typer.Abort, click.exceptions.ClickException, KeyboardInterrupt):
        raise
    except Exception as err:
        if debug:
            traceback.print_exc(file=sys.stderr)
        else:
            typer.echo(
                f"rlguard {command}: internal error ({type(err).__name__}: {err}); rerun with --debug for the "
                "traceback, and report it",
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
    step_key: StepKeyOption = None,
    row_steps: RowStepsOption = False,
    run: RunOption = None,
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
        _doctor(path, as_json, html, not no_auto_map, key_map or [], step_key, row_steps, run)


def _doctor(
    path: Path,
    as_json: bool,
    html: Path | None,
    auto_map: bool,
    key_map: list[str],
    step_key: str | None,
    row_steps: bool,
    run: str | None,
) -> None:
    from rlguard.doctor import LogInputError, diagnose
    from rlguard.doctor.keys import parse_key_map

    try:
        mapping = parse_key_map(key_map)
    except ValueError as err:  # a malformed --map
        raise _bad_input("doctor", err) from None
    try:
        diagnosis = diagnose(path, key_map=mapping, auto_map=auto_map, step_key=step_key, row_steps=row_steps, run=run)
    except LogInputError as err:  # any other exception is ours: exit 4 (_internal_errors)
        raise _bad_input("doctor", err) from None
    if html is not None:
        from rlguard.doctor.html import doctor_html

        try:
            html.parent.mkdir(parents=True, exist_ok=True)
            html.write_text(doctor_html(diagnosis), encoding="utf-8")
        except OSError as err:
            why = f"--html {html}: cannot write the report there ({err.strerror or err})"
            raise _bad_input("doctor", LogInputError(why)) from None
    if as_json:
        typer.echo(json.dumps(diagnosis.to_dict(), indent=2))
    else:
        _print_diagnosis(diagnosis)
        if html is not None:
            console.print(f"wrote {escape(str(html))}")
    if diagnosis.exit_code:
        raise typer.Exit(diagnosis.exit_code)


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
    interval: Annotated[float, typer.Option(help="Seconds between looks at the run's files.", min=0.05)] = 2.0,
    pid: Annotated[int | None, typer.Option(help="End the watch when this process (the training job) exits.")] = None,
    idle: Annotated[
        float | None, typer.Option(help="End the watch after this many seconds without a change to the files.")
    ] = None,
    key_map: KeyMapOption = None,
    step_key: StepKeyOption = None,
    row_steps: RowStepsOption = False,
    run: RunOption = None,
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
        raise _bad_input("watch", err) from None
    with _internal_errors("watch", debug):
        from rlguard import watch as watching

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
        )
    if result.exit_code:
        raise typer.Exit(result.exit_code)


@app.command()
def report(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A run folder: trainer_state.json (or checkpoint-*/), a metrics "
            ".jsonl or TensorBoard files, and events.jsonl if the guard wrote one; or a log file."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for report.html and its PNGs (default RUN_DIR, or the log file's folder)."),
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
        except (doctor.LogInputError, OSError) as err:  # OSError: --out not writable
            raise _bad_input("report", err) from None
        console.print(
            f"wrote {escape(str(result.html))}: {len(result.images)} plots from {escape(str(result.log_path))}, "
            f"{len(result.events)} guard events"
        )


bench_app = typer.Typer(help="Reproducible benchmarks, each printing a table.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command(
    "collapse",
    # the benchmark's own parser reads the options (one definition, shared with benchmarks/collapse/run.py)
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def bench_collapse(ctx: typer.Context) -> None:
    """Collapse rate per objective, guard and stressor: --task short (default) or long (--help for the options).

    short: a tiny GRU on single-digit addition; long: 33-token completions, a dense or MoE transformer and a bf16
    rollout engine. Exit code 2 on bad input (an unknown objective, guard or stressor).
    """
    from rlguard.bench.collapse import main as collapse_main

    raise typer.Exit(collapse_main(ctx.args))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover - python -m rlguard.cli
    main()
