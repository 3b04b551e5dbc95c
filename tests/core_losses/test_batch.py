"""Bad inputs: shapes, dtypes, mask values, NaN/Inf, empty batches and invalid hyper-parameters."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from rlguard.core_losses import AGGREGATIONS, PolicyBatch, get_objective, list_objectives, objective_class

OBJECTIVES = list_objectives()
B, T = 3, 4
NAN, INF = float("nan"), float("inf")
TOKEN_FIELDS = ("old_logprobs", "ref_logprobs", "rollout_logprobs", "entropies")
# every optional input in use, so that a NaN in any of them could reach the loss
ALL_INPUTS = {"beta": 0.1, "entropy_coef": 0.01, "rollout_is": "token"}


def tensors() -> dict[str, torch.Tensor]:
    """Fresh finite float64 values for every field; mask rows of lengths 4, 2 and 3 (left-aligned)."""
    g = torch.Generator().manual_seed(0)
    f64 = torch.float64
    logprobs = -torch.rand(B, T, generator=g, dtype=f64) * 3
    return {
        "logprobs": logprobs,
        "advantages": torch.randn(B, generator=g, dtype=f64),
        "mask": (torch.arange(T) < torch.tensor([4, 2, 3])[:, None]).to(f64),
        "old_logprobs": logprobs + 0.3 * torch.randn(B, T, generator=g, dtype=f64),
        "ref_logprobs": logprobs + 0.3 * torch.randn(B, T, generator=g, dtype=f64),
        "rollout_logprobs": logprobs + 0.3 * torch.randn(B, T, generator=g, dtype=f64),
        "entropies": torch.rand(B, T, generator=g, dtype=f64),
    }


def make(**fields: Any) -> PolicyBatch:
    """A batch of :func:`tensors` with ``fields`` replaced; float ``logprobs`` become a leaf with a gradient."""
    values: dict[str, Any] = {**tensors(), **fields}
    logprobs = values["logprobs"]
    if isinstance(logprobs, torch.Tensor) and logprobs.is_floating_point():
        values["logprobs"] = logprobs.detach().requires_grad_(True)
    return PolicyBatch(**values)


def loss_and_grad(name: str, batch: PolicyBatch, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    out = get_objective(name, **kwargs)(batch)
    out.loss.backward()
    assert batch.logprobs.grad is not None
    return out.loss.detach(), batch.logprobs.grad


# -- shapes ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logprobs", torch.zeros(B * T, dtype=torch.float64)),
        ("logprobs", torch.zeros(B, T, 1, dtype=torch.float64)),
        ("mask", torch.ones(B, T + 1)),
        ("mask", torch.ones(B + 1, T)),
        ("mask", torch.ones(B)),
        ("advantages", torch.zeros(B + 1)),
        ("advantages", torch.zeros(B, 2)),  # neither (B, 1) nor (B, T)
        ("advantages", torch.zeros(B, T + 1)),
        ("advantages", torch.zeros(B, T, 1)),
        ("advantages", torch.zeros(())),
        *[(f, torch.zeros(B, T + 1)) for f in TOKEN_FIELDS],
        *[(f, torch.zeros(B - 1, T)) for f in TOKEN_FIELDS],
        *[(f, torch.zeros(B)) for f in TOKEN_FIELDS],
    ],
)
def test_wrong_shape_names_the_argument(field: str, value: torch.Tensor) -> None:
    # the other fields keep (B, T), so for logprobs the check on logprobs itself must come first
    with pytest.raises(ValueError, match=rf"^{field} must .*got (shape )?{re.escape(str(tuple(value.shape)))}"):
        make(**{field: value})


@pytest.mark.parametrize("field", ["logprobs", "advantages", "mask", *TOKEN_FIELDS])
def test_non_tensor_names_the_argument(field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be a torch.Tensor; got list"):
        make(**{field: tensors()[field].tolist()})


@pytest.mark.parametrize("field", ["logprobs", "advantages", *TOKEN_FIELDS])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_non_float_dtype_names_the_argument(field: str, dtype: torch.dtype) -> None:
    value = tensors()[field].round().to(dtype)
    with pytest.raises(ValueError, match=rf"^{field} must be a floating-point tensor .*got {re.escape(str(dtype))}"):
        make(**{field: value})


@pytest.mark.parametrize("field", ["advantages", *TOKEN_FIELDS])
def test_other_device_names_the_argument(field: str) -> None:
    # the meta device stands in for an accelerator; logprobs and mask stay on the CPU
    with pytest.raises(ValueError, match=rf"^{field} is on meta but logprobs is on cpu"):
        make(**{field: tensors()[field].to("meta")})


# -- mask values -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0, NAN])
def test_mask_values_other_than_0_and_1_raise(bad: float) -> None:
    mask = tensors()["mask"]
    mask[1, 0] = bad
    with pytest.raises(ValueError, match=r"^mask must hold only 0 and 1 .*got 1 other value"):
        make(mask=mask)


def test_integer_mask_value_2_raises() -> None:
    mask = tensors()["mask"].long()
    mask[0, 0] = 2
    with pytest.raises(ValueError, match=r"^mask must hold only 0 and 1.*2"):
        make(mask=mask)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int64, torch.float16, torch.float32])
def test_mask_of_any_dtype_holding_0_and_1_is_accepted(dtype: torch.dtype) -> None:
    reference, _ = loss_and_grad("grpo", make())
    loss, _ = loss_and_grad("grpo", make(mask=tensors()["mask"].to(dtype)))
    assert loss == reference


# -- NaN and Inf -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["logprobs", *TOKEN_FIELDS])
def test_nonfinite_at_unmasked_positions_raises_with_count(field: str) -> None:
    value = tensors()[field]
    value[0, 0] = value[0, 3] = value[2, 1] = NAN
    value[1, 3] = INF  # padding (row 1 has 2 tokens): not counted
    batch = make(**{field: value})
    with pytest.raises(ValueError, match=rf"^{field} contains 3 NaN values at unmasked positions, first at \(0, 0\)"):
        get_objective("grpo")(batch)


def test_token_advantages_nan_and_inf_are_counted_separately() -> None:
    adv = tensors()["advantages"][:, None].expand(B, T).clone()
    adv[0, 1] = adv[2, 2] = NAN
    adv[1, 0] = -INF
    with pytest.raises(ValueError, match=r"^advantages contains 2 NaN, 1 Inf values at unmasked positions"):
        get_objective("dapo")(make(advantages=adv))


def test_single_inf_is_reported_in_the_singular() -> None:
    value = tensors()["logprobs"]
    value[2, 2] = -INF
    with pytest.raises(ValueError, match=r"^logprobs contains 1 Inf value at unmasked positions, first at \(2, 2\)"):
        get_objective("grpo")(make(logprobs=value))


def test_sequence_advantage_nan_counts_values_of_the_tensor_given() -> None:
    # advantages (B,): one NaN value, for a sequence of 2 unmasked tokens. The message is about the
    # caller's tensor, which holds 1 NaN, at index (1,), not 2 NaN at a (B, T) position.
    adv = tensors()["advantages"]
    adv[1] = NAN
    with pytest.raises(ValueError, match=r"^advantages contains 1 NaN value\b"):
        get_objective("grpo")(make(advantages=adv))


@pytest.mark.parametrize("name", OBJECTIVES)
def test_nonfinite_logprobs_raise_for_every_objective(name: str) -> None:
    value = tensors()["logprobs"]
    value[0, 1] = value[2, 0] = NAN
    with pytest.raises(ValueError, match=r"^logprobs contains 2 NaN values"):
        get_objective(name)(make(logprobs=value))


def padded_with(garbage: float) -> dict[str, torch.Tensor]:
    """Every (B, T) field, and token-level advantages, with ``garbage`` at the padding positions."""
    values = tensors()
    values["advantages"] = values["advantages"][:, None] * torch.linspace(0.5, 1.5, T, dtype=torch.float64)
    pad = values["mask"] == 0
    return {k: v if k == "mask" else v.masked_fill(pad, garbage) for k, v in values.items()}


@pytest.mark.parametrize("name", OBJECTIVES)
@pytest.mark.parametrize("garbage", [NAN, INF, -INF])
def test_nonfinite_padding_is_ignored(name: str, garbage: float) -> None:
    clean = padded_with(0.0)
    loss, grad = loss_and_grad(name, make(**clean), **ALL_INPUTS)
    dirty_loss, dirty_grad = loss_and_grad(name, make(**padded_with(garbage)), **ALL_INPUTS)
    assert torch.isfinite(dirty_loss) and torch.isfinite(dirty_grad).all()
    assert dirty_loss == loss
    assert torch.equal(dirty_grad, grad)
    assert (dirty_grad[clean["mask"] == 0] == 0).all()


# one unmasked position per input (rows have 4, 2 and 3 tokens; each keeps one), and the value put there
POISON = {
    "logprobs": ((0, 0), NAN),
    "old_logprobs": ((0, 2), INF),
    "ref_logprobs": ((0, 3), -INF),
    "rollout_logprobs": ((2, 0), NAN),
    "entropies": ((1, 1), INF),
    "advantages": ((2, 1), NAN),
}


def poisoned_and_masked() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(inputs with POISON, the same finite inputs with the POISON positions masked out instead)``."""
    poisoned, masked = padded_with(0.0), padded_with(0.0)
    for field, (position, garbage) in POISON.items():
        poisoned[field][position] = garbage
        masked["mask"][position] = 0.0
    return poisoned, masked


