"""Step stats (``rlguard.guards.stats``): NaN and unknown names, the mismatch correlation, repetition loops, stats
from a real batch and from metrics read on the host (exact reductions: ``test_reduction.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlguard.core_losses import PolicyBatch, get_objective
from rlguard.guards import StepStats, collect_step_stats, repetition_flags
from rlguard.guards.stats.collect import add_metric_values


def test_max_propagates_nan_and_unknown_names_raise() -> None:
    st = StepStats()
    st.add("grad_norm", 1.0)
    st.add("grad_norm", math.nan)
    st.add("grad_norm", 2.0)
    assert math.isnan(st.reduce()["grad_norm"])
    with pytest.raises(ValueError, match="unknown stat 'gradnorm'; known stats: loss, entropy"):
        st.add("gradnorm", 1.0)


def test_reward_std_and_probability_correlation_are_exact() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=g, dtype=torch.float64)
    old = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 3
    engine = old + 0.1 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    mask[2, 3:] = 0
    batch = PolicyBatch(
        logprobs=old.clone(),
        advantages=torch.zeros(3, dtype=torch.float64),
        mask=mask,
        old_logprobs=old,
        rollout_logprobs=engine,
    )
    out = collect_step_stats(batch=batch, rewards=rewards).reduce()
    assert out["reward_std"] == pytest.approx(float(rewards.std(unbiased=False)), rel=1e-12)
    keep = mask.bool()
    expected = np.corrcoef(old[keep].exp().numpy(), engine[keep].exp().numpy())[0, 1]
    assert out["mismatch_prob_corr"] == pytest.approx(float(expected), rel=1e-12)


def test_objective_metrics_are_token_weighted_across_micro_batches() -> None:
    g = torch.Generator().manual_seed(1)
    lp = -torch.rand(6, 7, generator=g, dtype=torch.float64)
    old = lp + 0.3 * torch.randn(6, 7, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 7, generator=g) > 0.3).double()
    mask[:, 0] = 1
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    obj = get_objective("dapo")
    whole = PolicyBatch(logprobs=lp, advantages=adv, mask=mask, old_logprobs=old)
    st = StepStats()
    for rows in (slice(0, 2), slice(2, 6)):
        part = PolicyBatch(logprobs=lp[rows], advantages=adv[rows], mask=mask[rows], old_logprobs=old[rows])
        collect_step_stats(batch=part, output=obj(part), stats=st)
    combined, full = st.reduce(), obj(whole).metrics
    for name in ("clip_frac", "clip_frac_high", "kl_old", "ratio_mean", "ratio_max", "ratio_min"):
        assert combined[name] == pytest.approx(float(full[name]), rel=1e-12), name


def test_lengths_truncation_grad_norm_and_nonfinite() -> None:
    out = collect_step_stats(
        lengths=torch.tensor([3, 5, 10]),
        truncated=torch.tensor([False, False, True]),
        grad_norm=torch.tensor(math.inf),
        lr=1e-6,
    ).reduce()
    assert out["length_mean"] == 6.0 and out["length_max"] == 10.0
    assert out["truncated_frac"] == pytest.approx(1 / 3) and out["lr"] == 1e-6
    assert out["nonfinite"] == 1.0


@pytest.mark.parametrize(
    ("ids", "looping"),
    [
        ([5] * 12, True),  # "the the the ..."
        ([1, 2, 3] * 5, True),  # period 3, 15 tokens
        ([9, 8, 7, 6, *([1, 2, 3, 4] * 3)], True),  # loop at the end only
        (list(range(30)), False),
        ([1, 2, 3] * 3, False),  # 9 tokens: shorter than the minimum span of 12
        ([1, 2] * 6 + [7], False),  # the loop was broken at the end
    ],
)
def test_repetition_flags(ids: list[int], looping: bool) -> None:
    assert repetition_flags([ids]) == [looping]


def test_repetition_rate_from_completions() -> None:
    out = collect_step_stats(completion_ids=[[4] * 20, list(range(20)), [1, 2] * 10, [3, 1, 4]]).reduce()
    assert out["repetition_rate"] == 0.5


def test_float_and_tensor_inputs_reduce_alike() -> None:
    """Floats are accumulated in Python, tensors on their device; a stat may mix both; NaN wins max and min."""
    obs = [("entropy", 0.5, 3.0), ("entropy", 1.5, 1.0), ("grad_norm", 2.0, 1.0), ("ratio_max", 1.2, 1.0)]
    obs += [("ratio_max", math.nan, 1.0), ("ratio_max", 3.0, 1.0), ("nonfinite", 2.0, 1.0), ("nonfinite", 1.0, 1.0)]
    results = []
    for mode in ("float", "tensor", "mixed"):
        stats = StepStats()
        for k, (name, value, weight) in enumerate(obs):
            as_tensor = mode == "tensor" or (mode == "mixed" and k % 2 == 1)
            stats.add(name, torch.tensor(value) if as_tensor else value, torch.tensor(weight) if as_tensor else weight)
        results.append(stats.reduce())
    for got in results:
        assert got["entropy"] == (0.5 * 3 + 1.5) / 4 and got["grad_norm"] == 2.0 and got["nonfinite"] == 3.0, got
        assert math.isnan(got["ratio_max"]), got
    assert results[0].keys() == results[1].keys() == results[2].keys()


def test_metric_table_marks_exactly_the_stats_the_built_in_detectors_read() -> None:
    from rlguard.guards.registry import detector_registry
    from rlguard.metrics import JUDGED

    reads = {stat for cls in detector_registry().values() for stat in cls().reads()}
    assert reads == JUDGED


def test_metric_values_read_on_the_host_weigh_like_the_tensor_path_and_count_a_nonfinite_loss() -> None:
    """``add_metric_values`` (the TRL adapter hands over the metrics it read for logging) weighs each metric by
    the metric table: token-weighted, sequence-weighted, max and sum, written out by hand below."""
    names: tuple[str, ...] = ("clip_frac", "seq_ratio_mean", "ratio_max", "nonfinite", "loss")
    micro = [  # values, unmasked tokens, live sequences, loss
        ((0.25, 1.5, 2.0, 1.0, 0.3), 12.0, 3.0, 0.3),
        ((0.5, 0.5, 3.5, 0.0, math.nan), 4.0, 2.0, math.nan),
    ]
    st = StepStats()
    for values, tokens, sequences, loss in micro:
        add_metric_values(st, names, values, tokens=tokens, sequences=sequences, loss=loss)
    out = st.reduce()
    assert out["clip_frac"] == pytest.approx((0.25 * 12 + 0.5 * 4) / 16, rel=1e-15)
    assert out["seq_ratio_mean"] == pytest.approx((1.5 * 3 + 0.5 * 2) / 5, rel=1e-15)
    assert out["ratio_max"] == 3.5
    assert out["nonfinite"] == 1.0 + 0.0 + 1.0  # the objective's count, plus the non-finite loss
    assert math.isnan(out["loss"])

    g = torch.Generator().manual_seed(2)  # the same reduction as the tensor path on a real objective's output
    lp = -torch.rand(5, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(5, 6, generator=g) > 0.3).double()
    mask[:, 0] = 1
    batch = PolicyBatch(logprobs=lp, advantages=torch.randn(5, generator=g, dtype=torch.float64), mask=mask,
                        old_logprobs=lp + 0.2 * torch.randn(5, 6, generator=g, dtype=torch.float64))  # fmt: skip
    result = get_objective("grpo", on_nonfinite="mask")(batch)
    host = StepStats()
    names = tuple(sorted(result.metrics))
    add_metric_values(host, names, [float(result.metrics[n]) for n in names], tokens=float(mask.sum()),
                      sequences=5.0, loss=float(result.loss))  # fmt: skip
    assert host.reduce() == pytest.approx(collect_step_stats(batch=batch, output=result).reduce(), rel=1e-14)
    with pytest.raises(ValueError, match="unknown stat 'kl_reff'"):
        host.add_floats(["kl_reff"], [1.0], [1.0])
