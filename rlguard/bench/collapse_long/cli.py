"""Command line of the benchmark: ``rlguard bench collapse-long`` and ``benchmarks/collapse_long/run.py``."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlguard.bench.collapse_long.grid import build_grid, config_key, log_line, read_log, run_grid
from rlguard.bench.collapse_long.report import write_results
from rlguard.bench.collapse_long.stressors import STRESSORS, Stressor
from rlguard.bench.collapse_long.train import GUARDS, RunResult
from rlguard.core_losses import list_objectives

OBJECTIVES: tuple[str, ...] = ("grpo", "dapo", "gspo", "cispo", "sapo")
DEFAULT_OUT = "benchmarks/collapse_long/results"
# --quick: a CI smoke test of every layer (MoE engine included) in seconds, not a measurement
QUICK_OBJECTIVES, QUICK_STRESSORS = "grpo,gspo", "none,moe"
QUICK = {"iterations": 4, "warm_start_steps": 20, "num_prompts": 4, "group_size": 4, "length": 8}


def split_names(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [x.strip() for x in text.split(",") if x.strip()]


def _check_names(name: str, values: Sequence[str], known: Sequence[str]) -> None:
    if not values:
        raise ValueError(f"--{name} must name at least one entry; got none.")
    bad = [v for v in values if v not in known]
    if bad:
        raise ValueError(f"unknown --{name} {bad}; choose from {list(known)}.")


def run_benchmark(args: argparse.Namespace, argv: Sequence[str]) -> list[dict[str, Any]]:
    """Run the grid the parsed ``args`` describe, print the summary, write the results; returns the summary."""
    if args.quick:  # unless named explicitly: the dense and the MoE path of the two objectives the issue compares
        args.objectives = QUICK_OBJECTIVES if args.objectives == ",".join(OBJECTIVES) else args.objectives
        args.stressors = QUICK_STRESSORS if args.stressors == ",".join(STRESSORS) else args.stressors
    objectives, guards, names = split_names(args.objectives), split_names(args.guards), split_names(args.stressors)
    _check_names("objectives", objectives, list_objectives())
    _check_names("guards", guards, GUARDS)
    _check_names("stressors", names, STRESSORS)
    knobs = {
        "lr_multiplier": args.lr_multiplier,
        "stale_steps": args.stale_steps,
        "mismatch_noise": args.mismatch_noise,
        "router_noise": args.router_noise,
    }
    stressors = [Stressor(name, **knobs) for name in names]
    overrides: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.iterations is not None:
        overrides["iterations"] = args.iterations
    seeds = 1 if args.quick else args.seeds
    configs = build_grid(objectives, guards, stressors, seeds, seed_offset=args.seed_offset, **overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    keep = args.resume or args.report_only
    done = {config_key(r.config): r for r in read_log(log)} if keep else {}
    wanted = {config_key(c) for c in configs}
    todo = [c for c in configs if config_key(c) not in done]
    if args.report_only:
        todo = []
    start = time.perf_counter()
    with log.open("a" if args.resume or args.report_only else "w") as fh:

        def record(result: RunResult) -> None:
            fh.write(log_line(result))
            fh.flush()
            v = result.verdict
            c = result.config
            position = len(wanted & done.keys()) + 1
            print(
                f"{position}/{len(configs)} {c.stressor.name} {c.objective} guard={c.guard} seed={c.seed} "
                f"collapsed={int(v.collapsed)} {v.reason} final_reward={result.rewards[-1]:.3f} "
                f"{result.wall_s:.0f}s",
                flush=True,
            )
            done[config_key(c)] = result

        finished = len(done)
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `kill PID` still records the invocation
        try:
            run_grid(todo, workers=args.workers, warm_cache=out / "warm_starts", on_result=record)
        finally:  # also when interrupted (Ctrl-C, kill): the runs finished so far are in runs.jsonl
            signal.signal(signal.SIGTERM, previous)
            wall = time.perf_counter() - start
            stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
            entry = {"argv": list(argv), "runs": len(done) - finished, "wall_s": round(wall, 1), "ended": stamp}
            with (out / "invocations.jsonl").open("a") as inv:
                inv.write(json.dumps(entry) + "\n")
    recorded = [r for key, r in done.items() if key in wanted or args.resume or args.report_only]
    summary, _ = write_results(recorded, out)
    print((out / "summary.md").read_text())
    print(f"{len(todo)} runs on {args.workers} workers in {wall:.0f} s; results in {out}")
    return summary


def build_parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    d = Stressor()
    parser = argparse.ArgumentParser(
        prog="rlguard bench collapse-long",
        description="Long-completion collapse benchmark: collapse rate per objective x guard x stressor.",
    )
    parser.add_argument("--objectives", default=",".join(OBJECTIVES), help="comma-separated objective names")
    parser.add_argument(
        "--guards",
        default="off,default",
        help="comma-separated: off, default, stable (the trust-region preset; not in the default grid)",
    )
    parser.add_argument("--stressors", default=",".join(STRESSORS), help=f"comma-separated: {', '.join(STRESSORS)}")
    parser.add_argument("--seeds", type=int, default=8, help="seeds per cell")
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed (run seeds in parts)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder for runs.jsonl, CSVs, summary and plots")
    parser.add_argument("--iterations", type=int, default=None, help="rollout batches per run (default 60)")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out/runs.jsonl")
    parser.add_argument(
        "--report-only", action="store_true", help="write the outputs from --out/runs.jsonl, run nothing"
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke test: grpo,gspo x none,moe, 1 seed, tiny runs")
    parser.add_argument("--lr-multiplier", type=float, default=d.lr_multiplier, help="high_lr: LR factor")
    parser.add_argument("--stale-steps", type=int, default=d.stale_steps, help="stale: policy age in batches")
    parser.add_argument(
        "--mismatch-noise", type=float, default=d.mismatch_noise, help="mismatch: engine weight noise x RMS (+bf16)"
    )
    parser.add_argument(
        "--router-noise", type=float, default=d.router_noise, help="moe: engine router noise x RMS (+bf16)"
    )
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run; returns the exit code (2 on bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.seeds < 1 or args.seed_offset < 0 or args.workers < 1:
            raise ValueError(
                f"--seeds and --workers must be >= 1 and --seed-offset >= 0; got {args.seeds}, {args.workers}, "
                f"{args.seed_offset}."
            )
        run_benchmark(args, argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
