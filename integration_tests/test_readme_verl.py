"""The README's verl quick start, run as written on the CPU harness: its ``python -m rlguard.adapters.verl.main_ppo``
and its overrides, with ``<your verl overrides>`` filled by the tiny example's and the CPU's (and 2 steps)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl")

from verl_main_ppo_run import launch

from rlguard.verl_cpu.example import write_example
from tests.helpers.readme_blocks import block, commands  # the README's blocks, shared with tests/project/test_readme.py

pytestmark = pytest.mark.slow


def test_readme_verl_quick_start_trains_guarded(tmp_path: Path) -> None:
    example = write_example(tmp_path / "example")
    ((python, flag, entry, *overrides),) = commands(block("verl"), {"your verl overrides": []})
    assert (python, flag) == ("python", "-m")
    run = launch(example, tmp_path / "run", [*overrides, "trainer.total_training_steps=2"], entry=entry)
    assert run.returncode == 0, run.log[-8000:]
    steps = run.steps()
    assert [s["training/global_step"] for s in steps] == [1, 2], run.log[-4000:]
    # the guard judged each step on the driver (its action is logged), the workers ran the guarded rlguard.gspo loss
    assert all("rlguard/guard/action" in s for s in steps)
    assert all("actor/rlguard/guard/clip_low" in s and "actor/rlguard/seq_ratio_max" in s for s in steps)
