"""The import rule of ``docs/design.md`` ("Layers"): import-linter's contracts in ``pyproject.toml`` hold
(``make lint`` runs the same ``lint-imports``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    pytest.importorskip("importlinter", reason="import-linter is in the dev extra")
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "lint-imports not found next to the interpreter"
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
