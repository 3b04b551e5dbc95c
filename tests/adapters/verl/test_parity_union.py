"""``rlguard.adapters.verl`` against verl 0.9.1's own registered losses for the objectives that came with the
TRL/verl union: rlguard.clip_cov vs ``clip_cov``, kl_cov vs ``kl_cov``, gpg vs ``gpg``, dppo_tv vs ``dppo_tv``,
dppo_kl vs ``dppo_kl``, dro vs ``dro``.

Same float64 inputs and ActorConfig on both sides; every ``loss_agg_mode``; with no ``global_batch_info``, and
each micro-batch of 2 ranks x 2 micro-batches under the data-parallel one verl's engine sets. Loss and gradient
agree to ``rtol=1e-6``. Clip-Cov draws its tokens at random: both sides start from the same torch RNG state
(``torch.manual_seed``), so they draw the same tokens; a test shows that another state draws others. Each test
asserts that its data make the objective's mechanism act (tokens dropped, penalised or masked).

Needs ``pip install rlguard[verl]``; skipped where verl is not installed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

from verl.trainer.ppo import core_algos  # after the skip
from verl.workers.config import ActorConfig, PolicyLossConfig

from rlguard.adapters import verl as adapter
from tests.helpers.verl_parity import ATOL, DP, RTOL, VERL_MODES, actor_config, dp_info, make_inputs, micro_batches

SEED = 2026
#: loss_mode -> the policy_loss settings that make its mechanism act on these inputs
POLICY_LOSS: dict[str, dict[str, Any]] = {
    "clip_cov": {"clip_cov_ratio": 0.08, "clip_cov_lb": 0.1, "clip_cov_ub": 5.0},
    "kl_cov": {"kl_cov_ratio": 0.1, "ppo_kl_coef": 0.5},
    "gpg": {},
    "dppo_tv": {},
    "dppo_kl": {},
    "dro": {"dro_beta": 0.7},
}
NAMES = tuple(POLICY_LOSS)
#: the same objectives under verl's own defaults (dro has none: verl requires dro_beta)
DEFAULTS: dict[str, dict[str, Any]] = {"clip_cov": {}, "kl_cov": {}, "dppo_tv": {}, "dppo_kl": {}}


def log_probabilities(seed: int = 0) -> dict[str, torch.Tensor]:
    """``make_inputs`` with every unmasked log-prob <= 0 (DPPO reads probabilities): each row is shifted down by
    its largest value, which keeps the log-ratios; padding holds a valid log-prob (verl's dppo_kl would
    otherwise compute log of a negative number there)."""
    inputs = make_inputs(seed=seed)
    mask = inputs["response_mask"]
    log_prob = torch.where(mask, inputs["log_prob"], inputs["old_log_prob"])
    top = torch.maximum(log_prob.amax(-1, keepdim=True), inputs["old_log_prob"].amax(-1, keepdim=True))
    shift = (top + 0.05).clamp(min=0.0)
    return {**inputs, "log_prob": log_prob - shift, "old_log_prob": inputs["old_log_prob"] - shift}


def config_for(name: str, mode: str, policy: dict[str, Any]) -> ActorConfig:
    # dppo_*: clip_ratio_c is the truncation of the IS weight; 1.5 binds on some tokens of these inputs
    extra = {"clip_ratio_c": 1.5} if name.startswith("dppo") else {}
    return actor_config(loss_agg_mode=mode, policy_loss=PolicyLossConfig(**policy), **extra)


def call(
    loss_mode: str,
    inputs: dict[str, torch.Tensor],
    config: ActorConfig,
    mode: str,
    info: dict[str, Any],
    rows: slice = slice(None),
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(loss, d loss / d log_prob, metrics) of the registered ``loss_mode`` on ``rows``, from RNG state SEED."""
    config.global_batch_info.clear()
    config.global_batch_info.update(info)
    leaf = inputs["log_prob"].clone().requires_grad_(True)
    torch.manual_seed(SEED)
    loss, metrics = core_algos.get_policy_loss_fn(loss_mode)(
        old_log_prob=inputs["old_log_prob"][rows],
        log_prob=leaf[rows],
        advantages=inputs["advantages"][rows],
        response_mask=inputs["response_mask"][rows],
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=None if weights is None else weights[rows],
    )
    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True, materialize_grads=True)
    return loss.detach(), grad.nan_to_num(), metrics


