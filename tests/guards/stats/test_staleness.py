"""Staleness stats (issue 38, part 3): each sample's age and the train-inference gap by age bucket, written out per
token with Python floats (no code shared with ``rlguard.guards.stats.staleness``), and how two micro-batches
combine."""

from __future__ import annotations

import pytest
import torch

from rlguard.guards.stats.collect import StepStats
from rlguard.guards.stats.staleness import PublishedSteps, add_staleness_stats, add_step_ages, staleness_bucket

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


# -- ages in optimizer steps ----------------------------------------------------------------------------------------
def _pipeline(sync_every: int, steps: int) -> PublishedSteps:
    """A trainer that publishes version ``v`` after optimizer step ``v * sync_every`` (version 0: the initial
    weights), as TRL's ``weight_sync_steps`` and verl's ``trigger_parameter_sync_step`` do."""
    published = PublishedSteps()
    for step in range(steps + 1):
        if step % sync_every == 0:
            published.publish(step // sync_every, step)
    return published


@pytest.mark.parametrize("sync_every", [1, 3])
def test_the_age_in_optimizer_steps_is_the_updates_since_the_samples_weights(sync_every: int) -> None:
    """At step ``t`` (the trainer's weights hold ``t`` updates) a sample of version ``v`` was made ``v * k`` updates
    in: ``t - v k`` steps old, against ``floor(t / k) - v`` versions; equal at one sync per step."""
    k = sync_every
    published = _pipeline(k, 12)
    for t in range(12):
        versions = list(range(t // k + 1))  # every version published by step t
        ages = published.ages(torch.tensor(versions, dtype=torch.float32), t).tolist()
        assert ages == [float(t - v * k) for v in versions]
        in_versions = [t // k - v for v in versions]
        if k == 1:
            assert ages == in_versions
    if k == 3:
        # step 5: version 1 (made at step 3) is 2 steps old though the last published version (0 versions);
        # version 0 is 5 steps, 1 version old: the trainer's lead over the last version is in every age
        assert published.ages(torch.tensor([1.0, 0.0]), 5).tolist() == [2.0, 5.0]
        assert [published.step_of(v) for v in range(5)] == [0, 3, 6, 9, 12]


def test_a_rollback_forgets_the_discarded_versions_and_brings_the_kept_ones_nearer() -> None:
    """One sync per step, versions 0-5; at step 5 the weights go back to step 3's and are republished as version
    6: a sample of version 3 is then one update old at step 6, one of version 2 two (the discarded updates 4 and 5
    are in no weights), the republished version one."""
    published = _pipeline(1, 5)
    published.rollback(to_step=3, at_step=5)
    published.publish(6, 5)
    assert published.ages(torch.tensor([3.0, 2.0, 6.0]), 6).tolist() == [1.0, 2.0, 1.0]
    assert published.step_of(3) == published.step_of(4) == 5  # 4 was discarded: it counts as the kept 3
    published.publish(6, 5)  # the same weights sent again: keeps its step
    with pytest.raises(ValueError, match=r"versions and their steps go forward; the last published is version 6"):
        published.publish(7, 4)
    with pytest.raises(ValueError, match="to_step must not be after at_step"):
        published.rollback(to_step=7, at_step=6)


def test_a_version_never_published_has_no_age() -> None:
    published = PublishedSteps()
    assert torch.isnan(published.ages(torch.tensor([0.0]), 1)).all()
    published.publish(2, 4)  # a resumed run starts at version 2
    with pytest.raises(ValueError, match=r"policy version 1 was never published \(the first is 2\)"):
        published.step_of(1)
    ages = published.ages(torch.tensor([1.0, 2.0]), 6)
    assert torch.isnan(ages[0]) and ages[1] == 2.0
    with pytest.raises(ValueError, match=r"ages must be finite and >= 0 optimizer steps; got \[nan, 2.0\]"):
        add_step_ages(StepStats(), ages)
    st = StepStats()
    add_step_ages(st, torch.tensor([0.0, 2.0, 7.0]))
    assert st.reduce() == {"staleness_steps_mean": 3.0, "staleness_steps_max": 7.0}
    with pytest.raises(ValueError, match="version must be a whole number >= 0; got -1"):
        published.publish(-1, 0)
