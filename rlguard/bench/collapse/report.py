"""Outputs of a grid, for any task: ``runs.csv``, the per-cell summary (collapse counts with Wilson intervals),
paired comparisons (exact McNemar p, paired bootstrap intervals), ``summary.md`` and per-cell plots.

Every column is defined once here; a task's :class:`ReportLayout` chooses which it reports and how its table and
plots look. A cell is (stressor, objective, guard, pi_old convention); the convention gets a column only when a
report holds runs with the trainer's pi_old.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlguard.bench.collapse.spec import GUARDS, RunResult
from rlguard.bench.collapse.stats import mcnemar_exact_p, paired_bootstrap_ci, wilson_interval
from rlguard.bench.collapse.verdict import trailing_mean

CellKey = tuple[str, str, str, str]  # (stressor, objective, guard, old_logprobs)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


# -- columns --------------------------------------------------------------------------------------------------------
def _rewards(r: RunResult) -> list[float]:
    """The trailing ``window``-batch mean reward, as in the collapse definition."""
    return trailing_mean(r.rewards, r.config.window)


def _intervention(name: str) -> Callable[[RunResult], int]:
    """How often the guard did ``name`` in a run (0 without a guard)."""
    return lambda r: r.interventions.get(name, 0)


#: a run's ``runs.csv`` values (rewards and entropy: trailing ``window``-batch means; ``clip_frac``: the mean over
#: batches of each batch's mean, ``clip_frac_mean``: the mean over optimizer steps)
RUN_COLUMNS: dict[str, Callable[[RunResult], Any]] = {
    "objective": lambda r: r.config.objective,
    "guard": lambda r: r.config.guard,
    "stressor": lambda r: r.config.stressor.name,
    "old_logprobs": lambda r: r.config.old_logprobs,
    "seed": lambda r: r.config.seed,
    "collapsed": lambda r: int(r.verdict.collapsed),
    "collapse_reason": lambda r: r.verdict.reason,
    "collapse_step": lambda r: "" if r.verdict.step is None else r.verdict.step,
    "halted": lambda r: int(r.halted),
    "halts": lambda r: int(r.halted),  # the short task's name for ``halted``
    "nonfinite": lambda r: int(r.nonfinite),
    "start_reward": lambda r: round(_rewards(r)[min(len(r.rewards), r.config.window) - 1], 4),
    "final_reward": lambda r: round(_rewards(r)[-1], 4),
    "peak_reward": lambda r: round(max(_rewards(r)), 4),
    "final_entropy": lambda r: round(_mean(r.entropies[-r.config.window :]), 4),
    "mean_completion_tokens": lambda r: round(_mean(r.lengths), 2),
    "clip_frac": lambda r: round(_mean(r.clip_fracs), 5),
    "clip_frac_mean": lambda r: round(math.nan if r.clip_frac_mean is None else r.clip_frac_mean, 5),
    "routed_differently": lambda r: round(_mean(r.routed_differently), 5),
    "logp_gap_abs_mean": lambda r: round(_mean(r.logp_gaps), 5),
    "staleness_mean": lambda r: round(_mean(r.ages), 3),  # NaN: no asynchronous-pipeline stressor
    "iterations_run": lambda r: len(r.rewards),
    **{k: _intervention(k) for k in ("skips", "rollbacks", "lr_backoffs", "clip_changes")},
}


def _cell_mean(name: str, digits: int) -> Callable[[list[dict[str, Any]], list[RunResult]], Any]:
    """The mean over a cell's runs of their ``runs.csv`` value ``name``, rounded."""
    return lambda rows, runs: round(statistics.fmean(x[name] for x in rows), digits)


def _collapsed(runs: Sequence[RunResult]) -> int:
    return sum(r.verdict.collapsed for r in runs)


def _median_step(rows: list[dict[str, Any]], runs: list[RunResult]) -> Any:
    steps = [r.verdict.step for r in runs if r.verdict.step is not None]
    return statistics.median(steps) if steps else ""


