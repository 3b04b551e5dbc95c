"""The plugin guide's worked plugin, tested as written (``docs/examples/plugin``, shown in ``docs/guides/plugins.md``):
its package installed as a distribution with the entry points of its own ``pyproject.toml``, then used in child
processes as an author's user meets it: the detector by ``rlguard doctor`` where torch is not installed (the
objective's module never imported), the objective through ``get_objective`` against a float64 reference written here
from its formula (and announced by TRL's adapter as a plugin with its defaults), and the opt-in intervention only where
a ``GuardConfig`` names it; the guide's own code blocks likewise (its verl check runs in
tests/project/test_plugin_objective.py's verl child)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rlguard.plugins import DISABLE_AUTOLOAD_ENV
from tests.helpers.plugin_install import EXAMPLE_PLUGIN, guide_python_blocks, install_distribution

ROOT = Path(__file__).resolve().parents[2]

# the modules of argv[1] (comma-separated, "-" for none) fail to import, as where they are not installed
_BLOCK = """
import importlib.abc, json, sys
_MISSING = set(sys.argv.pop(1).split(",")) - {"-"}
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _MISSING:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's package and a ``.dist-info`` with the entry points its ``pyproject.toml`` declares."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((EXAMPLE_PLUGIN / "pyproject.toml").read_text())["project"]
    package = EXAMPLE_PLUGIN / "band_plugin"
    modules = {f"band_plugin.{path.stem}": path.read_text() for path in sorted(package.glob("*.py"))}
    folder = tmp_path_factory.mktemp("site")
    install_distribution(folder, "band_plugin", project["entry-points"], modules)
    return folder


def run_child(site: Path, code: str, *args: str, missing: str = "-") -> tuple[Any, str]:
    """``code`` (after the import blocker) in a fresh interpreter that sees the installed example; it prints one
    JSON line last. Returns that and stderr."""
    env = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join((str(site), str(ROOT)))
    proc = subprocess.run(
        [sys.executable, "-c", _BLOCK + textwrap.dedent(code), missing, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


DOCTOR = """
import contextlib, io
sys.argv = ["rlguard", "doctor", "--json", sys.argv[1]]
out, code = io.StringIO(), 0
with contextlib.redirect_stdout(out):
    try:
        from rlguard.cli import main
        main()
    except SystemExit as exit_:
        code = exit_.code or 0
loaded = sorted(m for m in sys.modules if m.startswith("band_plugin") or m == "torch")
print(json.dumps({"code": code, "report": json.loads(out.getvalue()), "loaded": loaded}))
"""


def test_the_doctor_runs_the_plugin_s_detector_without_torch(site: Path, tmp_path: Path) -> None:
    """A TRL log whose loss sits at 50 for steps 25-31: the plugin's ``loss_above`` (limit 10) finds it critical."""
    history = [
        {"step": s, "loss": 50.0 if 25 <= s < 32 else 0.01, "grad_norm": 0.5, "entropy": 0.8} for s in range(1, 61)
    ]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 60}))
    result, stderr = run_child(site, DOCTOR, str(tmp_path), missing="torch")
    # the torch-free modules (the doctor's guard replay collects the interventions too), neither objective nor torch
    assert result["loaded"] == ["band_plugin", "band_plugin.detectors", "band_plugin.interventions"], stderr
    assert result["code"] == 1  # critical
    (finding,) = result["report"]["findings"]
    assert (finding["detector"], finding["severity"], finding["step"]) == ("loss_above", "critical", 25)
    assert finding["message"].startswith("loss 50 >= 10.0")


OBJECTIVE = """
import torch
from rlguard.core_losses import PolicyBatch, get_objective

torch.manual_seed(0)
old = torch.randn(4, 6, dtype=torch.float64)  # (B, T)
new = (old + 0.3 * torch.randn(4, 6, dtype=torch.float64)).requires_grad_()  # ratios in and out of the band
mask = torch.ones(4, 6, dtype=torch.float64)
mask[1, 4:] = 0.0
adv = torch.randn(4, dtype=torch.float64)  # (B,)
out = get_objective("band_pg", band_low=0.15, band_high=0.25)(
    PolicyBatch(logprobs=new, advantages=adv, mask=mask, old_logprobs=old)
)
(grad,) = torch.autograd.grad(out.loss, new)
result = {
    "loss": float(out.loss), "grad": grad.tolist(), "clip_frac": float(out.metrics["clip_frac"]),
    "new": new.tolist(), "old": old.tolist(), "mask": mask.tolist(), "adv": adv.tolist(),
}
print(json.dumps(result))
"""


