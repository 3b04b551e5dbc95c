"""Training logs in each format the doctor reads, written from synthetic canonical streams.

The key names are written out here from the frameworks' sources (not imported from ``rlguard.doctor.keys``), so a
wrong entry in the doctor's table fails the tests. Steps count from 1, as TRL's ``global_step`` and verl's do.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

Stream = list[dict[str, float]]

#: canonical -> TRL GRPOTrainer key; stats TRL does not log come as the TRL adapter's ``rlguard/<name>``
TRL_KEYS = {
    "loss": "loss",
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "entropy": "entropy",
    "grad_norm": "grad_norm",
    "kl_ref": "kl",
    "clip_frac": "clip_ratio/region_mean",
    "length_mean": "completions/mean_length",
    "truncated_frac": "completions/clipped_ratio",
    "frac_zero_std_groups": "frac_reward_zero_std",
    "lr": "learning_rate",
}
#: canonical -> verl key; stats verl does not log come as the verl adapter's ``rlguard/<name>``
VERL_KEYS = {
    "loss": "actor/pg_loss",
    "reward_mean": "critic/score/mean",
    "entropy": "actor/entropy",
    "grad_norm": "actor/grad_norm",
    "kl_ref": "actor/kl_loss",
    "kl_old": "actor/ppo_kl",
    "clip_frac": "actor/pg_clipfrac",
    "length_mean": "response_length/mean",
    "truncated_frac": "response_length/clip_ratio",
    "mismatch_kl": "rollout_corr/k3_kl",
    "lr": "actor/lr",
}


def renamed(stats: dict[str, float], keys: dict[str, str]) -> dict[str, float]:
    return {keys.get(k, f"rlguard/{k}"): v for k, v in stats.items()}


def write_trainer_state(stream: Stream, path: Path) -> Path:
    """TRL's ``trainer_state.json``: a training row per step, an eval-only row every 50 steps, the final summary."""
    history: list[dict[str, float]] = []
    for i, stats in enumerate(stream, start=1):
        history.append({"epoch": i / len(stream), "step": i, **renamed(stats, TRL_KEYS), "num_tokens": 100.0 * i})
        if i % 50 == 0:
            history.append({"epoch": i / len(stream), "step": i, "eval_loss": 0.5, "eval_runtime": 1.0})
    history.append({"epoch": 1.0, "step": len(stream), "train_runtime": 12.0, "train_loss": 0.1, "total_flos": 0.0})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"global_step": len(stream), "log_history": history}, indent=2), encoding="utf-8")
    return path


def write_verl_jsonl(stream: Stream, path: Path) -> Path:
    """verl's file logger: ``{"step": .., "data": {..}}``; orjson writes NaN as null, as verl's logger does."""
    with path.open("w", encoding="utf-8") as fh:
        for i, stats in enumerate(stream, start=1):
            data = {k: (v if math.isfinite(v) else None) for k, v in renamed(stats, VERL_KEYS).items()}
            data |= {"timing_s/gen": 1.5, "training/global_step": i, "critic/score/max": 1.0}
            fh.write(json.dumps({"step": i, "data": data}) + "\n")
    return path


def verl_line(step: int, stats: dict[str, float]) -> str:
    """One line of verl's file logger for ``step``, written out with no rounding."""
    return json.dumps({"step": step, "data": renamed(stats, VERL_KEYS)}) + "\n"


