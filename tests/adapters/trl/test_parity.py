"""The TRL adapter: exact parity with TRL's own ``GRPOTrainer._compute_loss``, config mapping, errors, callback.

Parity calls TRL's real code: a ``GuardedGRPOTrainer`` is built from a real config (so TRL's ``__init__`` sets
every attribute its loss reads), and on the same float64 inputs ``GRPOTrainer._compute_loss(trainer, ...)`` (stock
TRL) is compared with ``trainer._compute_loss(...)`` (rlguard), losses and gradients at rtol 1e-6. The only stub
is ``_get_per_token_logps_and_entropies``, which both share: it returns log-probs and entropies that are functions
of one float64 leaf ``theta``, so that the gradient of each loss with respect to ``theta`` can be compared. One
test (``test_parity_through_the_real_model``) keeps TRL's real log-prob computation on the tiny Llama (float32,
TRL's kernel precision).

Every batch mixes a full row, a one-token row, an empty row and rows of other lengths; log-ratios have per-row
scales from 0.02 to 1.2, towards the advantage's sign or away from it, so that clipping is active on some tokens
and not on others, which each comparison asserts from TRL's own clip metrics. Gradient accumulation is 2 and
``steps_per_generation`` 4, so that every normaliser's GA and generation-batch factors matter.
"""

from __future__ import annotations

import inspect
import math
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from transformers import HfArgumentParser, TrainerControl, TrainerState
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from rlguard.adapters.trl import (
    SUPPORTED_TRL,
    GuardedGRPOConfig,
    GuardedGRPOTrainer,
    StabilityCallback,
    canonical_stats,
    check_trl_compatibility,
    map_trl_config,
)
from rlguard.tasks.hf import (
    addition_dataset,
    addition_reward,
    checkpointing_argument,
)
from tests.helpers.trl_parity import (
    ATOL,
    BASE,
    RTOL,
    B,
    assert_parity,
    assert_some_clipped,
    config,
    make_inputs,
    run,
    trainer_for,
)

SEQUENCE_WARNING = "trl#3823"
TOKEN_SUMMED = ("bnpo", "dr_grpo", "dapo")


# ---------------------------------------------------------------- parity: loss_type x importance_sampling_level
CASES = [(lt, lvl) for lt in ("grpo", "bnpo", "dr_grpo", "dapo") for lvl in ("token", "sequence")]
CASES += [("cispo", "token"), ("sapo", "token")]
LOSS_OPTIONS: dict[str, dict[str, Any]] = {
    "cispo": {"epsilon_high": 1.3},  # an absolute cap that binds here
    # TRL builds its temperatures with torch.where from Python floats, a float32 tensor: 1.05 becomes 1.0499999523.
    # rlguard keeps the configured value, so the test uses temperatures that float32 holds exactly.
    "sapo": {"sapo_temperature_pos": 0.875, "sapo_temperature_neg": 1.125},
}


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize(("loss_type", "level"), CASES)
def test_loss_and_gradient_equal_trl(model_dir: Path, loss_type: str, level: str, beta: float) -> None:
    expect = (SEQUENCE_WARNING,) if level == "sequence" and loss_type in TOKEN_SUMMED else ()
    trainer = trainer_for(
        model_dir,
        expect,
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=beta,
        # TRL weights the sequence-level KL by the sequence ratio (see the xfail below); the plain k3 term is shared
        use_bias_correction_kl=level == "token",
        **LOSS_OPTIONS.get(loss_type, {}),
    )
    expected_objective = {"bnpo": "grpo"}.get(loss_type, loss_type) if level == "token" else "gspo"
    assert trainer.rlguard_mapping.objective == expected_objective
    _, metrics = assert_parity(trainer, seed=zlib.crc32(repr((loss_type, level, beta)).encode()), ref=beta > 0)
    if loss_type == "cispo":
        assert_some_clipped(metrics, "cispo_clip_ratio")
    elif loss_type != "sapo":
        assert_some_clipped(metrics)
    if beta > 0:
        assert metrics["kl"][0] > 0


def test_the_comparison_tells_loss_types_apart(model_dir: Path) -> None:
    """The same inputs give different TRL losses per loss_type: a wrong mapping could not pass the test above."""
    losses = {}
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        trainer = trainer_for(model_dir, loss_type=loss_type, beta=0.0)
        theta, inputs, policy = make_inputs(7)
        losses[loss_type] = run(trainer, GRPOTrainer._compute_loss, theta, inputs, policy)[0].item()
    assert len({round(v, 9) for v in losses.values()}) == len(losses), losses


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_evaluation_mode_uses_trl_eval_normalisers(model_dir: Path, loss_type: str) -> None:
    trainer = trainer_for(model_dir, loss_type=loss_type, beta=0.0, **LOSS_OPTIONS.get(loss_type, {}))
    trainer.model.eval()  # type: ignore[union-attr]
    assert_parity(trainer, seed=3, ref=False)


