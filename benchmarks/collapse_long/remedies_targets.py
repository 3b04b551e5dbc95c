"""The mismatch remedies against their targets, from a long-task grid's ``runs.jsonl`` (default: this folder's
``remedies/``): per pi_old convention and stressor, the collapses with and without ``stable``, the final reward of
each objective with ``stable`` against unguarded CISPO's on the same seeds, and ``stable - off`` per objective,
paired by seed.

    python benchmarks/collapse_long/remedies_targets.py [--log PATH]

Only seeds that every cell of a (convention, stressor) block has are counted, so a grid stopped part-way compares
like with like.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(log: Path) -> dict[tuple[str, str, str, str, int], dict[str, float]]:
    """``{(convention, stressor, objective, guard, seed): {"final", "start", "collapsed"}}`` from ``log``."""
    runs: dict[tuple[str, str, str, str, int], dict[str, float]] = {}
    for line in log.read_text().splitlines():
        row = json.loads(line)
        c = row["config"]
        rewards = row["rewards"]
        key = (c.get("old_logprobs", "engine"), c["stressor"]["name"], c["objective"], c["guard"], int(c["seed"]))
        runs[key] = {"final": rewards[-1], "start": rewards[0], "collapsed": float(row["verdict"]["collapsed"])}
    return runs


def table(runs: dict[tuple[str, str, str, str, int], dict[str, float]]) -> str:
    """The targets table as Markdown."""
    blocks: dict[tuple[str, str], dict[tuple[str, str], set[int]]] = defaultdict(lambda: defaultdict(set))
    for conv, stressor, obj, guard, seed in runs:
        blocks[(conv, stressor)][(obj, guard)].add(seed)
    lines = [
        "| pi_old | stressor | seeds | collapsed off | collapsed stable | objective | start | off | stable | "
        "stable - off (paired) | stable / CISPO off |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (conv, stressor), cells in sorted(blocks.items()):
        seeds = sorted(set.intersection(*cells.values()))
        objectives = sorted({o for o, _ in cells}, key=["grpo", "dapo", "gspo", "cispo", "sapo"].index)
        if not seeds or any((o, g) not in cells for o in objectives for g in ("off", "stable")):
            continue

        def r(o: str, g: str, s: int, what: str, conv: str = conv, stressor: str = stressor) -> float:
            return runs[(conv, stressor, o, g, s)][what]

        collapsed = {g: int(sum(r(o, g, s, "collapsed") for o in objectives for s in seeds)) for g in ("off", "stable")}
        cispo = statistics.fmean(r("cispo", "off", s, "final") for s in seeds) if "cispo" in objectives else None
        for o in objectives:
            start = statistics.fmean(r(o, "off", s, "start") for s in seeds)
            off = statistics.fmean(r(o, "off", s, "final") for s in seeds)
            stable = statistics.fmean(r(o, "stable", s, "final") for s in seeds)
            ratio = f"{stable / cispo:.3f}" if cispo else "-"
            lines.append(
                f"| {conv} | {stressor} | {len(seeds)} | {collapsed['off']}/{len(seeds) * len(objectives)} | "
                f"{collapsed['stable']}/{len(seeds) * len(objectives)} | {o} | {start:.3f} | {off:.3f} | {stable:.3f} "
                f"| {stable - off:+.3f} | {ratio} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, default=HERE / "remedies" / "runs.jsonl", help="a grid's runs.jsonl")
    args = parser.parse_args()
    print(table(load(args.log)))


if __name__ == "__main__":
    main()
