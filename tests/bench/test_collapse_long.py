"""The long-completion collapse benchmark: the task and its verifier, the transformer and its MoE layer against
float64 references, KV-cache sampling against a full forward, the measured MoE routing mismatch of a bf16 engine,
the statistics of the report, the command line and a --quick run."""

from __future__ import annotations

import copy
import csv
import json
import math
from collections import deque
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from typer.testing import CliRunner

from rlguard.bench.collapse import CollapseVerdict, RunResult, TrainerPass, loop, mismatch_stats
from rlguard.bench.collapse.report import paired_comparisons
from rlguard.bench.collapse.stats import mcnemar_exact_p, paired_bootstrap_ci, wilson_interval
from rlguard.bench.collapse_long import LONG_TASK, LongRunConfig
from rlguard.bench.collapse_long import LongStressor as Stressor
from rlguard.bench.collapse_long.cli import main
from rlguard.bench.collapse_long.engine import EngineNumerics, Rollouts, engine_copy, sample_rollouts, trainer_pass
from rlguard.bench.collapse_long.model import ModelConfig, MoE, generate, make_model
from rlguard.bench.collapse_long.stressors import behaviour_policy
from rlguard.bench.collapse_long.task import EOS, NUM_SPECIAL, PAD, ReverseShiftTask
from rlguard.cli import app

TASK = ReverseShiftTask(length=6, alphabet=60)


def _cfg(num_experts: int = 0) -> ModelConfig:
    return ModelConfig(vocab_size=TASK.vocab_size, max_len=16, d_model=32, n_heads=4, num_experts=num_experts)


# -- task and verifier ----------------------------------------------------------------------------------------------
def test_the_default_task_has_a_64_token_vocabulary_and_33_token_answers() -> None:
    task = ReverseShiftTask()
    assert task.vocab_size == 64
    assert task.answers(task.prompts(3, seed=1)).shape == (3, 33)


def test_the_answer_is_the_prompt_reversed_and_shifted_by_one_symbol_cyclically() -> None:
    s = NUM_SPECIAL
    prompt = torch.tensor([[1, s + 0, s + 5, s + 59, 2]])  # <bos> a f <last symbol> <sep>
    # reversed: <last>, f, a; shifted by one: <last> -> a (wraps), f -> g, a -> b
    assert TASK.answers(prompt).tolist() == [[s + 0, s + 6, s + 1, EOS]]


def test_prompts_are_reproducible_from_their_seed_and_use_symbols_only() -> None:
    a, b = TASK.prompts(4, seed=7), TASK.prompts(4, seed=7)
    assert torch.equal(a, b) and not torch.equal(a, TASK.prompts(4, seed=8))
    assert bool((a[:, 1:-1] >= NUM_SPECIAL).all()) and a.shape == (4, 8)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ([10, 11, 12, 13, EOS], 1.0),  # exact
        ([10, 11, 99, 13, EOS], 3 / 4),  # one wrong symbol
        ([10, 11, EOS, PAD, PAD], 2 / 4),  # stopped early: 2 matches over max(2, 4)
        ([10, 11, 12, 13, 14, 15], 4 / 6),  # no <eos>, two extra symbols: 4 matches over max(6, 4)
        ([EOS, PAD, PAD, PAD, PAD], 0.0),  # empty
        ([11, 12, 13, 10, EOS], 0.0),  # right symbols, wrong positions
    ],
)
def test_the_verifier_gives_partial_credit_by_position(completion: list[int], expected: float) -> None:
    answer = torch.tensor([10, 11, 12, 13, EOS])
    assert TASK.reward(torch.tensor(completion), answer) == pytest.approx(expected, abs=1e-12)


def test_bad_task_shapes_are_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="length must be >= 1; got 0"):
        ReverseShiftTask(length=0)


# -- model ----------------------------------------------------------------------------------------------------------
@torch.no_grad()
def _moe_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token in float64: top-k of the router logits, softmax over them, the chosen experts' MLPs."""
    router = moe.router.weight.double()
    w_in, w_out = moe.w_in.double(), moe.w_out.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            h = x[b, s].double()
            logits = router @ h
            top = sorted(range(len(logits)), key=lambda e: -float(logits[e]))[: moe.top_k]
            gates = torch.softmax(logits[top], dim=0)
            for g, e in zip(gates, top, strict=True):
                out[b, s] += g * (F.gelu(h @ w_in[e]) @ w_out[e])
    return out


