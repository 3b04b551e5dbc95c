"""The scripted decisions of ``tests/guards/actuation/test_executor.py`` through TRL's actuators on two processes: DDP
(``TrainerActuator``), DeepSpeed ZeRO-2 and ZeRO-3 (``ZeroActuator``), one ``torchrun`` launch of
``trl_guard_deepspeed_worker.py`` (runs ``script``, ``2/script``, ``3/script``).

Checked for each: both ranks identical; a skipped or halted step leaves the full weights bit-identical; the rollback
restores the weights of the snapshot taken before step 1's update (the initial weights), bit for bit; the
objective's controls after each step; training stops at the halt. Across actuators: the weights after every step
agree with DDP's (sums of the weights and of their squares to 1e-6 relative: ZeRO reduces in another order).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("deepspeed")

import test_trl_guard_deepspeed as guard_runs  # the launch helper and fixtures (module import: no tests)

pytestmark = [pytest.mark.slow]

deepspeed_ops_built = guard_runs.deepspeed_ops_built
model_dir = guard_runs.model_dir
RUNS = ("script", "2/script", "3/script")  # without DeepSpeed first: accelerate's state stays on DeepSpeed after


@pytest.fixture(scope="module")
def results(model_dir: Path, tmp_path_factory: pytest.TempPathFactory, deepspeed_ops_built: None) -> dict[str, Any]:
    return guard_runs.launch(model_dir, tmp_path_factory.mktemp("script"), ",".join(RUNS))


@pytest.mark.parametrize("run", RUNS)
def test_each_actuator_carries_out_the_script(results: dict[str, Any], run: str) -> None:
    result = results[run]
    trace = {row["step"]: row for row in result["trace"]}
    assert result["steps"] == 6 and sorted(trace) == [1, 2, 3, 4, 5, 6]  # halted at step 6
    assert trace[1]["digest"] != result["initial"] and trace[2]["digest"] != trace[1]["digest"]  # steps taken
    assert trace[3]["digest"] == trace[2]["digest"]  # skipped: weights bit-identical
    assert trace[4]["digest"] != trace[3]["digest"]
    assert trace[5]["digest"] == result["initial"]  # rolled back to the snapshot before step 1's update
    assert trace[6]["digest"] == trace[5]["digest"]  # halted: the step's update dropped
    low, high, entropy = trace[1]["controls"]
    assert trace[2]["controls"] == pytest.approx([low * 0.5, high * 0.5, entropy], rel=1e-12)
    assert trace[4]["controls"] == pytest.approx([low, high * 2.0, 0.02], rel=1e-12)
    assert trace[5]["controls"] == pytest.approx([low, high, entropy], rel=1e-12)


@pytest.mark.parametrize("run", ["2/script", "3/script"])
def test_zero_actuators_move_the_weights_as_ddp_does(results: dict[str, Any], run: str) -> None:
    ddp, zero = results["script"]["trace"], results[run]["trace"]
    for a, b in zip(ddp, zero, strict=True):
        assert b["sum"] == pytest.approx(a["sum"], rel=1e-6, abs=1e-6 * math.sqrt(a["sumsq"])), a["step"]
        assert b["sumsq"] == pytest.approx(a["sumsq"], rel=1e-6), a["step"]
        assert b["controls"] == a["controls"]
