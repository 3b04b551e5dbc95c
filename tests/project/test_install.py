"""The core installs without torch (``pyproject.toml``, ``docs/install.md``): the commands that read logs and the
guard's pure logic run where torch (or matplotlib, or pluggy in a broken install) is missing, and what needs a
missing extra says so in one line naming it. Each case runs in a fresh interpreter in which importing the missing
modules fails, as in a venv without them; ``make dist-check`` (``.ci/wheel-check``) does the same in real venvs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlguard._extras import CORE, EXTRA_OF, missing_extra, missing_extra_line
from tests.helpers.doctor_logs import write_log
from tests.helpers.synthetic import failing_stream

ROOT = Path(__file__).resolve().parents[2]

# The interpreter's import of the modules in argv[1] (comma-separated) fails, as where they are not installed.
_BLOCK = """
import importlib.abc, sys
_MISSING = set(sys.argv.pop(1).split(","))
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _MISSING:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""
# the console script (rlguard.cli:main) with argv[2:] as its arguments
_CLI = _BLOCK + "from rlguard.cli import main\nsys.argv[0] = 'rlguard'\nmain()\n"


def _run(code: str, missing: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLGUARD_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-c", code, missing, *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TRL output folder: 40 healthy steps in ``trainer_state.json``."""
    folder = tmp_path_factory.mktemp("run")
    history = [
        {"step": s, "loss": 0.01, "grad_norm": 0.5, "entropy": 0.8 - 0.001 * s, "reward": 0.2 + 0.01 * s}
        for s in range(1, 41)
    ]
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 40}))
    return folder


def test_losses_without_torch_lists_the_objectives() -> None:
    """The objectives' declarations are readable without their classes (rlguard.core_losses.catalogue)."""
    proc = _run(_CLI, "torch", "losses", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"grpo", "gspo", "dapo"} <= {row["name"] for row in json.loads(proc.stdout)}


def test_demo_without_torch_is_one_line_naming_the_extra() -> None:
    proc = _run(_CLI, "torch", "demo", "--quick")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        'rlguard demo needs torch, which comes with the torch extra: pip install "rlguard[torch]"'
    ]


@pytest.mark.parametrize("args", [["doctor", "RUN"], ["doctor", "--json", "RUN"], ["watch", "--once", "RUN"]])
def test_the_log_commands_run_without_torch_or_matplotlib(trl_run: Path, args: list[str]) -> None:
    proc = _run(_CLI, "torch,safetensors,matplotlib", *[str(trl_run) if a == "RUN" else a for a in args])
    assert proc.returncode == 0, proc.stderr[-3000:]


NO_PLOTS = 'no plots: matplotlib is not installed (it comes with the plots extra: pip install "rlguard[plots]")'


