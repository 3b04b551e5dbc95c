"""The command line starts without torch or a training framework: `--version`, `detectors`, `losses`, `doctor`,
`report` and `watch` import neither (each in a fresh interpreter, what it left in ``sys.modules`` after the command
ran). `benchmarks/cli_startup.py` times them against ``python -c pass``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.doctor_logs import write_log
from tests.helpers.synthetic import failing_stream, healthy_stream

ROOT = Path(__file__).resolve().parents[2]
#: torch and every framework the adapters wrap; none may be imported by the commands that only read logs
HEAVY = ("torch", "trl", "transformers", "accelerate", "deepspeed", "verl", "ray", "wandb")

# Runs the command in this interpreter (as the console script does), then writes which heavy modules are loaded.
_PROBE = f"""
import json, sys
out, args = sys.argv[1], sys.argv[2:]
code = 0
try:
    from rlguard.cli import app
    app(args, prog_name="rlguard")
except SystemExit as exit_:
    code = exit_.code or 0
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
with open(out, "w") as fh:
    json.dump({{"code": code, "heavy": heavy, "numpy": "numpy" in sys.modules}}, fh)
"""


def _probe(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "probe.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), *args], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.exists(), proc.stderr[-3000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TRL output folder whose log ends in an entropy collapse (the doctor's critical path runs)."""
    folder = tmp_path_factory.mktemp("run")
    write_log("trl", failing_stream("entropy_collapse", steps=120, onset=60, seed=0), folder)
    return folder


def test_doctor_imports_no_torch(tmp_path: Path, trl_run: Path) -> None:
    result = _probe(tmp_path, "doctor", str(trl_run))
    assert result["code"] == 1  # the collapse was judged critical: the whole diagnosis ran
    assert result["heavy"] == []


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["detectors"],
        ["detectors", "--json"],
        ["doctor", "--json", "LOG"],
        ["watch", "--once", "LOG"],
        ["losses"],
        ["losses", "--json"],
    ],
)
def test_read_only_commands_import_no_torch(tmp_path: Path, trl_run: Path, args: list[str]) -> None:
    args = [str(trl_run) if a == "LOG" else a for a in args]
    result = _probe(tmp_path, *args)
    assert result["code"] in (0, 1), result
    assert result["heavy"] == []


def test_version_imports_neither_numpy_nor_the_guard(tmp_path: Path) -> None:
    assert _probe(tmp_path, "--version") == {"code": 0, "heavy": [], "numpy": False}


def test_report_imports_no_torch(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_log("verl", healthy_stream(40, seed=1), folder)
    result = _probe(tmp_path, "report", str(folder), "--out", str(tmp_path / "report"))
    assert result["code"] == 0 and result["heavy"] == []
    assert (tmp_path / "report" / "report.html").exists()


def test_the_probe_sees_torch_where_a_command_needs_it(tmp_path: Path) -> None:
    """`rlguard bench collapse` trains, so it imports torch: the probe above can fail."""
    result = _probe(tmp_path, "bench", "collapse", "--help")
    assert result["code"] == 0 and "torch" in result["heavy"]  # type: ignore[operator]


def test_cli_startup_benchmark_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cli_startup.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "python -c pass" in proc.stdout and "rlguard --version" in proc.stdout