def assert_same(actual: tuple[Any, ...], expected: tuple[Any, ...]) -> None:
    torch.testing.assert_close(actual[0], expected[0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(actual[1], expected[1], rtol=RTOL, atol=ATOL)


def mechanism_acts(name: str, inputs: dict[str, torch.Tensor], config: ActorConfig, mode: str) -> None:
    """The part of the objective that differs from the plain policy gradient changes verl's loss here."""
    theirs = call(name, inputs, config, mode, {})
    if name in ("clip_cov", "dppo_tv", "dppo_kl"):
        assert 0 < theirs[2]["actor/pg_clipfrac"] < 1, "some tokens must be dropped or masked, not all"
    if name == "kl_cov":
        plain = config_for(name, mode, {**POLICY_LOSS[name], "ppo_kl_coef": 0.0})
        assert abs(float(call(name, inputs, plain, mode, {})[0] - theirs[0])) > 1e-6
    if name == "dro":
        gpg = call("gpg", inputs, config, mode, {})
        assert abs(float(gpg[0] - theirs[0])) > 1e-3


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_parity_one_batch(name: str, mode: str) -> None:
    inputs = log_probabilities()
    config = config_for(name, mode, POLICY_LOSS[name])
    expected = call(name, inputs, config, mode, {})
    actual = call(adapter.loss_mode(name), inputs, config, mode, {})
    assert expected[1].abs().max() > 1e-3, "the gradient vanished: the comparison would prove nothing"
    assert_same(actual, expected)
    mechanism_acts(name, inputs, config, mode)
    if "actor/ppo_kl" in expected[2] and name != "kl_cov":  # verl's kl_cov reports the mean |log r| there
        assert actual[2]["actor/ppo_kl"] == pytest.approx(expected[2]["actor/ppo_kl"], rel=RTOL, abs=1e-9)


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_parity_per_micro_batch_with_data_parallel_info(name: str, mode: str) -> None:
    """Each micro-batch of each rank under the global_batch_info verl's engine sets with dp_size=2; and their
    sum over the step, averaged over ranks, is the same on both sides."""
    inputs = log_probabilities()
    config = config_for(name, mode, POLICY_LOSS[name])
    info = dp_info(inputs)
    totals = {"verl": torch.zeros(()), "rlguard": torch.zeros(())}
    for rows in micro_batches():
        expected = call(name, inputs, config, mode, info, rows)
        actual = call(adapter.loss_mode(name), inputs, config, mode, info, rows)
        assert_same(actual, expected)
        totals["verl"] = totals["verl"] + expected[0] / DP
        totals["rlguard"] = totals["rlguard"] + actual[0] / DP
    torch.testing.assert_close(totals["rlguard"], totals["verl"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_parity_under_verls_defaults(name: str, mode: str) -> None:
    inputs = log_probabilities(seed=3)
    config = actor_config(loss_agg_mode=mode)
    assert_same(call(adapter.loss_mode(name), inputs, config, mode, {}), call(name, inputs, config, mode, {}))


@pytest.mark.parametrize("name", NAMES)
def test_parity_with_rollout_is_weights(name: str) -> None:
    inputs = log_probabilities()
    g = torch.Generator().manual_seed(1)
    weights = 0.2 + 1.8 * torch.rand(inputs["log_prob"].shape, generator=g, dtype=torch.float64)
    config = config_for(name, "token-mean", POLICY_LOSS[name])
    expected = call(name, inputs, config, "token-mean", dp_info(inputs), slice(0, 4), weights)
    actual = call(adapter.loss_mode(name), inputs, config, "token-mean", dp_info(inputs), slice(0, 4), weights)
    assert_same(actual, expected)


def test_clip_cov_draw_depends_on_the_rng_state_on_both_sides() -> None:
    """Another seed draws other tokens in verl and in rlguard alike: the parity above is not vacuous."""
    inputs = log_probabilities()
    config = config_for("clip_cov", "token-mean", POLICY_LOSS["clip_cov"])
    losses = {}
    for mode in ("clip_cov", adapter.loss_mode("clip_cov")):
        config.global_batch_info.clear()
        out = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            loss, _ = core_algos.get_policy_loss_fn(mode)(
                old_log_prob=inputs["old_log_prob"],
                log_prob=inputs["log_prob"],
                advantages=inputs["advantages"],
                response_mask=inputs["response_mask"],
                loss_agg_mode="token-mean",
                config=config,
            )
            out.append(float(loss))
        losses[mode] = out
        assert out[0] != out[1]
    assert losses["clip_cov"] == pytest.approx(losses[adapter.loss_mode("clip_cov")], rel=RTOL)


def test_dro_needs_dro_beta() -> None:
    inputs = log_probabilities()
    with pytest.raises(ValueError, match=r"policy_loss.dro_beta must be set"):
        call(adapter.loss_mode("dro"), inputs, actor_config(loss_agg_mode="token-mean"), "token-mean", {})


def test_hyperparameters_from_verls_keys() -> None:
    config = actor_config(
        clip_ratio_low=0.1,
        clip_ratio_high=0.3,
        clip_ratio_c=7.0,
        policy_loss=PolicyLossConfig(
            clip_cov_ratio=0.01, clip_cov_lb=0.5, clip_cov_ub=2.0, kl_cov_ratio=0.02, ppo_kl_coef=0.3, dro_beta=0.4
        ),
    )
    hp = {name: adapter.objective_hyperparameters(name, config, "token-mean") for name in NAMES}
    assert hp["clip_cov"] == {
        "clip_low": 0.1,
        "clip_high": 0.3,
        "clip_cov_ratio": 0.01,
        "clip_cov_lb": 0.5,
        "clip_cov_ub": 2.0,
        "aggregation": "token-mean",
    }
    assert hp["kl_cov"] == {"kl_cov_ratio": 0.02, "kl_cov_coef": 0.3, "aggregation": "token-mean"}
    assert hp["dppo_tv"] == {"clip_low": 0.1, "clip_high": 0.3, "is_cap": 7.0, "aggregation": "token-mean"}
    assert hp["dro"] == {"tau": 0.4, "aggregation": "token-mean"}
    assert hp["gpg"] == {"aggregation": "token-mean"}
