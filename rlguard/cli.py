"""The ``rlguard`` command line (typer + rich)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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

_DEMO_METRICS = ("clip_frac", "ratio_min", "ratio_max", "seq_ratio_max", "kl_old", "kl_ref", "mismatch_kl")


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
    """List the guard's detectors and interventions with their default thresholds and sources."""
    from rlguard.plugins import detector_registry, intervention_registry

    dets, acts = detector_registry(), intervention_registry()
    if as_json:
        data = {
            "detectors": [
                {"name": n, "summary": c.summary, "source": c.source, "defaults": c.defaults()} for n, c in dets.items()
            ],
            "interventions": [{"name": n, "summary": c.summary, "defaults": c.defaults()} for n, c in acts.items()],
        }
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    table = Table(title="rlguard detectors (default preset)")
    for col in ("detector", "fires when", "source"):
        table.add_column(col)
    for n, det in dets.items():
        table.add_row(n, escape(det.summary), escape(det.source))
    console.print(table)
    table = Table(title="rlguard interventions")
    table.add_column("intervention")
    table.add_column("what it does")
    for n, act in acts.items():
        table.add_row(n, escape(act.summary))
    console.print(table)


@app.command()
def demo(
    seed: Annotated[int, typer.Option(help="Seed of the tiny model and the sampled batch.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Every objective's loss and metrics on one off-policy batch of the embedded tiny addition task."""
    from rlguard.core_losses import get_objective, list_objectives
    from rlguard.tasks import demo_batch

    batch, rollouts = demo_batch(seed)
    results = {}
    for name in list_objectives():
        out = get_objective(name, beta=0.04)(batch)
        results[name] = {
            "loss": float(out.loss.detach()),
            **{k: float(v) for k, v in out.metrics.items() if k != "loss"},
        }
    if as_json:
        typer.echo(json.dumps(results, indent=2))
        return
    console.print(
        f"[bold]tiny addition task[/bold]: {len(rollouts.completions)} completions, "
        f"mean reward {float(rollouts.rewards.mean()):.3f}, e.g. {rollouts.completions[:4]}"
    )
    table = Table(title="one off-policy batch, beta=0.04 (k3)")
    table.add_column("objective")
    table.add_column("loss", justify="right")
    for k in _DEMO_METRICS:
        table.add_column(k, justify="right")
    for name, res in results.items():
        table.add_row(name, f"{res['loss']:+.5f}", *(f"{res[k]:.4g}" if k in res else "-" for k in _DEMO_METRICS))
    console.print(table)


_SEVERITY_STYLE = {"critical": "bold red", "warn": "yellow"}


def _bad_input(command: str, err: Exception) -> typer.Exit:
    """One line on stderr, exit code 2."""
    typer.echo(f"rlguard {command}: {err}", err=True)
    return typer.Exit(2)


@app.command()
def doctor(
    path: Annotated[
        Path,
        typer.Argument(
            help="A training log: trainer_state.json, a .jsonl, a wandb .csv, a "
            "TensorBoard folder, or a run folder holding one."
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write an HTML report with a plot per finding.")
    ] = None,
) -> None:
    """Diagnose a training log offline with the live guard's detectors.

    Exit code 0: no critical finding; 1: a critical finding; 2: bad input (missing file, unknown format, no usable
    metric).
    """
    from rlguard.doctor import LogInputError, diagnose

    try:
        diagnosis = diagnose(path)
    except LogInputError as err:
        raise _bad_input("doctor", err) from None
    if html is not None:
        from rlguard.doctor.html import doctor_html

        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(doctor_html(diagnosis), encoding="utf-8")
    if as_json:
        typer.echo(json.dumps(diagnosis.to_dict(), indent=2))
    else:
        _print_diagnosis(diagnosis)
        if html is not None:
            console.print(f"wrote {escape(str(html))}")
    if diagnosis.critical:
        raise typer.Exit(1)


def _print_diagnosis(d: Diagnosis) -> None:
    """The doctor's summary line, unrecognised keys and findings table."""
    console.print(
        f"[bold]{escape(str(d.log.path))}[/bold]: {d.log.format}, {len(d.steps)} steps ({d.steps[0]} to "
        f"{d.steps[-1]}); stats: {escape(', '.join(sorted(set(d.keys.mapped.values()))))}"
    )
    if d.keys.unrecognised:
        console.print(f"unrecognised keys: {escape(', '.join(d.keys.unrecognised))}")
    if not d.findings:
        console.print("[green]no finding[/green]: the detectors saw nothing wrong.")
        return
    table = Table(title=f"rlguard doctor: {len(d.findings)} finding(s), most severe first")
    for col in ("severity", "detector", "onset step", "evidence and suggested fix"):
        table.add_column(col)
    for f in d.findings:
        onset = str(f.step) if f.severity_step == f.step else f"{f.step} ({f.severity} at {f.severity_step})"
        table.add_row(f"[{_SEVERITY_STYLE[f.severity]}]{f.severity}[/]", f.detector, onset, escape(f.message))
    console.print(table)


@app.command()
def report(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A run folder: trainer_state.json (or checkpoint-*/), a metrics "
            ".jsonl or TensorBoard files, and events.jsonl if the guard wrote one."
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for report.html and its PNGs (default RUN_DIR).")
    ] = None,
) -> None:
    """Plot a run's canonical metrics with the guard's events marked, into report.html."""
    from rlguard.doctor import LogInputError, write_report

    try:
        result = write_report(run_dir, out)
    except LogInputError as err:
        raise _bad_input("report", err) from None
    console.print(
        f"wrote {escape(str(result.html))}: {len(result.images)} plots from {escape(str(result.log_path))}, "
        f"{len(result.events)} guard events"
    )


def main() -> None:  # pragma: no cover - console entry point
    app()