@pytest.mark.parametrize("name", OBJECTIVES)
def test_on_nonfinite_mask_counts_and_keeps_gradients_finite(name: str) -> None:
    poisoned, masked = poisoned_and_masked()
    batch = make(**poisoned)
    out = get_objective(name, on_nonfinite="mask", **ALL_INPUTS)(batch)
    out.loss.backward()
    assert out.metrics["nonfinite"] == len(POISON)
    assert torch.isfinite(out.loss.detach())
    assert batch.logprobs.grad is not None and torch.isfinite(batch.logprobs.grad).all()
    assert (batch.logprobs.grad[masked["mask"] == 0] == 0).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize(
    ("name", "aggregation"),
    [(n, None) for n in OBJECTIVES] + [("grpo", a) for a in AGGREGATIONS if a != "seq-mean-token-mean"],
)
def test_on_nonfinite_mask_equals_masking_those_tokens(name: str, aggregation: str | None) -> None:
    """Dropped tokens are as if masked out: same loss (default normalisers included) and same gradient."""
    kwargs: dict[str, Any] = {**ALL_INPUTS, **({} if aggregation is None else {"aggregation": aggregation})}
    poisoned, masked = poisoned_and_masked()
    loss, grad = loss_and_grad(name, make(**poisoned), on_nonfinite="mask", **kwargs)
    expected_loss, expected_grad = loss_and_grad(name, make(**masked), **kwargs)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_on_nonfinite_mask_equals_masking_with_explicit_normalisers(aggregation: str) -> None:
    """With the step's counts given (as adapters do), a dropped token is as if masked out."""
    normalisers = {"num_tokens": 9.0, "num_sequences": 3.0}
    kwargs: dict[str, Any] = {"aggregation": aggregation, **ALL_INPUTS}
    poisoned, masked = poisoned_and_masked()
    out = get_objective("grpo", on_nonfinite="mask", **kwargs)(make(**poisoned), **normalisers)
    expected = get_objective("grpo", **kwargs)(make(**masked), **normalisers)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-12, atol=1e-12)


