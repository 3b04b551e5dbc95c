"""Plugins cannot break the command line (``rlguard/plugins.py``): entry points load per kind when that kind is first
collected, so ``rlguard doctor`` (detectors) never imports an objective plugin's module nor the torch it imports; a
plugin that fails to load is one warning line naming it, skipped where it is not needed and refused with that line
where a name it might have registered is asked for.

Met the way a third party meets it: each plugin is an installed distribution (its module and ``.dist-info`` with
``entry_points.txt`` on a ``PYTHONPATH`` folder, as ``pip install`` leaves one), run in a child process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlguard.plugins import DISABLE_AUTOLOAD_ENV, ENTRY_POINT_GROUP, GROUPS, PluginFailure, make_plugin_manager
from tests.helpers.plugin_install import install_distribution

ROOT = Path(__file__).resolve().parents[2]

DETECTOR = '''
"""The torch-free half of a plugin: a detector (group rlguard.detectors)."""
from dataclasses import dataclass

from rlguard.guards import Detector, Finding
from rlguard.hookspecs import hookimpl


@dataclass(kw_only=True)
class LossAbove(Detector):
    name = "loss_above"
    source = "split plugin"
    summary = "loss >= limit"
    limit: float = 10.0

    def check(self, step, stats, armed):
        loss = stats.get("loss")
        if armed and loss is not None and loss >= self.limit:
            return Finding("critical", loss, self.limit, f"loss {loss:.3g} >= {self.limit}")
        return None


@hookimpl
def rlguard_add_detectors():
    return [LossAbove]
'''

OBJECTIVE = '''
"""The torch half of a plugin: an objective (group rlguard.objectives), -A clip(r, 1 - band, 1 + band)."""
from dataclasses import dataclass

import torch

from rlguard.core_losses import Objective
from rlguard.core_losses.ratios import Surrogate
from rlguard.hookspecs import hookimpl


@dataclass(frozen=True, kw_only=True)
class SplitBandPG(Objective):
    name = "split_band_pg"
    band: float = 0.1

    def surrogate(self, log_ratio, batch, mask):
        ratio = torch.exp(log_ratio)  # (B, T)
        return Surrogate(loss=-batch.advantages * ratio.clamp(1 - self.band, 1 + self.band))


@hookimpl
def rlguard_add_objectives():
    return [SplitBandPG]
'''

BROKEN = """
raise ImportError("broken_plugin needs libbroken, which is not installed")
"""

# a plugin of the catch-all `rlguard` group whose module imports torch and registers a detector
LEGACY_TORCH = DETECTOR.replace('"loss_above"', '"legacy_loss_above"').replace(
    "from dataclasses import dataclass", "from dataclasses import dataclass\n\nimport torch"
)

# Runs the console script in this interpreter (argv: out, the modules to make missing or "-", the arguments), then
# writes its exit code and which plugin modules and torch it left in sys.modules.
PROBE = """
import importlib.abc, json, sys
out, missing, args = sys.argv[1], set(sys.argv[2].split(",")) - {"-"}, sys.argv[3:]
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in missing:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
sys.argv = ["rlguard", *args]
code = 0
try:
    from rlguard.cli import main
    main()
except SystemExit as exit_:
    code = exit_.code or 0
watched = ("torch", "split_detector", "split_objective", "broken_plugin", "legacy_torch")
with open(out, "w") as fh:
    json.dump({"code": code, "loaded": sorted(m for m in watched if m in sys.modules)}, fh)