@pytest.mark.parametrize(("loss_type", "level"), [("grpo", "token"), ("dapo", "token"), ("grpo", "sequence")])
def test_on_policy_without_old_logprobs(model_dir: Path, loss_type: str, level: str) -> None:
    trainer = trainer_for(
        model_dir,
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=0.04,
        use_bias_correction_kl=level == "token",
    )
    assert_parity(trainer, seed=4, old=False)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_token_level_advantages_and_tool_mask(model_dir: Path, loss_type: str) -> None:
    trainer = trainer_for(model_dir, loss_type=loss_type, beta=0.04)
    assert_parity(trainer, seed=5, token_adv=True, tool_mask=True)


def test_gradient_accumulation_of_one_and_other_generation_batches(model_dir: Path) -> None:
    trainer = trainer_for(model_dir, loss_type="dapo", beta=0.0)
    for ga in (1, 3):
        trainer.current_gradient_accumulation_steps = ga
        assert_parity(trainer, seed=6, ref=False)


# ---------------------------------------------------------------- parity: dual clip, masks, IS, entropy, aux loss
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_delta_is_the_dual_clip(model_dir: Path, level: str) -> None:
    trainer = trainer_for(model_dir, loss_type="grpo", importance_sampling_level=level, delta=1.3, beta=0.0)
    assert trainer.rlguard_objective.clip_c == 1.3  # type: ignore[attr-defined]
    _, inputs, policy = make_inputs(8, ref=False)
    ratio = torch.exp(policy()[0].detach() - inputs["old_per_token_logps"])
    dual = (ratio > 1.3) & (inputs["advantages"].unsqueeze(1) < 0) & inputs["completion_mask"].bool()
    assert level == "sequence" or dual.any(), "the dual clip must bind on some token"
    assert_parity(trainer, seed=8, ref=False)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_off_policy_mask_threshold(model_dir: Path, level: str) -> None:
    trainer = trainer_for(
        model_dir, loss_type="grpo", importance_sampling_level=level, off_policy_mask_threshold=0.2, beta=0.0
    )
    assert trainer.rlguard_objective.off_policy_mask_delta == 0.2
    _, inputs, policy = make_inputs(9, ref=False)
    keep = GRPOTrainer.get_off_policy_mask(
        inputs["advantages"].unsqueeze(1),
        policy()[0],
        inputs["old_per_token_logps"],
        inputs["completion_mask"],
        0.2,
    )
    assert 0 < keep.sum() < B, "some sequences must be dropped, not all"
    assert_parity(trainer, seed=9, ref=False)


VLLM_FIELDS = (
    "use_vllm",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
)
VLLM_MODES = [
    ("token_truncate", None, 1.5),
    ("sequence_truncate", None, 1.5),
    ("token_mask", 0.7, 1.5),
    ("token_mask", None, 1.5),
    ("sequence_mask", 0.5, 2.0),
]


def trl_importance_sampling_ratio(inputs: dict[str, Any], mode: str, c_min: float | None, c_max: float) -> torch.Tensor:
    """The ratio TRL computes at generation time (grpo_trainer.py, ``_generate_and_score_completions``): TRL's
    ``_compute_loss`` receives it as an input. Computing it needs vLLM in TRL, so it is written out here."""
    diff = (inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]) * inputs["completion_mask"]
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=c_min, max=c_max)
    low = -math.inf if c_min is None else c_min
    return ratio.masked_fill((ratio < low) | (ratio > c_max), 0.0)