def _band_reference(new: list[list[float]], old: list[list[float]], mask: list[list[float]], adv: list[float]):
    """The guide's formula in float64 with plain Python: ``l_it = -A_i clip(r_it, 1 - 0.15, 1 + 0.25)``, token mean
    over the mask; its gradient in ``log pi`` is ``-A_i r_it / N`` inside the band, 0 outside."""
    import math

    n = sum(map(sum, mask))
    loss, grad, outside = 0.0, [], 0
    for new_i, old_i, mask_i, a in zip(new, old, mask, adv, strict=True):
        row = []
        for lp, lp_old, m in zip(new_i, old_i, mask_i, strict=True):
            r = math.exp(lp - lp_old)
            inside = 0.85 <= r <= 1.25
            loss += m * -a * min(max(r, 0.85), 1.25) / n
            row.append(m * -a * r / n if inside else 0.0)
            outside += int(m and not inside)
        grad.append(row)
    return loss, grad, outside / n


def test_the_plugin_s_objective_computes_its_formula(site: Path) -> None:
    result, _ = run_child(site, OBJECTIVE)
    loss, grad, clip_frac = _band_reference(result["new"], result["old"], result["mask"], result["adv"])
    assert 0 < clip_frac < 1  # some ratios left the band, some did not
    assert result["loss"] == pytest.approx(loss, rel=1e-12, abs=1e-15)
    assert result["clip_frac"] == pytest.approx(clip_frac, rel=1e-12)
    for got, want in zip(result["grad"], grad, strict=True):
        assert got == pytest.approx(want, rel=1e-10, abs=1e-15)


GUARD = """
from rlguard.guards import Guard, GuardConfig

preset = GuardConfig.preset("default")
result = {}
for name, config in (
    ("preset", preset),
    ("enabled", GuardConfig.preset("default", interventions={**preset.interventions, "halve_lr_on_loss": {}})),
):
    guard = Guard(config)
    acted = []
    for step in range(1, 41):
        stats = {"loss": 50.0 if 30 <= step < 33 else 0.01, "grad_norm": 0.5, "entropy": 0.8}
        decision = guard.observe(step, stats)
        if decision.reason:
            acted.append([step, decision.outcome, decision.reason, decision.controls.lr_scale])
    result[name] = {"interventions": sorted(guard.interventions), "acted": acted}
print(json.dumps(result))
"""


def test_the_opt_in_intervention_acts_only_where_a_config_names_it(site: Path) -> None:
    result, _ = run_child(site, GUARD, missing="torch")  # the guard's logic is torch-free, as the plugin's halves
    assert "halve_lr_on_loss" not in result["preset"]["interventions"] and result["preset"]["acted"] == []
    assert "halve_lr_on_loss" in result["enabled"]["interventions"]
    assert result["enabled"]["acted"] == [[step, "step", "loss too high", 0.5] for step in (30, 31, 32)]


def test_the_guide_shows_the_example_s_files_as_they_are() -> None:
    """The guide includes each file of the example (pymdownx.snippets), so what it shows is what is tested."""
    guide = (ROOT / "docs" / "guides" / "plugins.md").read_text()
    files = sorted(p.relative_to(ROOT).as_posix() for p in EXAMPLE_PLUGIN.rglob("*") if p.suffix in {".py", ".toml"})
    assert files, EXAMPLE_PLUGIN
    for name in files:
        if name.endswith("__init__.py"):
            continue
        assert f'--8<-- "{name}"' in guide, name


