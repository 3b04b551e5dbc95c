"""A plugin objective works everywhere a built-in does: ``band_pg`` (the plugin guide's objective,
docs/examples/plugin/band_plugin/objective.py, with its own clip field names) is installed as a third-party
distribution with an ``rlguard`` entry point and used, in child processes that load it only through that entry point,
in TRL's ``GuardedGRPOTrainer``, in verl as ``rlguard.band_pg`` and in the fused path. Each is compared with a float64
reference written here from the formula ``l_it = -A_it clip(r_it, 1 - band_low, 1 + band_high)``, token mean. The
stock ``verl.trainer.main_ppo`` run with it is in integration_tests/test_verl_main_ppo.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.plugin_install import BAND_PG_SOURCE, guide_python_blocks, install_plugin

PLUGIN_SOURCE = BAND_PG_SOURCE

#: the float64 reference, shared by the child scripts: the loss and TRL's and rlguard's clip fractions
REFERENCE = '''
import torch

def band_reference(logprobs, old, advantages, mask, low, high, weights=None, entropies=None, entropy_coef=0.0):
    """-A clip(r, 1 - low, 1 + high) (times weights), minus entropy_coef * H, token mean over mask. (B, T)."""
    ratio = torch.exp(logprobs - old)
    term = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    if weights is not None:
        term = term * weights
    if entropies is not None:
        term = term - entropy_coef * entropies
    return (term * mask).sum() / mask.sum()

def trl_clip_metrics(logprobs, old, advantages, mask, low, high):
    """TRL's clip_ratio/*: below 1 - low with A < 0, above 1 + high with A > 0, token means; per-row extremes."""
    ratio = torch.exp(logprobs - old)
    below = ((ratio < 1.0 - low) & (advantages < 0)).double()
    above = ((ratio > 1.0 + high) & (advantages > 0)).double()
    rows = mask.sum(-1) > 0
    per_row = lambda x: ((x * mask).sum(-1) / mask.sum(-1))[rows]
    n = mask.sum()
    return {
        "clip_ratio/low_mean": float((below * mask).sum() / n),
        "clip_ratio/high_mean": float((above * mask).sum() / n),
        "clip_ratio/region_mean": float((torch.maximum(below, above) * mask).sum() / n),
        "clip_ratio/low_min": float(per_row(below).min()),
        "clip_ratio/high_max": float(per_row(above).max()),
    }

def batch(seed, b=6, t=5, scale=0.4):
    """(theta, advantages (B, T), mask, log_ratio): ragged rows with an empty one; ratios on both sides of 1."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(b, t, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([t, 1, 0, 3, 4, 2][:b])
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).double()
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0][:b], dtype=torch.float64).unsqueeze(1)
    advantages = (signs * (0.5 + torch.rand(b, 1, generator=g, dtype=torch.float64))).expand(b, t)
    log_ratio = scale * torch.randn(b, t, generator=g, dtype=torch.float64)
    return theta, advantages, mask, log_ratio
'''

TRL_CHILD = """
import json, sys
from pathlib import Path

import torch
import torch.nn.functional as F

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.core_losses import Controls
from rlguard.guards import Constant, GuardConfig
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

out = Path(sys.argv[1])
guard = GuardConfig(observe_only=True, schedules={"clip_low": Constant(0.05), "clip_high": Constant(0.3)})
args = GuardedGRPOConfig(
    output_dir=str(out / "run"), objective="band_pg", epsilon=0.15, epsilon_high=0.25, loss_type="dapo",
    guard=guard, use_vllm=False, per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
    max_steps=2, logging_steps=1, save_strategy="no", disable_tqdm=True, **cpu_training_arguments(),
)
trainer = GuardedGRPOTrainer(
    model=str(save_tiny_llama(out / "model")), reward_funcs=addition_reward, args=args,
    train_dataset=addition_dataset(8),
)
result = {"kwargs": {k: trainer.rlguard_mapping.kwargs[k] for k in ("band_low", "band_high")}}