def test_the_moe_layer_matches_a_float64_token_loop() -> None:
    moe = make_model(_cfg(num_experts=4), seed=0).blocks[0].mlp
    assert isinstance(moe, MoE)
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = moe(x).double()
    torch.testing.assert_close(got, _moe_reference(moe, x), rtol=0, atol=1e-5)
    assert moe.last_routing is not None and moe.last_routing.shape == (2, 5, 2)


def test_the_transformer_is_causal() -> None:
    model = make_model(_cfg(num_experts=4), seed=0)
    ids = TASK.prompts(2, seed=3)
    changed = ids.clone()
    changed[:, -1] = NUM_SPECIAL + 1 if int(ids[0, -1]) != NUM_SPECIAL + 1 else NUM_SPECIAL + 2
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :-1], model(changed)[:, :-1], rtol=0, atol=0)


@pytest.mark.parametrize("num_experts", [0, 4])
def test_kv_cache_sampling_equals_a_full_float64_forward(num_experts: int) -> None:
    model = make_model(_cfg(num_experts), seed=2)
    prompts = TASK.prompts(5, seed=4)
    out = generate(model, prompts, TASK.max_new_tokens, torch.Generator().manual_seed(0), eos_id=EOS)
    reference = copy.deepcopy(model).double()
    with torch.no_grad():
        ids = torch.cat([prompts, out.completions], dim=1)
        logits = reference(ids[:, :-1])[:, prompts.shape[1] - 1 :]  # (B, T, V) float64
        expected = torch.log_softmax(logits, -1).gather(-1, out.completions[..., None]).squeeze(-1)
        routing = reference.routing()
    mask = out.mask > 0
    assert out.logprobs.dtype == torch.float32
    torch.testing.assert_close(out.logprobs[mask].double(), expected[mask], rtol=0, atol=1e-5)
    if num_experts:
        assert routing is not None and out.routing is not None
        assert torch.equal(out.routing[mask], routing[:, prompts.shape[1] - 1 :][mask])


def test_generation_masks_after_eos_and_pads() -> None:
    model = make_model(_cfg(), seed=0)
    with torch.no_grad():  # make <eos> the only token the model can emit
        model.head.bias.fill_(-1e4)
        model.head.bias[EOS] = 0.0
    out = generate(model, TASK.prompts(3, seed=0), 7, torch.Generator().manual_seed(0), eos_id=EOS)
    assert out.completions.tolist() == [[EOS] + [PAD] * 6] * 3
    assert out.mask.tolist() == [[1.0] + [0.0] * 6] * 3


# -- engine and mismatch --------------------------------------------------------------------------------------------
def test_an_exact_engine_is_the_trainer_and_reports_no_mismatch() -> None:
    model = make_model(_cfg(num_experts=4), seed=0)
    assert engine_copy(model, EngineNumerics(), torch.Generator()) is model
    with torch.no_grad():
        r = sample_rollouts(model, TASK, num_prompts=4, group_size=4, seed=0)
        gap = mismatch_stats(trainer_pass(model, r), r)
    assert gap.routed_differently == 0.0 and gap.logp_gap_abs_mean < 1e-5


def test_a_bf16_moe_engine_routes_tokens_to_other_experts_than_the_trainer() -> None:
    model = make_model(ModelConfig(num_experts=4, max_len=72), seed=0)
    task = ReverseShiftTask()
    engine = engine_copy(model, EngineNumerics(bf16=True), torch.Generator().manual_seed(0))
    assert engine is not model
    with torch.no_grad():
        r = sample_rollouts(engine, task, num_prompts=8, group_size=8, seed=0, bf16_logits=True)
        gap = mismatch_stats(trainer_pass(model, r), r)
    # bf16 rounding of weights, router and logits alone: no injected noise
    assert gap.routed_differently > 0.0
    assert gap.logp_gap_abs_mean > 1e-3


