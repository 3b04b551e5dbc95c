"""objective_from_hidden (objective fused into the LM-head pass) equals the unfused paths: loss, metrics, gradients.

Two references per case: the float64 path through the full logits (``log_softmax(h W^T)`` of the inputs upcast to
float64, the objective on it, autograd), and the unfused chunked path in the inputs' dtype
(``logprobs_from_hidden`` then the objective).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlguard.core_losses import (
    LossOutput,
    PolicyBatch,
    RolloutBatch,
    default_normalisers,
    get_objective,
    list_objectives,
    logprobs_from_hidden,
    objective_from_hidden,
)
from rlguard.core_losses.fused import _chunk_bounds
from rlguard.core_losses.objective import Objective

B, T, H, V = 4, 9, 16, 53
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
#: loss and metrics: accumulation-order error of the accumulation dtype (float32 for the half types, whose values
#: upcast exactly). Gradients: that, plus one rounding to the input dtype (2 ulps).
TOL = {torch.float64: 1e-11, torch.float32: 2e-5, torch.bfloat16: 2e-5, torch.float16: 2e-5}


def _grad_tol(dtype: torch.dtype) -> float:
    return max(TOL[dtype], 2 * torch.finfo(dtype).eps)


def _case(dtype: torch.dtype, seed: int = 0, *, ref: bool = True, rollout: bool = False) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    weight = (0.5 * torch.randn(V, H, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.25).float()
    mask[:, 0] = 1
    mask[1, 5:] = 0  # a shorter sequence
    with torch.no_grad():
        lp, _ = logprobs_from_hidden(hidden.double(), weight.double(), targets)
    old = (lp + 0.15 * torch.randn(B, T, generator=g, dtype=torch.float64)).float()
    batch = RolloutBatch(
        advantages=torch.randn(B, generator=g),
        mask=mask,
        old_logprobs=old,
        ref_logprobs=(lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).float() if ref else None,
        rollout_logprobs=(old + 0.1 * torch.randn(B, T, generator=g)) if rollout else None,
    )
    return {"hidden": hidden, "weight": weight, "targets": targets, "batch": batch}


def _policy_batch(batch: RolloutBatch, lp: torch.Tensor, ent: torch.Tensor) -> PolicyBatch:
    to: dict[str, Any] = {"dtype": lp.dtype}
    return PolicyBatch(
        logprobs=lp,
        advantages=batch.advantages.to(**to),
        mask=batch.mask,
        old_logprobs=None if batch.old_logprobs is None else batch.old_logprobs.to(**to),
        ref_logprobs=None if batch.ref_logprobs is None else batch.ref_logprobs.to(**to),
        rollout_logprobs=None if batch.rollout_logprobs is None else batch.rollout_logprobs.to(**to),
        entropies=ent,
    )


def _run(path: str, objective: Objective, case: dict[str, Any], scale: float = 1.0, **kw: Any) -> tuple[Any, ...]:
    """``(loss, metrics, hidden grad, weight grad)`` of one path; grads as float64 in the inputs' rounding."""
    hidden, weight, targets, batch = case["hidden"], case["weight"], case["targets"], case["batch"]
    if path == "fused":
        out: LossOutput = objective_from_hidden(
            objective, hidden, weight, targets, batch, chunk_size=kw.pop("chunk_size", 5), **kw
        )
    elif path == "unfused":
        lp, ent = logprobs_from_hidden(hidden, weight, targets, chunk_size=5)
        assert ent is not None
        out = objective(_policy_batch(batch, lp, ent), **kw)
    else:  # float64 through the full logits
        h64, w64 = hidden.double(), weight.double()
        logp = torch.log_softmax(h64 @ w64.T, dim=-1)  # (B, T, V)
        lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
        out = objective(_policy_batch(batch, lp, ent), **kw)
    (scale * out.loss).backward()
    result = (out.loss.detach().double(), out.metrics, hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    return result


def _assert_same(got: tuple[Any, ...], want: tuple[Any, ...], dtype: torch.dtype) -> None:
    loss, metrics, gh, gw = got
    w_loss, w_metrics, w_gh, w_gw = want
    tol, gtol = TOL[dtype], _grad_tol(dtype)
    torch.testing.assert_close(loss, w_loss, rtol=tol, atol=tol)
    assert set(metrics) == set(w_metrics)
    for key in w_metrics:
        torch.testing.assert_close(metrics[key].double(), w_metrics[key].double(), rtol=tol, atol=tol, msg=key)
    assert gh.dtype == dtype and gw.dtype == dtype
    # compare in the input dtype's rounding of the reference; atol relative to the gradient's scale
    for a, b in ((gh, w_gh), (gw, w_gw)):
        b = b.to(dtype).double()
        torch.testing.assert_close(a.double(), b, rtol=gtol, atol=gtol * float(b.abs().max()))


TERMS = {"plain": {}, "kl+entropy": {"beta": 0.05, "entropy_coef": 0.02}}


#: Clip-Cov and KL-Cov need the whole batch at once: the fused path refuses them (tested below)
WHOLE_BATCH = ("clip_cov", "kl_cov")


@pytest.mark.parametrize("terms", list(TERMS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", [name for name in list_objectives() if name not in WHOLE_BATCH])
def test_every_objective_equals_the_unfused_paths(name: str, dtype: torch.dtype, terms: str) -> None:
    objective = get_objective(name, **TERMS[terms])
    case = _case(dtype, seed=len(name))
    fused = _run("fused", objective, case)
    _assert_same(fused, _run("float64", objective, case), dtype)
    _assert_same(fused, _run("unfused", objective, case), dtype)
    assert fused[2].abs().sum() > 0 and fused[3].abs().sum() > 0  # the case has a gradient to compare


@pytest.mark.parametrize(
    "params",
    [
        {"rollout_is": "sequence", "rollout_mask": "geometric", "rollout_mask_high": 1.01},
        {"rollout_is": "token", "rollout_mask": "token", "rollout_mask_high": 1.1},
        {"off_policy_mask_delta": 0.01},
        {"kl_unbiased": True, "beta": 0.1, "kl_estimator": "k2"},
        {"aggregation": "seq-mean-token-sum-norm", "max_length": 12},
    ],
    ids=lambda p: ",".join(p),
)
@pytest.mark.parametrize("name", ["grpo", "gspo", "cispo"])
def test_rollout_corrections_and_options(name: str, params: dict[str, Any]) -> None:
    objective = get_objective(name, **params)
    case = _case(torch.float64, seed=3, rollout=True)
    fused = _run("fused", objective, case)
    _assert_same(fused, _run("float64", objective, case), torch.float64)
    if "rollout_mask" in params or "off_policy_mask_delta" in params:
        assert 0 < float(fused[1]["masked_frac"]) < 1  # the correction dropped some tokens, not all


@pytest.mark.parametrize("chunk_size", [1, 2, 7, 10, 1000])
@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo", "gmpo"])
def test_chunk_sizes(name: str, chunk_size: int) -> None:
    """Chunks that split sequences (token-local objectives) or hold several whole ones give the same result."""
    objective = get_objective(name, entropy_coef=0.02)
    case = _case(torch.float64, seed=4)
    _assert_same(_run("fused", objective, case, chunk_size=chunk_size), _run("float64", objective, case), torch.float64)


def test_sequence_objectives_chunk_by_whole_sequences() -> None:
    rows = torch.tensor([0, 1, 2, 5, 6, 10, 11, 12, 13, 14, 20])  # T = 5: sequences 0, 0, 0, 1, 1, 2 x 5, 4
    assert _chunk_bounds(rows, 5, 4, token_local=True) == [(0, 4), (4, 8), (8, 11)]
    # whole sequences, as many as fit in 4 rows, at least one
    assert _chunk_bounds(rows, 5, 4, token_local=False) == [(0, 3), (3, 5), (5, 10), (10, 11)]
    assert _chunk_bounds(rows, 5, 100, token_local=False) == [(0, 11)]
    assert _chunk_bounds(rows[:0], 5, 4, token_local=False) == []


@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_gradient_accumulation_and_data_parallel_normalisers(name: str) -> None:
    """Two micro-batches with the step's normalisers add up to the whole batch; halving the normalisers (two
    data-parallel ranks averaging gradients) doubles loss and gradients, exactly as on the unfused path."""
    objective = get_objective(name, beta=0.05, entropy_coef=0.02)
    case = _case(torch.float64, seed=5)
    whole = _run("fused", objective, case)
    num_tokens, num_sequences = default_normalisers(case["batch"].mask)
    parts = []
    for rows in (slice(0, 1), slice(1, B)):
        batch = case["batch"]
        micro = dict(
            case,
            batch=RolloutBatch(
                advantages=batch.advantages[rows],
                mask=batch.mask[rows],
                old_logprobs=batch.old_logprobs[rows],
                ref_logprobs=batch.ref_logprobs[rows],
            ),
        )
        hidden = case["hidden"].detach()[rows].clone().requires_grad_()
        out = objective_from_hidden(
            objective,
            hidden,
            case["weight"],
            case["targets"][rows],
            micro["batch"],
            num_tokens=num_tokens,
            num_sequences=num_sequences,
            chunk_size=3,
        )
        out.loss.backward()
        parts.append((out.loss.detach(), hidden.grad))
    torch.testing.assert_close(parts[0][0] + parts[1][0], whole[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([parts[0][1], parts[1][1]]), whole[2], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(case["weight"].grad, whole[3], rtol=1e-12, atol=1e-14)
    case["weight"].grad = None

    dp: dict[str, Any] = {"num_tokens": num_tokens / 2, "num_sequences": num_sequences / 2}
    fused = _run("fused", objective, case, **dp)
    _assert_same(fused, _run("float64", objective, case, **dp), torch.float64)
    torch.testing.assert_close(fused[0], 2 * whole[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(fused[3], 2 * whole[3], rtol=1e-12, atol=1e-14)


class _CountHeadProducts(TorchDispatchMode):
    """Counts matrix products over the LM head: an operand with the hidden size H and one with the vocabulary V."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_, torch.ops.aten.bmm):
            dims = [set(a.shape) for a in args if isinstance(a, torch.Tensor)]
            self.count += any(H in d for d in dims) and any(V in d for d in dims)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["grpo", "gspo"])
def test_no_pass_over_the_vocabulary_in_backward(name: str) -> None:
    """Three matrix products per chunk in forward (logits, hidden and weight gradients), none in backward."""
    case = _case(torch.float32, seed=6)
    with _CountHeadProducts() as fwd:
        out = objective_from_hidden(
            get_objective(name), case["hidden"], case["weight"], case["targets"], case["batch"], chunk_size=1000
        )
    with _CountHeadProducts() as bwd:
        out.loss.backward()
    assert (fwd.count, bwd.count) == (3, 0)


def test_backward_scales_and_runs_once() -> None:
    objective = get_objective("grpo", entropy_coef=0.02)
    case = _case(torch.float32, seed=7)
    one = _run("fused", objective, case)
    three = _run("fused", objective, case, scale=3.0)
    torch.testing.assert_close(three[2], 3 * one[2], rtol=1e-6, atol=0)
    torch.testing.assert_close(three[3], 3 * one[3], rtol=1e-6, atol=0)
    out = objective_from_hidden(objective, case["hidden"], case["weight"], case["targets"], case["batch"])
    out.loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="can be backpropagated once"):
        out.loss.backward()


def test_no_grad_and_frozen_head() -> None:
    objective = get_objective("dapo")
    case = _case(torch.float32, seed=8)
    want = _run("unfused", objective, case)
    with torch.no_grad():
        out = objective_from_hidden(objective, case["hidden"], case["weight"], case["targets"], case["batch"])
    assert not out.loss.requires_grad
    torch.testing.assert_close(out.loss.double(), want[0], rtol=2e-6, atol=1e-7)
    case["weight"].requires_grad_(False)
    out = objective_from_hidden(objective, case["hidden"], case["weight"], case["targets"], case["batch"])
    out.loss.backward()
    assert case["weight"].grad is None
    torch.testing.assert_close(case["hidden"].grad, want[2], rtol=2e-5, atol=2e-5 * float(want[2].abs().max()))


def test_padding_and_empty_batches() -> None:
    objective = get_objective("gspo")
    case = _case(torch.float64, seed=9)
    mask = case["batch"].mask.clone()
    mask[2] = 0  # an empty sequence
    case["batch"] = RolloutBatch(
        advantages=case["batch"].advantages, mask=mask, old_logprobs=case["batch"].old_logprobs
    )
    fused = _run("fused", objective, case)
    _assert_same(fused, _run("float64", objective, case), torch.float64)
    assert float(fused[2][2].abs().max()) == 0.0
    empty = RolloutBatch(advantages=case["batch"].advantages, mask=torch.zeros(B, T))
    out = objective_from_hidden(objective, case["hidden"], case["weight"], case["targets"], empty)
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and float(case["weight"].grad.abs().max()) == 0.0


def test_nonfinite_inputs() -> None:
    case = _case(torch.float64, seed=10)
    old = case["batch"].old_logprobs.clone()
    old[0, 0] = float("nan")
    case["batch"] = RolloutBatch(advantages=case["batch"].advantages, mask=case["batch"].mask, old_logprobs=old)
    with pytest.raises(ValueError, match="old_logprobs contains 1 NaN value"):
        objective_from_hidden(get_objective("grpo"), case["hidden"], case["weight"], case["targets"], case["batch"])
    objective = get_objective("grpo", on_nonfinite="mask")  # the token leaves sums and default counts alike
    fused = _run("fused", objective, case)
    _assert_same(fused, _run("float64", objective, case), torch.float64)
    assert float(fused[1]["nonfinite"]) == 1.0

    clean = RolloutBatch(advantages=case["batch"].advantages, mask=case["batch"].mask)
    hidden = case["hidden"].detach().clone()
    hidden[3, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"computed from hidden and lm_head_weight are NaN/Inf .* first at \(3, 0\)"):
        objective_from_hidden(get_objective("grpo"), hidden.requires_grad_(), case["weight"], case["targets"], clean)


def test_bad_input() -> None:
    case = _case(torch.float32)
    args = (case["hidden"], case["weight"], case["targets"], case["batch"])
    objective = get_objective("grpo")
    with pytest.raises(ValueError, match="objective must be an rlguard Objective"):
        objective_from_hidden("grpo", *args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch must be a RolloutBatch"):
        objective_from_hidden(objective, *args[:3], PolicyBatch(torch.zeros(B, T), torch.zeros(B), torch.ones(B, T)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lm_head_weight \\(V, H\\) with the same H"):
        objective_from_hidden(objective, args[0], args[1][:, :3], *args[2:])
    with pytest.raises(ValueError, match="target_ids must be integer"):
        objective_from_hidden(objective, args[0], args[1], args[2].float(), args[3])
    with pytest.raises(ValueError, match="chunk_size must be a positive number of rows; got 0"):
        objective_from_hidden(objective, *args, chunk_size=0)
    with pytest.raises(ValueError, match="num_tokens must be positive"):
        objective_from_hidden(objective, *args, num_tokens=0)
    short = RolloutBatch(advantages=torch.zeros(B), mask=torch.ones(B, T - 1))
    with pytest.raises(ValueError, match=r"batch.mask must have the \(B, T\) = \(4, 9\) of hidden; got \(4, 8\)"):
        objective_from_hidden(objective, *args[:3], short)
    with pytest.raises(ValueError, match=r"old_logprobs must have the shape of mask \(4, 9\); got \(4, 8\)"):
        RolloutBatch(advantages=torch.zeros(B), mask=torch.ones(B, T), old_logprobs=torch.zeros(B, T - 1))
    with pytest.raises(ValueError, match="advantages must have shape"):
        RolloutBatch(advantages=torch.zeros(B + 1), mask=torch.ones(B, T))
    with pytest.raises(ValueError, match=r"beta=0\.1 needs batch\.ref_logprobs"):
        objective_from_hidden(
            get_objective("grpo", beta=0.1), *args[:3], RolloutBatch(torch.zeros(B), torch.ones(B, T))
        )


def test_result_type_and_logprobs() -> None:
    case = _case(torch.float32)
    out = objective_from_hidden(get_objective("sapo"), case["hidden"], case["weight"], case["targets"], case["batch"])
    assert isinstance(out, LossOutput) and out.loss.dim() == 0 and "entropy" in out.metrics
    want_lp, want_ent = logprobs_from_hidden(case["hidden"].detach(), case["weight"].detach(), case["targets"])
    mask = case["batch"].mask
    torch.testing.assert_close(out.logprobs, want_lp * mask, rtol=1e-5, atol=1e-5)
    assert want_ent is not None and not out.logprobs.requires_grad
    torch.testing.assert_close(out.entropies, want_ent * mask, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", WHOLE_BATCH)
def test_batch_coupled_objectives_are_refused(name: str) -> None:
    case = _case(torch.float64, seed=1)
    with pytest.raises(ValueError, match=f"objective '{name}' selects tokens by statistics of the whole batch"):
        objective_from_hidden(get_objective(name), case["hidden"], case["weight"], case["targets"], case["batch"])
