"""Seeded float64 batches for the objectives' tests (``tests/core_losses/test_objectives.py`` and
``test_objectives_union.py``), and the comparisons they share."""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from rlguard.core_losses import PolicyBatch

RTOL = 1e-6  # reference comparisons
ATOL = 1e-12
_Field = TypeVar("_Field", torch.Tensor, None)

ROW_SCALES = (1e-4, 0.05, 0.3, 1.5)
ROLLOUT_OFFSETS = ((0.0, 0.9), (0.05, -0.6))  # (kept, dropped) offsets of log rho


# ---------------------------------------------------------------- data
def make_batch(seed: int, T: int = 6, *, token_adv: bool = False, on_policy: bool = False) -> dict[str, Any]:
    """Raw float64 tensors (all optional fields filled); ``logprobs`` is a leaf requiring grad.

    Rows: 0 one token at a random position, 1 one token at position 0, 2 full, 3 empty, 4 zero advantage
    (sequence advantages), then one row for each (log-ratio scale, direction, advantage sign) in a seeded
    order. ``direction = +1`` pushes the log-ratio towards sign(A) (the side where the clip binds), ``-1``
    away from it (where the unclipped branch is taken, and where the dual clip binds for A < 0).
    """
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def pick(values: tuple[float, ...], n: int) -> list[float]:
        return [values[int(k)] for k in torch.randint(len(values), (n,), generator=g)]

    # (scale, direction, sign, engine offset): for each scale and each sign of direction·sign (the sign of
    # the log-ratio's drift), one row has an engine offset that rollout masks keep and one an offset that
    # they drop, in a seeded order
    combos = []
    for sc in ROW_SCALES:
        for drift in (1.0, -1.0):
            keep_off, drop_off = ROLLOUT_OFFSETS[drift < 0]
            offsets = (keep_off, drop_off) if bool(torch.rand(1, generator=g) < 0.5) else (drop_off, keep_off)
            combos += [(sc, sg * drift, sg, off) for sg, off in zip((1.0, -1.0), offsets, strict=True)]
    combos = [combos[int(k)] for k in torch.randperm(len(combos), generator=g)]
    head = list(
        zip(pick(ROW_SCALES, 5), pick((1.0, -1.0), 5), pick((1.0, -1.0), 5), pick((-0.3, 0.0, 0.3), 5), strict=True)
    )
    rows = head + combos
    B = len(rows)
    scale = torch.tensor([r[0] for r in rows], dtype=torch.float64)[:, None]  # (B, 1)
    direction = torch.tensor([r[1] for r in rows], dtype=torch.float64)[:, None]
    sign = torch.tensor([r[2] for r in rows], dtype=torch.float64)[:, None]

    mask = (rand(B, T) < 0.7).double()
    for i in range(5, B):  # the remaining rows have at least two tokens
        if mask[i].sum() < 2:
            mask[i, :2] = 1.0
    mask[0] = 0.0
    mask[0, int(torch.randint(T, (1,), generator=g))] = 1.0
    mask[1] = 0.0
    mask[1, 0] = 1.0
    mask[2] = 1.0
    mask[3] = 0.0

    logprobs = -(0.05 + 3.0 * rand(B, T))
    token_factor = torch.tensor([0.3, 1.0, 2.0], dtype=torch.float64)[torch.randint(3, (B, T), generator=g)]
    log_ratio = scale * (0.8 * direction * sign + token_factor * randn(B, T))
    old = logprobs - log_ratio
    # log-probabilities must be <= 0 for the objectives that read probabilities (DPPO): shift the rows where
    # old > 0 down, which keeps every log-ratio
    shift = (torch.maximum(logprobs.amax(-1, keepdim=True), old.amax(-1, keepdim=True)) + 0.01).clamp(min=0.0)
    logprobs, old = logprobs - shift, old - shift

    if token_adv:
        advantages = sign * (0.5 + 0.8 * randn(B, T))
    else:
        advantages = sign[:, 0] * (0.3 + randn(B).abs())
        advantages[4] = 0.0  # a group whose rewards were all equal
    ref = logprobs + 0.3 * randn(B, T)
    # engine mismatch log rho = old - rollout: a per-row offset plus token noise, so that token, sequence and
    # geometric masks keep some rows and drop others, and the IS cap binds on some tokens
    row_offset = torch.tensor([r[3] for r in rows], dtype=torch.float64)[:, None]
    log_rho = row_offset + 0.15 * randn(B, T)
    behaviour = logprobs if on_policy else old
    rollout = behaviour - log_rho
    entropies = 3.0 * rand(B, T)
    return {
        "logprobs": logprobs.clone().requires_grad_(True),
        "advantages": advantages,
        "mask": mask,
        "old_logprobs": None if on_policy else old,
        "ref_logprobs": ref,
        "rollout_logprobs": rollout,
        "entropies": entropies,
    }


def policy_batch(d: dict[str, Any], rows: slice | None = None) -> PolicyBatch:
    def take(x: _Field) -> _Field:
        return x if x is None or rows is None else x[rows]

    return PolicyBatch(
        logprobs=take(d["logprobs"]),
        advantages=take(d["advantages"]),
        mask=take(d["mask"]),
        old_logprobs=take(d["old_logprobs"]),
        ref_logprobs=take(d["ref_logprobs"]),
        rollout_logprobs=take(d["rollout_logprobs"]),
        entropies=take(d["entropies"]),
    )


def grad_of(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, leaf)
    return g


def assert_close(got: torch.Tensor, expected: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> None:
    torch.testing.assert_close(got.detach(), expected.detach(), rtol=rtol, atol=atol)
