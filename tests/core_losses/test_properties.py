"""Properties every registered objective has on random finite inputs (strategies in tests/helpers/strategies.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlguard.core_losses import LossOutput, PolicyBatch, get_objective, list_objectives
from tests.helpers.strategies import BatchData, batch_data, objective_kwargs

OBJECTIVES = list_objectives()
SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(name: str, kwargs: dict[str, Any], batch: PolicyBatch, **normalisers: Any) -> LossOutput:
    if name == "clip_cov":  # its random token draw: the same generator state in every run compared
        kwargs = {**kwargs, "generator": torch.Generator().manual_seed(0)}
    out = get_objective(name, **kwargs)(batch, **normalisers)
    out.loss.backward()
    return out


def assert_finite(out: LossOutput, batch: PolicyBatch) -> None:
    assert out.loss.shape == ()
    assert torch.isfinite(out.loss.detach()), out.loss
    assert batch.logprobs.grad is not None
    assert torch.isfinite(batch.logprobs.grad).all(), batch.logprobs.grad
    if batch.entropies is not None and batch.entropies.grad is not None:
        assert torch.isfinite(batch.entropies.grad).all(), batch.entropies.grad
    for key, value in out.metrics.items():
        assert value.shape == (), key
        assert torch.isfinite(value), (key, value)


def test_objectives_are_registered() -> None:
    assert {"cispo", "dapo", "dr_grpo", "gmpo", "grpo", "gspo", "gspo_token", "sapo"} <= set(OBJECTIVES)


@pytest.mark.parametrize("name", OBJECTIVES)
@SETTINGS
@given(dtype=st.sampled_from([torch.float32, torch.float64]), data=st.data())
def test_loss_and_gradients_finite(name: str, dtype: torch.dtype, data: st.DataObject) -> None:
    values = data.draw(batch_data())
    kwargs = data.draw(objective_kwargs(name, values))
    batch = values.batch(dtype)
    out = run(name, kwargs, batch)
    assert out.loss.dtype == dtype
    assert_finite(out, batch)


@pytest.mark.parametrize("name", OBJECTIVES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@SETTINGS
@given(data=st.data())
def test_half_precision_is_computed_in_float32(name: str, dtype: torch.dtype, data: st.DataObject) -> None:
    # float16 gradients overflow at 65504, so keep ratios within e^+-4 (the loss itself is computed in float32).
    values = data.draw(batch_data(offset_range=4.0))
    kwargs = data.draw(objective_kwargs(name, values))
    half = values.batch(dtype)
    full = values.batch(dtype, upcast_to=torch.float32)  # the same (exactly representable) values
    out_half, out_full = run(name, kwargs, half), run(name, kwargs, full)

    assert out_half.loss.dtype == torch.float32
    assert all(v.dtype == torch.float32 for v in out_half.metrics.values())
    assert_finite(out_half, half)
    torch.testing.assert_close(out_half.loss, out_full.loss, rtol=1e-6, atol=1e-7)
    assert half.logprobs.grad is not None and full.logprobs.grad is not None
    assert half.logprobs.grad.dtype == dtype
    # the cast's backward rounds the float32 gradient to the input dtype, and nothing else
    torch.testing.assert_close(half.logprobs.grad, full.logprobs.grad.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("name", OBJECTIVES)
@SETTINGS
@given(data=st.data())
def test_float64_stays_float64(name: str, data: st.DataObject) -> None:
    values = data.draw(batch_data())
    kwargs = data.draw(objective_kwargs(name, values))
    batch = values.batch(torch.float64)
    out = run(name, kwargs, batch)
    assert out.loss.dtype == torch.float64
    assert all(v.dtype == torch.float64 for v in out.metrics.values())
    assert batch.logprobs.grad is not None and batch.logprobs.grad.dtype == torch.float64
    assert_finite(out, batch)


@pytest.mark.parametrize("name", OBJECTIVES)
@SETTINGS
@given(data=st.data())
def test_nonfinite_tokens_are_masked_and_counted(name: str, data: st.DataObject) -> None:
    values = data.draw(batch_data(garbage_padding=False))
    kwargs = data.draw(objective_kwargs(name, values))
    b, t = values.shape
    poison = data.draw(hnp.arrays(np.bool_, (b, t))) & (values.mask == 1)
    bad = data.draw(hnp.arrays(np.float64, (b, t), elements=st.sampled_from([np.nan, np.inf, -np.inf])))
    poisoned = dataclasses.replace(values, logprobs=np.where(poison, bad, values.logprobs))
    batch = poisoned.batch(torch.float32)
    out = run(name, {**kwargs, "on_nonfinite": "mask"}, batch)
    assert_finite(out, batch)
    assert out.metrics["nonfinite"] == int(poison.sum())
    assert batch.logprobs.grad is not None
    assert (batch.logprobs.grad[torch.from_numpy(poison)] == 0).all()


#: Clip-Cov and KL-Cov select tokens by their covariance over the (micro-)batch, as the paper and verl do:
#: their micro-batch losses do not add up to the batch's by design
BATCH_STATISTICS = ("clip_cov", "kl_cov")


@pytest.mark.parametrize("name", [name for name in OBJECTIVES if name not in BATCH_STATISTICS])
@SETTINGS
@given(data=st.data())
def test_micro_batches_add_up_to_the_batch(name: str, data: st.DataObject) -> None:
    """With the whole batch's counts as normalisers, the losses and gradients of a row split add up."""
    values = data.draw(batch_data(max_b=6))
    kwargs = data.draw(objective_kwargs(name, values))
    b = values.shape[0]
    cut = data.draw(st.integers(0, b))
    counts = values.mask.sum(axis=1)
    normalisers = {"num_tokens": max(counts.sum(), 1.0), "num_sequences": max(float((counts > 0).sum()), 1.0)}

    whole = values.batch(torch.float64)
    out = run(name, kwargs, whole, **normalisers)
    total = torch.zeros((), dtype=torch.float64)
    grads = []
    for rows in (slice(0, cut), slice(cut, b)):
        part = _rows(values, rows)
        if part.shape[0] == 0:
            continue
        batch = part.batch(torch.float64)
        total = total + run(name, kwargs, batch, **normalisers).loss.detach()
        assert batch.logprobs.grad is not None
        grads.append(batch.logprobs.grad)
    torch.testing.assert_close(total, out.loss.detach(), rtol=1e-12, atol=1e-12)
    assert whole.logprobs.grad is not None
    torch.testing.assert_close(torch.cat(grads), whole.logprobs.grad, rtol=1e-12, atol=1e-12)


def _rows(values: BatchData, rows: slice) -> BatchData:
    arrays = {f.name: getattr(values, f.name) for f in dataclasses.fields(values)}
    return dataclasses.replace(values, **{k: v[rows] for k, v in arrays.items() if isinstance(v, np.ndarray)})  # type: ignore[arg-type]
