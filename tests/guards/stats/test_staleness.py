"""Staleness stats (issue 38, part 3): each sample's age and the train-inference gap by age bucket, written out per
token with Python floats (no code shared with ``rlguard.guards.stats.staleness``), and how two micro-batches
combine."""

from __future__ import annotations

import pytest
import torch

from rlguard.guards.stats.collect import StepStats
from rlguard.guards.stats.staleness import add_staleness_stats, staleness_bucket

AGES = [0.0, 1.0, 3.0, 2.0, 7.0]
TRAINER = [[-1.0, -0.5, -2.0], [-0.3, -0.9, -1.1], [-2.0, -0.1, -0.4], [-0.7, -0.7, -0.2], [-1.5, -0.6, -0.8]]
ROLLOUT = [[-1.1, -0.5, -1.7], [-0.1, -1.4, -1.0], [-2.6, -0.3, -0.4], [-0.2, -0.9, -0.9], [-0.5, -1.6, -0.8]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]


def _reference() -> dict[str, float]:
    """The definition: the mean of |log p_trainer - log p_rollout| over the unmasked tokens of each bucket's rows."""
    buckets = {"age0": [0], "age1": [1], "age2_3": [2, 3], "age4plus": [4]}
    out = {"staleness_mean": sum(AGES) / len(AGES), "staleness_max": max(AGES)}
    for name, rows in buckets.items():
        gaps = [abs(TRAINER[b][t] - ROLLOUT[b][t]) for b in rows for t in range(3) if MASK[b][t]]
        out[f"mismatch_logp_abs_mean_{name}"] = sum(gaps) / len(gaps)
    return out


def _add(st: StepStats, rows: slice) -> None:
    t = lambda x: torch.tensor(x, dtype=torch.float32)[rows]  # noqa: E731
    add_staleness_stats(st, t(AGES), t(TRAINER), t(ROLLOUT), t(MASK))


def test_the_gap_by_age_matches_its_definition_in_one_and_in_two_micro_batches() -> None:
    whole = StepStats()
    _add(whole, slice(None))
    split = StepStats()
    _add(split, slice(0, 2))
    _add(split, slice(2, None))
    for stats in (whole.reduce(), split.reduce()):
        for name, expected in _reference().items():
            assert stats[name] == pytest.approx(expected, rel=1e-6, abs=1e-7), name


def test_a_bucket_without_samples_is_absent_and_ages_alone_are_accepted() -> None:
    st = StepStats()
    add_staleness_stats(st, torch.tensor([2.0, 3.0]))
    stats = st.reduce()
    assert (stats["staleness_mean"], stats["staleness_max"]) == (2.5, 3.0)
    assert not any(k.startswith("mismatch_logp_abs_mean_age") for k in stats)


def test_bad_input_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="ages must be finite and >= 0"):
        add_staleness_stats(StepStats(), torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="pass all three"):
        add_staleness_stats(StepStats(), torch.tensor([1.0]), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="ages has 2 samples"):
        add_staleness_stats(
            StepStats(), torch.tensor([1.0, 2.0]), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)
        )
    with pytest.raises(ValueError, match="age must be a finite number"):
        staleness_bucket(float("nan"))
    assert [staleness_bucket(a) for a in (0, 0.5, 1, 2, 3.9, 4, 100)] == [
        "mismatch_logp_abs_mean_age0",
        "mismatch_logp_abs_mean_age0",
        "mismatch_logp_abs_mean_age1",
        "mismatch_logp_abs_mean_age2_3",
        "mismatch_logp_abs_mean_age2_3",
        "mismatch_logp_abs_mean_age4plus",
        "mismatch_logp_abs_mean_age4plus",
    ]
