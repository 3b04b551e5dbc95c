"""Data parallelism: two CPU ranks with unequal shares give the gradient of the whole batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlguard.core_losses import AGGREGATIONS

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "ddp_worker.py"
TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_ddp_gradient_equals_single_process_gradient(tmp_path: Path) -> None:
    out = tmp_path / "ddp.json"
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(WORKER), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish within {TIMEOUT_S} s:\n{exc.stderr!s}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-5000:]}"
    summary = json.loads(out.read_text())

    assert summary["world_size"] == 2
    assert summary["tokens_per_rank"] == [7.0, 16.0]  # unequal shares
    results = summary["results"]
    assert {(r["objective"], r["aggregation"]) for r in results} == {
        (name, agg) for name in ("grpo", "dapo", "gspo", "dr_grpo") for agg in AGGREGATIONS
    }
    for r in results:
        where = f"{r['objective']} / {r['aggregation']}: {r}"
        assert r["grad_max_abs"] > 1e-3, where  # a gradient worth comparing
        assert r["grad_max_abs_diff"] <= 1e-9, where
        assert r["loss_abs_diff"] <= 1e-9, where
        # each rank normalising by its own counts is measurably wrong, so the comparison can fail
        assert r["naive_grad_max_abs_diff"] > 1e-4, where
