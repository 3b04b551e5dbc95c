"""The benchmarks run end to end in their --quick mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_guard_detection_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "guard_detection.py"), "--quick", "--steps", "200"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "entropy_collapse" in proc.stdout and "healthy runs" in proc.stdout
    assert "missed" in proc.stdout
