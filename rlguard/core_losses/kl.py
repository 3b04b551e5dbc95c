"""Per-token estimators of KL(pi || pi_ref) from samples of the policy (J. Schulman, "Approximating KL
divergence", 2020), and DeepSeek-V3.2's importance-weighted correction for samples drawn from pi_old.

With ``d = log pi_ref(y) - log pi(y)`` and ``y ~ pi``:

- ``k1 = -d``                 unbiased, high variance, can be negative
- ``k2 = d^2 / 2``            biased, low variance
- ``k3 = exp(d) - d - 1``     unbiased and non-negative (GRPO, arXiv 2402.03300 eq. 4)

The samples of an off-policy step come from pi_old, not pi. DeepSeek-V3.2 (arXiv 2512.02556, sec. 3.1)
re-weights k3 by ``pi / pi_old`` so that both the estimate and its gradient are unbiased; the weight is *not*
detached, since ``grad E_old[(pi/pi_old) k3] = grad KL(pi || pi_ref)`` needs the gradient through it.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from rlguard.core_losses.ratios import LOG_RATIO_CLAMP

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)


def kl_estimate(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    estimator: KLEstimator = "k3",
    *,
    old_logprobs: Tensor | None = None,
) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate. All tensors ``(B, T)``; returns ``(B, T)``.

    Args:
        logprobs: log pi of the sampled tokens (differentiable).
        ref_logprobs: log pi_ref of the same tokens.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.
        old_logprobs: if given, multiply by ``pi / pi_old`` (DeepSeek-V3.2's unbiased off-policy correction).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {list(KL_ESTIMATORS)}; got {estimator!r}.")
    d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        kl = -d
    elif estimator == "k2":
        kl = 0.5 * d.square()
    else:
        kl = k3_from_log_ratio(d)
    if old_logprobs is not None:
        kl = kl * torch.exp((logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return kl


def k3_from_log_ratio(log_ratio: Tensor) -> Tensor:
    """``k3 = r - 1 - log r`` with ``log r = log p - log q``: KL(q || p) for samples of q. ``(B, T)``."""
    return torch.expm1(log_ratio) - log_ratio
