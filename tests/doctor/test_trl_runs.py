"""`benchmarks/trl_failure_runs.py --quick`: real TRL runs of the tiny model, one healthy and one with a x100
learning-rate spike; the doctor must pass the first (exit 0) and flag the second critical (exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_real_trl_runs_healthy_and_lr_spike(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "trl_failure_runs.py"), "--out", str(tmp_path), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert "| 0 | yes |" in rows["healthy"], rows["healthy"]
    assert "critical" in rows["lr_spike"] and "| 1 | yes |" in rows["lr_spike"], rows["lr_spike"]
    assert (tmp_path / "lr_spike" / "trainer_state.json").is_file()