def test_mismatch_stats_count_masked_tokens_only() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    engine_lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, 9.0, 9.0]])
    trainer_lp = torch.tensor([[-1.5, -2.0, 0.0], [-0.25, 0.0, 0.0]])
    engine_route = torch.zeros(2, 3, 2, 1, dtype=torch.long)
    trainer_route = engine_route.clone()
    trainer_route[0, 1, 1, 0] = 3  # token (0, 1) differs in layer 1
    trainer_route[1, 2, 0, 0] = 3  # masked: does not count
    r = Rollouts(torch.zeros(2, 1), torch.zeros(2, 3), mask, torch.zeros(2), torch.zeros(2), engine_lp, engine_route)
    gap = mismatch_stats(TrainerPass(trainer_lp, torch.zeros(2, 3), trainer_route), r)
    assert gap.logp_gap_abs_mean == pytest.approx((0.5 + 0.0 + 0.25) / 3, abs=1e-7)
    assert gap.routed_differently == pytest.approx(1 / 3, abs=1e-12)


def test_a_stale_behaviour_policy_is_the_policy_of_stale_steps_batches_ago() -> None:
    model = make_model(_cfg(), seed=0)
    st = Stressor("stale", stale_steps=2)
    history: deque[dict[str, torch.Tensor]] = deque(maxlen=3)
    first = copy.deepcopy(model.state_dict())
    for _ in range(3):
        behaviour = behaviour_policy(model, st, torch.Generator(), history)
        with torch.no_grad():
            model.head.bias.add_(1.0)
    # third call: history holds the weights of calls 1, 2, 3; the oldest is the model before any change
    assert torch.equal(behaviour.head.bias, first["head.bias"])


def test_stressor_knobs_are_validated_with_the_value() -> None:
    with pytest.raises(ValueError, match="stressor must be one of"):
        Stressor("bogus")
    with pytest.raises(ValueError, match="router_noise must be >= 0; got -1"):
        Stressor("moe", router_noise=-1)
    assert Stressor("high_lr", lr_multiplier=3).lr_factor == 3 and Stressor("stale", lr_multiplier=3).lr_factor == 1


# -- statistics -----------------------------------------------------------------------------------------------------
def test_wilson_interval_matches_its_formula() -> None:
    # 0/8: centre = (z^2/16) / (1 + z^2/8), half = z sqrt(z^2/256) / (1 + z^2/8) = (z^2/16) / (1 + z^2/8)
    z2 = 1.959963984540054**2
    assert wilson_interval(0, 8) == pytest.approx((0.0, (z2 / 8) / (1 + z2 / 8)), abs=1e-12)
    low, high = wilson_interval(4, 8)
    assert low == pytest.approx(1 - high, abs=1e-12) and 0.2 < low < 0.3


def test_mcnemar_exact_p_is_the_two_sided_binomial_tail() -> None:
    assert mcnemar_exact_p(0, 5) == pytest.approx(2 / 32, abs=1e-15)
    assert mcnemar_exact_p(1, 6) == pytest.approx(2 * (1 + 7) / 128, abs=1e-15)
    assert mcnemar_exact_p(3, 3) == 1.0 and mcnemar_exact_p(0, 0) == 1.0


def test_paired_bootstrap_interval_of_constant_differences_is_that_constant() -> None:
    assert paired_bootstrap_ci([0.25] * 8) == pytest.approx((0.25, 0.25), abs=1e-12)
    low, high = paired_bootstrap_ci([0, 0, 0, 1, 1, 1, 1, 1])
    assert low < 5 / 8 < high


# -- command line and a quick run -----------------------------------------------------------------------------------
def _result(objective: str, guard: str, seed: int, collapsed: bool, final: float) -> RunResult:
    config = LongRunConfig(objective=objective, guard=guard, seed=seed)  # type: ignore[arg-type]
    n = config.window
    return RunResult(
        config,
        [0.5] * n + [final] * n,
        [1.0] * 2 * n,
        CollapseVerdict(collapsed, 5 if collapsed else None, "reward" if collapsed else ""),
        lengths=[33.0] * 2 * n,
        clip_fracs=[0.0] * 2 * n,
        logp_gaps=[0.0] * 2 * n,
        routed_differently=[0.0] * 2 * n,
    )


