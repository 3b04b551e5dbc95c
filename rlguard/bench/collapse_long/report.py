"""Outputs of the grid: ``runs.csv``, a summary with confidence intervals, paired comparisons, per-cell plots."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlguard.bench.collapse_long.train import RunResult

CellKey = tuple[str, str, str]  # (stressor, objective, guard)
Z95 = 1.959963984540054  # standard normal 97.5 % quantile


def _tail_mean(values: Sequence[float], window: int) -> float:
    """Mean of the last ``window`` values (nan for none)."""
    tail = values[-window:]
    return statistics.fmean(tail) if tail else math.nan


def _peak_trailing_mean(values: Sequence[float], window: int) -> float:
    """Largest ``window``-batch trailing mean (fewer at the start), as in the collapse definition."""
    return max((statistics.fmean(values[max(0, t - window + 1) : t + 1]) for t in range(len(values))), default=math.nan)


def run_row(r: RunResult) -> dict[str, Any]:
    """The ``runs.csv`` row of one run (rewards: trailing ``window``-batch means)."""
    w = r.config.window
    return {
        "objective": r.config.objective,
        "guard": r.config.guard,
        "stressor": r.config.stressor.name,
        "seed": r.config.seed,
        "collapsed": int(r.verdict.collapsed),
        "collapse_reason": r.verdict.reason,
        "collapse_step": "" if r.verdict.step is None else r.verdict.step,
        "halted": int(r.halted),
        "nonfinite": int(r.nonfinite),
        "start_reward": round(statistics.fmean(r.rewards[:w]), 4),
        "final_reward": round(_tail_mean(r.rewards, w), 4),
        "peak_reward": round(_peak_trailing_mean(r.rewards, w), 4),
        "final_entropy": round(_tail_mean(r.entropies, w), 4),
        "mean_completion_tokens": round(statistics.fmean(r.lengths), 2),
        "clip_frac": round(statistics.fmean(r.clip_fracs), 5),
        "routed_differently": round(statistics.fmean(r.routed_differently), 5),
        "logp_gap_abs_mean": round(statistics.fmean(r.logp_gaps), 5),
        "iterations_run": len(r.rewards),
        **r.interventions,
        "wall_s": round(r.wall_s, 1),
    }


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial rate (Wilson 1927; Brown, Cai, DasGupta 2001)."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs ``b`` (only A collapsed) and ``c`` (only B)."""
    n = b + c
    if n == 0:
        return 1.0
    tail: float = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def paired_bootstrap_ci(diffs: Sequence[float], *, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of paired differences (resampling seeds)."""
    x = np.asarray(diffs, dtype=np.float64)
    if len(x) == 0:
        return (math.nan, math.nan)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    means = x[idx].mean(axis=1)
    return (float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))


_GUARD_COLOUR = {"off": "tab:red", "default": "tab:blue", "stable": "tab:green"}


def _cells(results: Sequence[RunResult]) -> dict[CellKey, list[RunResult]]:
    cells: dict[CellKey, list[RunResult]] = {}
    for r in results:
        cells.setdefault((r.config.stressor.name, r.config.objective, r.config.guard), []).append(r)
    return cells


def summarise(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per (stressor, objective, guard) cell: collapses with a Wilson interval, final reward mean and
    std over seeds, completion length, clip fraction, trainer/engine mismatch, halts and wall time."""
    rows = []
    for (stressor, objective, guard), runs in _cells(results).items():
        rr = [run_row(r) for r in runs]
        k = sum(x["collapsed"] for x in rr)
        low, high = wilson_interval(k, len(rr))
        final = [x["final_reward"] for x in rr]
        reasons = sorted({x["collapse_reason"] for x in rr if x["collapse_reason"]})
        rows.append(
            {
                "stressor": stressor,
                "objective": objective,
                "guard": guard,
                "runs": len(rr),
                "collapsed": k,
                "collapse_rate": round(k / len(rr), 3),
                "collapse_ci_low": round(low, 3),
                "collapse_ci_high": round(high, 3),
                "reasons": "+".join(reasons),
                "halts": sum(x["halted"] for x in rr),
                "start_reward_mean": round(statistics.fmean(x["start_reward"] for x in rr), 3),
                "final_reward_mean": round(statistics.fmean(final), 3),
                "final_reward_std": round(statistics.stdev(final), 3) if len(final) > 1 else 0.0,
                "mean_completion_tokens": round(statistics.fmean(x["mean_completion_tokens"] for x in rr), 1),
                "clip_frac": round(statistics.fmean(x["clip_frac"] for x in rr), 4),
                "routed_differently": round(statistics.fmean(x["routed_differently"] for x in rr), 4),
                "logp_gap_abs_mean": round(statistics.fmean(x["logp_gap_abs_mean"] for x in rr), 4),
                "wall_s_mean": round(statistics.fmean(x["wall_s"] for x in rr), 1),
            }
        )
    return rows


def paired_comparisons(results: Sequence[RunResult], baseline: str = "grpo") -> list[dict[str, Any]]:
    """Each objective against ``baseline`` in the same stressor and guard, and each guarded cell against the same
    objective with the guard off (``baseline`` then reads ``guard off``), on the seeds both ran (same seed: same
    initial weights, warm start, prompts and sampling seeds): discordant pairs, exact McNemar p, the difference of
    collapse rates and of final rewards with 95 % paired bootstrap intervals."""
    cells = _cells(results)
    pairs: list[tuple[str, str, str, str, list[RunResult], list[RunResult]]] = []
    for (stressor, objective, guard), runs in cells.items():
        base = cells.get((stressor, baseline, guard))
        if objective != baseline and base is not None:
            pairs.append((stressor, guard, objective, baseline, runs, base))
    for (stressor, objective, guard), runs in cells.items():
        off = cells.get((stressor, objective, "off"))
        if guard != "off" and off is not None:
            pairs.append((stressor, guard, objective, f"{objective}, guard off", runs, off))
    rows = []
    for stressor, guard, objective, against, runs, base in pairs:
        a = {r.config.seed: run_row(r) for r in runs}
        b = {r.config.seed: run_row(r) for r in base}
        seeds = sorted(a.keys() & b.keys())
        if not seeds:
            continue
        d_collapse = [a[s]["collapsed"] - b[s]["collapsed"] for s in seeds]
        d_reward = [a[s]["final_reward"] - b[s]["final_reward"] for s in seeds]
        only_a, only_b = d_collapse.count(1), d_collapse.count(-1)
        c_low, c_high = paired_bootstrap_ci(d_collapse)
        r_low, r_high = paired_bootstrap_ci(d_reward)
        rows.append(
            {
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
        )
    return rows


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` as CSV with the first row's keys as header (nothing written for no rows)."""
    if not rows:
        return
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown(summary: Sequence[dict[str, Any]], paired: Sequence[dict[str, Any]]) -> str:
    """The summary and the paired comparisons as Markdown tables."""
    lines = [
        "| stressor | objective | guard | collapsed (95 % CI) | reasons | final reward | start | tokens | clip frac "
        "| routed differently | abs log-prob gap |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        lines.append(
            f"| {r['stressor']} | {r['objective']} | {r['guard']} | {r['collapsed']}/{r['runs']} "
            f"({r['collapse_ci_low']:.2f}-{r['collapse_ci_high']:.2f}) | {r['reasons'] or '-'} "
            f"| {r['final_reward_mean']:.3f} ± {r['final_reward_std']:.3f} | {r['start_reward_mean']:.3f} "
            f"| {r['mean_completion_tokens']} | {r['clip_frac']} | {r['routed_differently']} "
            f"| {r['logp_gap_abs_mean']} |"
        )
    lines += [
        "",
        "Paired with the baseline on the same seeds (difference = objective - baseline; 95 % paired bootstrap):",
        "",
        "| stressor | guard | objective vs baseline | pairs | only obj. / only base collapsed | McNemar p "
        "| collapse-rate diff (CI) | final-reward diff (CI) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in paired:
        lines.append(
            f"| {p['stressor']} | {p['guard']} | {p['objective']} vs {p['baseline']} | {p['pairs']} "
            f"| {p['only_objective_collapsed']} / {p['only_baseline_collapsed']} | {p['mcnemar_p']} "
            f"| {p['collapse_rate_diff']:+.3f} ({p['collapse_diff_ci_low']:+.2f}, {p['collapse_diff_ci_high']:+.2f}) "
            f"| {p['final_reward_diff']:+.4f} ({p['reward_diff_ci_low']:+.3f}, {p['reward_diff_ci_high']:+.3f}) |"
        )
    return "\n".join(lines) + "\n"


def plot_cells(results: Sequence[RunResult], folder: Path) -> list[Path]:
    """One PNG per (stressor, objective): reward and entropy per rollout batch, one line per seed, guard off red,
    default blue, stable green, collapsed runs dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.config.stressor.name, r.config.objective), []).append(r)
    paths = []
    for (stressor, objective), runs in groups.items():
        fig, (ax_r, ax_e) = plt.subplots(1, 2, figsize=(9, 3.2))
        for r in runs:
            style = dict(color=_GUARD_COLOUR.get(r.config.guard, "tab:grey"), lw=0.8, alpha=0.7)
            ls = "--" if r.verdict.collapsed else "-"
            ax_r.plot(r.rewards, ls, **style)
            ax_e.plot(r.entropies, ls, **style)
        ax_r.set(title=f"{objective}, {stressor}: reward", xlabel="rollout batch", ylim=(0, 1))
        ax_e.set(title="entropy (nats/token)", xlabel="rollout batch")
        for guard in sorted({r.config.guard for r in runs}, key=list(_GUARD_COLOUR).index):
            ax_r.plot([], [], color=_GUARD_COLOUR[guard], label=f"guard {guard}")
        ax_r.plot([], [], "--", color="grey", label="collapsed")
        ax_r.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = folder / f"{stressor}_{objective}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths


def write_results(results: Sequence[RunResult], out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``runs.csv``, ``summary.csv``, ``paired.csv``, ``summary.md`` and ``plots/`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "runs.csv", [run_row(r) for r in results])
    summary, paired = summarise(results), paired_comparisons(results)
    write_csv(out / "summary.csv", summary)
    write_csv(out / "paired.csv", paired)
    (out / "summary.md").write_text(markdown(summary, paired))
    plot_cells(results, out / "plots")
    return summary, paired
