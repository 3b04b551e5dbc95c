"""``rlguard.adapters.verl`` against verl's own policy losses, called on the same float64 inputs and config.

Pairs: rlguard.grpo vs ``vanilla`` (dual clip active), rlguard.gspo vs ``gspo``, rlguard.sapo vs ``sapo``,
rlguard.cispo vs ``cispo``, rlguard.gmpo vs ``geo_mean``; rlguard.gspo_token vs ``gspo`` for per-token
advantages and weights. Every ``loss_agg_mode``, with no ``global_batch_info`` and with a data-parallel one
(2 ranks x 2 micro-batches). Loss and gradient agree to ``rtol=1e-6``; each test asserts that its data make the
clip ranges matter, so that a wrong branch would show.

Needs ``pip install rlguard[verl]``; skipped where verl is not installed.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

from omegaconf import OmegaConf  # after the skip: verl brings omegaconf
from verl.trainer.ppo import core_algos
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig

from rlguard.adapters import verl as adapter
from rlguard.core_losses import list_objectives
from tests.helpers.verl_parity import (
    ATOL,
    DP,
    RTOL,
    VERL_MODES,
    B,
    T,
    actor_config,
    dp_info,
    make_inputs,
    micro_batches,
)

#: (rlguard objective, verl loss_mode), compared for every loss_agg_mode
PAIRS = (("grpo", "vanilla"), ("gspo", "gspo"), ("sapo", "sapo"), ("cispo", "cispo"), ("gmpo", "geo_mean"))


def token_weights(seq_level: bool, seed: int = 1) -> torch.Tensor:
    """rollout_is_weights as verl's rollout correction makes them: per token, or constant along a sequence."""
    g = torch.Generator().manual_seed(seed)
    shape = (B, 1) if seq_level else (B, T)
    return (0.2 + 1.8 * torch.rand(*shape, generator=g, dtype=torch.float64)).expand(B, T).contiguous()


