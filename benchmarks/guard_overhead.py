"""The guard's cost per optimizer step as a fraction of a tiny TRL step, measured inside the same run.

    python benchmarks/guard_overhead.py            # 3 x 2 trainings of 12 steps, interleaved (a few minutes)
    python benchmarks/guard_overhead.py --quick    # 1 x 2 trainings of 3 steps

A ``GuardedGRPOTrainer`` on the tiny Llama (``rlguard.tasks.hf``) trains with ``guard=None`` and with
``guard="default"``, one after the other, ``--repeats`` times, with one torch thread. In the guarded runs the
guard's own work is timed where it happens: its share of every micro-batch (``add_metric_values``, in the loss,
from the metrics the trainer reads to the host for logging with or without a guard) and ``collect_step_stats`` of
the step, ``StepStats.reduce`` (the one collective), ``Guard.observe``, and applying the decision (including
snapshots); the gradient clipping the callback does in place of the trainer is counted apart, since the
unguarded trainer clips too. Step time is ``on_step_begin`` to ``on_step_end`` (generation, loss, backward,
optimizer), median over steps after the first.

Times are the main thread's CPU time (``time.thread_time``, ``--clock cpu``, the default), which a busy shared
machine does not inflate when it deschedules the process; ``--clock wall`` uses ``time.perf_counter``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import PrinterCallback, TrainerCallback

import rlguard.adapters.trl.callback as trl_guard
import rlguard.adapters.trl.objective_glue as trl_adapter
from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
from rlguard.guards import Guard, StepStats
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

RUN: dict[str, Any] = {
    **cpu_training_arguments(),
    "use_vllm": False,
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "max_completion_length": 8,
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "seed": 0,
}
#: the guard's parts, timed where they run; "clip" is the callback's gradient clipping (the trainer's otherwise)
PARTS = ("collect", "reduce", "observe", "apply", "clip")


class Timers:
    """Seconds per named part, accumulated per optimizer step."""

    clock: Callable[[], float] = time.thread_time

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.step_seconds: list[float] = []
        self._inside_callback = False

    def wrap(self, name: str, fn: Callable[..., Any], *, only_in_callback: bool = False) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if only_in_callback and not self._inside_callback:
                return fn(*args, **kwargs)
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[name] += self.clock() - start

        return timed

    @contextmanager
    def callback(self) -> Iterator[None]:
        self._inside_callback = True
        try:
            yield
        finally:
            self._inside_callback = False


class StepClock(TrainerCallback):
    """Wall time of each optimizer step; closes the guard timers' record of the step."""

    def __init__(self, timers: Timers) -> None:
        self.timers = timers
        self._start = 0.0

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self._start = self.timers.clock()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.timers.step_seconds.append(self.timers.clock() - self._start)
        self.timers.steps.append(dict(self.timers.current))
        self.timers.current.clear()


@contextmanager
def instrumented(timers: Timers) -> Iterator[None]:
    """Time the guard's parts by wrapping them in place (restored on exit)."""
    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, attr: str, new: Any) -> None:
        patches.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, new)

    def timed(owner: Any, attr: str, part: str) -> None:
        patch(owner, attr, timers.wrap(part, getattr(owner, attr)))

    on_pre_optimizer_step = StabilityCallback.on_pre_optimizer_step

    def guarded_step(self: StabilityCallback, *args: Any, **kwargs: Any) -> None:
        with timers.callback():
            on_pre_optimizer_step(self, *args, **kwargs)

    timed(trl_adapter, "add_metric_values", "collect")  # per micro-batch, in the loss (from the logged metrics)
    timed(trl_adapter, "collect_step_stats", "collect")  # per micro-batch with vLLM's log-probs
    timed(trl_guard, "collect_step_stats", "collect")  # per step, in the callback
    timed(StepStats, "reduce", "reduce")
    timed(Guard, "observe", "observe")
    timed(Guard, "apply", "apply")  # the decision carried out on the actuator
    patch(StabilityCallback, "on_pre_optimizer_step", guarded_step)
    patch(torch.nn.utils, "clip_grad_norm_", timers.wrap("clip", torch.nn.utils.clip_grad_norm_, only_in_callback=True))
    try:
        yield
    finally:
        for owner, attr, old in reversed(patches):
            setattr(owner, attr, old)


