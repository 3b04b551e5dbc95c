"""Exact reductions (``rlguard.guards.stats.reduction``): weighted means, sums, maxima and minima combine like the
concatenated data, and one rank on the host combines in Python exactly as the vectorised combine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlguard.guards import StepStats
from rlguard.guards.stats.reduction import combine as _combine
from rlguard.guards.stats.reduction import combine_local as _combine_local


def test_weighted_mean_sum_max_min_combine_like_the_concatenated_data() -> None:
    a, b = StepStats(), StepStats()
    a.add("entropy", 0.5, weight=10)
    b.add("entropy", 0.8, weight=30)
    a.add("ratio_max", 1.5)
    b.add("ratio_max", 3.0)
    a.add("ratio_min", 0.7)
    b.add("ratio_min", 0.9)
    a.add("nonfinite", 2)
    b.add("nonfinite", 3)
    parts = np.stack([a._packed().numpy(), b._packed().numpy()])
    out = _combine(parts)
    assert out["entropy"] == pytest.approx((0.5 * 10 + 0.8 * 30) / 40, rel=1e-15)
    assert (out["ratio_max"], out["ratio_min"], out["nonfinite"]) == (3.0, 0.7, 5.0)
    assert "kl_ref" not in out  # never added on any rank -> absent, not 0


def test_one_rank_on_the_host_combines_in_python_exactly_as_the_vectorised_combine() -> None:
    """``reduce`` of host-only stats without a process group skips numpy (``_combine_local``): the same floats,
    NaN included, and unseen stats absent, as ``_combine`` of the packed array."""
    rng = np.random.default_rng(3)
    for trial in range(20):
        st = StepStats()
        for name in rng.choice(["entropy", "kl_old", "ratio_max", "ratio_min", "nonfinite", "loss", "grad_norm",
                                "reward_mean", "_reward_sq_mean", "clip_frac", "length_max"], size=12):  # fmt: skip
            value = math.nan if rng.random() < 0.1 else float(rng.normal())
            st.add(str(name), value, weight=float(rng.integers(0, 5)))
        local, vectorised = _combine_local(st._value, st._weight), _combine(st._host_packed()[None])
        assert local.keys() == vectorised.keys(), trial
        for name, value in vectorised.items():
            assert local[name] == value or (math.isnan(local[name]) and math.isnan(value)), (trial, name)
        assert st.reduce().keys() == local.keys()
