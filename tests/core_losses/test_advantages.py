"""group_advantages: GRPO's std scaling, Dr. GRPO's plain centring, RLOO, and the zero-std statistics."""

from __future__ import annotations

import math
import statistics
from typing import Any, Literal

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlguard.core_losses import ADVANTAGE_SCALES, group_advantages

#: group_advantages' scale modes
Scale = Literal["std", "none", "rloo"]


def t(values: list[Any], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def ids(values: list[Any]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def loop_advantages(rewards: list[float], group_ids: list[int], scale: str, eps: float = 1e-6) -> list[float]:
    """The definitions, one completion at a time."""
    out = []
    for r, g in zip(rewards, group_ids, strict=True):
        group = [x for x, h in zip(rewards, group_ids, strict=True) if h == g]
        if len(group) == 1:
            out.append(0.0)
        elif scale == "std":
            out.append((r - statistics.fmean(group)) / (statistics.stdev(group) + eps))
        elif scale == "none":
            out.append(r - statistics.fmean(group))
        else:  # rloo: the mean of the *other* completions of the group is the baseline
            others = list(group)
            others.remove(r)
            out.append(r - statistics.fmean(others))
    return out


def test_grpo_std_uses_the_unbiased_std_and_eps() -> None:
    # group 0: rewards 0, 1, 1, 0 (mean 0.5, unbiased std sqrt(1/3)); group 1: 2, 4 (mean 3, std sqrt(2))
    rewards, groups = t([0.0, 1.0, 1.0, 0.0, 2.0, 4.0]), ids([0, 0, 0, 0, 1, 1])
    out = group_advantages(rewards, groups, scale="std", eps=1e-6)
    s0, s1 = math.sqrt(1 / 3), math.sqrt(2.0)
    expected = [-0.5 / (s0 + 1e-6), 0.5 / (s0 + 1e-6), 0.5 / (s0 + 1e-6), -0.5 / (s0 + 1e-6)]
    expected += [-1 / (s1 + 1e-6), 1 / (s1 + 1e-6)]
    torch.testing.assert_close(out.advantages, t(expected), rtol=1e-12, atol=0)


def test_eps_is_added_to_the_std() -> None:
    out = group_advantages(t([0.0, 2.0]), ids([5, 5]), eps=0.5)  # mean 1, std sqrt(2)
    torch.testing.assert_close(out.advantages, t([-1.0, 1.0]) / (math.sqrt(2) + 0.5), rtol=1e-12, atol=0)


def test_default_scale_is_grpo_std() -> None:
    rewards, groups = t([0.0, 1.0, 3.0]), ids([0, 0, 0])
    default, std = group_advantages(rewards, groups), group_advantages(rewards, groups, scale="std")
    assert torch.equal(default.advantages, std.advantages)


def test_dr_grpo_none_only_centres() -> None:
    out = group_advantages(t([1.0, 2.0, 6.0, 10.0, 20.0]), ids([0, 0, 0, 1, 1]), scale="none")
    torch.testing.assert_close(out.advantages, t([-2.0, -1.0, 3.0, -5.0, 5.0]), rtol=1e-12, atol=0)


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    rewards, groups = [1.0, 2.0, 6.0, 10.0, 20.0], [0, 0, 0, 1, 1]
    out = group_advantages(t(rewards), ids(groups), scale="rloo")
    # 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - 1.5 = 4.5; 10 - 20 = -10, 20 - 10 = 10
    torch.testing.assert_close(out.advantages, t([-3.0, -1.5, 4.5, -10.0, 10.0]), rtol=1e-12, atol=0)


@pytest.mark.parametrize("scale", ADVANTAGE_SCALES)
def test_groups_of_one_get_zero(scale: Scale) -> None:
    out = group_advantages(t([3.0, 1.0, 2.0, -7.0]), ids([0, 1, 1, 2]), scale=scale)
    assert out.advantages[0] == 0 and out.advantages[3] == 0
    assert out.advantages[1] != 0 and out.advantages[2] != 0
    assert torch.isfinite(out.advantages).all()


@pytest.mark.parametrize("scale", ADVANTAGE_SCALES)
def test_zero_std_groups_get_exactly_zero_advantage(scale: Scale) -> None:
    # 16 equal float32 rewards of 0.7: their computed mean is not exactly 0.7, and std scaling divides that
    # rounding (~1e-7) by std + eps = 1e-6. A group whose rewards are all equal carries no learning signal.
    dtype = torch.float32
    rewards = torch.cat([torch.full((16,), 0.7, dtype=dtype), torch.tensor([0.0, 1.0], dtype=dtype)])
    groups = ids([0] * 16 + [1, 1])
    out = group_advantages(rewards, groups, scale=scale)
    assert out.zero_std.tolist() == [True] * 16 + [False, False]
    assert torch.equal(out.advantages[:16], torch.zeros(16, dtype=dtype)), out.advantages[:16]
    assert (out.advantages[16:] != 0).all()


def test_eps_zero_gives_zero_not_nan_for_zero_std_groups() -> None:
    out = group_advantages(t([0.5, 0.5, 0.0, 2.0]), ids([0, 0, 1, 1]), eps=0.0)
    torch.testing.assert_close(out.advantages, t([0.0, 0.0, -1 / math.sqrt(2), 1 / math.sqrt(2)]), rtol=1e-12, atol=0)


def test_frac_zero_std_groups_and_solved() -> None:
    # groups: 0 all solved (1, 1), 1 all failed (0, 0, 0), 2 mixed, 3 all solved, 4 a single completion (its
    # rewards are trivially all equal; it is at the maximum, so it counts as solved)
    rewards = t([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    groups = ids([0, 0, 1, 1, 1, 2, 2, 3, 3, 4])
    out = group_advantages(rewards, groups)
    assert out.zero_std.tolist() == [True, True, True, True, True, False, False, True, True, True]
    assert out.frac_zero_std_groups.item() == pytest.approx(4 / 5, abs=1e-12)
    assert out.frac_zero_std_solved.item() == pytest.approx(2 / 5, abs=1e-12)


def test_frac_zero_std_solved_is_zero_when_no_group_is_at_the_maximum() -> None:
    out = group_advantages(t([0.0, 0.0, 0.0, 1.0]), ids([0, 0, 1, 1]))
    assert out.frac_zero_std_groups.item() == pytest.approx(0.5, abs=1e-12)
    assert out.frac_zero_std_solved.item() == 0.0


@pytest.mark.parametrize("scale", ADVANTAGE_SCALES)
def test_unsorted_non_contiguous_group_ids(scale: Scale) -> None:
    rewards = [0.3, 5.0, 1.0, 2.0, -1.0, 0.0, 4.0, 0.5]
    groups = [70, 3, 70, -2, 3, 70, 3, 1000]
    out = group_advantages(t(rewards), ids(groups), scale=scale)
    torch.testing.assert_close(out.advantages, t(loop_advantages(rewards, groups, scale)), rtol=1e-12, atol=1e-12)
    # relabelling and permuting the completions permutes the advantages
    perm = [5, 2, 7, 0, 3, 6, 1, 4]
    relabelled = group_advantages(t([rewards[i] for i in perm]), ids([groups[i] * 7 + 1 for i in perm]), scale=scale)
    torch.testing.assert_close(relabelled.advantages, out.advantages[perm], rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    scale=st.sampled_from(ADVANTAGE_SCALES),
    pairs=st.lists(
        st.tuples(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.5]) | st.floats(-10, 10), st.integers(-3, 3)),
        min_size=1,
        max_size=12,
    ),
)
def test_matches_the_explicit_loop(scale: Scale, pairs: list[tuple[float, int]]) -> None:
    rewards, groups = [r for r, _ in pairs], [g for _, g in pairs]
    out = group_advantages(t(rewards), ids(groups), scale=scale)
    expected = loop_advantages(rewards, groups, scale)
    # eps=1e-6 bounds the amplification of the rounding of the group mean (~1e-15) by 1/std to ~1e-9
    torch.testing.assert_close(out.advantages, t(expected), rtol=1e-9, atol=1e-7)
    values = {g: {x for x, h in pairs if h == g} for g in groups}
    zero_std = {g for g, v in values.items() if len(v) == 1}
    solved = {g for g in zero_std if values[g] == {max(rewards)}}
    assert out.zero_std.tolist() == [g in zero_std for g in groups]
    assert out.frac_zero_std_groups.item() == pytest.approx(len(zero_std) / len(values), abs=1e-12)
    assert out.frac_zero_std_solved.item() == pytest.approx(len(solved) / len(values), abs=1e-12)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_computed_in_float32_or_wider(dtype: torch.dtype, expected: torch.dtype) -> None:
    out = group_advantages(t([0.0, 1.0, 1.0], dtype), ids([0, 0, 0]))
    assert out.advantages.dtype == expected
    assert out.frac_zero_std_groups.dtype == expected


def test_empty_batch() -> None:
    out = group_advantages(t([]), ids([]))
    assert out.advantages.shape == (0,)
    assert out.frac_zero_std_groups.item() == 0.0 and out.frac_zero_std_solved.item() == 0.0


@pytest.mark.parametrize(
    ("rewards", "group_ids", "kwargs", "pattern"),
    [
        (
            t([1.0, 2.0]),
            ids([0, 0]),
            {"scale": "zscore"},
            r"scale must be one of \['std', 'none', 'rloo'\]; got 'zscore",
        ),
        (t([[1.0, 2.0]]), ids([[0, 0]]), {}, r"rewards and group_ids must both have shape \(B,\); got \(1, 2\)"),
        (t([1.0, 2.0]), ids([0, 0, 1]), {}, r"got \(2,\) and \(3,\)"),
        (torch.tensor([1, 0]), ids([0, 0]), {}, r"rewards must be a floating-point tensor; got torch.int64"),
        (t([1.0, 2.0]), t([0.0, 0.0]), {}, r"group_ids must be an integer tensor .*got torch.float64"),
        (t([1.0, float("nan"), float("inf")]), ids([0, 0, 0]), {}, r"rewards contains 2 NaN/Inf values"),
        (t([1.0, 2.0]), ids([0, 0]), {"eps": -1.0}, r"eps must be .*got -1.0"),
    ],
)
def test_bad_inputs_raise(rewards: torch.Tensor, group_ids: torch.Tensor, kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        group_advantages(rewards, group_ids, **kwargs)
