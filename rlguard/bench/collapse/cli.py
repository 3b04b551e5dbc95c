"""The command line of both tasks: ``python benchmarks/collapse/run.py --task short|long`` (also ``rlguard bench
collapse`` and, for ``--task long``, ``benchmarks/collapse_long/run.py``): run or
resume a task's grid, or rebuild its report from ``runs.jsonl``.

See :mod:`rlguard.bench.collapse` for the design.
"""

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

from rlguard.bench.collapse.grid import TaskSpec, build_grid, canonical_order, log_line, read_log, run_grid
from rlguard.bench.collapse.report import write_results
from rlguard.bench.collapse.spec import GUARDS, OLD_LOGPROBS, RunResult, numerics, same_numerics
from rlguard.core_losses import get_objective


def task_specs() -> dict[str, TaskSpec]:
    """The tasks by name (imported on call: the long task's package builds on this one)."""
    from rlguard.bench.collapse.tiny import TINY_TASK
    from rlguard.bench.collapse_long.spec import LONG_TASK

    return {spec.name: spec for spec in (TINY_TASK, LONG_TASK)}


def split_names(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]`` (the comma-separated options of the command line)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def _names(name: str, text: str, known: Sequence[str] | None) -> list[str]:
    """The comma-separated ``text`` of option ``name``, each checked against ``known`` (objectives: registered)."""
    values = split_names(text)
    if not values:
        raise ValueError(f"{name} must name at least one entry; got none.")
    if known is None:
        for v in values:
            get_objective(v)  # unknown name -> ValueError listing the registered objectives
        return values
    bad = [v for v in values if v not in known]
    if bad:
        raise ValueError(f"unknown {name} {bad}; choose from {list(known)}.")
    return values


