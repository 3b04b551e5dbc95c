"""Identical decisions on both ranks of a 2-process gloo run whose local data differ."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlguard.guards import StepStats, collect_step_stats

WORKER = Path(__file__).resolve().parents[2] / "helpers" / "guard_ddp_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_both_ranks_reduce_the_same_stats_and_take_the_same_decisions(tmp_path: Path) -> None:
    out = tmp_path / "log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(WORKER),
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    assert r0 == r1  # stats, actions and events bit-identical on both ranks
    assert r0[40]["action"] == "skip_step" and r0[40]["stats"]["nonfinite"] == 1.0  # only rank 1 was poisoned
    assert all(step["action"] != "skip_step" for i, step in enumerate(r0) if i != 40)

    # the reduced stats equal the stats of both ranks' data taken together
    from rlguard.core_losses import get_objective
    from tests.helpers.guard_ddp_worker import local_batch

    objective = get_objective("grpo", on_nonfinite="mask")
    for step in (0, 17):
        st = StepStats()
        for rank in (0, 1):
            batch, rewards, lengths = local_batch(step, rank)
            collect_step_stats(batch=batch, output=objective(batch), rewards=rewards, lengths=lengths, stats=st)
        local = st.reduce()
        for name in (
            "entropy",
            "kl_old",
            "ratio_max",
            "ratio_min",
            "clip_frac",
            "reward_mean",
            "reward_std",
            "length_mean",
            "length_max",
        ):
            if name in local:
                assert math.isclose(r0[step]["stats"][name], local[name], rel_tol=1e-12), (step, name)
    assert torch.distributed.is_available()
