"""verl's own training code on CPU with ``loss_mode=rlguard.gspo``: one process, then two.

``verl_worker.py`` builds verl's ``TrainingWorker`` (FSDP2 engine, gloo) from verl's own ``ppo_trainer.yaml``
with command-line overrides, computes pi_old's log-probs with ``infer_batch`` and runs ``train_mini_batch``:
two mini-batches of 4 sequences, each in micro-batches of 1 per rank, through verl's ``ppo_loss``. Under
``torchrun --nproc_per_node=2`` every rank holds half of each mini-batch; the loss of each optimizer step and the
gradient norm must be those of one process, which they are only if the loss honours ``global_batch_info``.

Takes about 1.5 minutes on 2 cores (two torchrun launches at once, mostly verl's import time).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="needs verl (pip install 'rlguard[verl]')")

WORKER = Path(__file__).with_name("verl_worker.py")
TIMEOUT_S = 420


def launch(nproc: int, out: Path, objective: str = "gspo", clip: str | None = None) -> subprocess.Popen[str]:
    """torchrun with a free rendezvous port (``--standalone``), run in the output's folder."""
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", WORKER, out],
        cwd=out.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **os.environ,
            "RLGUARD_VERL_OBJECTIVE": objective,
            **({} if clip is None else {"RLGUARD_VERL_CLIP": clip}),
        },
    )


def finish(process: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    try:
        log, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        log, _ = process.communicate()
        pytest.fail(f"torchrun did not finish in {TIMEOUT_S} s:\n{log[-6000:]}")
    assert process.returncode == 0, log[-6000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.slow
def test_gspo_one_process_equals_two(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    outs = [tmp_path / "one" / "out.json", tmp_path / "two" / "out.json"]
    # clip range 1e-3: this setup's sequence ratios (0.991, 1.005) stay inside verl's default 0.02/0.03, so GSPO's clip
    # would never act and the parity below would not cover it
    processes = [launch(nproc, out, clip="0.001") for nproc, out in zip((1, 2), outs, strict=True)]  # at once
    one, two = (finish(process, out) for process, out in zip(processes, outs, strict=True))
    assert (one["world_size"], two["world_size"]) == (1, 2)
    m1, m2 = one["metrics"], two["metrics"]

    # rlguard's loss ran (its canonical metrics are there) and did something
    assert len(m1["loss"]) == len(m2["loss"]) == 2  # two optimizer steps
    assert "rlguard/seq_ratio_max" in m1
    assert all(math.isfinite(v) and v > 1e-3 for v in m1["grad_norm"])
    assert max(m1["actor/pg_clipfrac"]) > 0  # GSPO's clip acts on some sequences

    # one optimizer step over 2 ranks = the same step on 1 process (float32 model)
    for key in ("loss", "grad_norm", "actor/pg_loss", "actor/ppo_kl"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
    assert m2["actor/pg_clipfrac"] == m1["actor/pg_clipfrac"]
    print(f"TRL installed beside verl: {one['trl']}")
    for run in (one, two):
        print(
            f"{run['world_size']} process(es): engine built in {run['build_s']:.1f} s, update {run['update_s']:.1f} s"
        )


@pytest.mark.slow
def test_dppo_tv_one_process_equals_two(tmp_path: Path) -> None:
    """An objective of the TRL/verl union in verl's own training code: rlguard.dppo_tv (token-local, so one
    process and two take the same step when the loss honours global_batch_info)."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    outs = [tmp_path / "one" / "out.json", tmp_path / "two" / "out.json"]
    processes = [launch(nproc, out, "dppo_tv") for nproc, out in zip((1, 2), outs, strict=True)]
    one, two = (finish(process, out) for process, out in zip(processes, outs, strict=True))
    m1, m2 = one["metrics"], two["metrics"]
    assert len(m1["loss"]) == len(m2["loss"]) == 2
    assert "rlguard/kl_old" in m1
    assert all(math.isfinite(v) and v > 1e-3 for v in m1["grad_norm"])
    for key in ("loss", "grad_norm", "actor/pg_loss", "actor/ppo_kl"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
