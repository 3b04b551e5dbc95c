"""The long task's asynchronous-pipeline stressors (issue 38, part 6): each batch's policy age is drawn uniformly in
``0..A`` under the bound in force, the engine is the policy of that many batches ago, the guard sees the staleness
stats, a lowered bound reaches the pipeline, and the runner records each batch's age."""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from typing import Any

import pytest
import torch

from rlguard.bench.collapse import loop
from rlguard.bench.collapse.spec import draw_age
from rlguard.bench.collapse_long import LONG_TASK, LongRunConfig
from rlguard.bench.collapse_long import LongStressor as Stressor
from rlguard.bench.collapse_long.model import ModelConfig, make_model
from rlguard.bench.collapse_long.stressors import behaviour_policy


def test_ages_are_uniform_on_0_to_the_bound() -> None:
    """4000 draws under bound 3: every age 0..3 and no other; each count within 5 binomial standard deviations of
    1000 (sd = sqrt(4000 * 1/4 * 3/4) = 27.4), which a draw from 0..2 or 0..4 would miss by far."""
    gen = torch.Generator().manual_seed(0)
    ages = [draw_age(gen, 3) for _ in range(4000)]
    assert set(ages) == {0, 1, 2, 3}
    for a in range(4):
        assert abs(ages.count(a) - 1000) < 5 * 27.4
    assert {draw_age(gen, 0) for _ in range(50)} == {0}
    with pytest.raises(ValueError, match="bound must be >= 0"):
        draw_age(gen, -1)


def test_the_engine_is_the_policy_of_age_batches_ago() -> None:
    model = make_model(ModelConfig(vocab_size=16, max_len=12, d_model=16, n_layers=1), seed=0)
    st = Stressor("async4")
    assert (st.max_age, st.history_length) == (4, 5)
    history: deque[dict[str, torch.Tensor]] = deque(maxlen=st.history_length)
    biases = []
    for _ in range(5):
        biases.append(copy.deepcopy(model.head.bias))
        behaviour_policy(model, st, torch.Generator(), history, 0)
        with torch.no_grad():
            model.head.bias.add_(1.0)
    biases.append(copy.deepcopy(model.head.bias))
    # history holds the weights of the last five calls (biases[0..4]); this call adds biases[5]
    for age in range(5):
        h = copy.deepcopy(history)
        engine = behaviour_policy(model, st, torch.Generator(), h, age)
        assert torch.equal(engine.head.bias, biases[5 - age])
    # an age past what the history holds (early in a run) is the oldest policy it has
    engine = behaviour_policy(model, st, torch.Generator(), deque(maxlen=5), 3)
    assert torch.equal(engine.head.bias, model.head.bias)
    assert Stressor("stale").max_age is None and Stressor("stale", stale_steps=3).history_length == 4


def _quick(**changes: Any) -> LongRunConfig:
    config = LongRunConfig(**{**LONG_TASK.quick_overrides, "iterations": 12, **changes})
    return dataclasses.replace(config)


def test_the_guard_sees_the_staleness_stats_and_a_lowered_bound_reaches_the_pipeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A guarded ``async8`` run: every step's stats carry ``staleness_mean/max`` (= the batch's recorded age), the
    bound and the gap of the age's bucket; when the guard lowers the bound to 1 at step 5, every later batch is at
    most 1 version old, and the run records each batch's age."""
    seen: list[dict[str, float]] = []
    real = loop.guarded_update

    def spy(guard: Any, step: int, stats: dict[str, float], actuator: Any, tally: loop.GuardTally) -> str:
        seen.append(dict(stats))
        outcome = real(guard, step, stats, actuator, tally)
        if step >= 5:
            tally.staleness_bound = 1  # as a decision with Controls(max_staleness=1) sets it
        return outcome

    monkeypatch.setattr(loop, "guarded_update", spy)
    result = loop.run_one(_quick(stressor=Stressor("async8"), guard="stable", objective="grpo"))
    assert len(result.ages) == 12 and all(0 <= a <= 8 for a in result.ages)
    assert len(seen) == 24  # two minibatches per batch
    for i, stats in enumerate(seen):
        age = result.ages[i // 2]
        assert stats["staleness_mean"] == stats["staleness_max"] == age
        bucket = "age0" if age == 0 else "age1" if age == 1 else "age2_3" if age <= 3 else "age4plus"
        assert stats[f"mismatch_logp_abs_mean_{bucket}"] >= 0
        assert stats["staleness_bound"] == (8 if i < 6 else 1)
    assert all(a <= 1 for a in result.ages[3:])  # step 5 (batch 2's second) set it: from batch 3 on
    assert all(a <= i for i, a in enumerate(result.ages[:3]))  # capped by the history an early run has


def test_an_unguarded_run_draws_the_same_ages_and_the_actuator_declares_the_pipeline() -> None:
    off = loop.run_one(_quick(stressor=Stressor("async2")))
    again = loop.run_one(_quick(stressor=Stressor("async2")))
    assert off.ages == again.ages and set(off.ages) <= {0, 1, 2} and len(set(off.ages)) > 1
    assert {"staleness_bound", "drop_stale"} <= loop.ASYNC_CAPABILITIES
    none = loop.run_one(_quick(iterations=2))
    assert none.ages == []