def append_verl(
    path: Path, stream: list[dict[str, float]], pause: float, torn_every: int = 0, first_step: int = 1
) -> None:
    """Append ``stream`` one verl record at a time, from step ``first_step``; every ``torn_every``-th line in two
    writes with a pause between them, so a reader meets a torn last line."""
    with path.open("a", encoding="utf-8") as fh:
        for step, stats in enumerate(stream, start=first_step):
            line = verl_line(step, stats)
            if torn_every and step % torn_every == 0:
                fh.write(line[: len(line) // 2])
                fh.flush()
                time.sleep(3 * pause)
                line = line[len(line) // 2 :]
            fh.write(line)
            fh.flush()
            time.sleep(pause)


def write_flat_jsonl(stream: Stream, path: Path) -> Path:
    """One ``{"step": .., <canonical name>: value}`` per line, as ``StabilityCallback.history`` dumped."""
    with path.open("w", encoding="utf-8") as fh:
        for i, stats in enumerate(stream, start=1):
            fh.write(json.dumps({"step": i, **stats}) + "\n")
    return path


def write_wandb_csv(stream: Stream, path: Path) -> Path:
    """wandb's history export of a TRL run: ``train/<key>``, ``train/global_step``, ``_step``; eval columns are
    empty on training rows (gaps)."""
    rows = []
    for i, stats in enumerate(stream, start=1):
        row = {f"train/{k}": repr(v) for k, v in renamed(stats, TRL_KEYS).items()}
        rows.append({"_step": str(i - 1), "_runtime": str(2.0 * i), "train/global_step": str(i), **row})
        rows[-1]["eval/loss"] = "0.5" if i % 50 == 0 else ""
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_tensorboard(stream: Stream, path: Path) -> Path:
    """A TensorBoard folder of scalar summaries under verl's keys, one event per step holding all its scalars (as
    valid as ``SummaryWriter.add_scalar``'s one event per scalar, and faster to write)."""
    from tensorboard.compat.proto.summary_pb2 import Summary  # type: ignore[import-untyped]
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(path))
    for i, stats in enumerate(stream, start=1):
        values = [Summary.Value(tag=k, simple_value=v) for k, v in renamed(stats, VERL_KEYS).items()]
        writer.file_writer.add_summary(Summary(value=values), i)  # type: ignore[attr-defined]  # typed None until the writer opens
    writer.close()
    return path


#: format -> (writer, file name)
WRITERS: dict[str, tuple[Callable[[Stream, Path], Path], str]] = {
    "trl": (write_trainer_state, "trainer_state.json"),
    "verl": (write_verl_jsonl, "metrics.jsonl"),
    "jsonl": (write_flat_jsonl, "history.jsonl"),
    "wandb-csv": (write_wandb_csv, "wandb_export.csv"),
    "tensorboard": (write_tensorboard, "tb"),
}


def write_log(fmt: str, stream: Stream, folder: Path) -> Path:
    """Write ``stream`` in format ``fmt`` into ``folder``; return the file (or TensorBoard folder)."""
    writer, name = WRITERS[fmt]
    folder.mkdir(parents=True, exist_ok=True)
    return writer(stream, folder / name)


def shaped_stream(steps: int, seed: int, **shapes: Callable[[int], float]) -> Stream:
    """A TRL-like run of ``steps`` steps: noisy healthy stats (gradient norm, loss, entropy, lengths, KL to the
    reference growing slowly), with each stat named in ``shapes`` given by its function of the step index
    (``reward_mean=lambda i: ...``). Noise comes from ``seed``; the shapes are written out by each test."""
    rng = np.random.default_rng(seed)
    out: Stream = []
    for i in range(steps):
        t = i / max(steps - 1, 1)
        row = {
            "loss": float(rng.normal(0, 0.02)),
            "reward_mean": float(0.2 + 0.6 * t + rng.normal(0, 0.04)),
            "reward_std": float(abs(0.3 + rng.normal(0, 0.02))),
            "entropy": float(0.8 * (1 - 0.3 * t) * math.exp(rng.normal(0, 0.04))),
            "grad_norm": float(0.5 * math.exp(rng.normal(0, 0.25))),
            "kl_ref": float((2e-3 + 0.04 * t) * math.exp(rng.normal(0, 0.2))),
            "length_mean": float(200 * (1 + 0.2 * t) * math.exp(rng.normal(0, 0.05))),
            "truncated_frac": float(rng.binomial(64, 0.02) / 64),
            "frac_zero_std_groups": float(rng.binomial(16, 0.1) / 16),
            "clip_frac": float(0.02 * math.exp(rng.normal(0, 0.3))),
            "lr": 1e-6,
        }
        for name, shape in shapes.items():
            row[name] = float(shape(i))
        out.append(row)
    return out
