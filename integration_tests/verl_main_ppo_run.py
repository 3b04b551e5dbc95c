"""Launch ``python -m <entry> <overrides>`` (verl's stock ``verl.trainer.main_ppo`` or rlguard's guarded one) on
the CPU harness with the tiny example, and read what it logged: the helper of test_verl_main_ppo.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # verl imports ray.experimental.state, deprecated by Ray
    from rlguard.verl_cpu import cpu_environment, cpu_overrides
    from rlguard.verl_cpu.example import example_overrides

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900


@dataclass
class Run:
    """One launch: exit code, combined output, the file logger's records and the wall time."""

    returncode: int
    log: str
    records: list[dict[str, Any]]
    wall_s: float

    def steps(self) -> list[dict[str, Any]]:
        """The training steps' metrics, in order (records with ``training/global_step``)."""
        return [r["data"] for r in self.records if "training/global_step" in r["data"]]


def launch(
    example: Path,
    out: Path,
    overrides: list[str],
    *,
    entry: str = "verl.trainer.main_ppo",
    workers: int = 1,
    name: str = "run",
    env: dict[str, str] | None = None,
) -> Run:
    """Run ``entry`` in ``out`` (created) with the example's and the CPU harness's overrides, then ``overrides``;
    verl's file logger writes ``out/<name>.jsonl``, the output goes to ``out/<name>.log``. ``env``: the
    environment to start from (default this process's; e.g. one with a plugin installed on its ``PYTHONPATH``)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**(os.environ if env is None else env), **cpu_environment(), "OMP_NUM_THREADS": "1"}
    env["TOKENIZERS_PARALLELISM"] = "false"
    paths = (str(REPO), str(REPO / "integration_tests"), env.get("PYTHONPATH", ""))  # the scripted guard's module
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["VERL_FILE_LOGGER_PATH"] = str(out / f"{name}.jsonl")
    args = [
        *example_overrides(example),
        *cpu_overrides(workers),
        f"trainer.default_local_dir={out / 'checkpoints'}",
        *overrides,
    ]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", entry, *args],
            cwd=out,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT_S,
        )
        returncode, log = done.returncode, done.stdout
    except subprocess.TimeoutExpired as err:
        returncode, log = -9, str(err.stdout or "") + f"\n[timed out after {TIMEOUT_S} s]"
    (out / f"{name}.log").write_text(log)
    path = out / f"{name}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return Run(returncode, log, records, time.perf_counter() - start)


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor of a (nested) checkpoint object, in order, as plain local tensors."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return [local.detach().cpu()]
    if isinstance(obj, dict):
        return [t for key in sorted(obj, key=str) for t in _tensors(obj[key])]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in _tensors(value)]
    return []


def checkpoint_state(folder: Path) -> dict[str, list[torch.Tensor]]:
    """The actor's model and optimizer tensors saved in verl checkpoint ``folder`` (``global_step_<N>``)."""
    state = {}
    for path in sorted((folder / "actor").glob("*.pt")):
        if path.name.startswith(("model_", "optim_")):
            state[path.name] = _tensors(torch.load(path, map_location="cpu", weights_only=False))
    assert state, (
        f"no model/optimizer files in {folder / 'actor'}: {sorted(p.name for p in (folder / 'actor').iterdir())}"
    )
    return state
