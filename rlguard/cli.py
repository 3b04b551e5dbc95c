"""The ``rlguard`` command line (typer + rich)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

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


def main() -> None:  # pragma: no cover - console entry point
    app()
