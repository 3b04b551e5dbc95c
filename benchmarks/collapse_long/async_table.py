"""The asynchronous-pipeline grid against its targets, from the long task's ``runs.jsonl`` files (default: this
folder's ``async_off/`` and ``async_stable/``): per objective and staleness bound ``A`` (``async<A>``; ``none`` is the
synchronous on-policy run), the collapses and the final reward without a guard and with ``stable``, ``stable - off``
paired by seed, and the guarded final reward over the objective's own synchronous on-policy one (guarded too).

    python benchmarks/collapse_long/async_table.py [--logs PATH ...]

The final reward is the mean reward of the last ``window`` (10) batches, as in ``summary.md``. Only seeds that every
cell of an objective has (both guards, every bound) are counted, so a grid stopped part-way compares like with like.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rlguard.core_losses import get_objective
from rlguard.guards.interventions.base import StepContext
from rlguard.guards.interventions.staleness_remedy import StalenessRemedy
from rlguard.guards.stats.staleness import staleness_bucket

HERE = Path(__file__).resolve().parent
STRESSORS = ("none", "async1", "async2", "async4", "async8")
OBJECTIVES = ("grpo", "dapo", "gspo", "cispo")

Key = tuple[str, str, str, int]  # (stressor, objective, guard, seed)


def load(logs: list[Path]) -> dict[Key, dict[str, float]]:
    """``{(stressor, objective, guard, seed): {"final", "collapsed", "age"}}`` from ``logs``."""
    runs: dict[Key, dict[str, float]] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            row = json.loads(line)
            c = row["config"]
            window = row["rewards"][-int(c.get("window", 10)) :]
            ages = row.get("ages") or [0.0]
            width = get_objective(c["objective"]).clip_log_width()
            diagnosed = diagnosed_at(row.get("ages") or [], row["logp_gaps"], int(c["minibatches"]), width)
            runs[(c["stressor"]["name"], c["objective"], c["guard"], int(c["seed"]))] = {
                "final": statistics.fmean(window),
                "collapsed": float(row["verdict"]["collapsed"]),
                "age": statistics.fmean(ages),
                "diagnosed": float(diagnosed),
            }
    return runs


def diagnosed_at(ages: list[float], gaps: list[float], minibatches: int, clip_log_width: float | None = None) -> int:
    """The batch at which ``staleness_remedy`` diagnoses staleness on this run's gap by age, or -1: its diagnosis
    replayed on what it saw (each batch's gap before its first update, in its age's bucket, at each of the batch's
    ``minibatches`` steps, and the objective's ``clip_log_width`` as configured; the diagnosis reads nothing else).
    A run of a rlguard before the clip width was a stat was diagnosed on the 0.08 bound alone: replay it with
    ``clip_log_width=None``."""
    remedy = StalenessRemedy()
    width = {} if clip_log_width is None else {"clip_log_width": clip_log_width}
    for batch, (age, gap) in enumerate(zip(ages, gaps, strict=False)):
        for mb in range(minibatches):
            step = batch * minibatches + mb
            stats = {staleness_bucket(age): gap, **width}
            if remedy.propose(StepContext(step, stats, {}, {}, {}, 0, None)) is not None:
                return batch
    return -1


def table(runs: dict[Key, dict[str, float]]) -> str:
    """The table as Markdown."""
    lines = [
        "| objective | bound A | seeds | mean age | collapsed off | collapsed stable | final off | final stable | "
        "stable - off (paired, min..max) | stable / own on-policy (stable) | staleness diagnosed (stable) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in OBJECTIVES:
        per_cell = [
            {s for (st, ob, g, s) in runs if (st, ob, g) == (st_, o, g_)}
            for st_ in STRESSORS
            for g_ in ("off", "stable")
        ]
        seeds = sorted(set.intersection(*per_cell)) if all(per_cell) else []
        if not seeds:
            continue
        sync = statistics.fmean(runs[("none", o, "stable", s)]["final"] for s in seeds)
        for st in STRESSORS:
            cell = {g: [runs[(st, o, g, s)] for s in seeds] for g in ("off", "stable")}
            final = {g: [r["final"] for r in rs] for g, rs in cell.items()}
            collapsed = {g: int(sum(r["collapsed"] for r in rs)) for g, rs in cell.items()}
            diffs = [b - a for a, b in zip(final["off"], final["stable"], strict=True)]
            stable = statistics.fmean(final["stable"])
            bound = "on-policy" if st == "none" else st[len("async") :]
            age = statistics.fmean(r["age"] for r in cell["off"])
            diagnosed = sum(r["diagnosed"] >= 0 for r in cell["stable"])
            lines.append(
                f"| {o} | {bound} | {len(seeds)} | {age:.2f} | {collapsed['off']}/{len(seeds)} | "
                f"{collapsed['stable']}/{len(seeds)} | {statistics.fmean(final['off']):.3f} | {stable:.3f} | "
                f"{statistics.fmean(diffs):+.3f} ({min(diffs):+.3f}..{max(diffs):+.3f}) | {stable / sync:.3f} | "
                f"{diagnosed}/{len(seeds)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = [HERE / "async_off" / "runs.jsonl", HERE / "async_stable" / "runs.jsonl"]
    parser.add_argument("--logs", type=Path, nargs="+", default=default, help="the grid's runs.jsonl files")
    args = parser.parse_args()
    print(table(load(args.logs)))


if __name__ == "__main__":
    main()