def single_info(inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {**dp_info(inputs), "dp_size": 1}


def direct_info(theirs: str, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """global_batch_info of a direct call: none. verl's geo_mean ignores it and averages over all rows, the
    empty one included, where rlguard counts non-empty rows unless told the global batch size, which verl's
    engine always sets (``global_batch_size``, the mini-batch's rows): give it that."""
    return single_info(inputs) if theirs == "geo_mean" else {}


def run(
    loss_mode: str,
    inputs: dict[str, torch.Tensor],
    mode: str,
    info: dict[str, Any],
    rows: slice = slice(None),
    weights: torch.Tensor | None = None,
    config: ActorConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(loss, d loss / d log_prob over the full batch, metrics) of verl's registered ``loss_mode`` on ``rows``."""
    config = config if config is not None else actor_config(loss_agg_mode=mode)
    config.global_batch_info.clear()
    config.global_batch_info.update(info)
    leaf = inputs["log_prob"].clone().requires_grad_(True)
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
    return loss.detach(), grad.nan_to_num(), metrics  # padding's gradient is NaN in verl (NaN * 0); never used


def data_parallel(
    loss_mode: str, inputs: dict[str, torch.Tensor], mode: str, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and gradient of one optimizer step over DP ranks: the sum of each rank's micro-batch losses,
    averaged over ranks (what FSDP's gradient all-reduce computes)."""
    info = dp_info(inputs)
    parts = [run(loss_mode, inputs, mode, info, rows, weights)[:2] for rows in micro_batches()]
    loss = torch.stack([part[0] for part in parts]).sum() / DP
    grad = torch.stack([part[1] for part in parts]).sum(dim=0) / DP
    return loss, grad


def assert_same(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert actual[1].abs().max() > 1e-3, "the gradient vanished: the comparison would prove nothing"
    torch.testing.assert_close(actual[0], expected[0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(actual[1], expected[1], rtol=RTOL, atol=ATOL)


# -- loss and gradient parity -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
def test_parity_one_batch(ours: str, theirs: str, mode: str) -> None:
    inputs = make_inputs()
    expected = run(theirs, inputs, mode, direct_info(theirs, inputs))
    actual = run(adapter.loss_mode(ours), inputs, mode, direct_info(theirs, inputs))
    assert_same(actual[:2], expected[:2])
    torch.testing.assert_close(actual[2]["actor/ppo_kl"], expected[2]["actor/ppo_kl"], rtol=RTOL, atol=ATOL)
    if theirs in ("gspo", "cispo"):  # same definition of the clip fraction; vanilla's excludes the dual clip
        assert actual[2]["actor/pg_clipfrac"] == pytest.approx(expected[2]["actor/pg_clipfrac"], rel=RTOL)
    if theirs != "sapo":
        assert 0 < actual[2]["actor/pg_clipfrac"] < 1, "the data must clip some terms and not others"


def test_dual_clip_is_active() -> None:
    """The data reach verl's dual clip (ratio > clip_ratio_c with A < 0), so grpo's parity covers it, and
    rlguard.grpo applies verl's clip_ratio_c: without it the loss differs."""
    inputs = make_inputs()
    verl_loss, _, metrics = run("vanilla", inputs, "token-mean", {})
    assert metrics["actor/pg_clipfrac_lower"] > 0
    no_dual = actor_config(
        loss_agg_mode="token-mean",
        policy_loss=adapter.RLGuardPolicyLossConfig(objective_kwargs={"clip_c": None}),
    )
    loss, _, _ = run(adapter.loss_mode("grpo"), inputs, "token-mean", {}, config=no_dual)
    assert abs(float(loss - verl_loss)) > 1e-3


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize(("ours", "theirs"), [pair for pair in PAIRS if pair[1] != "geo_mean"])
def test_parity_per_micro_batch_with_data_parallel_info(ours: str, theirs: str, mode: str) -> None:
    """Each micro-batch of each rank, under the global_batch_info verl's engine sets with dp_size=2. (verl's
    geo_mean ignores global_batch_info, so its micro-batch losses do not add up to the batch's; gmpo is checked
    against geo_mean of the whole batch in test_data_parallel_step_equals_one_batch.)"""
    inputs = make_inputs()
    for rows in micro_batches():
        expected = run(theirs, inputs, mode, dp_info(inputs), rows)
        actual = run(adapter.loss_mode(ours), inputs, mode, dp_info(inputs), rows)
        torch.testing.assert_close(actual[0], expected[0], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(actual[1], expected[1], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
def test_data_parallel_step_equals_one_batch(ours: str, theirs: str, mode: str) -> None:
    """2 ranks x 2 micro-batches of rlguard's loss give verl's loss of the whole batch on one process."""
    inputs = make_inputs()
    expected = run(theirs, inputs, mode, {} if theirs == "geo_mean" else single_info(inputs))
    assert_same(data_parallel(adapter.loss_mode(ours), inputs, mode), expected[:2])


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize(
    ("ours", "theirs", "seq_weights"),
    [
        ("grpo", "vanilla", False),
        ("sapo", "sapo", False),
        ("cispo", "cispo", False),
        ("gspo_token", "gspo", False),
        ("gspo", "gspo", True),
        ("gmpo", "geo_mean", True),
    ],
)
def test_parity_with_rollout_is_weights(ours: str, theirs: str, seq_weights: bool, mode: str) -> None:
    """verl's rollout correction weights multiply each token's term. GSPO's sequence ratio and GMPO's
    geometric mean agree with verl for sequence-level weights (verl's rollout_is="sequence"); for token-level
    weights verl's gspo is GSPO-token and its geo_mean takes their geometric mean."""
    inputs = make_inputs()
    weights = token_weights(seq_weights)
    weights[~inputs["response_mask"]] = 7.0  # padding may hold anything
    info = direct_info(theirs, inputs)
    expected = run(theirs, inputs, mode, info, weights=weights)
    assert_same(run(adapter.loss_mode(ours), inputs, mode, info, weights=weights)[:2], expected[:2])
    assert abs(float(expected[0] - run(theirs, inputs, mode, info)[0])) > 1e-3, "the weights must matter"
    if theirs != "geo_mean":
        expected = run(theirs, inputs, mode, single_info(inputs), weights=weights)
    assert_same(data_parallel(adapter.loss_mode(ours), inputs, mode, weights), expected[:2])


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize(("ours", "theirs"), [("grpo", "vanilla"), ("sapo", "sapo"), ("cispo", "cispo")])
def test_parity_token_level_advantages(ours: str, theirs: str, mode: str) -> None:
    inputs = make_inputs(token_advantages=True)
    assert_same(run(adapter.loss_mode(ours), inputs, mode, {})[:2], run(theirs, inputs, mode, {})[:2])


@pytest.mark.parametrize("mode", VERL_MODES)
def test_gspo_with_token_level_advantages_is_gspo_token(mode: str) -> None:
    """verl's gspo is GSPO-token (sg[s_i] pi_t / sg[pi_t]); with per-token advantages that is rlguard.gspo_token,
    while rlguard.gspo sends each token's advantage through the whole sequence ratio."""
    inputs = make_inputs(token_advantages=True)
    expected = run("gspo", inputs, mode, {})
    assert_same(run(adapter.loss_mode("gspo_token"), inputs, mode, {})[:2], expected[:2])
    gspo_grad = run(adapter.loss_mode("gspo"), inputs, mode, {})[1]
    assert (gspo_grad - expected[1]).abs().max() > 1e-3


# -- translation of verl's settings ----------------------------------------------------------------------------


def test_hyperparameters_follow_verls_keys() -> None:
    config = actor_config(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=0.3, clip_ratio_c=4.0)
    assert adapter.objective_hyperparameters("grpo", config, "token-mean") == {
        "clip_low": 0.1,  # clip_ratio where clip_ratio_low is null
        "clip_high": 0.3,
        "clip_c": 4.0,
        "aggregation": "token-mean",
    }
    gspo = adapter.objective_hyperparameters("gspo", config, "seq-mean-token-sum")
    assert "clip_c" not in gspo  # verl's gspo has no dual clip
    assert gspo["aggregation"] == "seq-mean-token-sum"
    assert adapter.objective_hyperparameters("sapo", actor_config(tau_pos=0.5, tau_neg=2.0), "token-mean") == {
        "tau_pos": 0.5,
        "tau_neg": 2.0,
    }  # no aggregation: SAPO keeps seq-mean-token-mean, as verl's sapo does
    assert adapter.objective_hyperparameters("cispo", config, "token-sum")["aggregation"] == "token-mean"


def test_normalisers_from_global_batch_info() -> None:
    info = {"dp_size": 4, "batch_num_tokens": 100, "global_batch_size": 16, "loss_scale_factor": 32}
    assert adapter.normalisers(info, "token-mean", "token-mean") == adapter.Normalisers(25.0, 4.0, 32)
    assert adapter.normalisers(info, "token-sum", "token-mean").num_tokens == 0.25
    assert adapter.normalisers({}, "token-mean", "token-mean") == adapter.Normalisers(None, None, None)
    with pytest.raises(ValueError, match="dp_size=2 but no batch_num_tokens"):
        adapter.normalisers({"dp_size": 2}, "token-mean", "token-mean")
    with pytest.raises(ValueError, match="dp_size=2 but no global_batch_size"):
        adapter.normalisers({"dp_size": 2, "batch_num_tokens": 10}, "seq-mean-token-mean", "seq-mean-token-mean")


def test_policy_loss_config_from_hydra_target() -> None:
    """``policy_loss._target_`` selects RLGuardPolicyLossConfig; its keys reach the objective."""
    node = OmegaConf.create(
        {
            "_target_": "rlguard.adapters.verl.RLGuardPolicyLossConfig",
            "loss_mode": "rlguard.grpo",
            "aggregation": "seq-mean-token-sum",
            "off_policy_mask_delta": 0.0,
            "objective_kwargs": {"clip_high": 0.5},
        }
    )
    policy = omega_conf_to_dataclass(node)
    assert isinstance(policy, adapter.RLGuardPolicyLossConfig)
    config = actor_config(loss_agg_mode="token-mean", policy_loss=policy)
    assert adapter.objective_hyperparameters("grpo", config, "token-mean") == {
        "clip_low": 0.2,
        "clip_high": 0.5,
        "clip_c": 3.0,
        "aggregation": "seq-mean-token-sum",
        "off_policy_mask_delta": 0.0,
        "on_nonfinite": "raise",
    }
    _, _, metrics = run(adapter.loss_mode("grpo"), make_inputs(), "token-mean", {}, config=config)
    assert metrics["rlguard/masked_frac"] > 0  # sequences with A < 0 that drifted were dropped


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"aggregation": "token-sum"}, "policy_loss.aggregation must be null or one of"),
        ({"on_nonfinite": "ignore"}, "policy_loss.on_nonfinite must be one of"),
        ({"objective_kwargs": {"rollout_is": "token"}}, "algorithm.rollout_correction"),
    ],
)
def test_policy_loss_config_rejects(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        adapter.RLGuardPolicyLossConfig(**kwargs)


def test_unknown_objective_kwargs_are_named() -> None:
    config = actor_config(policy_loss=adapter.RLGuardPolicyLossConfig(objective_kwargs={"tau_pos": 2.0}))
    with pytest.raises(ValueError, match=r"\['tau_pos'\], which objective 'grpo' does not take"):
        adapter.objective_hyperparameters("grpo", config, "token-mean")


def test_nonfinite_policy_reaches_the_objective() -> None:
    inputs = make_inputs()
    inputs["log_prob"][0, 2] = float("nan")
    with pytest.raises(ValueError, match="logprobs contains 1 NaN"):
        run(adapter.loss_mode("gspo"), inputs, "token-mean", {})
    masked = actor_config(loss_agg_mode="token-mean", policy_loss=adapter.RLGuardPolicyLossConfig(on_nonfinite="mask"))
    loss, _, metrics = run(adapter.loss_mode("gspo"), inputs, "token-mean", {}, config=masked)
    assert torch.isfinite(loss)
    assert metrics["rlguard/nonfinite"] == 1.0


def test_metrics_are_floats_in_verls_names_and_rlguards() -> None:
    _, _, metrics = run(adapter.loss_mode("gspo"), make_inputs(), "token-mean", {})
    assert {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"} <= set(metrics)
    assert {"rlguard/clip_frac_high", "rlguard/seq_ratio_max", "rlguard/kl_old"} <= set(metrics)
    assert "rlguard/loss" not in metrics  # the micro-batch share; verl reports actor/pg_loss itself
    assert all(type(value) is float for value in metrics.values())


def test_config_is_required() -> None:
    inputs = make_inputs()
    fn = core_algos.get_policy_loss_fn(adapter.loss_mode("grpo"))
    with pytest.raises(ValueError, match="needs verl's actor config"):
        fn(**inputs, loss_agg_mode="token-mean", config=None, rollout_is_weights=None)


# -- registration --------------------------------------------------------------------------------------------


def test_every_objective_is_registered() -> None:
    for name in list_objectives():
        fn = core_algos.get_policy_loss_fn(f"rlguard.{name}")
        assert fn.rlguard_objective == name
    assert adapter.register() == [f"rlguard.{name}" for name in list_objectives()]  # idempotent


def test_registered_losses_take_verl_s_own_signature_and_name_it_once() -> None:
    """``rlguard.<name>`` has the signature of verl's own losses, and ``VerlLossInputs`` (what it hands the guarded
    and the plain loss) its arguments in the same order with the same defaults."""
    verl = inspect.signature(core_algos.compute_policy_loss_vanilla).parameters
    ours = inspect.signature(core_algos.get_policy_loss_fn("rlguard.grpo")).parameters
    inputs = {f.name: f.default for f in dataclasses.fields(adapter.VerlLossInputs)}
    assert list(ours) == list(verl) == list(inputs)
    assert [p.default for p in ours.values()] == [p.default for p in verl.values()]
    assert [p.default for p in verl.values() if p.default is not inspect.Parameter.empty] == [
        v for v in inputs.values() if v is not dataclasses.MISSING
    ]


def test_a_foreign_registration_is_not_overwritten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "rlguard.gspo", core_algos.compute_policy_loss_gspo)
    with pytest.raises(ValueError, match=r"already holds 'rlguard\.gspo'"):
        adapter.register()


_CHECK_REGISTRY = textwrap.dedent(
    """
    import verl
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    print(sorted(key for key in POLICY_LOSS_REGISTRY if key.startswith("rlguard.")))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "env",
    [
        {},  # the `verl.plugins` entry point, which verl loads on `import verl`
        {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "rlguard.adapters.verl"},
    ],
    ids=["entry-point", "external-modules"],
)
def test_registered_after_plain_import_verl_in_fresh_process(env: dict[str, str], tmp_path: Path) -> None:
    """What every Ray worker does: a new interpreter that imports verl, and nothing of rlguard. It runs outside
    the repository, whose rlguard.egg-info would otherwise shadow the installed distribution's entry points."""
    result = subprocess.run(
        [sys.executable, "-c", _CHECK_REGISTRY],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str([f"rlguard.{name}" for name in list_objectives()]), result.stderr[-3000:]


# -- verl 0.9.1 with TRL >= 1.0 --------------------------------------------------------------------------------


def _tiny_causal_lm() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return LlamaForCausalLM(config)


def test_apply_monkey_patch_with_trl_without_value_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's engine calls apply_monkey_patch on every model; with TRL 1.x (no AutoModelForCausalLMWithValueHead)
    it raises ImportError unless the adapter's fix is in place."""
    trl = pytest.importorskip("trl", reason="needs TRL installed beside verl")
    if hasattr(trl, "AutoModelForCausalLMWithValueHead"):
        pytest.skip(f"TRL {trl.__version__} still has AutoModelForCausalLMWithValueHead")
    from verl.models.transformers import monkey_patch
    from verl.utils import import_utils

    model = _tiny_causal_lm()
    monkey_patch.apply_monkey_patch(model, use_remove_padding=False)  # the adapter's fix is active
    monkeypatch.setattr(monkey_patch, "is_trl_available", import_utils.is_trl_available)
    with pytest.raises(ImportError, match="AutoModelForCausalLMWithValueHead"):
        monkey_patch.apply_monkey_patch(model, use_remove_padding=False)


def test_value_head_patch_still_applies_where_the_class_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a TRL that has the class (TRL 0.x), verl's state_dict patch runs as before."""
    pytest.importorskip("trl", reason="needs TRL installed beside verl")
    from verl.models.transformers import monkey_patch

    value_head = type("AutoModelForCausalLMWithValueHead", (torch.nn.Module,), {})
    fake = types.ModuleType("trl.experimental.ppo")
    fake.AutoModelForCausalLMWithValueHead = value_head  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trl.experimental.ppo", fake)
    adapter.patch_verl_trl_value_head_check()
    assert monkey_patch.is_trl_available()
    monkey_patch.apply_monkey_patch(_tiny_causal_lm(), use_remove_padding=False)
    assert value_head.state_dict is not torch.nn.Module.state_dict  # type: ignore[attr-defined]  # verl replaced it
