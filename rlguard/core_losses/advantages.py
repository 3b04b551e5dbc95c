"""Group-relative advantages from scalar rewards (one per completion) and group ids (one per prompt)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

AdvantageScale = Literal["std", "none", "rloo"]
ADVANTAGE_SCALES: tuple[str, ...] = get_args(AdvantageScale)


@dataclass(frozen=True)
class GroupAdvantages:
    """Result of :func:`group_advantages`.

    Attributes:
        advantages: ``(B,)`` one advantage per completion.
        zero_std: ``(B,)`` bool, True where the completion's group has all-equal rewards (no learning signal).
        frac_zero_std_groups: 0-dim, fraction of groups with all-equal rewards.
        frac_zero_std_solved: 0-dim, fraction of groups with all-equal rewards at the maximum reward seen
            ("too easy"); the rest of the zero-std groups sit lower ("too hard" when all fail).
    """

    advantages: Tensor
    zero_std: Tensor
    frac_zero_std_groups: Tensor
    frac_zero_std_solved: Tensor


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    scale: AdvantageScale = "std",
    eps: float = 1e-6,
) -> GroupAdvantages:
    """Group-relative advantages. rewards ``(B,)`` float, group_ids ``(B,)`` int (equal for one prompt).

    - ``"std"``: GRPO, ``(r - mean_g) / (std_g + eps)`` with the unbiased std (DeepSeekMath, arXiv 2402.03300,
      sec. 4.1.2; as TRL and verl compute it).
    - ``"none"``: Dr. GRPO, ``r - mean_g`` (arXiv 2503.20783, sec. 3.1: the std divides out question difficulty).
    - ``"rloo"``: RLOO, ``r - mean of the other completions of the group`` = ``G/(G-1) (r - mean_g)``
      (Ahmadian et al., arXiv 2402.14740).

    Groups of one completion and groups whose rewards are all equal get exactly 0.
    """
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0 (it keeps (r - mean) / (std + eps) finite); got {eps!r}.")
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {list(ADVANTAGE_SCALES)}; got {scale!r}.")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape (B,); got {tuple(rewards.shape)} and {tuple(group_ids.shape)}."
        )
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a floating-point tensor; got {rewards.dtype}.")
    if group_ids.is_floating_point():
        raise ValueError(f"group_ids must be an integer tensor (one id per prompt); got {group_ids.dtype}.")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError(
            f"rewards contains {int((~torch.isfinite(rewards)).sum())} NaN/Inf values; fix the reward function."
        )
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,) dense group index
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros_like(count).index_add_(0, inverse, r)
    mean = total / count  # (G,)
    centred = r - mean[inverse]  # (B,)
    sq = torch.zeros_like(count).index_add_(0, inverse, centred.square())
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # (G,) unbiased
    g_max = torch.full_like(count, float("-inf")).scatter_reduce_(0, inverse, r, reduce="amax")
    g_min = torch.full_like(count, float("inf")).scatter_reduce_(0, inverse, r, reduce="amin")
    zero_std_group = g_max == g_min  # (G,)
    n = count[inverse]
    if scale == "std":
        adv = centred / (std[inverse] + eps)
    elif scale == "none":
        adv = centred
    else:
        adv = centred * n / (n - 1).clamp(min=1)
    # all-equal groups carry no signal: exactly 0, not the rounding error of the mean divided by eps
    adv = torch.where((n > 1) & ~zero_std_group[inverse], adv, torch.zeros_like(adv))
    solved = zero_std_group & (g_max == r.max()) if r.numel() else zero_std_group
    return GroupAdvantages(
        advantages=adv,
        zero_std=zero_std_group[inverse],
        frac_zero_std_groups=zero_std_group.to(r.dtype).mean() if n_groups else r.new_zeros(()),
        frac_zero_std_solved=solved.to(r.dtype).mean() if n_groups else r.new_zeros(()),
    )
