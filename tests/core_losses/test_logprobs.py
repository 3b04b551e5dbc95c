"""logprobs_from_hidden (chunked, recomputing) equals the plain path through full logits."""

from __future__ import annotations

import pytest
import torch

from rlguard.core_losses import PolicyBatch, get_objective, list_objectives
from rlguard.core_losses.logprobs import logprobs_from_hidden, logprobs_from_logits

B, T, H, V = 3, 7, 16, 37


def _inputs(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    weight = (0.5 * torch.randn(V, H, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    return hidden, weight, targets


def _grads(fn, hidden, weight, targets, upcast: bool):
    g = torch.Generator().manual_seed(1)
    w_lp = torch.randn(B, T, generator=g, dtype=torch.float64)
    w_h = torch.randn(B, T, generator=g, dtype=torch.float64)
    h, w = (hidden.float(), weight.float()) if upcast else (hidden, weight)
    lp, ent = fn(h, w, targets)
    (lp.double() * w_lp + ent.double() * w_h).sum().backward()
    out = (lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    return out


def _plain(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lp, ent = logprobs_from_logits(h @ w.T, y, compute_entropy=True)
    assert ent is not None
    return lp, ent


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 21, 1000])
def test_float64_equals_the_plain_path(chunk_size: int) -> None:
    hidden, weight, targets = _inputs(torch.float64)

    def chunked(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp, ent = logprobs_from_hidden(h, w, y, chunk_size=chunk_size)
        assert ent is not None
        return lp, ent

    got = _grads(chunked, hidden, weight, targets, upcast=False)
    want = _grads(_plain, hidden, weight, targets, upcast=False)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [(torch.float32, 2e-5), (torch.bfloat16, 2e-5), (torch.float16, 2e-5)],
)
def test_low_precision_accumulates_in_float32(dtype: torch.dtype, tol: float) -> None:
    """Half-precision inputs give the float32 result of the same (upcast) values; gradients are that result
    rounded to the input dtype."""
    hidden, weight, targets = _inputs(dtype)

    def chunked(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp, ent = logprobs_from_hidden(h, w, y, chunk_size=4)
        assert ent is not None and lp.dtype == torch.float32
        return lp, ent

    lp, ent, gh, gw = _grads(chunked, hidden, weight, targets, upcast=False)
    lp32, ent32, gh32, gw32 = _grads(_plain, hidden, weight, targets, upcast=True)
    torch.testing.assert_close(lp, lp32, rtol=tol, atol=tol)
    torch.testing.assert_close(ent, ent32, rtol=tol, atol=tol)
    assert gh.dtype == dtype and gw.dtype == dtype
    # one rounding to the input dtype (2 ulps) on top of float32 accumulation-order differences
    gtol = max(2 * torch.finfo(dtype).eps, tol)
    torch.testing.assert_close(gh.float(), gh32.to(dtype).float(), rtol=gtol, atol=gtol)
    torch.testing.assert_close(gw.float(), gw32.to(dtype).float(), rtol=gtol, atol=gtol)


@pytest.mark.parametrize("name", list_objectives())
def test_objective_loss_and_gradients_match_through_either_path(name: str) -> None:
    hidden, weight, targets = _inputs(torch.float64, seed=2)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(B, T, generator=g) > 0.2).double()
    mask[:, 0] = 1
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    results = []
    for chunked in (True, False):
        if chunked:
            lp, ent = logprobs_from_hidden(hidden, weight, targets, chunk_size=5)
        else:
            lp, ent = logprobs_from_logits(hidden @ weight.T, targets, compute_entropy=True)
        assert ent is not None
        old = lp.detach() + 0.2 * torch.randn(B, T, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        batch = PolicyBatch(logprobs=lp, advantages=adv, mask=mask, old_logprobs=old, entropies=ent)
        torch.manual_seed(0)  # clip_cov draws tokens at random: the same draw on both paths
        loss = get_objective(name, entropy_coef=0.01).__call__(batch).loss
        loss.backward()
        results.append((loss.detach(), hidden.grad.clone(), weight.grad.clone()))  # type: ignore[union-attr]
        hidden.grad = weight.grad = None
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_without_entropy() -> None:
    hidden, weight, targets = _inputs(torch.float64)
    lp, ent = logprobs_from_hidden(hidden, weight, targets, compute_entropy=False)
    assert ent is None
    lp.sum().backward()
    want = torch.autograd.grad(_plain(hidden, weight, targets)[0].sum(), hidden)[0]
    torch.testing.assert_close(hidden.grad, want, rtol=1e-12, atol=1e-12)


def test_bad_input() -> None:
    hidden, weight, targets = _inputs(torch.float32)
    with pytest.raises(ValueError, match="lm_head_weight \\(V, H\\) with the same H"):
        logprobs_from_hidden(hidden, weight[:, :3], targets)
    with pytest.raises(ValueError, match="target_ids must be integer"):
        logprobs_from_hidden(hidden, weight, targets.float())
    with pytest.raises(ValueError, match="chunk_size must be a positive number of rows; got 0"):
        logprobs_from_hidden(hidden, weight, targets, chunk_size=0)


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [(torch.float32, 1e-5), (torch.bfloat16, 1e-5), (torch.float16, 1e-5)],
)
@pytest.mark.parametrize("name", list_objectives())
def test_objective_loss_and_gradients_across_dtypes(name: str, dtype: torch.dtype, tol: float) -> None:
    """Every objective on the chunked path with ``dtype`` inputs equals the plain path on the same values upcast
    to float32: the loss at float32 tolerance, the gradients to one rounding to ``dtype`` (2 ulps)."""
    hidden, weight, targets = _inputs(dtype, seed=5)
    g = torch.Generator().manual_seed(6)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    mask[:, 0] = 1
    adv = torch.randn(B, generator=g)
    shift = 0.2 * torch.randn(B, T, generator=g)
    objective = get_objective(name, entropy_coef=0.01)
    results = []
    for chunked in (True, False):
        if chunked:
            lp, ent = logprobs_from_hidden(hidden, weight, targets, chunk_size=4)
        else:
            lp, ent = logprobs_from_logits(hidden.float() @ weight.float().T, targets, compute_entropy=True)
        assert ent is not None and lp.dtype == torch.float32
        batch = PolicyBatch(logprobs=lp, advantages=adv, mask=mask, old_logprobs=lp.detach() + shift, entropies=ent)
        torch.manual_seed(0)  # clip_cov draws tokens at random: the same draw on both paths
        loss = objective(batch).loss
        loss.backward()
        results.append((loss.detach(), hidden.grad.clone(), weight.grad.clone()))  # type: ignore[union-attr]
        hidden.grad = weight.grad = None
    (loss, gh, gw), (loss32, gh32, gw32) = results
    torch.testing.assert_close(loss, loss32, rtol=tol, atol=tol)
    assert gh.dtype == gw.dtype == dtype and gh32.abs().sum() > 0
    gtol = max(2 * torch.finfo(dtype).eps, tol)
    torch.testing.assert_close(gh.float(), gh32.to(dtype).float(), rtol=gtol, atol=gtol)
    torch.testing.assert_close(gw.float(), gw32.to(dtype).float(), rtol=gtol, atol=gtol)


@pytest.mark.parametrize("use", ["logprobs", "entropy"])
def test_gradient_of_one_output_alone(use: str) -> None:
    """Backward with only one of the two outputs in the loss (the other gets no gradient at all)."""
    hidden, weight, targets = _inputs(torch.float64)
    grads = []
    for fn in (lambda h, w, y: logprobs_from_hidden(h, w, y, chunk_size=3), _plain):
        lp, ent = fn(hidden, weight, targets)
        assert ent is not None
        (lp if use == "logprobs" else ent).pow(2).sum().backward()
        grads.append((hidden.grad.clone(), weight.grad.clone()))  # type: ignore[union-attr]
        hidden.grad = weight.grad = None
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