# execs the guide's blocks of argv[1] (a JSON list) in one namespace, in the folder argv[2], then prints argv[3]'s
# expression (JSON)
BLOCKS = """
import os
blocks, folder, expression = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
os.chdir(folder)
namespace = {}
for code in blocks:
    exec(compile(code, "docs/guides/plugins.md", "exec"), namespace)
print(json.dumps(eval(expression, namespace)))
"""


def test_the_guide_s_opt_in_block_enables_the_intervention(site: Path, tmp_path: Path) -> None:
    (block,) = guide_python_blocks("## An intervention")[1:]  # the first is interventions.py itself
    result, _ = run_child(
        site, BLOCKS, json.dumps([block]), str(tmp_path), "sorted(guard.interventions)", missing="torch"
    )
    assert "halve_lr_on_loss" in result and "skip_step" in result  # the preset's own, and the plugin's


# the TRL adapter's start-up lines, as (level, message) in `announced`
ANNOUNCED = """
import logging
announced = []
_handler = logging.Handler()
_handler.emit = lambda record: announced.append((record.levelname, record.getMessage()))
logging.getLogger("rlguard.adapters.trl.config").addHandler(_handler)
logging.getLogger("rlguard.adapters.trl.config").setLevel(logging.INFO)
"""


@pytest.mark.slow
def test_the_guide_s_trl_blocks_train_the_plugin_objective(site: Path, tmp_path: Path) -> None:
    """The tiny-model run of "Testing it" trains two steps with ``band_pg``, announced as a plugin objective with its
    defaults; the config of "Using it" then builds a trainer on its model, reward and data (on the CPU:
    ``cpu_training_arguments`` added, as the README test does) whose attributes hold the objective in use."""
    pytest.importorskip("trl")
    (testing,) = guide_python_blocks("### Testing it")
    (using,) = [b for b in guide_python_blocks("### Using it") if "GuardedGRPOTrainer(" in b]
    on_cpu = (
        "import rlguard.adapters.trl as _trl\nfrom rlguard.tasks.hf import cpu_training_arguments as _cpu\n"
        "_real = _trl.GuardedGRPOConfig\n_trl.GuardedGRPOConfig = lambda **kw: _real(**{**_cpu(), **kw})\n"
        "model, reward_funcs, dataset = str(save_tiny_llama('tiny')), addition_reward, addition_dataset(16)\n"
    )
    expression = (
        "{'steps': trainer.state.global_step, 'objective': type(trainer.rlguard_objective).__name__,"
        " 'kwargs': trainer.rlguard_mapping.kwargs,"
        " 'configured': trainer.rlguard_configured_objective.band_high}"
    )
    # the adapter's start-up lines are kept; the first run's trainer is kept as `trained` before the second block
    # rebinds `trainer`
    blocks = [ANNOUNCED, testing, "trained = trainer", on_cpu, using]
    result, _ = run_child(
        site, BLOCKS, json.dumps(blocks), str(tmp_path), f"[trained.state.global_step, announced, {expression}]"
    )
    trained_steps, announced, built = result
    assert trained_steps == 2
    # the paper-less plugin objective announced as a plugin, with its own defaults (both configs of the guide)
    line = (
        "rlguard: objective 'band_pg' (plugin band_plugin.objective.BandPG) with clip range (0.1, 0.1) (its defaults)"
        " and aggregation 'token-mean' (its defaults, loss_type='dapo'); set epsilon, epsilon_high or loss_type to use"
        " TRL's."
    )
    assert announced[0] == ["WARNING", line]
    # the second sets the clip range through TRL's settings and the aggregation through objective_kwargs
    assert announced[1] == [
        "INFO",
        "rlguard: objective 'band_pg' (plugin band_plugin.objective.BandPG) with clip range (0.15, 0.25) (from "
        "epsilon/epsilon_high) and aggregation 'seq-mean-token-mean' (from loss_type/objective_kwargs, "
        "loss_type='dapo').",
    ]
    assert not any("paper" in message for _, message in announced)
    assert built["objective"] == "BandPG" and built["steps"] == 0
    assert built["kwargs"]["band_low"] == 0.15 and built["kwargs"]["band_high"] == 0.25 == built["configured"]
    assert built["kwargs"]["aggregation"] == "seq-mean-token-mean"  # objective_kwargs over loss_type's
