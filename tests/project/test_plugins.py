"""Third-party objectives through the ``rlguard`` entry-point group, and the registry's checks."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from rlguard.core_losses import GRPO, Objective
from rlguard.core_losses.objectives import BUILTIN_OBJECTIVES
from rlguard.core_losses.ratios import Surrogate
from rlguard.core_losses.registry import collect_objectives
from rlguard.hookspecs import hookimpl
from rlguard.plugins import DISABLE_AUTOLOAD_ENV, make_plugin_manager
from tests.helpers.plugin_install import install_plugin

PLUGIN_MODULE = '''
"""A throwaway third-party plugin: plain REINFORCE with a scale, -scale * A * pi / sg[pi]."""
from dataclasses import dataclass

import torch

from rlguard.core_losses import Objective
from rlguard.core_losses.ratios import Surrogate
from rlguard.hookspecs import hookimpl


@dataclass(frozen=True, kw_only=True)
class ScaledReinforce(Objective):
    name = "test_scaled_reinforce"
    scale: float = 1.0

    def surrogate(self, log_ratio, batch, mask):
        return Surrogate(loss=-self.scale * batch.advantages * torch.exp(log_ratio))


@hookimpl
def rlguard_add_objectives():
    return [ScaledReinforce]
'''

# Runs in the subprocess: list the objectives, then use the plugin's on a batch (token-mean by default).
CHILD = """
import json
import torch
from rlguard.core_losses import PolicyBatch, get_objective, list_objectives

result = {"names": list_objectives()}
logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -4.0]], dtype=torch.float64, requires_grad=True)
batch = PolicyBatch(
    logprobs=logprobs,
    advantages=torch.tensor([1.0, -2.0], dtype=torch.float64),
    mask=torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64),
)
try:
    objective = get_objective("test_scaled_reinforce", scale=2.0)
except ValueError as exc:
    result["error"] = str(exc)
else:
    out = objective(batch)
    out.loss.backward()
    result.update(loss=out.loss.item(), grad=logprobs.grad.tolist(), module=type(objective).__module__)
print(json.dumps(result))
"""

BUILTIN_NAMES = sorted(cls.name for cls in BUILTIN_OBJECTIVES)


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    """A child's environment with an installed-looking distribution that has an ``rlguard`` entry point."""
    return install_plugin(tmp_path, "rlguard_testplugin", PLUGIN_MODULE)


def run_child(plugin_env: dict[str, str], disable: str | None) -> dict[str, Any]:
    env = dict(plugin_env)
    if disable is not None:
        env[DISABLE_AUTOLOAD_ENV] = disable
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_entry_point_plugin_is_loaded_and_usable(plugin_env: dict[str, str]) -> None:
    result = run_child(plugin_env, disable=None)
    assert "error" not in result, result["error"]
    assert result["names"] == sorted([*BUILTIN_NAMES, "test_scaled_reinforce"])
    assert result["module"] == "rlguard_testplugin"
    # on-policy the ratio is 1: terms -2 * A, A = 1 on 2 tokens and -2 on 3; token mean (-4 + 12) / 5;
    # d loss / d logprob = -2 * A / 5 per unmasked token
    assert result["loss"] == pytest.approx(8 / 5, rel=1e-12)
    expected_grad = torch.tensor([[-0.4, -0.4, 0.0], [0.8, 0.8, 0.8]], dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(result["grad"], dtype=torch.float64), expected_grad, rtol=1e-12, atol=0)


def test_autoload_can_be_disabled(plugin_env: dict[str, str]) -> None:
    result = run_child(plugin_env, disable="1")
    assert result["names"] == BUILTIN_NAMES
    assert "unknown objective 'test_scaled_reinforce'" in result["error"]


def test_builtins_register_through_the_plugin_manager() -> None:
    registry = collect_objectives(make_plugin_manager(autoload=False))
    assert sorted(registry) == BUILTIN_NAMES
    assert all(registry[cls.name] is cls for cls in BUILTIN_OBJECTIVES)


# -- in-process checks of what plugins return ------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ImpostorGRPO(Objective):
    name = "grpo"

    def surrogate(self, log_ratio: torch.Tensor, batch: Any, mask: torch.Tensor) -> Surrogate:
        return Surrogate(loss=-batch.advantages * torch.exp(log_ratio))


@dataclass(frozen=True, kw_only=True)
class Nameless(Objective):
    def surrogate(self, log_ratio: torch.Tensor, batch: Any, mask: torch.Tensor) -> Surrogate:
        return Surrogate(loss=log_ratio)


class ReturnsPlugin:
    def __init__(self, *objectives: object) -> None:
        self.objectives = objectives

    @hookimpl
    def rlguard_add_objectives(self) -> tuple[object, ...]:
        return self.objectives


def test_duplicate_name_names_both_plugins() -> None:
    pm = make_plugin_manager(autoload=False)
    pm.register(ReturnsPlugin(ImpostorGRPO), name="impostor-plugin")
    with pytest.raises(ValueError, match=r"objective name 'grpo' is registered twice") as info:
        collect_objectives(pm)
    message = str(info.value)
    assert "'rlguard.builtin.objectives'" in message and "'impostor-plugin'" in message
    assert "GRPO" in message and "ImpostorGRPO" in message


def test_duplicate_between_two_third_party_plugins() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Mine(ImpostorGRPO):
        name = "mine"

    @dataclass(frozen=True, kw_only=True)
    class AlsoMine(ImpostorGRPO):
        name = "mine"

    pm = make_plugin_manager(autoload=False)
    pm.register(ReturnsPlugin(Mine), name="first-plugin")
    pm.register(ReturnsPlugin(AlsoMine), name="second-plugin")
    with pytest.raises(ValueError, match=r"'mine' is registered twice") as info:
        collect_objectives(pm)
    assert "'first-plugin'" in str(info.value) and "'second-plugin'" in str(info.value)


def test_the_same_class_from_two_plugins_is_not_a_duplicate() -> None:
    pm = make_plugin_manager(autoload=False)
    pm.register(ReturnsPlugin(GRPO), name="reexports-grpo")
    assert collect_objectives(pm)["grpo"] is GRPO


@pytest.mark.parametrize("returned", [int, "grpo", GRPO(), Nameless, None])
def test_non_objective_raises_type_error(returned: object) -> None:
    pm = make_plugin_manager(autoload=False)
    pm.register(ReturnsPlugin(returned), name="broken-plugin")
    with pytest.raises(TypeError, match=r"plugin 'broken-plugin' returned .* expected a subclass of"):
        collect_objectives(pm)
