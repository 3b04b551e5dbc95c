"""The collapse benchmark: the collapse definition on hand-made curves, the stressors perturb what they claim, the
guard's decisions are applied with the adapter's semantics, the command line, and a --quick smoke run."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest
import torch

from rlguard.bench.collapse import (
    RunConfig,
    RunResult,
    Stressor,
    behaviour_policy,
    build_grid,
    build_parser,
    collapse_verdict,
    effective_lr,
    main,
    numerics,
    perturbed_copy,
    run_grid,
    run_one,
    same_numerics,
)
from rlguard.bench.collapse_long.train import RunConfig as LongRunConfig
from rlguard.core_losses import PolicyBatch
from rlguard.tasks.moe import make_tiny_moe_model
from rlguard.tasks.tiny import make_tiny_model, sample_rollouts, sequence_logprobs

ROOT = Path(__file__).resolve().parents[1]
FLAT = [1.0] * 200  # entropies that never collapse


# -- the collapse definition ----------------------------------------------------------------------------------------
def test_rising_reward_is_healthy() -> None:
    rewards = [0.3 + 0.6 * t / 99 for t in range(100)]
    assert collapse_verdict(rewards, FLAT[:100]).collapsed is False


def test_reward_collapse_starts_where_the_trailing_mean_first_falls_below_half_the_peak() -> None:
    # 20 x 0.4, 30 x 0.8, 30 x 0.1. Peak of the 10-step trailing mean: 0.8. With k steps of 0.1 in the window,
    # m = (0.8 (10 - k) + 0.1 k) / 10 = 0.8 - 0.07 k < 0.4  <=>  k > 5.71, so k = 6: step 50 + 5 = 55.
    rewards = [0.4] * 20 + [0.8] * 30 + [0.1] * 30
    verdict = collapse_verdict(rewards, FLAT[:80], window=10)
    assert verdict.collapsed and verdict.reason == "reward" and verdict.step == 55


def test_a_drop_that_recovers_is_not_a_collapse() -> None:
    rewards = [0.8] * 30 + [0.1] * 30 + [0.8] * 30
    assert collapse_verdict(rewards, FLAT[:90]).collapsed is False


def test_a_drop_shorter_than_the_window_at_the_end_is_not_yet_a_collapse() -> None:
    # the trailing mean falls below 0.4 after 6 low steps; 6 + 9 = 15 low steps leave a 10-step stretch, 14 do not
    assert collapse_verdict([0.8] * 40 + [0.1] * 14, FLAT[:54]).collapsed is False
    assert collapse_verdict([0.8] * 40 + [0.1] * 15, FLAT[:55]).collapsed is True


def test_a_run_whose_peak_stays_below_min_peak_never_collapses_by_reward() -> None:
    rewards = [0.25] * 30 + [0.05] * 30  # fell by 80 %, but never learned (peak 0.25 < min_peak 0.3)
    assert collapse_verdict(rewards, FLAT[:60], min_peak=0.3).collapsed is False
    assert collapse_verdict(rewards, FLAT[:60], min_peak=0.2).reason == "reward"


def test_an_immediate_drop_from_the_warm_started_level_counts() -> None:
    # the first batch is the warm-started policy's: a fall to a third of it right away is a collapse from step 1
    verdict = collapse_verdict([0.45] + [0.15] * 40, FLAT[:41], window=10)
    # m_t = (0.45 + 0.15 t) / (t + 1) < 0.225 <=> 0.225 + 0.225 t > 0.45 + 0.15 t <=> t > 3
    assert verdict.collapsed and verdict.step == 4


def test_stopped_runs_collapse_at_their_last_step() -> None:
    v = collapse_verdict([0.5] * 7, FLAT[:7], nonfinite=True)
    assert (v.collapsed, v.step, v.reason) == (True, 6, "nonfinite")
    v = collapse_verdict([0.5] * 12, FLAT[:12], halted=True)
    assert (v.collapsed, v.step, v.reason) == (True, 11, "halted")
    v = collapse_verdict([0.5] * 5, [1.0, 1.0, math.nan, 1.0, 1.0])
    assert (v.collapsed, v.step, v.reason) == (True, 2, "nonfinite")


def test_entropy_collapse_counts_unless_the_task_is_solved() -> None:
    entropies = [1.0] * 20 + [0.05] * 30  # below 10 % of the start from step 20 on (trailing mean from step 27)
    v = collapse_verdict([0.6] * 50, entropies)
    assert v.collapsed and v.reason == "entropy"
    # m = (1.0 (10 - k) + 0.05 k) / 10 < 0.1 <=> k > 9.47: only the full window of 0.05, step 29
    assert v.step == 29
    assert collapse_verdict([1.0] * 50, entropies).collapsed is False  # converged: every answer right


def test_empty_curves_are_healthy() -> None:
    assert collapse_verdict([], []).collapsed is False


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rewards": [0.1, 0.2], "entropies": [1.0]}, "equal lengths"),
        ({"rewards": [0.1], "entropies": [1.0], "drop": 1.5}, "drop"),
        ({"rewards": [0.1], "entropies": [1.0], "window": 0}, "window"),
    ],
)
def test_collapse_verdict_rejects_bad_input(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        collapse_verdict(**kwargs)  # type: ignore[arg-type]


# -- stressors ------------------------------------------------------------------------------------------------------
def _gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a - b).detach().abs() * mask).sum() / mask.sum())


def test_perturbed_copy_adds_noise_of_the_requested_relative_size() -> None:
    model = make_tiny_model(0, hidden=64)
    engine = perturbed_copy(model, 0.3, torch.Generator().manual_seed(1))
    for (name, p), q in zip(model.named_parameters(), engine.parameters(), strict=True):
        if p.numel() < 1000:
            continue  # the sample RMS of small tensors is too noisy to check tightly
        rel = float((q - p).detach().pow(2).mean().sqrt() / p.detach().pow(2).mean().sqrt())
        assert rel == pytest.approx(0.3, rel=0.1), name  # 10 % covers the sampling error of >= 1000 draws
    quiet = perturbed_copy(model, 0.0, torch.Generator())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), quiet.parameters(), strict=True))


@torch.no_grad()
def test_mismatch_engine_logprobs_differ_from_the_trainers_and_grow_with_the_noise() -> None:
    model = make_tiny_model(0)
    rollouts = sample_rollouts(model, num_prompts=8, group_size=8, max_new_tokens=3, seed=0)
    trainer, _ = sequence_logprobs(model, rollouts)
    # bf16 logits alone: |delta logit| <= 2^-8 |logit| per logit, so |delta log p| <= 2 * 2^-8 * max |logit|
    bf16, _ = sequence_logprobs(model, rollouts, logits_dtype=torch.bfloat16)
    bound = 2 * 2**-8 * float(model(rollouts.input_ids).abs().max())
    assert 0 < _gap(bf16, trainer, rollouts.mask) <= bound
    gaps = []
    for noise in (0.05, 0.3, 1.0):
        engine = perturbed_copy(model, noise, torch.Generator().manual_seed(0))
        lp, _ = sequence_logprobs(engine, rollouts, logits_dtype=torch.bfloat16)
        gaps.append(_gap(lp, trainer, rollouts.mask))
    assert gaps[0] > bound / 4 and gaps[0] < gaps[1] < gaps[2]


def test_in_a_mismatch_run_old_logprobs_are_the_engines_and_none_is_on_policy_at_first() -> None:
    seen: dict[str, list[PolicyBatch]] = {"none": [], "mismatch": []}
    for name in seen:
        cfg = RunConfig(stressor=Stressor(name), iterations=1, warm_start_steps=0)
        run_one(cfg, on_batch=lambda it, batch, name=name: seen[name].append(batch))  # type: ignore[misc]
    first_none, first_mm = seen["none"][0], seen["mismatch"][0]
    assert first_none.old_logprobs is not None and first_none.rollout_logprobs is None
    torch.testing.assert_close(first_none.old_logprobs, first_none.logprobs.detach(), rtol=0, atol=0)
    assert first_mm.rollout_logprobs is not None and torch.equal(first_mm.old_logprobs, first_mm.rollout_logprobs)
    assert _gap(first_mm.old_logprobs, first_mm.logprobs.detach(), first_mm.mask) > 0.02


def test_stale_batches_come_from_the_policy_k_steps_old() -> None:
    model = make_tiny_model(0)
    stressor = Stressor("stale", stale_steps=3)
    history: deque[dict[str, torch.Tensor]] = deque(maxlen=stressor.stale_steps + 1)
    marks = []
    for step in range(6):
        with torch.no_grad():
            model.head.bias.fill_(float(step))  # mark the weights of step `step`
        behaviour, dtype = behaviour_policy(model, stressor, torch.Generator(), history)
        marks.append(float(behaviour.head.bias.detach()[0]))
        assert dtype is None and behaviour is not model
    assert marks == [0.0, 0.0, 0.0, 0.0, 1.0, 2.0]  # max(step - 3, 0)
    assert float(model.head.bias.detach()[0]) == 5.0  # the trainer's model is untouched


def test_moe_rollout_routing_differs_from_the_trainers_and_only_the_router_is_perturbed() -> None:
    model = make_tiny_moe_model(0)
    engine, dtype = behaviour_policy(
        model, Stressor("moe", router_noise=1.0), torch.Generator().manual_seed(0), deque()
    )
    assert dtype is None
    for (name, p), q in zip(model.named_parameters(), engine.parameters(), strict=True):
        assert torch.equal(p, q) is (not name.startswith("router")), name
    rollouts = sample_rollouts(engine, num_prompts=8, group_size=8, max_new_tokens=3, seed=0)
    sequence_logprobs(engine, rollouts)
    sequence_logprobs(model, rollouts)
    assert engine.last_routing is not None and model.last_routing is not None
    flipped = (engine.last_routing != model.last_routing).float().mean()
    assert 0.01 < float(flipped) < 0.9
    quiet, _ = behaviour_policy(model, Stressor("moe", router_noise=0.0), torch.Generator(), deque())
    sequence_logprobs(quiet, rollouts)
    assert quiet.last_routing is not None and torch.equal(quiet.last_routing, model.last_routing)


def test_high_lr_multiplies_the_learning_rate_only_under_its_stressor() -> None:
    assert effective_lr(RunConfig(lr=1e-3, stressor=Stressor("high_lr", lr_multiplier=7.0))) == pytest.approx(7e-3)
    assert effective_lr(RunConfig(lr=1e-3, stressor=Stressor("stale", lr_multiplier=7.0))) == 1e-3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "typo"}, "stressor must be one of"),
        ({"name": "mismatch", "mismatch_noise": -1.0}, "mismatch_noise"),
        ({"name": "stale", "stale_steps": -2}, "stale_steps"),
        ({"name": "high_lr", "lr_multiplier": 0.0}, "lr_multiplier"),
    ],
)
def test_stressor_rejects_bad_knobs(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Stressor(**kwargs)  # type: ignore[arg-type]


# -- the grid and its command line ----------------------------------------------------------------------------------
def test_full_grid_has_every_cell_and_seed_once() -> None:
    grid = build_grid(seeds=8)
    keys = {(c.objective, c.guard, c.stressor.name, c.seed) for c in grid}
    assert len(grid) == len(keys) == 3 * 3 * 5 * 8


def test_parser_defaults_and_lists() -> None:
    args = build_parser().parse_args(["--quick", "--workers", "1", "--stressors", "none, moe"])
    assert args.quick and args.workers == 1 and args.seeds == 8 and args.stressors == "none, moe"
    assert args.out == "benchmarks/collapse/results"


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--stressors", "none,typo"], "unknown stressors ['typo']"),
        (["--guards", "strict"], "unknown guards ['strict']"),
        (["--objectives", "nope"], "unknown objective 'nope'"),
        (["--workers", "0"], "workers must be >= 1; got 0"),
        (["--seeds", "0"], "seeds must be >= 1; got 0"),
        (["--stressors", ","], "stressors must name at least one"),
    ],
)
def test_bad_command_lines_exit_2_naming_the_argument(
    argv: list[str], match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "runs.csv").exists()


@pytest.mark.slow
def test_quick_grid_runs_end_to_end(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "collapse" / "run.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with (tmp_path / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 3 * 2  # grpo, gspo x off, default, stable x none, high_lr x 1 seed
    for col in ("objective", "guard", "stressor", "seed", "collapsed", "final_reward", "clip_frac_mean", "wall_s"):
        assert col in rows[0]
    assert {(r["objective"], r["guard"], r["stressor"]) for r in rows} == {
        (o, g, s) for o in ("grpo", "gspo") for g in ("off", "default", "stable") for s in ("none", "high_lr")
    }
    assert (tmp_path / "summary.md").read_text().count("\n") == 2 + 12  # header and rule, one row per cell
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        f"curves_{s}_{o}.png" for s in ("high_lr", "none") for o in ("grpo", "gspo")
    ]
    assert "collapse benchmark" in proc.stdout


# -- reproducibility ------------------------------------------------------------------------------------------------
def _short(stressor: str, *, seed: int = 1, objective: str = "grpo", iterations: int = 4) -> RunConfig:
    return RunConfig(
        objective=objective,
        stressor=Stressor(stressor),
        seed=seed,
        iterations=iterations,
        num_prompts=4,
        group_size=4,
        warm_start_steps=5,
    )


def _curves(results: list[RunResult]) -> list[tuple[list[float], list[float], float]]:
    return [(r.rewards, r.entropies, r.clip_frac_mean) for r in results]


def test_a_run_gives_the_same_curves_twice_and_after_other_runs() -> None:
    # mismatch and moe draw engine noise from the run's Generator; the warm-start cache is shared per process
    target = [_short("mismatch"), _short("moe", objective="gspo")]
    first = [run_one(c) for c in target]
    run_one(_short("moe", seed=2))  # other runs first: another seed's and model's warm start, the global RNG used
    run_one(_short("stale", objective="dapo"))
    again = [run_one(c) for c in reversed(target)][::-1]
    assert _curves(again) == _curves(first)
    assert run_one(_short("mismatch", seed=2)).entropies != first[0].entropies  # the comparison can fail


@pytest.mark.slow
def test_a_run_in_a_worker_process_gives_the_curves_of_the_main_process() -> None:
    target = [_short("mismatch"), _short("moe", objective="gspo")]
    in_workers = run_grid(target, workers=2)  # spawned processes, cold caches, one torch thread each
    assert _curves(in_workers) == _curves([run_one(c) for c in target])


def test_a_run_records_its_numerics_and_the_log_keeps_them() -> None:
    result = run_one(_short("none", iterations=1))
    here = numerics()
    assert result.numerics == here and here["torch"] == torch.__version__
    assert here["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    back = RunResult.from_json(json.loads(json.dumps(result.to_json())))
    assert back.numerics == here and back.rewards == result.rewards and back.config == result.config
    legacy = {k: v for k, v in result.to_json().items() if k != "numerics"}  # rows logged before the fingerprint
    assert RunResult.from_json(legacy).numerics == {}
    assert same_numerics(here, here) and same_numerics({**here, "threads": "7"}, here)
    assert not same_numerics({}, here)
    assert not same_numerics({**here, "cpu_capability": "other"}, here)
    assert not same_numerics({**here, "cpu": "other"}, here)


def test_resume_warns_when_kept_runs_were_recorded_on_other_numerics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = RunConfig(iterations=2)
    verdict = collapse_verdict([0.4, 0.5], [1.0, 1.0])
    kept = RunResult(config, [0.4, 0.5], [1.0, 1.0], verdict, numerics={**numerics(), "cpu": "another machine"})
    (tmp_path / "runs.jsonl").write_text(json.dumps(kept.to_json()) + "\n")
    argv = ["--objectives", "grpo", "--guards", "off", "--stressors", "none", "--seeds", "1", "--iterations", "2"]
    assert main([*argv, "--resume", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 of the 1 runs kept" in out and "recorded on other numerics" in out
    assert "0 runs on 2 workers" in out  # kept, not rerun
    kept.numerics = numerics()
    (tmp_path / "runs.jsonl").write_text(json.dumps(kept.to_json()) + "\n")
    assert main([*argv, "--resume", "--out", str(tmp_path)]) == 0
    assert "other numerics" not in capsys.readouterr().out


@pytest.mark.parametrize("config_cls", [RunConfig, LongRunConfig])
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"objective": "nope"}, "unknown objective 'nope'"),
        ({"guard": "strict"}, "guard must be one of ['off', 'default', 'stable']; got 'strict'"),
        ({"num_prompts": 8, "minibatches": 3}, r"num_prompts \(8\) must be divisible by minibatches \(3\)"),
        ({"minibatches": 0}, r"minibatches \(0\), which must be >= 1"),
        ({"iterations": 0}, "iterations must be >= 1; got 0"),
    ],
)
def test_both_benchmarks_run_configs_refuse_bad_fields_naming_them(
    config_cls: type, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match if "\\" in match else re.escape(match)):
        config_cls(**kwargs)
