"""The README's before/after plot: one real TRL run (tiny Llama, CPU) three ways, an LR spike injected at one step.

- ``clean``: no fault, no guard (the reference curve);
- ``fault, no guard``: a x1000 learning rate at optimizer step ``--at`` on a stock ``trl.GRPOTrainer``;
- ``fault, guard``: the same fault on ``GuardedGRPOTrainer`` with the ``strict`` preset (short warm-ups), which
  detects the entropy collapse and rolls model and optimizer back to the last healthy snapshot.

It prints a table (entropy and largest |weight| before and after the fault, the guard's actions) and writes a PNG
with the per-step entropy and largest |weight| of the three runs.

    .venv/bin/python benchmarks/guard_before_after.py --out docs/images/guard_before_after.png

The fault injectors and the short-warm-up guard are the integration tests' (``integration_tests/trl_guard_faults.py``),
so the plot shows the run those tests check.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from rich.console import Console
from rich.table import Table
from transformers import PrinterCallback, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration_tests"))
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer
from trl_guard_faults import RUN, build, guard_config

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.tasks.hf import save_tiny_llama


class WeightTrace(TrainerCallback):  # type: ignore[misc]
    """The largest |weight| after every optimizer step (inf once any weight is non-finite)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        params = [p.detach() for p in model.parameters()]
        finite = all(bool(torch.isfinite(p).all()) for p in params)
        self.values.append(max(float(p.abs().max()) for p in params) if finite else float("inf"))


def run(kind: str, model_dir: Path, out: Path, steps: int, at: int) -> dict[str, Any]:
    trace = WeightTrace()
    start = time.perf_counter()
    if kind == "fault, guard":
        args: Any = GuardedGRPOConfig(output_dir=str(out), guard=guard_config("strict"), max_steps=steps, **RUN)
        trainer = build(GuardedGRPOTrainer, model_dir, args, "lr", at, callbacks=[trace])
    else:
        args = GRPOConfig(output_dir=str(out), max_steps=steps, **RUN)
        trainer = build(
            GRPOTrainer, model_dir, args, "lr" if kind == "fault, no guard" else None, at, callbacks=[trace]
        )
    trainer.remove_callback(PrinterCallback)  # disable_tqdm=True prints every log record otherwise
    try:
        trainer.train()
    except RuntimeError as err:  # a non-finite policy cannot sample: the run ends there
        print(f"{kind}: stopped at step {trainer.state.global_step}: {str(err)[:80]}")
    logs = [r for r in trainer.state.log_history if "entropy" in r and "train_runtime" not in r]
    return {
        "steps": [int(r["step"]) for r in logs],
        "entropy": [float(r["entropy"]) for r in logs],
        "reward": [float(r["reward"]) for r in logs],
        "weight_abs_max": trace.values[: len(logs)],
        "rolled_back": [int(r["step"]) for r in logs if "rlguard/guard/rollback_to" in r],
        "skipped": [int(r["step"]) for r in logs if r.get("rlguard/guard/skipped")],
        "wall_s": time.perf_counter() - start,
    }


def plot(runs: dict[str, dict[str, Any]], at: int, path: Path) -> None:
    colours = {"clean": "tab:gray", "fault, no guard": "tab:red", "fault, guard": "tab:blue"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, r in runs.items():
        style = {"color": colours[name], "label": name, "marker": "o", "markersize": 3}
        axes[0].plot(r["steps"], r["entropy"], **style)
        axes[1].plot(r["steps"], r["weight_abs_max"], **style)
        for step in r["rolled_back"]:
            for ax in axes:
                ax.axvline(step, color=colours[name], linestyle=":", linewidth=1)
    for ax, title in zip(axes, ("policy entropy (nats/token)", "largest |weight|"), strict=True):
        ax.axvline(at, color="black", linewidth=0.8, alpha=0.5)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
    axes[0].annotate("x1000 LR", (at, axes[0].get_ylim()[1]), ha="left", va="top", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle("TRL GRPOTrainer, tiny Llama: LR spike at one step; dotted = guard's rollback", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps per run")
    parser.add_argument("--at", type=int, default=4, help="the optimizer step with the LR spike (>= 2)")
    parser.add_argument("--out", type=Path, default=Path("guard_before_after.png"), help="the PNG to write")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_llama(Path(tmp) / "model")
        runs = {
            kind: run(kind, model_dir, Path(tmp) / kind.replace(", ", "-").replace(" ", "_"), opts.steps, opts.at)
            for kind in ("clean", "fault, no guard", "fault, guard")
        }
    plot(runs, opts.at, opts.out)
    table = Table(title=f"LR x1000 at step {opts.at} of {opts.steps} (TRL GRPOTrainer, tiny Llama, CPU)")
    for col in ("run", "entropy before", "entropy at end", "max |w| at end", "guard actions", "wall s"):
        table.add_column(col, justify="right" if col != "run" else "left")
    for name, r in runs.items():
        before = r["entropy"][opts.at - 2] if len(r["entropy"]) >= opts.at - 1 else float("nan")
        actions = ", ".join([f"rollback@{s}" for s in r["rolled_back"]] + [f"skip@{s}" for s in r["skipped"]]) or "-"
        table.add_row(
            name, f"{before:.3f}", f"{r['entropy'][-1]:.3f}", f"{r['weight_abs_max'][-1]:.3g}", actions,
            f"{r['wall_s']:.0f}",
        )  # fmt: skip
    Console(width=150).print(table)
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