def run_benchmark(spec: TaskSpec, args: argparse.Namespace, argv: Sequence[str]) -> list[dict[str, Any]]:
    """Run the grid the parsed ``args`` describe, print the summary, write the results; returns the summary rows.

    Every finished run is appended to ``--out/runs.jsonl`` at once; ``--resume`` keeps the runs already there and
    runs only the missing ones, ``--report-only`` runs none. The report covers every run of the log (with either)
    or of this invocation, in the grid's order (:func:`~rlguard.bench.collapse.grid.canonical_order`).
    """
    for name in ("workers", "seeds"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1; got {getattr(args, name)}.")
    if args.seed_offset < 0:
        raise ValueError(f"seed-offset must be >= 0; got {args.seed_offset}.")
    defaults = build_parser(spec.name).parse_args([])
    if args.quick:  # unless named explicitly
        args.objectives = ",".join(spec.quick_objectives) if args.objectives == defaults.objectives else args.objectives
        args.stressors = ",".join(spec.quick_stressors) if args.stressors == defaults.stressors else args.stressors
    objectives = _names("objectives", args.objectives, None)
    guards = _names("guards", args.guards, GUARDS)
    names = _names("stressors", args.stressors, spec.stressors)
    conventions = _names("old-logprobs", args.old_logprobs, OLD_LOGPROBS)
    knobs = {k: getattr(args, k) for k in ("lr_multiplier", "stale_steps", "mismatch_noise", "router_noise")}
    stressors = [spec.config_type.stressor_type()(name, **knobs) for name in names]
    overrides: dict[str, Any] = dict(spec.quick_overrides) if args.quick else {}
    if args.iterations is not None:
        overrides["iterations"] = args.iterations
    seeds = 1 if args.quick else args.seeds
    configs = build_grid(
        spec,
        objectives=objectives,
        guards=guards,
        stressors=stressors,
        seeds=seeds,
        seed_offset=args.seed_offset,
        old_logprobs=conventions,
        **overrides,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    keep = args.resume or args.report_only
    done = {r.config.key(): r for r in read_log(log, spec.config_type)} if keep else {}
    foreign = [r for r in done.values() if not same_numerics(r.numerics, numerics())]
    if foreign and not args.report_only:  # kept runs are not recomputed: say when they would not reproduce here
        print(
            f"warning: {len(foreign)} of the {len(done)} runs kept from {log} were recorded on other numerics "
            f"(torch build, CPU, MKL mode) or before runs recorded them; here: {numerics()}. Their curves will "
            "not reproduce bit for bit on this machine: rerun them into another --out to compare."
        )
    wanted = {c.key() for c in configs}
    todo = [] if args.report_only else [c for c in configs if c.key() not in done]
    start = time.perf_counter()
    with log.open("a" if keep else "w") as fh:

        def record(result: RunResult) -> None:
            fh.write(log_line(result))
            fh.flush()
            v, c = result.verdict, result.config
            position = len(wanted & done.keys()) + 1
            print(
                f"{position}/{len(configs)} {c.stressor.name} {c.objective} guard={c.guard} pi_old={c.old_logprobs} "
                f"seed={c.seed} collapsed={int(v.collapsed)} {v.reason} final_reward={result.rewards[-1]:.3f} "
                f"{result.wall_s:.0f}s",
                flush=True,
            )
            done[c.key()] = result

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
    report = write_results(canonical_order(done.values(), spec.objectives), out, spec.layout)
    print(f"collapse benchmark, {spec.name} task ({len(report.summary)} cells; runs over seeds):")
    print((out / "summary.md").read_text())
    print(f"{len(todo)} runs on {args.workers} workers in {wall:.0f} s; results in {out}")
    return report.summary


def build_parser(task: str = "short") -> argparse.ArgumentParser:
    """The command line of :func:`main`, with ``task``'s defaults."""
    tasks = task_specs()
    spec = tasks[task]
    d = spec.config_type.stressor_type()()
    parser = argparse.ArgumentParser(
        prog="rlguard bench collapse",
        description="Collapse benchmark: collapse rate per objective x guard x stressor, for one task: "
        + "; ".join(f"{s.name}: {s.description}" for s in tasks.values())
        + ".",
    )
    parser.add_argument("--task", choices=list(tasks), default=task, help="the task (its own defaults below)")
    parser.add_argument("--objectives", default=",".join(spec.objectives), help="comma-separated objective names")
    parser.add_argument("--guards", default=",".join(spec.guards), help="comma-separated: off, default, stable")
    parser.add_argument(
        "--stressors", default=",".join(spec.grid_stressors), help=f"comma-separated: {', '.join(spec.stressors)}"
    )
    parser.add_argument(
        "--old-logprobs",
        default="engine",
        help="comma-separated: engine (pi_old is the engine's log-probs, no recomputation), trainer (pi_old "
        "recomputed by the trainer before the update, as verl does; the engine's become rollout_logprobs)",
    )
    parser.add_argument("--seeds", type=int, default=8, help="seeds per cell")
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed (run seeds in parts)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    parser.add_argument("--out", default=spec.default_out, help="folder for runs.jsonl, CSVs, summary and plots")
    parser.add_argument("--iterations", type=int, default=None, help="rollout batches per run (task default)")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out/runs.jsonl")
    parser.add_argument(
        "--report-only", action="store_true", help="write the outputs from --out/runs.jsonl, run nothing"
    )
    quick = f"{','.join(spec.quick_objectives)} x {','.join(spec.quick_stressors)}, 1 seed, {spec.quick_overrides}"
    parser.add_argument("--quick", action="store_true", help=f"smoke test: {quick}")
    parser.add_argument("--lr-multiplier", type=float, default=d.lr_multiplier, help="high_lr: LR factor")
    parser.add_argument("--stale-steps", type=int, default=d.stale_steps, help="stale: policy age in batches")
    parser.add_argument("--mismatch-noise", type=float, default=d.mismatch_noise, help="mismatch: engine weight noise")
    parser.add_argument("--router-noise", type=float, default=d.router_noise, help="moe: engine router noise x RMS")
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None, *, task: str = "short") -> int:
    """Parse ``argv`` (``--task`` picks the task, ``task`` when absent) and run; returns the exit code (2 on bad
    input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", choices=list(task_specs()), default=task)
    chosen, _ = pre.parse_known_args(argv)
    args = build_parser(chosen.task).parse_args(argv)
    try:
        run_benchmark(task_specs()[args.task], args, argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