def vllm_case(
    trainer: GuardedGRPOTrainer, mode: str, c_min: float | None, c_max: float, seed: int = 10
) -> tuple[dict[str, Any], torch.Tensor]:
    """Switch ``trainer`` to vLLM importance sampling as TRL's ``__init__`` would (vLLM is not installed here) and
    return inputs with TRL's ratio, and the tokens the correction changes."""
    vllm = dict(zip(VLLM_FIELDS, (True, True, mode, c_min, c_max), strict=True))
    for name, value in vllm.items():
        setattr(trainer, name, value)
        setattr(trainer.args, name, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # test_vllm_warnings checks them
        trainer.rlguard_mapping = map_trl_config(trainer.args)  # type: ignore[arg-type]
    trainer.rlguard_objective = trainer.rlguard_mapping.build()
    _, inputs, _ = make_inputs(seed, ref=False, sampling=True)
    inputs["importance_sampling_ratio"] = ratio = trl_importance_sampling_ratio(inputs, mode, c_min, c_max)
    changed = (ratio == 0) if mode.endswith("mask") else (ratio == c_max)
    return inputs, changed


@pytest.fixture
def vllm_trainer(model_dir: Path, request: pytest.FixtureRequest) -> Iterator[GuardedGRPOTrainer]:
    trainer = trainer_for(model_dir, loss_type="grpo", importance_sampling_level=request.param, beta=0.0)
    saved = {name: (getattr(trainer, name), getattr(trainer.args, name)) for name in VLLM_FIELDS}
    yield trainer
    for name, (value, arg) in saved.items():
        setattr(trainer, name, value)
        setattr(trainer.args, name, arg)
    trainer.rlguard_mapping = map_trl_config(trainer.args, warn=False)  # type: ignore[arg-type]
    trainer.rlguard_objective = trainer.rlguard_mapping.build()


def assert_parity_on(trainer: GuardedGRPOTrainer, seed: int, inputs: dict[str, Any]) -> None:
    theta, _, policy = make_inputs(seed, ref=False, sampling=True)
    trl_loss, trl_grad = run(trainer, GRPOTrainer._compute_loss, theta, inputs, policy)
    ours_loss, ours_grad = run(trainer, GuardedGRPOTrainer._compute_loss, theta, inputs, policy)
    torch.testing.assert_close(ours_loss, trl_loss, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ours_grad, trl_grad, rtol=RTOL, atol=ATOL)


# token-level masks with a sequence-level ratio: see test_known_difference_token_mask_in_sequence_ratio
VLLM_CASES = [
    (lvl, *m) for lvl in ("token", "sequence") for m in VLLM_MODES if (lvl, m[0]) != ("sequence", "token_mask")
]


@pytest.mark.parametrize(("vllm_trainer", "mode", "c_min", "c_max"), VLLM_CASES, indirect=["vllm_trainer"])
def test_vllm_importance_sampling_modes(
    vllm_trainer: GuardedGRPOTrainer, mode: str, c_min: float | None, c_max: float
) -> None:
    inputs, changed = vllm_case(vllm_trainer, mode, c_min, c_max)
    assert changed.any() and not changed.all(), "the correction must bind on some tokens and not on others"
    assert_parity_on(vllm_trainer, 10, inputs)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_entropy_bonus(model_dir: Path, loss_type: str) -> None:
    trainer = trainer_for(model_dir, loss_type=loss_type, entropy_coef=0.05, beta=0.0)
    _, metrics = assert_parity(trainer, seed=11, ref=False)
    assert "policy_loss" in metrics and "entropy_coef" in metrics


def test_moe_auxiliary_loss(model_dir: Path) -> None:
    trainer = trainer_for(model_dir, loss_type="dapo", beta=0.0)
    trainer.aux_loss_enabled, trainer.router_aux_loss_coef = True, 0.02
    try:
        theta, inputs, policy = make_inputs(12, ref=False)

        def aux() -> torch.Tensor:
            return (theta**2).mean()

        trl_loss, trl_grad = run(trainer, GRPOTrainer._compute_loss, theta, inputs, policy, aux)
        ours_loss, ours_grad = run(trainer, GuardedGRPOTrainer._compute_loss, theta, inputs, policy, aux)
    finally:
        trainer.aux_loss_enabled = False
    torch.testing.assert_close(ours_loss, trl_loss, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ours_grad, trl_grad, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- known differences (strict xfail: they must differ)
@pytest.mark.xfail(
    raises=AssertionError, reason="TRL weights the KL by the sequence ratio at importance_sampling_level='sequence'"
)
def test_known_difference_sequence_level_kl_correction(model_dir: Path) -> None:
    trainer = trainer_for(
        model_dir,
        ("trl#3823|sequence ratio",),
        loss_type="grpo",
        importance_sampling_level="sequence",
        beta=0.04,
        use_bias_correction_kl=True,
    )
    assert_parity(trainer, seed=13)


@pytest.mark.xfail(
    raises=AssertionError, reason="TRL keeps the KL term of sequences removed by off-policy masking; rlguard drops it"
)
def test_known_difference_kl_of_masked_sequences(model_dir: Path) -> None:
    trainer = trainer_for(
        model_dir, ("lose their KL term",), loss_type="grpo", off_policy_mask_threshold=0.2, beta=0.04
    )
    assert_parity(trainer, seed=9)


@pytest.mark.xfail(
    raises=AssertionError, reason="rlguard drops tokens removed by token-level masked IS from log s_i; TRL keeps them"
)
@pytest.mark.parametrize("vllm_trainer", ["sequence"], indirect=True)
def test_known_difference_token_mask_in_sequence_ratio(vllm_trainer: GuardedGRPOTrainer) -> None:
    inputs, changed = vllm_case(vllm_trainer, "token_mask", 0.7, 1.5)
    assert changed.any()
    assert_parity_on(vllm_trainer, 10, inputs)


# ---------------------------------------------------------------- parity through TRL's real log-prob computation
@pytest.mark.parametrize(("loss_type", "level"), [("dapo", "token"), ("grpo", "sequence")])
def test_parity_through_the_real_model(model_dir: Path, loss_type: str, level: str) -> None:
    """No stub: TRL's fused LM head computes the log-probs of the tiny Llama; gradients w.r.t. its weights.

    TRL's chunked log-prob kernel accumulates in float32 and returns float32 log-probs whatever the model's dtype,
    so this comparison is in float32: both losses are float32 computations in a different order, compared at
    rtol 1e-5, and the weight gradients at 1e-5 of the largest gradient entry.
    """
    trainer = trainer_for(
        model_dir, loss_type=loss_type, importance_sampling_level=level, beta=0.04, use_bias_correction_kl=False
    )
    _, inputs, _ = make_inputs(14)
    inputs = {k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}
    params = [p for p in trainer.model.parameters() if p.requires_grad]  # type: ignore[union-attr]

    def loss_and_grads(fn: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        loss = fn(trainer, trainer.model, inputs)
        return loss.detach(), list(torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True))

    trl_loss, trl_grads = loss_and_grads(GRPOTrainer._compute_loss)
    ours_loss, ours_grads = loss_and_grads(GuardedGRPOTrainer._compute_loss)
    assert trl_loss.dtype == ours_loss.dtype == torch.float32
    scale = max(g.abs().max().item() for g in trl_grads)
    assert scale > 0
    torch.testing.assert_close(ours_loss, trl_loss, rtol=1e-5, atol=0.0)
    for ours, theirs in zip(ours_grads, trl_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0.0, atol=1e-5 * scale)


# ---------------------------------------------------------------- config mapping
@pytest.mark.parametrize(
    ("loss_type", "objective", "aggregation", "normaliser"),
    [
        ("grpo", "grpo", "seq-mean-token-mean", "sequences"),
        ("bnpo", "grpo", "token-mean", "local_tokens"),
        ("dr_grpo", "dr_grpo", "seq-mean-token-sum-norm", "sequences"),
        ("dapo", "dapo", "token-mean", "global_tokens"),
        ("cispo", "cispo", "token-mean", "global_tokens"),
        ("sapo", "sapo", "seq-mean-token-mean", "sequences"),
    ],
)
def test_loss_type_mapping(loss_type: str, objective: str, aggregation: str, normaliser: str) -> None:
    mapping = config(loss_type=loss_type, epsilon_high=5.0 if loss_type == "cispo" else None).objective_mapping()
    assert (mapping.objective, mapping.kwargs["aggregation"], mapping.normaliser) == (
        objective,
        aggregation,
        normaliser,
    )
    assert mapping.kwargs["max_length"] == BASE["max_completion_length"]


def test_trl_settings_map_to_objective_arguments() -> None:
    kw = config(loss_type="grpo", epsilon=0.1, epsilon_high=0.25, delta=1.5, beta=0.01).objective_mapping().kwargs
    assert (kw["clip_low"], kw["clip_high"], kw["clip_c"], kw["beta"], kw["kl_estimator"], kw["kl_unbiased"]) == (
        0.1,
        0.25,
        1.5,
        0.01,
        "k3",
        True,
    )
    kw = config(loss_type="grpo", use_bias_correction_kl=False).objective_mapping().kwargs
    assert (kw["clip_low"], kw["clip_high"], kw["clip_c"], kw["kl_unbiased"]) == (0.2, 0.2, None, False)
    kw = config(loss_type="cispo", epsilon_high=5.0).objective_mapping().kwargs
    assert (kw["bounds"], kw["clip_low"], kw["clip_high"]) == ("absolute", None, 5.0)
    kw = config(loss_type="sapo", sapo_temperature_pos=0.9, sapo_temperature_neg=1.2).objective_mapping().kwargs
    assert (kw["tau_pos"], kw["tau_neg"]) == (0.9, 1.2)
    kw = config(loss_type="grpo", off_policy_mask_threshold=0.5).objective_mapping().kwargs
    assert kw["off_policy_mask_delta"] == 0.5


@pytest.mark.parametrize(
    ("mode", "c_min", "c_max", "expected"),
    [
        ("token_truncate", None, 2.0, {"rollout_is": "token", "rollout_is_cap": 2.0}),
        ("sequence_truncate", None, 3.0, {"rollout_is": "sequence", "rollout_is_cap": 3.0}),
        (
            "token_mask",
            0.5,
            2.0,
            {"rollout_is": "token", "rollout_mask": "token", "rollout_mask_low": 0.5, "rollout_mask_high": 2.0},
        ),
        (
            "sequence_mask",
            None,
            None,
            {"rollout_is": "sequence", "rollout_mask": "sequence", "rollout_mask_low": 0.0},
        ),
    ],
)
def test_vllm_importance_sampling_mapping(
    mode: str, c_min: float | None, c_max: float | None, expected: dict[str, Any]
) -> None:
    args = config(
        loss_type="grpo",
        use_vllm=True,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=c_min,
        vllm_importance_sampling_clip_max=c_max,
    )
    kw = args.objective_mapping().kwargs
    assert {k: kw[k] for k in expected} == expected
    cap = math.inf if c_max is None else c_max
    assert kw["rollout_is_cap"] == cap and kw.get("rollout_mask_high", cap) == cap
    assert "rollout_is" not in config(loss_type="grpo", use_vllm=False).objective_mapping().kwargs


def test_sequence_level_means_gspo_and_named_objectives_follow_trl_settings() -> None:
    assert config(loss_type="grpo", importance_sampling_level="sequence").objective_mapping().objective == "gspo"
    mapping = config(objective="grpo", loss_type="grpo", importance_sampling_level="sequence").objective_mapping()
    assert mapping.objective == "gspo"
    mapping = config(objective="gspo", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4).objective_mapping()
    assert (mapping.objective, mapping.kwargs["clip_low"], mapping.kwargs["clip_high"]) == ("gspo", 3e-4, 4e-4)
    mapping = config(objective="gmpo", loss_type="grpo").objective_mapping()
    assert "clip_low" not in mapping.kwargs  # GMPO clips in log space: TRL's epsilon does not carry over


def test_objective_kwargs_override_and_choose_the_normaliser() -> None:
    mapping = config(
        objective="dapo", loss_type="bnpo", objective_kwargs={"aggregation": "token-mean", "clip_high": 0.3}
    ).objective_mapping()
    assert (mapping.kwargs["clip_high"], mapping.normaliser) == (0.3, "global_tokens")  # named: the exact global count
    parsed = config(objective_kwargs='{"aggregation": "seq-mean-token-sum"}', loss_type="grpo")
    assert parsed.objective_kwargs == {"aggregation": "seq-mean-token-sum"}
    assert config(loss_type="grpo").objective_kwargs == {}


def test_command_line_parsing() -> None:
    argv = ["--output_dir", "unused", "--use_cpu", "--bf16", "False", f"--{checkpointing_argument()}", "False"]
    argv += ["--objective", "gspo", "--loss_type", "grpo", "--objective_kwargs", '{"clip_high": 0.001}']
    (args,) = HfArgumentParser((GuardedGRPOConfig,)).parse_args_into_dataclasses(argv)  # type: ignore[arg-type]
    assert (args.objective, args.objective_kwargs) == ("gspo", {"clip_high": 0.001})
    assert args.objective_mapping().kwargs["clip_high"] == 0.001


def _parse(argv: list[str], yaml_text: str | None = None, tmp: Path | None = None) -> GuardedGRPOConfig:
    """TRL's own parser, as TRL's scripts use it: command line and optionally a YAML ``--config``."""
    from trl import TrlParser

    base = ["--output_dir", "unused", "--use_cpu", "--bf16", "False", f"--{checkpointing_argument()}", "False"]
    if yaml_text is not None:
        assert tmp is not None
        (tmp / "config.yaml").write_text(yaml_text)
        base += ["--config", str(tmp / "config.yaml")]
    (args,) = TrlParser((GuardedGRPOConfig,)).parse_args_and_config(base + argv)  # type: ignore[arg-type]
    return args


def test_guard_and_objective_through_trl_parser_command_line_and_yaml(tmp_path: Path) -> None:
    """``--guard default`` was parsed as GuardConfig("default") (the parsers type a union by its second member)."""
    from rlguard.guards import GuardConfig

    args = _parse(["--objective", "gspo", "--guard", "default"])
    assert (args.guard, args.objective_mapping().objective) == ("default", "gspo")
    args = _parse([], "objective: gspo\nguard: strict\n", tmp_path)
    assert (args.guard, args.objective) == ("strict", "gspo")
    as_json = '{"preset": "strict", "snapshot_interval": 3, "detectors": {"entropy_collapse": null}}'
    args = _parse(["--guard", as_json])
    assert isinstance(args.guard, GuardConfig)
    assert args.guard.snapshot_interval == 3 and args.guard.detectors["entropy_collapse"] is None
    assert args.guard.interventions == GuardConfig.preset("strict").interventions  # the rest is the preset's
    args = _parse([], "guard:\n  preset: monitor\n  snapshot_interval: 7\n", tmp_path)  # a YAML mapping
    assert isinstance(args.guard, GuardConfig) and args.guard.observe_only and args.guard.snapshot_interval == 7
    args = _parse([], "guard: '{\"snapshot_interval\": 4}'\n", tmp_path)  # JSON in YAML: the default preset
    assert isinstance(args.guard, GuardConfig) and args.guard.snapshot_interval == 4


@pytest.mark.parametrize(
    ("guard", "match"),
    [
        ('{"preset": "strict", "snapshot": 3}', r"unknown GuardConfig field\(s\) \['snapshot'\]"),
        ('{"preset": "strict",', "guard: .* is not valid JSON"),
        ('{"schedules": {"beta": 0.1}}', r"unknown GuardConfig field\(s\) \['schedules'\].*only from Python"),
        ('{"preset": "loud"}', "unknown guard preset 'loud'"),
    ],
)
def test_guard_json_errors(guard: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _parse(["--guard", guard])


def test_objective_alone_gives_its_papers_clip_range_and_aggregation(caplog: pytest.LogCaptureFixture) -> None:
    """``--objective gspo`` on TRL's defaults gave epsilon=0.2 (500x GSPO's range) and dapo's token-mean."""
    import logging

    with caplog.at_level(logging.INFO, logger="rlguard.adapters.trl.config"):
        args = config(objective="gspo")
    kwargs = args.objective_mapping().kwargs
    assert (kwargs["clip_low"], kwargs["clip_high"], kwargs["aggregation"]) == (3e-4, 4e-4, "seq-mean-token-mean")
    assert (args.epsilon, args.epsilon_high, args.loss_type) == (3e-4, 4e-4, "grpo")  # what ran is what is saved
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "(0.0003, 0.0004) (the paper's)" in record.getMessage()
    assert "'seq-mean-token-mean' (the paper's, loss_type='grpo')" in record.getMessage()
    parsed = _parse(["--objective", "gspo", "--max_completion_length", str(BASE["max_completion_length"])])
    assert parsed.objective_mapping().kwargs == kwargs  # the command line alike

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rlguard.adapters.trl.config"):
        args = config(objective="gspo", epsilon=0.2, loss_type="dapo", expect=(SEQUENCE_WARNING,))  # TRL's values
    kwargs = args.objective_mapping().kwargs
    assert (kwargs["clip_low"], kwargs["clip_high"], kwargs["aggregation"]) == (0.2, 0.2, "token-mean")
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "(from epsilon/epsilon_high)" in record.getMessage()
    # set explicitly to TRL's default values, on the command line or in YAML: kept
    args = _parse(["--objective", "gspo", "--epsilon", "0.2"])
    assert (args.epsilon, args.epsilon_high, args.loss_type) == (0.2, None, "grpo")
    assert args.objective_mapping().kwargs["clip_high"] == 0.2  # TRL's meaning: epsilon_high = epsilon
    args = config(objective="gspo", epsilon_high=1e-3)  # only the upper bound: the lower stays the paper's
    assert (args.epsilon, args.epsilon_high) == (3e-4, 1e-3)
    # without an objective, TRL's defaults and TRL's loss exactly
    args = config()
    assert (args.epsilon, args.epsilon_high, args.loss_type) == (0.2, None, "dapo")
    assert GRPOConfig.__dataclass_fields__["epsilon"].default == 0.2  # the values _TRL_DEFAULTS reads


@pytest.mark.parametrize(
    ("objective", "expected"),
    [
        ("grpo", {"epsilon": 0.2, "epsilon_high": 0.2, "loss_type": "grpo"}),
        ("dapo", {"epsilon": 0.2, "epsilon_high": 0.28, "loss_type": "dapo"}),
        ("dr_grpo", {"epsilon": 0.2, "epsilon_high": 0.2, "loss_type": "dr_grpo"}),
        ("gspo", {"epsilon": 3e-4, "epsilon_high": 4e-4, "loss_type": "grpo"}),
        ("cispo", {"epsilon_high": 5.0, "loss_type": "cispo"}),
        ("sapo", {"loss_type": "sapo"}),
        ("gmpo", {"loss_type": "grpo"}),
    ],
)
def test_paper_trl_settings_map_back_to_the_objectives_defaults(objective: str, expected: dict[str, Any]) -> None:
    from rlguard.adapters.trl.mapping import paper_trl_settings
    from rlguard.core_losses import get_objective

    assert paper_trl_settings(objective) == expected
    built = config(objective=objective).objective_mapping().build()
    default = get_objective(objective)
    assert built.aggregation == default.aggregation
    if hasattr(default, "clip_low"):
        if objective == "cispo":  # TRL's absolute convention for the same cap of 5
            assert built.weight_bounds() == (None, 5.0) == default.weight_bounds()  # type: ignore[attr-defined]
        else:
            assert (built.clip_low, built.clip_high) == (default.clip_low, default.clip_high)  # type: ignore[attr-defined]


def test_rollout_corrections_need_a_rollout_engine_at_config_time() -> None:
    """``rollout_is`` without vLLM passed the config and failed at the first step, after loading the model."""
    with pytest.raises(ValueError, match=r"rollout_is='token'.*use_vllm=False.*Set use_vllm=True.*remove rollout_is"):
        config(objective_kwargs={"rollout_is": "token"})
    with pytest.raises(ValueError, match=r"rollout_mask='geometric'.*use_vllm=False"):
        config(loss_type="grpo", objective_kwargs={"rollout_mask": "geometric"})
    assert config(loss_type="grpo", use_vllm=True, objective_kwargs={"rollout_is": "token"}).objective_kwargs


def test_sequence_ratio_with_token_sums_warns() -> None:
    config(objective="gspo", loss_type="dapo", expect=(SEQUENCE_WARNING,))  # dapo aggregates by token-mean
    config(objective="gmpo", loss_type="dr_grpo", expect=(SEQUENCE_WARNING,))
    config(objective="gspo", loss_type="grpo")  # no warning
    config(objective="gspo", objective_kwargs={"aggregation": "seq-mean-token-mean"})  # no warning


def test_other_warnings() -> None:
    config(loss_type="sapo", delta=2.0, expect=("delta=2.0 is ignored",))
    vllm: dict[str, Any] = {"use_vllm": True, "vllm_importance_sampling_mode": "token_mask"}
    config(loss_type="grpo", importance_sampling_level="sequence", **vllm, expect=("token-level masked IS",))
    config(loss_type="grpo", **vllm)  # token-level ratio: no warning
    config(loss_type="cispo", expect=("epsilon_high=0.2",))
    config(loss_type="grpo", beta=0.1, off_policy_mask_threshold=0.5, expect=("lose their KL term",))


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"guard": "nope"}, ValueError, "unknown guard preset .nope."),
        ({"objective": "nope"}, ValueError, "unknown objective 'nope'.*grpo"),
        ({"objective_kwargs": {"beta": 0.1}}, ValueError, "must not set beta"),
        ({"objective_kwargs": {"tau": 1.0}}, ValueError, "does not take 'tau'"),
        ({"objective_kwargs": "kwargs.json"}, ValueError, "objective_kwargs must be a dict"),
        ({"loss_type": "grpo", "delta": 1.1}, ValueError, "delta=1.1 is below 1 \\+ epsilon_high"),
        ({"loss_type": "cispo", "importance_sampling_level": "sequence"}, NotImplementedError, "token-level ratio"),
        ({"objective": "sapo", "importance_sampling_level": "sequence"}, NotImplementedError, "token-level ratio"),
        (
            {"use_adaptive_entropy": True, "top_entropy_quantile": 0.5},
            NotImplementedError,
            "use_adaptive_entropy=True with top_entropy_quantile=0.5",
        ),
        (
            {
                "use_vllm": True,
                "vllm_importance_sampling_mode": "token_truncate",
                "vllm_importance_sampling_clip_min": 0.5,
            },
            NotImplementedError,
            "caps from above only",
        ),
    ],
)
def test_config_errors(overrides: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        GuardedGRPOConfig(output_dir="unused", **{**BASE, **overrides})


def test_a_plain_grpo_config_works_and_follows_loss_type(model_dir: Path) -> None:
    args = GRPOConfig(output_dir=str(model_dir.parent / "plain"), **{**BASE, "loss_type": "dr_grpo"})
    trainer = GuardedGRPOTrainer(
        model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(8)
    )
    assert trainer.rlguard_mapping.objective == "dr_grpo"


def test_changed_trl_signature_fails_at_construction(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_trl_compatibility()  # the installed TRL passes

    def changed(self: Any, model: Any, inputs: Any, num_items_in_batch: Any) -> None: ...

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", changed)
    with pytest.raises(RuntimeError, match=f"supports trl{SUPPORTED_TRL}.*_compute_loss"):
        GuardedGRPOTrainer(
            model=str(model_dir), reward_funcs=addition_reward, args=config(), train_dataset=addition_dataset(8)
        )
    monkeypatch.undo()
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", lambda self, model, input_ids: None)
    with pytest.raises(RuntimeError, match="_get_per_token_logps_and_entropies"):
        check_trl_compatibility()


def test_signature_check_matches_what_the_override_calls() -> None:
    params = inspect.signature(GRPOTrainer._compute_loss).parameters
    assert list(params) == ["self", "model", "inputs"]


# ---------------------------------------------------------------- StabilityCallback
def test_canonical_stats_from_trl_logs() -> None:
    logs = {
        "loss": 0.5,
        "grad_norm": 2.0,
        "learning_rate": 1e-3,
        "reward": 0.25,
        "reward_std": 0.1,
        "frac_reward_zero_std": 0.5,
        "completions/mean_length": 3.0,
        "completions/max_length": 4.0,
        "completions/clipped_ratio": 0.25,
        "clip_ratio/region_mean": 0.2,
        "clip_ratio/low_mean": 0.05,
        "clip_ratio/high_mean": 0.15,
        "entropy": 1.5,
        "kl": 0.01,
        "rlguard/entropy": 1.25,  # the objective's value wins over TRL's key
        "rlguard/ratio_max": 1.8,
        "step_time": 0.3,
        "frac": None,
    }
    assert canonical_stats(logs) == {
        "loss": 0.5,
        "grad_norm": 2.0,
        "lr": 1e-3,
        "reward_mean": 0.25,
        "reward_std": 0.1,
        "frac_zero_std_groups": 0.5,
        "length_mean": 3.0,
        "length_max": 4.0,
        "truncated_frac": 0.25,
        "clip_frac": 0.2,
        "clip_frac_low": 0.05,
        "clip_frac_high": 0.15,
        "entropy": 1.25,
        "kl_ref": 0.01,
        "ratio_max": 1.8,
    }


def test_callback_records_training_logs_only_and_asks_for_one_log_per_step() -> None:
    cb = StabilityCallback()
    state, control = TrainerState(), TrainerControl()
    state.global_step = 3
    assert cb.last is None
    assert cb.on_step_end(None, state, control).should_log  # type: ignore[arg-type]
    cb.on_log(None, state, control, logs={"loss": 1.0, "reward": 0.5})  # type: ignore[arg-type]
    cb.on_log(None, state, control, logs={"eval_loss": 1.0})  # type: ignore[arg-type]
    cb.on_log(None, state, control, logs={"train_runtime": 1.0, "train_loss": 0.5})  # type: ignore[arg-type]
    assert cb.history == [{"step": 3.0, "loss": 1.0, "reward_mean": 0.5}] and cb.last == cb.history[0]
    assert not StabilityCallback(every_step=False).on_step_end(None, state, TrainerControl()).should_log


# ---------------------------------------------------------------- the guard's mismatch remedies in TRL
def test_kept_gradient_remedy_is_trls_own_cispo_at_the_same_upper_bound(model_dir: Path) -> None:
    """The guard's kept_gradient control on a DAPO run (clip 0.2 / 0.28) gives TRL's own CISPO loss with the cap
    1 + 0.28 (TRL's absolute convention): loss and gradient."""
    from rlguard.core_losses import Controls

    ours = trainer_for(model_dir, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0)
    cispo = trainer_for(model_dir, loss_type="cispo", epsilon_high=1.28, beta=0.0)
    theta, inputs, policy = make_inputs(3, ref=False)
    trl_loss, trl_grad = run(cispo, GRPOTrainer._compute_loss, theta, inputs, policy)
    plain_loss, _ = run(ours, GuardedGRPOTrainer._compute_loss, theta, inputs, policy)
    ours.rlguard_set_controls(Controls(kept_gradient=True))
    try:
        assert ours.rlguard_objective.kept_gradient
        loss, grad = run(ours, GuardedGRPOTrainer._compute_loss, theta, inputs, policy)
    finally:
        ours.rlguard_set_controls(Controls())
    assert not torch.allclose(plain_loss, trl_loss), "degenerate case: the hard clip must bind somewhere"
    torch.testing.assert_close(loss, trl_loss.to(loss.dtype), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(grad, trl_grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("vllm_trainer", ["token"], indirect=True)
def test_rollout_is_remedy_is_trls_token_truncate_correction(vllm_trainer: GuardedGRPOTrainer) -> None:
    """The guard's rollout_is_cap control on a run configured without a correction gives TRL's own
    ``token_truncate`` vLLM importance sampling with that cap: loss and gradient."""
    import dataclasses

    from rlguard.core_losses import Controls

    inputs, changed = vllm_case(vllm_trainer, "token_truncate", None, 2.0)
    assert changed.any() and not changed.all(), "the cap must bind on some tokens and not on others"
    theta, _, policy = make_inputs(10, ref=False, sampling=True)
    trl_loss, trl_grad = run(vllm_trainer, GRPOTrainer._compute_loss, theta, inputs, policy)
    configured = vllm_trainer.rlguard_configured_objective
    vllm_trainer.rlguard_configured_objective = dataclasses.replace(vllm_trainer.rlguard_objective, rollout_is=None)
    try:
        vllm_trainer.rlguard_set_controls(Controls(rollout_is_cap=2.0))
        assert (vllm_trainer.rlguard_objective.rollout_is, vllm_trainer.rlguard_objective.rollout_is_cap) == (
            "token",
            2.0,
        )
        loss, grad = run(vllm_trainer, GuardedGRPOTrainer._compute_loss, theta, inputs, policy)
    finally:
        vllm_trainer.rlguard_configured_objective = configured
    torch.testing.assert_close(loss, trl_loss, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(grad, trl_grad, rtol=RTOL, atol=ATOL)


def test_remedy_capabilities_follow_the_trainer_and_its_objective() -> None:
    """kept_gradient only where the configured objective zeroes gradients at a bound; a rollout correction only
    with vLLM; a stock trainer gets TRL's own token_truncate settings, and a correction the user set stays."""
    from types import SimpleNamespace

    from rlguard.adapters.trl.actuators import set_trl_rollout_correction, trainer_capabilities
    from rlguard.core_losses import Controls, get_objective

    class Controlled(SimpleNamespace):
        def rlguard_set_controls(self, controls: Controls) -> None:
            self.controls = controls

    assert "kept_gradient" in trainer_capabilities(Controlled(rlguard_configured_objective=get_objective("grpo")))
    for name in ("cispo", "sapo"):
        assert "kept_gradient" not in trainer_capabilities(Controlled(rlguard_configured_objective=get_objective(name)))
    vllm = {name: None for name in VLLM_FIELDS} | {"use_vllm": True, "vllm_importance_sampling_correction": False}
    stock = SimpleNamespace(**vllm)
    assert trainer_capabilities(stock) & {"rollout_correction", "rollout_mask", "kept_gradient", "clip"} == {
        "rollout_correction"
    }  # no geometric mask in TRL's settings
    controlled = Controlled(rlguard_configured_objective=get_objective("grpo"), **vllm)
    assert {"rollout_correction", "rollout_mask"} <= trainer_capabilities(controlled)
    assert "rollout_correction" not in trainer_capabilities(SimpleNamespace(**{**vllm, "use_vllm": False}))
    set_trl_rollout_correction(stock, Controls(rollout_is_cap=2.0))
    assert (stock.vllm_importance_sampling_correction, stock.vllm_importance_sampling_mode) == (True, "token_truncate")
    assert (stock.vllm_importance_sampling_clip_min, stock.vllm_importance_sampling_clip_max) == (None, 2.0)
    users = SimpleNamespace(**vllm)
    users.vllm_importance_sampling_correction, users.vllm_importance_sampling_mode = True, "m"
    set_trl_rollout_correction(users, Controls(rollout_is_cap=2.0))
    assert users.vllm_importance_sampling_mode == "m"
