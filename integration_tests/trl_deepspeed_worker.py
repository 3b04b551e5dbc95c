"""One rank of ``test_trl_deepspeed.py`` (run by ``torchrun --nproc_per_node=2`` with ``DS_ACCELERATOR=cpu``).

Reads a JSON plan and trains its runs one after the other in this process (one interpreter start for all)::

    {"model": dir, "runs": [{"name": ..., "trainer": "guarded" | "stock", "deepspeed": config path,
                             "config": {GRPOConfig fields}}, ...],
     "compare": [[name_a, name_b], ...]}

``"guarded"`` is ``GuardedGRPOTrainer`` with ``GuardedGRPOConfig``, ``"stock"`` is ``trl.GRPOTrainer`` with
``GRPOConfig``; ``config`` adds to the common CPU settings below. Every run loads the tiny model saved in ``model``
with the same seed. Writes ``rank<r>.json``: per run, the ZeRO stage the engine ran, whether the weights were
partitioned, the log history, a hash of the trained weights and how far they moved; per compared pair, how far the
two runs' weight updates differ. Weights are gathered in full on every rank with
``deepspeed.zero.GatheredParameters`` (ZeRO-3 keeps one shard per rank; for ZeRO-2, whose weights are replicated,
it does nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import deepspeed
import torch
from safetensors.torch import load_file
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments

COMMON: dict[str, Any] = {
    **cpu_training_arguments(),  # use_cpu=True with DeepSpeed too: otherwise accelerate miscounts the processes
    "ddp_backend": "gloo",
    "ddp_timeout": 120,  # a collective that waits for a dead peer fails instead of hanging
    "use_vllm": False,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 4,
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "seed": 0,
}
#: log keys that measure this process's wall time, so differ between ranks
_RANK_LOCAL = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter in full (float64), on every rank: gather the ZeRO-3 shards, copy, re-partition."""
    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
        return {name: p.detach().to(torch.float64, copy=True) for name, p in params.items()}


def partitioned(model: torch.nn.Module) -> bool:
    """Whether this rank holds only a shard of every parameter (ZeRO-3)."""
    return all(hasattr(p, "ds_tensor") and p.ds_tensor.numel() < p.ds_numel for p in model.parameters())


def digest(weights: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].numpy().tobytes())
    return h.hexdigest()


def train(model_dir: str, run: dict[str, Any], out: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Train one run; return its summary and its weight updates."""
    stock = run["trainer"] == "stock"
    config_cls = GRPOConfig if stock else GuardedGRPOConfig
    trainer_cls = GRPOTrainer if stock else GuardedGRPOTrainer
    args = config_cls(output_dir=str(out / run["name"]), deepspeed=run["deepspeed"], **{**COMMON, **run["config"]})
    callback = StabilityCallback()
    start = time.perf_counter()
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=addition_reward,
        args=args,
        train_dataset=addition_dataset(64),
        callbacks=[callback],
    )
    was_partitioned = partitioned(trainer.model)
    before = full_weights(trainer.model)
    trainer.train()
    after = full_weights(trainer.model)
    seconds = time.perf_counter() - start
    saved = load_file(str(Path(model_dir) / "model.safetensors"))
    engine = trainer.model_wrapped
    logs = [
        {k: v for k, v in record.items() if k not in _RANK_LOCAL}
        for record in trainer.state.log_history
        if "loss" in record
    ]
    deltas = {name: after[name] - before[name] for name in before}
    summary = {
        "num_processes": trainer.accelerator.num_processes,
        "zero_stage": engine.zero_optimization_stage(),
        "optimizer": type(engine.optimizer).__name__,
        "partitioned": was_partitioned,
        "loaded_as_saved": max((before[n] - saved[n].double()).abs().max().item() for n in before),
        "weight_change": max(d.abs().max().item() for d in deltas.values()),
        "weights_sha256": digest(after),
        "logs": logs,
        "losses_finite": bool(logs) and all(math.isfinite(r["loss"]) for r in logs),
        "history": callback.history,
        "seconds": seconds,
    }
    return summary, deltas


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True)
    parser.add_argument("--out", required=True)
    cli = parser.parse_args()
    warnings.simplefilter("ignore")
    plan = json.loads(Path(cli.plan).read_text())
    out = Path(cli.out)
    runs: dict[str, Any] = {}
    deltas: dict[str, dict[str, torch.Tensor]] = {}
    for run in plan["runs"]:
        runs[run["name"]], deltas[run["name"]] = train(plan["model"], run, out)
    compared = {}
    for a, b in plan.get("compare", []):
        compared[f"{a}/{b}"] = {
            "scale": max(d.abs().max().item() for d in deltas[a].values()),
            "max_abs_diff": max((deltas[a][n] - deltas[b][n]).abs().max().item() for n in deltas[a]),
        }
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps({"runs": runs, "compared": compared}))


if __name__ == "__main__":
    from torchrun_exit import shut_down

    main()
    shut_down()