def test_report_without_matplotlib_writes_the_page_without_plots(trl_run: Path, tmp_path: Path) -> None:
    proc = _run(_CLI, "torch,matplotlib", "report", str(trl_run), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == NO_PLOTS and ": 0 plots from " in lines[0] and proc.stderr == ""
    html = (tmp_path / "report.html").read_text()
    assert NO_PLOTS.replace('"', "&quot;") in html and "<img" not in html
    # instead of the plots, each stat's range: the entropy logged falls from 0.799 to 0.76 over the 40 steps
    assert "<tr><td>entropy</td><td>40</td><td>0.799</td><td>0.76</td><td>0.76</td><td>0.799</td></tr>" in html


def test_doctor_html_without_matplotlib_writes_the_page_without_plots(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_log("trl", failing_stream("entropy_collapse", steps=120, onset=60, seed=0), folder)
    page = tmp_path / "page.html"
    proc = _run(_CLI, "torch,matplotlib", "doctor", str(folder), "--html", str(page))
    assert proc.returncode == 1, proc.stderr[-3000:]  # the collapse, judged as ever
    assert proc.stdout.strip().splitlines()[-1] == NO_PLOTS
    html = page.read_text()
    assert "entropy_collapse" in html and "<img" not in html and NO_PLOTS.replace('"', "&quot;") in html


def test_doctor_html_without_matplotlib_writes_a_real_logs_page_without_its_plots(tmp_path: Path) -> None:
    """A real log with critical findings (with matplotlib the page plots each finding's stats): without it the
    findings are judged as ever and the page says in one line why it has no plot."""
    log = ROOT.parent / "shared" / "doctor_foreign" / "chaos-economy-multiagent.trainer_state.json"
    if not log.exists():
        pytest.skip(f"no {log} (the real logs)")
    page = tmp_path / "page.html"
    proc = _run(_CLI, "torch,matplotlib", "doctor", "--html", str(page), str(log))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == NO_PLOTS
    html = page.read_text()
    assert "truncation" in html and "<img" not in html


def test_doctor_without_pluggy_says_the_install_is_broken(trl_run: Path) -> None:
    proc = _run(_CLI, "pluggy", "doctor", str(trl_run))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("rlguard doctor needs pluggy, a dependency of rlguard's core") and "broken install" in line


def test_an_unrelated_missing_module_keeps_its_traceback(trl_run: Path) -> None:
    """Only the extras' and the core's modules become one line: a bug's ModuleNotFoundError is not hidden."""
    proc = _run(_CLI, "json", "doctor", str(trl_run))
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "No module named 'json" in proc.stderr


def test_the_guards_pure_logic_runs_without_torch() -> None:
    code = _BLOCK + (
        "from rlguard.guards import Guard, GuardConfig\n"
        "guard = Guard(GuardConfig.preset('default'))\n"
        "outcomes = [guard.observe(s, {'loss': 0.1, 'grad_norm': 1e4 if s == 30 else 1.0}).outcome "
        "for s in range(1, 41)]\n"
        "print(outcomes[29], 'torch' in sys.modules)\n"
    )
    proc = _run(code, "torch,safetensors")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["skip", "False"]


@pytest.mark.parametrize(
    ("package", "name", "named"),
    [
        ("rlguard.core_losses", "get_objective", "rlguard.core_losses.get_objective"),
        ("rlguard", "PolicyBatch", "rlguard.core_losses.PolicyBatch"),  # rlguard hands out core_losses' name
        ("rlguard.guards", "StepStats", "rlguard.guards.StepStats"),
    ],
)
def test_a_torch_name_without_torch_is_an_import_error_naming_the_extra(package: str, name: str, named: str) -> None:
    code = _BLOCK + f"try:\n    from {package} import {name}\nexcept ImportError as err:\n    print(err)\n"
    proc = _run(code, "torch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == (
        f'{named} needs torch, which comes with the torch extra: pip install "rlguard[torch]"'
    )


def test_the_core_declares_no_torch_and_the_training_extras_bring_it() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {dep.split(">")[0].split("<")[0].split("=")[0] for dep in project["dependencies"]}
    assert core == {"numpy", "pluggy", "typer", "rich"}
    extras = project["optional-dependencies"]
    assert extras["torch"][0].startswith("torch") and extras["torch"][1].startswith("safetensors")
    assert extras["plots"] == ["matplotlib>=3.8"]
    for extra in ("trl", "verl", "deepspeed"):
        assert any(dep.startswith("rlguard[") and "torch" in dep for dep in extras[extra]), extra
    assert set(EXTRA_OF.values()) <= set(extras)
    assert project["scripts"]["rlguard"] == "rlguard.cli:main"


def test_missing_extra_reads_the_module_of_the_error() -> None:
    assert missing_extra(ModuleNotFoundError("x", name="torch.nn")) == "torch"
    assert missing_extra(ModuleNotFoundError("x", name="pluggy")) == "pluggy" and "pluggy" in CORE
    assert missing_extra(ModuleNotFoundError("x", name="json")) is None
    assert missing_extra(ImportError("cannot import name")) is None
    assert missing_extra_line("rlguard demo", "transformers").endswith('pip install "rlguard[trl]"')