theta, advantages, mask, log_ratio = batch(seed=0)
policy = lambda: (-F.softplus(theta) - 0.05, 1.5 * torch.sigmoid(theta))
logprobs = policy()[0].detach()
b, t = mask.shape
g = torch.Generator().manual_seed(1)
inputs = {
    "prompt_ids": torch.randint(3, 15, (b, 3), generator=g), "prompt_mask": torch.ones(b, 3, dtype=torch.long),
    "completion_ids": torch.randint(3, 15, (b, t), generator=g), "completion_mask": mask.long(),
    "advantages": advantages[:, 0].clone(), "num_items_in_batch": mask.sum(),
    "old_per_token_logps": logprobs - log_ratio,
}
trainer._get_per_token_logps_and_entropies = lambda *a, **k: (*policy(), None)
trainer.model.train()
trainer.current_gradient_accumulation_steps = 1

def compare(low, high):
    trainer._metrics["train"].clear()
    loss = trainer._compute_loss(trainer.model, inputs)
    (grad,) = torch.autograd.grad(loss, theta)
    old = inputs["old_per_token_logps"]
    ref = band_reference(policy()[0], old, advantages, mask, low, high)
    (ref_grad,) = torch.autograd.grad(ref, theta)
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)
    expected = trl_clip_metrics(logprobs, old, advantages, mask, low, high)
    logged = {k: trainer._metrics["train"][k] for k in expected}
    for key, value in expected.items():
        assert logged[key] == [value] or abs(logged[key][0] - value) < 1e-12, (key, logged[key], value)
    assert 0 < expected["clip_ratio/low_mean"] and 0 < expected["clip_ratio/high_mean"], expected  # both bounds bind
    assert "rlguard/clip_frac" in trainer._metrics["train"]
    return float(loss), expected

result["configured"] = compare(0.15, 0.25)
trainer.rlguard_set_controls(Controls(clip_scale=0.5, clip_high=0.4))  # the guard's clip controls, on band_*
controlled = trainer.rlguard_objective
result["controlled_bounds"] = [controlled.band_low, controlled.band_high]
result["controlled"] = compare(0.15 * 0.5, 0.4 * 0.5)
trainer.rlguard_set_controls(Controls())
result["reset_is_configured"] = trainer.rlguard_objective is trainer.rlguard_configured_objective

del trainer._get_per_token_logps_and_entropies
trainer._metrics["train"].clear()
trainer.train()  # the guard's clip schedules act through the callback, on the plugin's own fields
result["trained_bounds"] = [trainer.rlguard_objective.band_low, trainer.rlguard_objective.band_high]
logs = [r for r in trainer.state.log_history if "loss" in r]
result["logged_keys"] = sorted({k for r in logs for k in r if k.startswith(("clip_ratio/", "rlguard/clip"))})
result["steps"] = len(logs)
print(json.dumps(result))
"""

VERL_CHILD = """
import json
import sys
import torch
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

import rlguard.adapters.verl  # what verl's plugin entry point imports in every process
from rlguard.adapters.verl import GuardedPolicyLossConfig, RLGuardPolicyLossConfig

result = {"registered": "rlguard.band_pg" in core_algos.POLICY_LOSS_REGISTRY}
theta, advantages, mask, log_ratio = batch(seed=2)
weights = 0.5 + torch.rand(mask.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

def actor(policy_loss):
    return ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.15, clip_ratio_high=0.25,
        clip_ratio_c=3.0, loss_agg_mode="token-mean", policy_loss=policy_loss,
    )

def compare(config, low, high):
    log_prob = theta.detach().clone().requires_grad_()
    old = (log_prob - log_ratio).detach()
    fn = core_algos.get_policy_loss_fn("rlguard.band_pg")
    loss, metrics = fn(
        old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask.bool(),
        loss_agg_mode="token-mean", config=config, rollout_is_weights=weights,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    ref_lp = theta.detach().clone().requires_grad_()
    ref = band_reference(ref_lp, old, advantages, mask, low, high, weights=weights)
    (ref_grad,) = torch.autograd.grad(ref, ref_lp)
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)
    ratio = torch.exp(log_ratio)
    clipped = ((ratio < 1 - low) | (ratio > 1 + high)).double()
    assert abs(metrics["actor/pg_clipfrac"] - float((clipped * mask).sum() / mask.sum())) < 1e-12, metrics
    assert 0 < metrics["actor/pg_clipfrac"] < 1, metrics
    return float(loss), metrics