"""


def child_env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join((str(folder), str(ROOT)))
    return env


def probe(folder: Path, tmp_path: Path, *args: str, missing: str = "-") -> tuple[dict[str, object], list[str]]:
    """The console script with ``args`` where the plugins of ``folder`` are installed: (its result, its stderr)."""
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), missing, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(folder),
    )
    assert out.exists(), proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stderr.strip().splitlines()


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TRL output folder: 40 healthy steps in ``trainer_state.json``."""
    folder = tmp_path_factory.mktemp("run")
    history = [{"step": s, "loss": 0.01, "grad_norm": 0.5, "entropy": 0.8 - 0.001 * s} for s in range(1, 41)]
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 40}))
    return folder


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A split plugin (a torch-free detector, an objective that imports torch) and a plugin whose module raises
    ImportError, each its own installed distribution."""
    folder = tmp_path_factory.mktemp("site")
    install_distribution(
        folder,
        "split_plugin",
        {
            "rlguard.detectors": {"split_detector": "split_detector"},
            "rlguard.objectives": {"split_band_pg": "split_objective"},
        },
        {"split_detector": DETECTOR, "split_objective": OBJECTIVE},
    )
    install_distribution(
        folder, "broken_plugin", {"rlguard.detectors": {"broken_plugin": "broken_plugin"}}, {"broken_plugin": BROKEN}
    )
    return folder


BROKEN_LINE = (
    "warning: rlguard plugin 'broken_plugin' (rlguard.detectors: broken_plugin) failed to load and is skipped: "
    "ImportError: broken_plugin needs libbroken, which is not installed"
)


def test_the_doctor_runs_names_the_broken_plugin_and_imports_no_objective_plugin(
    plugins: Path, trl_run: Path, tmp_path: Path
) -> None:
    result, stderr = probe(plugins, tmp_path, "doctor", str(trl_run))
    assert result == {"code": 0, "loaded": ["split_detector"]}  # neither the objective's module nor torch
    assert stderr == [BROKEN_LINE]


def test_the_doctor_runs_without_torch_where_a_plugin_needs_it(plugins: Path, trl_run: Path, tmp_path: Path) -> None:
    result, stderr = probe(plugins, tmp_path, "doctor", "--json", str(trl_run), missing="torch")
    assert result == {"code": 0, "loaded": ["split_detector"]}
    assert stderr == [BROKEN_LINE]


def test_a_catch_all_plugin_that_imports_torch_is_skipped_in_one_line_without_torch(
    trl_run: Path, tmp_path: Path
) -> None:
    """The ``rlguard`` group loads for every kind (as before the groups per kind): without torch its plugin fails to
    load, and the doctor still runs."""
    folder = tmp_path / "site"
    install_distribution(
        folder, "legacy_torch", {"rlguard": {"legacy_torch": "legacy_torch"}}, {"legacy_torch": LEGACY_TORCH}
    )
    result, stderr = probe(folder, tmp_path, "doctor", str(trl_run), missing="torch")
    assert result == {"code": 0, "loaded": []}
    assert stderr == [
        "warning: rlguard plugin 'legacy_torch' (rlguard: legacy_torch) failed to load and is skipped: "
        "ModuleNotFoundError: No module named 'torch'"
    ]
    result, stderr = probe(folder, tmp_path, "detectors", "--json")  # with torch it loads, as it always did
    assert result == {"code": 0, "loaded": ["legacy_torch", "torch"]} and stderr == []


def test_the_detectors_command_lists_the_plugin_detector_and_no_objective(plugins: Path, tmp_path: Path) -> None:
    result, _ = probe(plugins, tmp_path, "detectors")
    assert result == {"code": 0, "loaded": ["split_detector"]}


def test_the_objective_half_loads_where_objectives_are_listed(plugins: Path, tmp_path: Path) -> None:
    result, stderr = probe(plugins, tmp_path, "losses", "--json")
    assert result["code"] == 0
    assert result["loaded"] == ["split_objective", "torch"]  # the detectors' group is not loaded for objectives
    assert stderr == []


CHILD = """
import json, warnings
from rlguard.core_losses import get_objective, list_objectives
from rlguard.guards import Guard, GuardConfig

result = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result["objectives"] = [n for n in list_objectives() if "broken" in n]
    try:
        get_objective("broken_pg")
    except ValueError as err:
        result["objective_refused"] = str(err)
    try:
        Guard(GuardConfig(detectors={"broken_detector": {}}))
    except ValueError as err:
        result["detector_refused"] = str(err)
    result["guard_runs"] = sorted(Guard(GuardConfig.preset("default")).detectors) != []
result["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
print(json.dumps(result))
"""


def test_a_name_asked_for_is_refused_with_the_broken_plugins_line(tmp_path: Path) -> None:
    install_distribution(
        tmp_path,
        "broken_pair",
        {
            "rlguard.objectives": {"broken_pg": "broken_plugin"},
            "rlguard.detectors": {"broken_detector": "broken_plugin"},
        },
        {"broken_plugin": BROKEN},
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, env=child_env(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    error = "ImportError: broken_plugin needs libbroken, which is not installed"
    assert result["objectives"] == []
    assert result["objective_refused"].startswith("unknown objective 'broken_pg'; registered objectives: ")
    assert result["objective_refused"].endswith(
        f"rlguard plugin 'broken_pg' (rlguard.objectives: broken_plugin) failed to load and is skipped: {error}."
    )
    assert result["detector_refused"].startswith("unknown detector(s) ['broken_detector']; registered: ")
    assert result["detector_refused"].endswith(
        f"rlguard plugin 'broken_detector' (rlguard.detectors: broken_plugin) failed to load and is skipped: {error}."
    )
    assert result["guard_runs"]
    # one warning per entry point, when its group first loaded
    assert result["warnings"] == [
        f"PluginLoadWarning: rlguard plugin 'broken_pg' (rlguard.objectives: broken_plugin) failed to load and is "
        f"skipped: {error}",
        f"PluginLoadWarning: rlguard plugin 'broken_detector' (rlguard.detectors: broken_plugin) failed to load and is "
        f"skipped: {error}",
    ]


def test_a_module_of_a_kinds_group_may_not_implement_another_kind(tmp_path: Path, trl_run: Path) -> None:
    """What a module of ``rlguard.objectives`` registers besides objectives would be seen or not depending on which
    kind a process collected first: such a module is refused, in one line."""
    both = OBJECTIVE + DETECTOR.split('"""', 2)[2]
    install_distribution(
        tmp_path / "site", "both", {"rlguard.objectives": {"both": "split_objective"}}, {"split_objective": both}
    )
    result, stderr = probe(tmp_path / "site", tmp_path, "losses", "--json")
    assert result["code"] == 0
    assert stderr == [
        "warning: rlguard plugin 'both' (rlguard.objectives: split_objective) failed to load and is skipped: "
        "TypeError: a plugin of the rlguard.objectives group implements rlguard_add_detectors: register the module "
        "that does under that hook's own group, or under 'rlguard'"
    ]


def test_a_manager_without_autoload_loads_no_entry_point(plugins: Path, tmp_path: Path) -> None:
    code = (
        "import json\nfrom rlguard.plugins import make_plugin_manager, load_plugins\n"
        "off, on = make_plugin_manager(autoload=False), make_plugin_manager(autoload=True)\n"
        "load_plugins(off, 'guard'); load_plugins(on, 'guard'); load_plugins(on, 'detector')\n"
        "print(json.dumps([sorted(map(str, (pm.get_name(p) for p in pm.get_plugins()))) for pm in (off, on)]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(plugins),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == [[], ["split_detector"]]  # each group once; the broken one skipped


def test_a_new_manager_loads_nothing_until_a_kind_is_collected() -> None:
    pm = make_plugin_manager(autoload=True)
    assert pm.loaded_groups == set() and pm.get_plugins() == set()


def test_the_plugin_guide_shows_the_groups_and_the_line_rlguard_uses() -> None:
    guide = (ROOT / "docs" / "guides" / "plugins.md").read_text()
    example = "docs/examples/plugin/pyproject.toml"  # the worked plugin's metadata, which the guide includes
    assert f'```toml\n--8<-- "{example}"\n```' in guide
    shown = set(re.findall(r'^\[project\.entry-points\."([\w.]+)"\]$', (ROOT / example).read_text(), re.MULTILINE))
    assert shown == {group for groups in GROUPS.values() for group in groups} - {ENTRY_POINT_GROUP}
    failure = PluginFailure(
        "band_pg", "rlguard.objectives", "band_plugin.objective", "ModuleNotFoundError: No module named 'torch'"
    )
    assert f"\nwarning: {failure.line}\n" in guide


# a hook that raises, and one that returns what is not a class of its kind
FAILING_HOOKS = """
from rlguard.hookspecs import hookimpl


@hookimpl
def rlguard_add_detectors():
    raise RuntimeError("failing_hooks cannot build its detectors")
"""
NOT_A_CLASS = FAILING_HOOKS.replace(
    'raise RuntimeError("failing_hooks cannot build its detectors")', 'return ["spike"]'
)


def test_a_plugin_whose_hook_fails_is_skipped_in_one_line_and_the_doctor_runs(trl_run: Path, tmp_path: Path) -> None:
    """Such a plugin failed to load: the doctor runs and names each, instead of reporting an internal error."""
    eps = {"rlguard.detectors": {"failing": "failing_hooks", "not_a_class": "not_a_class"}}
    install_distribution(tmp_path / "site", "hooks", eps, {"failing_hooks": FAILING_HOOKS, "not_a_class": NOT_A_CLASS})
    result, stderr = probe(tmp_path / "site", tmp_path, "doctor", str(trl_run))
    assert result["code"] == 0
    assert stderr == [
        "warning: rlguard plugin 'failing' (rlguard.detectors: failing_hooks) failed to load and is skipped: "
        "RuntimeError: failing_hooks cannot build its detectors",
        "warning: rlguard plugin 'not_a_class' (rlguard.detectors: not_a_class) failed to load and is skipped: "
        "TypeError: plugin 'not_a_class' returned 'spike' from rlguard_add_detectors; expected a subclass of "
        "rlguard.guards.detectors.base.Detector with a non-empty class attribute `name`.",
    ]


def test_a_broken_intervention_is_refused_by_name_and_a_broken_objective_is_not_the_doctor_s(
    trl_run: Path, tmp_path: Path
) -> None:
    eps = {
        "rlguard.interventions": {"broken_iv": "broken_plugin"},
        "rlguard.objectives": {"broken_pg": "broken_plugin"},
    }
    install_distribution(tmp_path / "site", "broken", eps, {"broken_plugin": BROKEN})
    error = "ImportError: broken_plugin needs libbroken, which is not installed"
    iv_line = (
        f"rlguard plugin 'broken_iv' (rlguard.interventions: broken_plugin) failed to load and is skipped: {error}"
    )
    pg_line = f"rlguard plugin 'broken_pg' (rlguard.objectives: broken_plugin) failed to load and is skipped: {error}"
    code = "from rlguard.guards import Guard, GuardConfig\nGuard(GuardConfig(interventions={'broken_iv': {}}))"
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=child_env(tmp_path / "site")
    )
    refused = proc.stderr.strip().splitlines()[-1]
    assert refused.startswith("ValueError: unknown intervention(s) ['broken_iv']; registered: ")
    assert refused.endswith(f"{iv_line}.")
    # the doctor names the intervention and never loads the objectives' group; rlguard losses names the objective
    result, stderr = probe(tmp_path / "site", tmp_path, "doctor", str(trl_run))
    assert result["code"] == 0
    assert stderr == [f"warning: {iv_line}"]
    result, stderr = probe(tmp_path / "site", tmp_path, "losses", "--json")
    assert result["code"] == 0
    assert stderr == [f"warning: {pg_line}"]