# -- empty batches -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", OBJECTIVES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("garbage", [0.0, NAN])
def test_all_masked_batch_gives_zero_loss_and_zero_gradient(name: str, aggregation: str, garbage: float) -> None:
    values = padded_with(0.0)
    values["mask"] = torch.zeros(B, T, dtype=torch.float64)
    values = {k: v if k == "mask" else v.masked_fill(values["mask"] == 0, garbage) for k, v in values.items()}
    batch = make(**values)
    out = get_objective(name, aggregation=aggregation, **ALL_INPUTS)(batch)
    out.loss.backward()
    assert out.loss.detach().item() == 0.0
    assert batch.logprobs.grad is not None
    assert torch.equal(batch.logprobs.grad, torch.zeros(B, T, dtype=torch.float64))
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize(
    ("rows", "cols", "named"),
    [(0, T, "B=0 (sequences)"), (B, 0, "T=0 (completion tokens)"), (0, 0, "B=0 (sequences) and T=0")],
)
def test_an_empty_batch_is_refused_naming_the_empty_dimension(rows: int, cols: int, named: str) -> None:
    """Not torch's "max(): Expected reduction dim" from inside an objective: PolicyBatch, which every objective takes,
    says which dimension is empty."""
    values = {k: v[:rows, :cols] if v.dim() == 2 else v[:rows] for k, v in tensors().items()}
    with pytest.raises(
        ValueError, match=rf"the batch is empty: logprobs has shape \({rows}, {cols}\), {re.escape(named)}"
    ):
        make(**values)