result["plain"] = compare(actor(RLGuardPolicyLossConfig(loss_mode="rlguard.band_pg")), 0.15, 0.25)[0]
guarded = actor(GuardedPolicyLossConfig(loss_mode="rlguard.band_pg", controls={"clip_scale": 0.5}))
loss, metrics = compare(guarded, 0.075, 0.125)
result["guarded"] = [loss, metrics["rlguard/guard/clip_low"], metrics["rlguard/guard/clip_high"]]
namespace = {}  # the plugin guide's check that verl sees a plugin loss (argv[1])
exec(sys.argv[1], namespace)
result["guide_check"] = namespace["loss_fn"] is core_algos.get_policy_loss_fn("rlguard.band_pg")
print(json.dumps(result))
"""

FUSED_CHILD = """
import dataclasses, json
import torch
from rlguard.core_losses import RolloutBatch, get_objective, objective_from_hidden

theta, advantages, mask, log_ratio = batch(seed=4, b=5, t=6)
b, t = mask.shape
g = torch.Generator().manual_seed(5)
hidden = torch.randn(b, t, 8, generator=g, dtype=torch.float64, requires_grad=True)
weight = torch.randn(11, 8, generator=g, dtype=torch.float64, requires_grad=True)
targets = torch.randint(0, 11, (b, t), generator=g)
with torch.no_grad():
    current = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
old = current - log_ratio
objective = get_objective("band_pg", band_low=0.15, band_high=0.25, entropy_coef=0.01)
result = {"token_local": objective.is_token_local(),
          "with_off_policy_mask": dataclasses.replace(objective, off_policy_mask_delta=0.5).is_token_local()}
rollout = RolloutBatch(advantages=advantages[:, 0].clone(), mask=mask, old_logprobs=old)
out = objective_from_hidden(objective, hidden, weight, targets, rollout, chunk_size=3)  # chunks split sequences
grads = torch.autograd.grad(out.loss, (hidden, weight))
logp = torch.log_softmax(hidden @ weight.T, -1)  # (B, T, V)
lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
entropy = -(logp.exp() * logp).sum(-1)
ref = band_reference(lp, old, advantages, mask, 0.15, 0.25, entropies=entropy, entropy_coef=0.01)
ref_grads = torch.autograd.grad(ref, (hidden, weight))
torch.testing.assert_close(out.loss.detach(), ref.detach(), rtol=1e-6, atol=1e-12)
for ours, theirs in zip(grads, ref_grads):
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-12)
result["loss"] = float(out.loss)
result["clip_frac"] = float(out.metrics["clip_frac"])
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return install_plugin(tmp_path_factory.mktemp("band_pg"), "rlguard_band_pg", PLUGIN_SOURCE)


def run_child(script: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    code = textwrap.dedent(REFERENCE) + textwrap.dedent(script)
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_plugin_is_not_visible_without_its_entry_point() -> None:
    from rlguard.core_losses import list_objectives

    assert "band_pg" not in list_objectives()  # the tests' own process never loads it: only the children do


def test_in_trls_guarded_trainer(plugin_env: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("trl")
    result = run_child(TRL_CHILD, plugin_env, str(tmp_path))
    # TRL's epsilon / epsilon_high set the plugin's own clip fields
    assert result["kwargs"] == {"band_low": 0.15, "band_high": 0.25}
    # the guard's clip controls act on them: x0.5 of the configured low bound, x0.5 of the scheduled high one
    assert result["controlled_bounds"] == pytest.approx([0.075, 0.2], rel=1e-15)
    assert result["configured"][0] != result["controlled"][0]  # the bounds matter on these data
    assert result["reset_is_configured"]
    # through the real training loop: the schedules reached the objective, TRL's clip metrics and rlguard's logged
    assert result["trained_bounds"] == [0.05, 0.3] and result["steps"] == 2
    assert {"clip_ratio/region_mean", "clip_ratio/low_mean", "rlguard/clip_frac"} <= set(result["logged_keys"])


def test_in_verl_as_rlguard_band_pg(plugin_env: dict[str, str]) -> None:
    pytest.importorskip("verl")
    (guide_check,) = [b for b in guide_python_blocks("### Using it") if "POLICY_LOSS_REGISTRY" in b]
    result = run_child(VERL_CHILD, plugin_env, guide_check)
    assert result["registered"] and result["guide_check"]
    loss, low, high = result["guarded"]
    assert (low, high) == pytest.approx((0.075, 0.125), rel=1e-15) and loss != result["plain"]


def test_in_the_fused_path(plugin_env: dict[str, str]) -> None:
    result = run_child(FUSED_CHILD, plugin_env)
    assert result["token_local"] and not result["with_off_policy_mask"]
    assert 0 < result["clip_frac"] < 1  # the band binds on some tokens, not all