#: a cell's summary values, from its runs' ``runs.csv`` rows (``wall_s_mean`` from the unrounded wall times)
SUMMARY_COLUMNS: dict[str, Callable[[list[dict[str, Any]], list[RunResult]], Any]] = {
    "runs": lambda rows, runs: len(runs),
    "collapsed": lambda rows, runs: _collapsed(runs),
    "collapse_rate": lambda rows, runs: round(_collapsed(runs) / len(runs), 3),
    "collapse_ci_low": lambda rows, runs: round(wilson_interval(_collapsed(runs), len(runs))[0], 3),
    "collapse_ci_high": lambda rows, runs: round(wilson_interval(_collapsed(runs), len(runs))[1], 3),
    "reasons": lambda rows, runs: "+".join(sorted({r.verdict.reason for r in runs if r.verdict.reason})),
    "median_collapse_step": _median_step,
    "halts": lambda rows, runs: sum(r.halted for r in runs),
    "start_reward_mean": _cell_mean("start_reward", 3),
    "final_reward_mean": _cell_mean("final_reward", 3),
    "final_reward_std": lambda rows, runs: (
        round(statistics.stdev(x["final_reward"] for x in rows), 3) if len(rows) > 1 else 0.0
    ),
    "skips_mean": _cell_mean("skips", 2),
    "rollbacks_mean": _cell_mean("rollbacks", 2),
    "lr_backoffs_mean": _cell_mean("lr_backoffs", 2),
    "mean_completion_tokens": _cell_mean("mean_completion_tokens", 1),
    "clip_frac": _cell_mean("clip_frac", 4),
    "clip_frac_mean": _cell_mean("clip_frac_mean", 4),
    "routed_differently": _cell_mean("routed_differently", 4),
    "logp_gap_abs_mean": _cell_mean("logp_gap_abs_mean", 4),
    "staleness_mean": _cell_mean("staleness_mean", 2),
}

#: how a summary value reads in ``summary.md``
CELL_TEXT: dict[str, Callable[[dict[str, Any]], str]] = {
    "collapsed": lambda s: f"{s['collapsed']}/{s['runs']}",
    "collapsed_ci": lambda s: f"{s['collapsed']}/{s['runs']} ({s['collapse_ci_low']:.2f}-{s['collapse_ci_high']:.2f})",
    "final_reward": lambda s: f"{s['final_reward_mean']:.3f} ± {s['final_reward_std']:.3f}",
    "start_reward": lambda s: f"{s['start_reward_mean']:.3f}",
    "median_collapse_step": lambda s: str(s["median_collapse_step"] or "-"),
    "reasons": lambda s: s["reasons"] or "-",
}


_CURVES: dict[str, Callable[[RunResult], list[float]]] = {
    "reward": lambda r: r.rewards,
    "reward_trailing": _rewards,
    "entropy": lambda r: r.entropies,
}


@dataclass(frozen=True)
class Panel:
    """One axes of a cell's plot: a curve per run (``reward``, ``reward_trailing`` or ``entropy``)."""

    curve: str
    title: str  # formatted with the cell's ``objective`` and ``stressor``
    ylabel: str | None = None
    ylim: tuple[float, float] | None = None


@dataclass(frozen=True)
class ReportLayout:
    """What a task's report shows: its ``runs.csv`` and ``summary.csv`` columns (names of :data:`RUN_COLUMNS` and
    :data:`SUMMARY_COLUMNS`), its ``summary.md`` table (header, summary column or :data:`CELL_TEXT` entry), whether
    it pairs cells (``paired.csv`` and a second table), its plots, and the decimals of wall times."""

    run_columns: tuple[str, ...]
    summary_columns: tuple[str, ...]
    table: tuple[tuple[str, str], ...]
    paired: bool
    panels: tuple[Panel, ...]
    plot_prefix: str = ""
    figsize: tuple[float, float] = (9, 3.2)
    wall_digits: int = 1

    def __post_init__(self) -> None:
        for name, chosen, known in (
            ("run_columns", self.run_columns, RUN_COLUMNS),
            ("summary_columns", self.summary_columns, SUMMARY_COLUMNS),
            ("panels", [p.curve for p in self.panels], _CURVES),
        ):
            unknown = [c for c in chosen if c not in known]
            if unknown:
                raise ValueError(f"{name} has unknown entries {unknown}; choose from {list(known)}.")


def _show_convention(results: Sequence[RunResult]) -> bool:
    return any(r.config.old_logprobs != "engine" for r in results)


def _with_convention(row: dict[str, Any], convention: str, show: bool) -> dict[str, Any]:
    """``row`` with an ``old_logprobs`` column after ``guard`` when the report has both conventions' runs."""
    if not show:
        return row
    out: dict[str, Any] = {}
    for k, v in row.items():
        out[k] = v
        if k == "guard":
            out["old_logprobs"] = convention
    return out


def run_row(r: RunResult, layout: ReportLayout, *, show_convention: bool = False) -> dict[str, Any]:
    """The ``runs.csv`` row of one run."""
    row = {k: RUN_COLUMNS[k](r) for k in layout.run_columns}
    row["wall_s"] = round(r.wall_s, layout.wall_digits)
    return _with_convention(row, r.config.old_logprobs, show_convention)