# -- hyper-parameters --------------------------------------------------------------------------------------
def objectives_with(param: str) -> list[str]:
    return [n for n in OBJECTIVES if param in objective_class(n).hyperparameters()]


@pytest.mark.parametrize(
    ("name", "kwargs", "pattern"),
    [
        *[(n, {"clip_low": -1}, r"clip_low must be .*>= 0.*got -1") for n in objectives_with("clip_low")],
        *[(n, {"clip_c": 0.5}, r"clip_c must be .*> 1.*got 0.5") for n in objectives_with("clip_c")],
        *[
            (n, {"aggregation": "bogus"}, r"aggregation must be one of \['token-mean', .*\]; got 'bogus'")
            for n in OBJECTIVES
        ],
        *[
            (n, {"kl_estimator": "k9"}, r"kl_estimator must be one of \['k1', 'k2', 'k3'\]; got 'k9'")
            for n in OBJECTIVES
        ],
        *[(n, {"bogus": 1}, rf"objective '{n}' does not take 'bogus'; it accepts: .*beta") for n in OBJECTIVES],
        ("grpo", {"beta": -0.1}, r"beta must be .*>= 0.*got -0.1"),
        ("grpo", {"max_length": 0}, r"max_length must be a positive int.*got 0"),
        ("grpo", {"on_nonfinite": "ignore"}, r"on_nonfinite must be one of \['raise', 'mask'\]; got 'ignore'"),
        ("grpo", {"rollout_is": "tokens"}, r"rollout_is must be one of .*got 'tokens'"),
        ("sapo", {"tau_pos": 0.0}, r"tau_pos must be .*> 0.*got 0.0"),
    ],
)
def test_invalid_hyperparameters_raise(name: str, kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        get_objective(name, **kwargs)


def test_unknown_objective_lists_the_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown objective 'ppo'") as info:
        get_objective("ppo")
    for name in OBJECTIVES:
        assert re.search(rf"\b{name}\b", str(info.value)), name


@pytest.mark.parametrize(
    ("kwargs", "drop", "pattern"),
    [
        ({"beta": 0.1}, "ref_logprobs", r"beta=0.1 needs batch.ref_logprobs"),
        ({"rollout_is": "token"}, "rollout_logprobs", r"needs? batch.rollout_logprobs"),
        ({"rollout_mask": "sequence"}, "rollout_logprobs", r"needs? batch.rollout_logprobs"),
        ({"entropy_coef": 0.01}, "entropies", r"entropy_coef=0.01 needs batch.entropies"),
    ],
)
@pytest.mark.parametrize("name", ["grpo", "gspo", "sapo"])
def test_missing_optional_input_raises(name: str, kwargs: dict[str, Any], drop: str, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        get_objective(name, **kwargs)(make(**{drop: None}))


@pytest.mark.parametrize("normaliser", ["num_tokens", "num_sequences"])
@pytest.mark.parametrize("value", [0, -2.0, INF, NAN, torch.tensor(0.0), torch.ones(2), "4", True])
def test_invalid_normalisers_raise(normaliser: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{normaliser} must be"):
        get_objective("grpo")(make(), **{normaliser: value})  # type: ignore[arg-type]