def train(model_dir: Path, out: Path, guard: str | None, steps: int, completion_length: int) -> Timers:
    timers = Timers()
    run = {**RUN, "max_completion_length": completion_length}
    args = GuardedGRPOConfig(output_dir=str(out), guard=guard, max_steps=steps, **run)
    trainer = GuardedGRPOTrainer(
        model=str(model_dir),
        reward_funcs=addition_reward,
        args=args,
        train_dataset=addition_dataset(8 * steps),
        callbacks=[StepClock(timers)],
    )
    trainer.remove_callback(PrinterCallback)  # no log line per step on stdout
    with instrumented(timers):
        trainer.train()
    return timers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat of 3 steps, for CI")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per training (default 12; quick 3)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved pairs of trainings (default 3)")
    parser.add_argument(
        "--max-completion-length",
        type=int,
        default=RUN["max_completion_length"],
        help="a bigger step (the guard's cost is fixed)",
    )
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="thread CPU time or wall time")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    cli = parser.parse_args()
    steps = cli.steps or (3 if cli.quick else 12)
    repeats = cli.repeats or (1 if cli.quick else 3)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    Timers.clock = time.thread_time if cli.clock == "cpu" else time.perf_counter

    step_ms: dict[str, list[float]] = {"none": [], "default": []}
    parts_ms: dict[str, list[float]] = {p: [] for p in PARTS}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_llama(Path(tmp) / "model")
        for r in range(repeats):
            for guard in (None, "default"):
                timers = train(model_dir, Path(tmp) / f"{guard}-{r}", guard, steps, cli.max_completion_length)
                step_ms["none" if guard is None else "default"] += [1e3 * s for s in timers.step_seconds[1:]]
                if guard is not None:
                    for record in timers.steps[1:]:
                        for part in PARTS:
                            parts_ms[part].append(1e3 * record.get(part, 0.0))

    median_none, median_guard = statistics.median(step_ms["none"]), statistics.median(step_ms["default"])
    part_median = {p: statistics.median(v) for p, v in parts_ms.items()}
    guard_ms = [sum(parts_ms[p][i] for p in PARTS if p != "clip") for i in range(len(parts_ms["collect"]))]
    overhead_ms = statistics.median(guard_ms)
    result = {
        "clock": cli.clock,
        "steps_per_training": steps,
        "max_completion_length": cli.max_completion_length,
        "repeats": repeats,
        "step_ms_no_guard": median_none,
        "step_ms_guard": median_guard,
        "side_by_side_difference_pct": 100.0 * (median_guard - median_none) / median_none,
        "guard_ms_per_step": overhead_ms,
        "guard_pct_of_step": 100.0 * overhead_ms / median_guard,
        "parts_ms": part_median,
    }

    console = Console(width=140)
    title = f"guard overhead per optimizer step, {cli.clock} time (tiny TRL step, {repeats} x {steps} steps per side)"
    table = Table(title=title)
    for col in ("measure", "ms per step", "% of a guarded step"):
        table.add_column(col, justify="right")
    table.add_row("step, guard=None (median)", f"{median_none:.2f}", "")
    table.add_row("step, guard='default' (median)", f"{median_guard:.2f}", "")
    table.add_row("difference, side by side", f"{median_guard - median_none:+.2f}", "")
    for part in PARTS:
        label = "clip (replaces the trainer's own)" if part == "clip" else part
        table.add_row(f"  {label}", f"{part_median[part]:.3f}", f"{100 * part_median[part] / median_guard:.3f}")
    table.add_row(
        "guard total (collect+reduce+observe+apply)", f"{overhead_ms:.3f}", f"{result['guard_pct_of_step']:.3f}"
    )
    console.print(table)
    if cli.json is not None:
        cli.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