def _cells(results: Sequence[RunResult]) -> dict[CellKey, list[RunResult]]:
    cells: dict[CellKey, list[RunResult]] = {}
    for r in results:
        c = r.config
        cells.setdefault((c.stressor.name, c.objective, c.guard, c.old_logprobs), []).append(r)
    return cells


def summarise(results: Sequence[RunResult], layout: ReportLayout) -> list[dict[str, Any]]:
    """One row per cell, in the order the cells first appear in ``results``."""
    show = _show_convention(results)
    rows = []
    for (stressor, objective, guard, convention), runs in _cells(results).items():
        rr = [run_row(r, layout) for r in runs]
        row: dict[str, Any] = {"stressor": stressor, "objective": objective, "guard": guard}
        row |= {k: SUMMARY_COLUMNS[k](rr, runs) for k in layout.summary_columns}
        row["wall_s_mean"] = round(statistics.fmean(r.wall_s for r in runs), layout.wall_digits)
        rows.append(_with_convention(row, convention, show))
    return rows


def paired_comparisons(
    results: Sequence[RunResult], layout: ReportLayout, baseline: str = "grpo"
) -> list[dict[str, Any]]:
    """Each objective against ``baseline`` in the same stressor, guard and pi_old convention, and each guarded cell
    against the same objective with the guard off (``baseline`` then reads ``guard off``), on the seeds both ran
    (same seed: same initial weights, warm start, prompts and sampling seeds): discordant pairs, exact McNemar p,
    the difference of collapse rates and of final rewards with 95 % paired bootstrap intervals."""
    cells = _cells(results)
    show = _show_convention(results)
    pairs: list[tuple[CellKey, str, list[RunResult], list[RunResult]]] = []
    for (stressor, objective, guard, convention), runs in cells.items():
        base = cells.get((stressor, baseline, guard, convention))
        if objective != baseline and base is not None:
            pairs.append(((stressor, objective, guard, convention), baseline, runs, base))
    for (stressor, objective, guard, convention), runs in cells.items():
        off = cells.get((stressor, objective, "off", convention))
        if guard != "off" and off is not None:
            pairs.append(((stressor, objective, guard, convention), f"{objective}, guard off", runs, off))
    rows = []
    for (stressor, objective, guard, convention), against, runs, base in pairs:
        a = {r.config.seed: run_row(r, layout) for r in runs}
        b = {r.config.seed: run_row(r, layout) for r in base}
        seeds = sorted(a.keys() & b.keys())
        if not seeds:
            continue
        d_collapse = [a[s]["collapsed"] - b[s]["collapsed"] for s in seeds]
        d_reward = [a[s]["final_reward"] - b[s]["final_reward"] for s in seeds]
        only_a, only_b = d_collapse.count(1), d_collapse.count(-1)
        c_low, c_high = paired_bootstrap_ci(d_collapse)
        r_low, r_high = paired_bootstrap_ci(d_reward)
        row = {
            "stressor": stressor,
            "guard": guard,
            "objective": objective,
            "baseline": against,
            "pairs": len(seeds),
            "only_objective_collapsed": only_a,
            "only_baseline_collapsed": only_b,
            "mcnemar_p": round(mcnemar_exact_p(only_a, only_b), 4),
            "collapse_rate_diff": round(statistics.fmean(d_collapse), 3),
            "collapse_diff_ci_low": round(c_low, 3),
            "collapse_diff_ci_high": round(c_high, 3),
            "final_reward_diff": round(statistics.fmean(d_reward), 4),
            "reward_diff_ci_low": round(r_low, 4),
            "reward_diff_ci_high": round(r_high, 4),
        }
        rows.append(_with_convention(row, convention, show))
    return rows


