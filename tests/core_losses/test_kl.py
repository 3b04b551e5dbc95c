"""KL estimators: exact expectations by enumerating a small categorical distribution."""

from __future__ import annotations

import pytest
import torch

from rlguard.core_losses import kl_estimate

V = 7


def _dists(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, V, generator=g, dtype=torch.float64)
    logp, logref, logold = torch.log_softmax(logits, dim=-1)
    return logp, logref, logold


def test_k1_and_k3_are_unbiased_under_pi() -> None:
    logp, logref, _ = _dists(0)
    p = logp.exp()
    exact = (p * (logp - logref)).sum()  # KL(pi || ref) = sum_y pi(y) log(pi(y)/ref(y))
    for est in ("k1", "k3"):
        expected_value = (p * kl_estimate(logp, logref, est)).sum()
        torch.testing.assert_close(expected_value, exact, rtol=1e-12, atol=0)


def test_k2_is_half_squared_log_ratio_and_k3_is_nonnegative() -> None:
    logp, logref, _ = _dists(1)
    torch.testing.assert_close(kl_estimate(logp, logref, "k2"), 0.5 * (logp - logref) ** 2, rtol=0, atol=0)
    assert bool((kl_estimate(logp, logref, "k3") >= 0).all())


def test_k3_is_biased_off_policy_and_the_deepseek_correction_removes_the_bias() -> None:
    """Samples from pi_old: E_old[k3] != KL(pi||ref), but E_old[(pi/pi_old) k3] == KL(pi||ref), gradient too."""
    logits = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    _, logref, logold = _dists(2)
    old = logold.exp()

    def kl_exact(lg: torch.Tensor) -> torch.Tensor:
        lp = torch.log_softmax(lg, -1)
        return (lp.exp() * (lp - logref)).sum()

    lp = torch.log_softmax(logits, -1)
    corrected = (old * kl_estimate(lp, logref, "k3", old_logprobs=logold)).sum()
    naive = (old * kl_estimate(lp, logref, "k3")).sum()
    exact = kl_exact(logits)
    torch.testing.assert_close(corrected, exact, rtol=1e-12, atol=0)
    assert abs(float(naive.detach()) - float(exact.detach())) > 1e-3  # the bias the correction removes
    (g_corr,) = torch.autograd.grad(corrected, logits)
    (g_exact,) = torch.autograd.grad(kl_exact(logits), logits)
    torch.testing.assert_close(g_corr, g_exact, rtol=1e-10, atol=1e-12)


def test_unknown_estimator_names_the_choices() -> None:
    logp, logref, _ = _dists(3)
    with pytest.raises(ValueError, match=r"kl_estimator must be one of \['k1', 'k2', 'k3'\]; got 'k4'"):
        kl_estimate(logp, logref, "k4")  # type: ignore[arg-type]
