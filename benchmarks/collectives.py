"""Collectives per optimizer step under 2-process gloo: stock TRL's metric logging against rlguard's guard.

    python benchmarks/collectives.py            # 6 optimizer steps per trainer (about a minute)
    python benchmarks/collectives.py --quick    # 2 steps

Starts ``torchrun --nproc_per_node 2`` (gloo, CPU) on this file. Each rank wraps the collectives of
``torch.distributed`` (``all_reduce``, ``all_gather``, ``all_gather_object``, ``broadcast``, ``gather``,
``reduce``, ...; a collective called inside another one counts once) and trains, on the tiny Llama, a stock
``trl.GRPOTrainer``, a ``GuardedGRPOTrainer`` without a guard, and one with ``guard="default"``. Calls are counted
from the first ``on_step_begin`` to the end of training and attributed to the first caller outside torch and
accelerate: TRL, transformers' Trainer, rlguard's guard (``StabilityCallback``, ``StepStats.reduce``) or rlguard's
adapter. DDP's gradient all-reduce runs in C++ buckets, identical in every variant, and is not counted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)
VARIANTS = ("stock TRL", "GuardedGRPOTrainer, guard=None", "GuardedGRPOTrainer, guard='default'")
SOURCES = ("trl", "transformers", "rlguard guard", "rlguard adapter", "other")


# ---------------------------------------------------------------- one rank
class Counting:
    """Counts outermost collective calls while ``active``, by function and by calling package."""

    def __init__(self) -> None:
        self.active = False
        self.by_function: Counter[str] = Counter()
        self.by_source: Counter[str] = Counter()
        self.by_caller: Counter[str] = Counter()
        self._depth = 0

    def wrap(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.active and self._depth == 0:
                self.by_function[name] += 1
                source, caller = _source(sys._getframe(1))
                self.by_source[source] += 1
                self.by_caller[caller] += 1
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted


@functools.cache
def _package_dirs() -> dict[str, str]:
    """Where each attributed package is installed (a path's folder names alone mislead: a checkout in a folder
    named ``rlguard`` holds the virtual environment's ``trl`` too)."""
    import accelerate
    import torch
    import transformers
    import trl

    import rlguard

    modules = {"rlguard": rlguard, "trl": trl, "transformers": transformers, "torch": torch, "accelerate": accelerate}
    return {name: os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep for name, m in modules.items()}


def _source(frame: Any) -> tuple[str, str]:
    """The package and function of the first caller outside torch, accelerate and this file."""
    here = os.path.abspath(__file__)
    dirs = _package_dirs()
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path != here and not path.startswith((dirs["torch"], dirs["accelerate"])):
            caller = f"{Path(path).stem}.{frame.f_code.co_name}"
            if path.startswith(dirs["rlguard"]):
                # the guard: rlguard.guards and the TRL callback that runs it
                guard = path.startswith(dirs["rlguard"] + "guards" + os.sep) or Path(path).name == "callback.py"
                return ("rlguard guard" if guard else "rlguard adapter"), caller
            for package in ("trl", "transformers"):
                if path.startswith(dirs[package]):
                    return package, caller
            return "other", caller
        frame = frame.f_back
    return "other", "?"


def install(counting: Counting) -> None:
    """Wrap every collective of ``torch.distributed`` where callers look it up."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = counting.wrap(name, original)
        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)


def worker(out: Path, steps: int) -> None:
    import torch.distributed as dist
    from transformers import PrinterCallback, TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
    from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

    warnings.simplefilter("ignore")
    counting = Counting()
    install(counting)

    class Window(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            counting.active = True

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            counting.active = False

    run: dict[str, Any] = {
        **cpu_training_arguments(),
        "use_vllm": False,
        "ddp_backend": "gloo",
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 6,
        "learning_rate": 1e-3,
        "max_steps": steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "seed": 0,
    }
    model_dir = out / "model"
    if int(os.environ["RANK"]) == 0:
        save_tiny_llama(model_dir)
    results = {}
    for variant in VARIANTS:
        counting.by_function.clear()
        counting.by_source.clear()
        counting.by_caller.clear()
        dist.barrier() if dist.is_initialized() else None
        folder = str(out / variant.replace(" ", "_"))
        if variant == "stock TRL":
            args: Any = GRPOConfig(output_dir=folder, **run)
            cls: Any = GRPOTrainer
        else:
            args = GuardedGRPOConfig(output_dir=folder, guard=None if "None" in variant else "default", **run)
            cls = GuardedGRPOTrainer
        trainer = cls(
            model=str(model_dir),
            reward_funcs=addition_reward,
            args=args,
            train_dataset=addition_dataset(16 * steps),
            callbacks=[Window()],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        results[variant] = {
            "steps": trainer.state.global_step,
            "by_function": dict(counting.by_function),
            "by_source": dict(counting.by_source),
            "by_caller": dict(counting.by_caller),
        }
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))


# ---------------------------------------------------------------- the launcher
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 optimizer steps per trainer, for CI")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per trainer (default 6; quick 2)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    cli = parser.parse_args()
    steps = cli.steps or (2 if cli.quick else 6)
    if cli.worker is not None:
        worker(cli.worker, steps)
        return

    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
            __file__, "--steps", str(steps), "--worker", tmp,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(2)]
    if ranks[0] != ranks[1]:
        raise SystemExit(f"the ranks counted different collectives: {ranks}")
    results = ranks[0]

    table = Table(
        show_lines=True, title=f"python-level collectives per optimizer step, 2 processes (gloo), {steps} steps"
    )
    for col in ("trainer", "total", *SOURCES, "by caller"):
        table.add_column(col, justify="right" if col != "by caller" else "left")
    summary: dict[str, Any] = {}
    for variant, counts in results.items():
        n = counts["steps"]
        per_source = {s: counts["by_source"].get(s, 0) / n for s in SOURCES}
        total = sum(counts["by_function"].values()) / n
        callers = "\n".join(f"{k} {v / n:g}" for k, v in sorted(counts["by_caller"].items()))
        table.add_row(variant, f"{total:g}", *(f"{per_source[s]:g}" for s in SOURCES), callers)
        summary[variant] = {"total": total, **per_source, "steps": n, "by_function": counts["by_function"]}
        summary[variant]["by_caller"] = counts["by_caller"]
    Console(width=180).print(table)
    if cli.json is not None:
        cli.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