# -- files ----------------------------------------------------------------------------------------------------------
def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` as CSV with the first row's keys as header (nothing written for no rows)."""
    if not rows:
        return
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _table(
    columns: Sequence[tuple[str, str]], rows: Sequence[dict[str, Any]], text: dict[str, Callable[[dict[str, Any]], str]]
) -> list[str]:
    """A Markdown table: a header of ``columns``' titles, a rule, one line per row (a column's cell is its
    ``text`` entry, else the row's value)."""
    lines = ["| " + " | ".join(title for title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(text[k](r) if k in text else str(r[k]) for _, k in columns) + " |")
    return lines


_PAIRED_TEXT: dict[str, Callable[[dict[str, Any]], str]] = {
    "versus": lambda p: f"{p['objective']} vs {p['baseline']}",
    "discordant": lambda p: f"{p['only_objective_collapsed']} / {p['only_baseline_collapsed']}",
    "collapse_diff": lambda p: (
        f"{p['collapse_rate_diff']:+.3f} ({p['collapse_diff_ci_low']:+.2f}, {p['collapse_diff_ci_high']:+.2f})"
    ),
    "reward_diff": lambda p: (
        f"{p['final_reward_diff']:+.4f} ({p['reward_diff_ci_low']:+.3f}, {p['reward_diff_ci_high']:+.3f})"
    ),
}
_PAIRED_TABLE = (
    ("stressor", "stressor"),
    ("guard", "guard"),
    ("objective vs baseline", "versus"),
    ("pairs", "pairs"),
    ("only obj. / only base collapsed", "discordant"),
    ("McNemar p", "mcnemar_p"),
    ("collapse-rate diff (CI)", "collapse_diff"),
    ("final-reward diff (CI)", "reward_diff"),
)


def _with_convention_column(columns: Sequence[tuple[str, str]], show: bool) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for column in columns:
        out.append(column)
        if show and column[1] == "guard":
            out.append(("pi_old", "old_logprobs"))
    return out


def markdown(
    summary: Sequence[dict[str, Any]], paired: Sequence[dict[str, Any]], layout: ReportLayout, *, show: bool = False
) -> str:
    """The summary (and, if the layout pairs cells, the paired comparisons) as Markdown tables."""
    lines = _table(_with_convention_column(layout.table, show), summary, CELL_TEXT)
    if layout.paired:
        lines += [
            "",
            "Paired with the baseline on the same seeds (difference = objective - baseline; 95 % paired bootstrap):",
            "",
            *_table(_with_convention_column(_PAIRED_TABLE, show), paired, _PAIRED_TEXT),
        ]
    return "\n".join(lines) + "\n"


_GUARD_COLOUR = {"off": "tab:red", "default": "tab:blue", "stable": "tab:green"}


def plot_cells(results: Sequence[RunResult], folder: Path, layout: ReportLayout) -> list[Path]:
    """One PNG per (stressor, objective, pi_old convention): the layout's panels, one line per run, guard off
    red, default blue, stable green, collapsed runs dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.config.stressor.name, r.config.objective, r.config.old_logprobs), []).append(r)
    paths = []
    for (stressor, objective, convention), runs in groups.items():
        fig, axes = plt.subplots(1, len(layout.panels), figsize=layout.figsize, squeeze=False)
        for r in runs:
            style = dict(color=_GUARD_COLOUR.get(r.config.guard, "tab:grey"), lw=0.8, alpha=0.7)
            ls = "--" if r.verdict.collapsed else "-"
            for panel, ax in zip(layout.panels, axes[0], strict=True):
                ax.plot(_CURVES[panel.curve](r), ls, **style)
        suffix = "" if convention == "engine" else f", pi_old {convention}"
        for panel, ax in zip(layout.panels, axes[0], strict=True):
            ax.set(title=panel.title.format(objective=objective, stressor=stressor) + suffix, xlabel="rollout batch")
            if panel.ylabel is not None:
                ax.set_ylabel(panel.ylabel)
            if panel.ylim is not None:
                ax.set_ylim(*panel.ylim)
        first = axes[0][0]
        for guard in sorted({r.config.guard for r in runs}, key=GUARDS.index):
            first.plot([], [], color=_GUARD_COLOUR[guard], label=f"guard {guard}")
        first.plot([], [], "--", color="grey", label="collapsed")
        first.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        name = f"{layout.plot_prefix}{stressor}_{objective}" + ("" if convention == "engine" else f"_{convention}")
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths


@dataclass(frozen=True)
class Report:
    """What :func:`write_results` wrote: the summary rows and the paired comparisons (empty if not paired)."""

    summary: list[dict[str, Any]]
    paired: list[dict[str, Any]]


def write_results(results: Sequence[RunResult], out: Path, layout: ReportLayout) -> Report:
    """``runs.csv``, ``summary.csv``, ``summary.md``, ``paired.csv`` (if the layout pairs cells) and ``plots/``
    under ``out``, the runs in the order given."""
    out.mkdir(parents=True, exist_ok=True)
    show = _show_convention(results)
    write_csv(out / "runs.csv", [run_row(r, layout, show_convention=show) for r in results])
    summary = summarise(results, layout)
    paired = paired_comparisons(results, layout) if layout.paired else []
    write_csv(out / "summary.csv", summary)
    if layout.paired:
        write_csv(out / "paired.csv", paired)
    (out / "summary.md").write_text(markdown(summary, paired, layout, show=show))
    plot_cells(results, out / "plots", layout)
    return Report(summary, paired)