def test_paired_comparisons_pair_objectives_within_a_guard_and_each_guard_with_guard_off() -> None:
    results = [
        *(_result("grpo", "off", s, s < 3, 0.1 if s < 3 else 0.9) for s in range(4)),
        *(_result("gspo", "off", s, s < 1, 0.2) for s in range(4)),
        *(_result("grpo", "stable", s, False, 0.8) for s in range(4)),
    ]
    rows = {(r["guard"], r["objective"], r["baseline"]): r for r in paired_comparisons(results, LONG_TASK.layout)}
    assert set(rows) == {("off", "gspo", "grpo"), ("stable", "grpo", "grpo, guard off")}
    objectives = rows[("off", "gspo", "grpo")]
    assert (objectives["only_objective_collapsed"], objectives["only_baseline_collapsed"]) == (0, 2)
    assert objectives["collapse_rate_diff"] == -0.5
    guarded = rows[("stable", "grpo", "grpo, guard off")]
    assert (guarded["pairs"], guarded["only_objective_collapsed"], guarded["only_baseline_collapsed"]) == (4, 0, 3)
    assert guarded["mcnemar_p"] == pytest.approx(mcnemar_exact_p(0, 3))
    assert guarded["final_reward_diff"] == pytest.approx(((0.8 - 0.1) * 3 + (0.8 - 0.9)) / 4)


def test_quick_run_writes_every_output_and_resume_runs_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "res"
    assert main(["--quick", "--workers", "1", "--out", str(out)]) == 0
    with (out / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 8  # grpo, gspo x off, default x none, moe
    for column in (
        "objective",
        "guard",
        "stressor",
        "seed",
        "collapsed",
        "halted",
        "final_reward",
        "peak_reward",
        "mean_completion_tokens",
        "clip_frac",
        "routed_differently",
        "logp_gap_abs_mean",
    ):
        assert column in rows[0]
    assert all(float(r["routed_differently"]) == 0 for r in rows if r["stressor"] == "none")
    assert all(float(r["logp_gap_abs_mean"]) > 1e-4 for r in rows if r["stressor"] == "moe")  # bf16 engine
    assert all(math.isfinite(float(r["final_reward"])) for r in rows)
    for name in ("summary.md", "summary.csv", "paired.csv", "plots/moe_gspo.png"):
        assert (out / name).is_file()
    assert main(["--quick", "--workers", "1", "--out", str(out), "--resume"]) == 0
    calls = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert [c["runs"] for c in calls] == [8, 0]


def test_bad_input_exits_2_naming_the_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--objectives", "grpo,nope", "--out", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["--quick", "--seeds", "0", "--out", str(tmp_path)]) == 2


def test_the_rlguard_command_dispatches_to_the_benchmark(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["bench", "collapse", "--task", "long", "--stressors", "bogus", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2


# -- the warm-start cache -------------------------------------------------------------------------------------------
PAYLOAD_RAN: list[bool] = []


def _payload() -> None:
    PAYLOAD_RAN.append(True)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_payload, ())


@pytest.mark.filterwarnings("ignore:Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
def test_a_warm_start_cache_that_is_not_a_state_dict_is_refused_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch < 2.6 (which pyproject allows) unpickles anything unless told weights_only; this variable restores
    # that default here, so only an explicit weights_only=True keeps the payload from running
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.setattr(loop, "WARM_START_CACHE", [tmp_path])
    monkeypatch.setattr(loop, "_WARM_STARTS", {})
    config = LongRunConfig(warm_start_steps=2, length=6)
    trained = loop.warm_started_model(config)  # trains and writes the cache
    [cached] = tmp_path.glob("warm_*.pt")
    monkeypatch.setattr(loop, "_WARM_STARTS", {})
    again = loop.warm_started_model(config)  # read back from the file
    assert all(
        torch.equal(a, b) for a, b in zip(trained.state_dict().values(), again.state_dict().values(), strict=True)
    )
    torch.save({"embed.weight": _Evil()}, cached)
    monkeypatch.setattr(loop, "_WARM_STARTS", {})
    with pytest.raises(ValueError, match=f"warm-start cache {cached} is not a state dict of tensors"):
        loop.warm_started_model(config)
    assert PAYLOAD_RAN == []
