"""Detection delay and false alarms of the guard's detectors on synthetic metric streams.

    python benchmarks/guard_detection.py            # 10 seeds per failure, 20 per healthy shape
    python benchmarks/guard_detection.py --quick    # 2 and 3
    python benchmarks/guard_detection.py --every 4  # generation stats (reward, lengths, ...) on every 4th step only
    python benchmarks/guard_detection.py --consequence online  # severity by consequence, live (GuardConfig)
    python benchmarks/guard_detection.py --seed-offset 1000    # other seeds (failures 1000.., healthy 1000..)
    python benchmarks/guard_detection.py --strength 0.5        # every fault at half its strength (2: double)

Prints, for each failure mode, the steps from onset to the expected detector's first event (min/median/max over
seeds), how often it reached critical and how often the `default` preset skipped a step; then the events raised on
healthy runs by the `default` preset.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.decision import decision_action

# the synthetic streams are the tests' data (tests/helpers/synthetic.py): the repository root on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers.synthetic import FAILURES, SHAPES, failing_stream, healthy_stream, sparse_stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few seeds, for CI")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=1, help="generation stats on every N-th step only (TRL)")
    parser.add_argument(
        "--consequence",
        choices=("step", "online"),
        default=None,
        help="GuardConfig.consequence of every guard (default: each preset's own)",
    )
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed (other seeds than the committed 0..)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per failure mode (default 10; --quick 2)")
    parser.add_argument(
        "--strength",
        type=float,
        default=1.0,
        help="scale of every fault (tests.helpers.synthetic.failing_stream: log-space size of a factor, multiple of "
        "a drop or fraction); 1 is the committed streams",
    )
    args = parser.parse_args()
    if not args.strength > 0:
        parser.error(f"--strength must be > 0; got {args.strength}")
    failure_seeds, healthy_seeds = (2, 3) if args.quick else (10, 20)
    if args.seeds is not None:
        failure_seeds = args.seeds
    seeds = range(args.seed_offset, args.seed_offset + failure_seeds)
    onset = args.steps // 2
    console = Console(width=150)

    sparse = f", generation stats every {args.every} steps" if args.every > 1 else ""
    changes = {} if args.consequence is None else {"consequence": args.consequence}
    sparse += f", consequence={args.consequence or 'each preset own'!r}"
    if args.seed_offset:
        sparse += f", seeds from {args.seed_offset}"
    if args.strength != 1.0:
        sparse += f", fault strength {args.strength:g}"
    table = Table(title=f"detection delay (steps after onset {onset}), {failure_seeds} seeds, preset 'monitor'{sparse}")
    columns = ("failure", "detector", "missed", "min", "median", "max", "reached critical", "skipped (default)")
    for col in (*columns, "acted (default)"):
        table.add_column(col)
    for mode, (_, detector) in FAILURES.items():
        delays, critical, skipped, acted = [], 0, 0, 0
        for seed in seeds:
            guard = Guard(GuardConfig.preset("monitor", **changes))
            acting = Guard(GuardConfig.preset("default", **changes))
            first, skips, acts = None, 0, 0
            for step, stats in enumerate(
                sparse_stream(failing_stream(mode, args.steps, onset, seed, strength=args.strength), args.every)
            ):
                for event in guard.observe(step, stats).events:
                    if event.detector == detector and first is None:
                        first = step - onset
                outcome = acting.observe(step, dict(stats)).outcome
                skips, acts = skips + (outcome == "skip"), acts + (outcome != "step")
            skipped, acted = skipped + (skips > 0), acted + (acts > 0)
            if first is not None:
                delays.append(first)
            critical += any(e.detector == detector and e.severity == "critical" for e in guard.events)
        stats_ = (min(delays), statistics.median(delays), max(delays)) if delays else ("-", "-", "-")
        table.add_row(
            mode,
            detector,
            str(failure_seeds - len(delays)),
            *map(str, stats_),
            f"{critical}/{failure_seeds}",
            f"{skipped}/{failure_seeds}",
            f"{acted}/{failure_seeds}",
        )
    console.print(table)

    counts: Counter[tuple[str, str]] = Counter()
    actions: Counter[str] = Counter()
    for shape in SHAPES:
        for seed in range(args.seed_offset, args.seed_offset + healthy_seeds):
            guard = Guard(GuardConfig.preset("default", **changes))
            for step, stats in enumerate(sparse_stream(healthy_stream(args.steps, seed, shape), args.every)):
                actions[decision_action(guard.observe(step, stats))] += 1
            counts.update((e.detector, e.severity) for e in guard.events)
    runs = len(SHAPES) * healthy_seeds
    table = Table(title=f"events on {runs} healthy runs of {args.steps} steps, preset 'default'")
    for col in ("detector", "severity", "events"):
        table.add_column(col)
    for (detector, severity), n in sorted(counts.items()):
        table.add_row(detector, severity, str(n))
    console.print(table)
    console.print(f"actions on healthy runs: {dict(actions)}")


if __name__ == "__main__":
    main()
