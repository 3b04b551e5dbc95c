"""The commands about training: ``rlguard losses``, ``detectors``, ``demo`` and ``bench``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from rlguard.cli.app import app, bad_input, console

__all__ = ["bench_app"]

#: the demo's default runs as its --help shows them: ``rlguard.demo.DEFAULT_RUNS`` (tests/cli/test_cli.py checks they
#: agree), written out so that the command line starts without importing the demo, torch or the objectives
_DEMO_RUNS = "grpo,gspo+guard,grpo@lr_spike,grpo+strict@lr_spike"


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
    from rlguard.core_losses.catalogue import SHARED_OPTIONS, objective_catalogue

    entries = objective_catalogue()  # torch-free for the built-ins
    if as_json:
        typer.echo(json.dumps([e.to_dict() for e in entries], indent=2))
        return
    caption = "shared options: " + ", ".join(sorted(set(SHARED_OPTIONS) - {"aggregation"}))
    table = Table(title="rlguard objectives", caption=caption)
    for col in ("name", "paper", "default aggregation", "own defaults", "what it does"):
        table.add_column(col)
    for e in entries:
        own_text = ", ".join(f"{k}={_format_default(v)}" for k, v in e.defaults.items())
        table.add_row(escape(e.name), escape(e.paper), escape(e.aggregation), escape(own_text), escape(e.summary))
    console.print(table)


@app.command()
def detectors(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """List the guard's detectors and interventions, their default thresholds and sources, and the presets.

    Shows which presets run each intervention (``stable`` adds the trust region, clip-higher on entropy collapse, the
    remedy of a train-inference gap and rollbacks that learn), and which remedy answers which cause."""
    from rlguard.guards.catalogue import catalogue

    data = catalogue()
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    presets = f"guard presets: {', '.join(data['presets'])} (monitor only observes)"
    tables: list[tuple[str, str | None, tuple[str, ...], list[tuple[str, ...]]]] = [
        ("rlguard detectors (default preset)", None, ("detector", "fires when", "source"), [
            (r["name"], r["summary"], r["source"]) for r in data["detectors"]
        ]),
        ("rlguard interventions", presets, ("intervention", "what it does", "presets"), [
            (r["name"], r["summary"], ", ".join(r["presets"]) or "opt-in") for r in data["interventions"]
        ]),
        ("remedies by cause", "each next remedy only when the one before did not help",
         ("cause", "diagnosed by", "remedies, in order", "intervention", "holds back meanwhile"), [
            (r["cause"], r["diagnosed_by"], r["remedies"], r["intervention"], ", ".join(r["yields"]))
            for r in data["remedies"]
        ]),
    ]  # fmt: skip
    for title, caption, columns, rows in tables:
        table = Table(*columns, title=title, caption=caption)
        for row in rows:
            table.add_row(*map(escape, row))
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
            "(+guard is +default; 'rlguard detectors' lists the presets), and @FAULT, a fault injected "
            "into that run (@lr_spike: the LR x1000 for one step, a third of the way in). 'rlguard losses' lists the "
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
        raise bad_input("demo", err) from None
    out_dir = out if out is not None else Path(time.strftime("rlguard-demo-%Y%m%d-%H%M%S"))
    from rlguard.demo.console import print_summary, run_with_progress

    command = "rlguard demo " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["demo"] else ""
    result = run_with_progress(config, out_dir, console=console, quiet=as_json, command=command)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    print_summary(result, console)


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
