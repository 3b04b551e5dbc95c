"""The grid of runs (objective x guard x stressor x seed), in worker processes, and its summary, tables and plots.

See :mod:`rlguard.bench.collapse` for the design, the stressors and the collapse definition.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from rlguard.bench.collapse.loop import run_one
from rlguard.bench.collapse.spec import GUARDS, OBJECTIVES, STRESSORS, RunConfig, RunResult, Stressor
from rlguard.bench.collapse.verdict import trailing_mean


# -- the grid -----------------------------------------------------------------------------------------------------
def build_grid(
    objectives: Iterable[str] = OBJECTIVES,
    guards: Iterable[str] = GUARDS,
    stressors: Iterable[str] = STRESSORS,
    seeds: int = 8,
    **overrides: Any,
) -> list[RunConfig]:
    """Every combination, seeds ``0 .. seeds - 1``; ``overrides`` set other :class:`RunConfig` fields.

    Seed-major order: a run stopped part-way has every cell at the same number of seeds (give ``--resume``).
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1; got {seeds}.")
    return [
        RunConfig(objective=o, guard=g, stressor=Stressor(s), seed=seed, **overrides)  # type: ignore[arg-type]
        for seed in range(seeds)
        for s in stressors
        for o in objectives
        for g in guards
    ]


def _init_worker() -> None:
    torch.set_num_threads(1)


def run_grid(
    configs: Sequence[RunConfig], *, workers: int = 2, on_result: Callable[[RunResult], None] | None = None
) -> list[RunResult]:
    """Run ``configs`` on ``workers`` processes (one torch thread each); results in the order of ``configs``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1; got {workers}.")
    results: dict[int, RunResult] = {}
    if workers == 1:
        _init_worker()
        for i, cfg in enumerate(configs):
            results[i] = run_one(cfg)
            if on_result is not None:
                on_result(results[i])
    else:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker) as pool:
            futures = {pool.submit(run_one, cfg): i for i, cfg in enumerate(configs)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if on_result is not None:
                    on_result(results[futures[fut]])
    return [results[i] for i in range(len(configs))]


# -- outputs ------------------------------------------------------------------------------------------------------
CellKey = tuple[str, str, str]  # (stressor, objective, guard)


def _cells(results: Sequence[RunResult]) -> dict[CellKey, list[RunResult]]:
    cells: dict[CellKey, list[RunResult]] = {}
    for r in results:
        cells.setdefault((r.config.stressor.name, r.config.objective, r.config.guard), []).append(r)
    return cells


def summarise(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per (stressor, objective, guard) cell: collapse rate, final reward mean and std over seeds, median
    steps to collapse, mean interventions, mean clip fraction and mean wall time."""
    rows = []
    for (stressor, objective, guard), runs in _cells(results).items():
        final = [float(r.row()["final_reward"]) for r in runs]
        steps = [r.verdict.step for r in runs if r.verdict.step is not None]
        rows.append(
            {
                "stressor": stressor,
                "objective": objective,
                "guard": guard,
                "runs": len(runs),
                "collapsed": sum(r.verdict.collapsed for r in runs),
                "collapse_rate": round(sum(r.verdict.collapsed for r in runs) / len(runs), 3),
                "final_reward_mean": round(statistics.fmean(final), 3),
                "final_reward_std": round(statistics.stdev(final), 3) if len(final) > 1 else 0.0,
                "median_collapse_step": statistics.median(steps) if steps else "",
                "skips_mean": round(statistics.fmean(r.skips for r in runs), 2),
                "rollbacks_mean": round(statistics.fmean(r.rollbacks for r in runs), 2),
                "lr_backoffs_mean": round(statistics.fmean(r.lr_backoffs for r in runs), 2),
                "halts": sum(r.halted for r in runs),
                "clip_frac_mean": round(statistics.fmean(r.clip_frac_mean for r in runs), 4),
                "wall_s_mean": round(statistics.fmean(r.wall_s for r in runs), 2),
            }
        )
    return rows


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _markdown(rows: Sequence[dict[str, Any]]) -> str:
    head = "| stressor | objective | guard | collapsed | final reward | median steps to collapse | skips | rollbacks "
    head += "| lr backoffs | halts | clip frac | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    lines = [
        f"| {r['stressor']} | {r['objective']} | {r['guard']} | {r['collapsed']}/{r['runs']} "
        f"| {r['final_reward_mean']:.3f} ± {r['final_reward_std']:.3f} | {r['median_collapse_step'] or '-'} "
        f"| {r['skips_mean']} | {r['rollbacks_mean']} | {r['lr_backoffs_mean']} | {r['halts']} "
        f"| {r['clip_frac_mean']} | {r['wall_s_mean']} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


_GUARD_COLOUR = {"off": "tab:red", "default": "tab:blue", "stable": "tab:green"}


def plot_curves(results: Sequence[RunResult], folder: Path) -> list[Path]:
    """One PNG per (stressor, objective) cell: reward per rollout batch (trailing mean), each seed a thin line,
    guard off in red, default in blue, stable in green, collapsed runs dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.config.stressor.name, r.config.objective), []).append(r)
    for (stressor, objective), runs in groups.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for r in runs:
            colour = _GUARD_COLOUR.get(r.config.guard, "tab:grey")
            style = "--" if r.verdict.collapsed else "-"
            ax.plot(trailing_mean(r.rewards, r.config.window), style, color=colour, lw=0.8, alpha=0.7)
        for guard in dict.fromkeys(r.config.guard for r in runs):
            ax.plot([], [], color=_GUARD_COLOUR.get(guard, "tab:grey"), label=f"guard {guard}")
        ax.plot([], [], "--", color="grey", label="collapsed")
        ax.set(title=f"{objective}, stressor {stressor}", xlabel="rollout batch", ylabel="reward (trailing mean)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = folder / f"curves_{stressor}_{objective}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths


def write_results(results: Sequence[RunResult], out: Path) -> list[dict[str, Any]]:
    """``runs.csv`` (one row per run), ``summary.csv``, ``summary.md`` and ``plots/*.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "runs.csv", [r.row() for r in results])
    summary = summarise(results)
    _write_csv(out / "summary.csv", summary)
    (out / "summary.md").write_text(_markdown(summary))
    plot_curves(results, out / "plots")
    return summary


def _table(summary: Sequence[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="collapse benchmark (per cell: runs over seeds)")
    for col in (
        "stressor",
        "objective",
        "guard",
        "collapsed",
        "final reward",
        "median step",
        "skips",
        "rollbacks",
        "lr backoffs",
        "halts",
        "clip frac",
        "wall s",
    ):
        table.add_column(col)
    for r in summary:
        table.add_row(
            r["stressor"],
            r["objective"],
            r["guard"],
            f"{r['collapsed']}/{r['runs']}",
            f"{r['final_reward_mean']:.3f} ± {r['final_reward_std']:.3f}",
            str(r["median_collapse_step"] or "-"),
            str(r["skips_mean"]),
            str(r["rollbacks_mean"]),
            str(r["lr_backoffs_mean"]),
            str(r["halts"]),
            str(r["clip_frac_mean"]),
            str(r["wall_s_mean"]),
        )
    return table
