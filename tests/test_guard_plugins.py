"""A third-party package adds a detector and an intervention through the `rlguard` entry-point group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = """
from dataclasses import dataclass
from rlguard.guards import Detector, Finding, Intervention, Proposal
from rlguard.hookspecs import hookimpl


@dataclass(kw_only=True)
class LossAbove(Detector):
    name = "loss_above"
    source = "test plugin"
    summary = "loss >= limit"
    warmup: int = 0
    limit: float = 10.0

    def check(self, step, stats, armed):
        loss = stats.get("loss")
        if armed and loss is not None and loss >= self.limit:
            return Finding("critical", loss, self.limit, f"loss {loss} >= {self.limit}")
        return None


@dataclass(kw_only=True)
class HaltOnLoss(Intervention):
    name = "halt_on_loss"
    summary = "halt when loss_above fires"

    def propose(self, ctx):
        return Proposal("halt", "loss too high") if "loss_above" in ctx.findings else None


@hookimpl
def rlguard_add_detectors():
    return [LossAbove]


@hookimpl
def rlguard_add_interventions():
    return [HaltOnLoss]
"""

SCRIPT = """
import json
from rlguard.guards import Guard, GuardConfig
guard = Guard(GuardConfig(detectors={"loss_above": {"limit": 5.0}}))
actions = [guard.observe(step, {"loss": loss}).action for step, loss in enumerate([1.0, 2.0, 7.0])]
print(json.dumps({"detectors": sorted(guard.detectors), "interventions": sorted(guard.interventions),
                  "actions": actions}))
"""


def _install(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "guard_plugin_pkg.py").write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "guard_plugin_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: guard-plugin-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlguard]\nguard_plugin = guard_plugin_pkg\n")
    env = {k: v for k, v in os.environ.items() if k != "RLGUARD_DISABLE_PLUGIN_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return env


def test_third_party_detector_and_intervention_join_every_guard(tmp_path: Path) -> None:
    env = _install(tmp_path)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "loss_above" in result["detectors"] and "nonfinite" in result["detectors"]
    assert "halt_on_loss" in result["interventions"]
    assert result["actions"] == ["continue", "continue", "halt"]


def test_autoload_can_be_disabled(tmp_path: Path) -> None:
    env = _install(tmp_path) | {"RLGUARD_DISABLE_PLUGIN_AUTOLOAD": "1"}
    script = "from rlguard.guards import Guard; print(sorted(Guard().detectors))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "loss_above" not in proc.stdout and "nonfinite" in proc.stdout
