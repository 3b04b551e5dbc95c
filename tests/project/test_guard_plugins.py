"""A third-party package adds a detector and an intervention through the `rlguard` entry-point group."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.plugin_install import install_plugin

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
from rlguard.guards.decision import decision_action
guard = Guard(GuardConfig(detectors={"loss_above": {"limit": 5.0}}))
actions = [decision_action(guard.observe(step, {"loss": loss})) for step, loss in enumerate([1.0, 2.0, 7.0])]
print(json.dumps({"detectors": sorted(guard.detectors), "interventions": sorted(guard.interventions),
                  "actions": actions}))
"""


def _install(tmp_path: Path) -> dict[str, str]:
    return install_plugin(tmp_path, "guard_plugin_pkg", textwrap.dedent(PLUGIN))


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


STEP_PLUGIN = """
from dataclasses import dataclass
from rlguard.guards import Detector, Finding
from rlguard.guards.decision import decision_action
from rlguard.hookspecs import hookimpl

SEEN = []


@dataclass(kw_only=True)
class RewardPerToken(Detector):
    name = "reward_per_token_low"
    source = "test plugin"
    summary = "reward_per_token < limit"
    warmup: int = 0
    limit: float = 0.01

    def check(self, step, stats, armed):
        value = stats.get("reward_per_token")
        if value is not None and value < self.limit:
            return Finding("critical", value, self.limit, f"reward per token {value:.3g} < {self.limit}")
        return None


@hookimpl
def rlguard_add_detectors():
    return [RewardPerToken]


@hookimpl
def rlguard_step_stats(step, stats):
    if "reward_mean" in stats and "length_mean" in stats:
        return {"reward_per_token": stats["reward_mean"] / stats["length_mean"]}
    return None


@hookimpl
def rlguard_on_decision(decision, applied):
    SEEN.append((decision.step, decision_action(decision), applied.outcome))
"""

STEP_SCRIPT = """
import json
import torch
import step_plugin_pkg
from rlguard.guards import Guard, GuardConfig
from rlguard.guards.actuation import apply_decision, TorchActuator

config = GuardConfig(interventions={"skip_step": {"on": ("reward_per_token_low",)}})
guard = Guard(config)
model = torch.nn.Linear(2, 1)
actuator = TorchActuator(model, torch.optim.SGD(model.parameters(), lr=0.1))
for step, (reward, length) in enumerate([(0.5, 10.0), (0.1, 40.0)], start=1):
    model(torch.ones(1, 2)).sum().backward()
    apply_decision(guard.observe(step, {"reward_mean": reward, "length_mean": length}), actuator)
print(json.dumps({"seen": step_plugin_pkg.SEEN, "events": [e.detector for e in guard.events]}))
"""


def test_a_plugin_adds_a_step_stat_and_sees_every_decision(tmp_path: Path) -> None:
    """The per-step hooks: rlguard_step_stats adds a stat its own detector judges; rlguard_on_decision sees each
    decision after the actuator carried it out (tests/guards/actuation/test_executor.py covers the executor itself)."""
    env = install_plugin(tmp_path, "step_plugin_pkg", textwrap.dedent(STEP_PLUGIN))
    proc = subprocess.run([sys.executable, "-c", STEP_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # step 2: 0.1 / 40 = 0.0025 per token, below 0.01: the plugin's detector fires and the step is skipped
    assert result["seen"] == [[1, "continue", "step"], [2, "skip_step", "skip"]]
    assert "reward_per_token_low" in result["events"] and "action:skip_step" in result["events"]


def test_a_plugin_stat_may_not_replace_a_step_stat() -> None:
    from rlguard.guards.registry import with_plugin_stats
    from rlguard.hookspecs import hookimpl
    from rlguard.plugins import plugin_manager

    class Clobber:
        @hookimpl
        def rlguard_step_stats(self, step: int, stats: dict[str, float]) -> dict[str, float]:
            return {"loss": 0.0}

    plugin = Clobber()
    plugin_manager().register(plugin, name="test.clobber")
    try:
        with pytest.raises(ValueError, match="returned 'loss' for step 3, which the step already has"):
            with_plugin_stats(plugin_manager().hook, 3, {"loss": 1.0})
        assert with_plugin_stats(plugin_manager().hook, 3, {"grad_norm": 1.0}) == {"grad_norm": 1.0, "loss": 0.0}
    finally:
        plugin_manager().unregister(plugin)
