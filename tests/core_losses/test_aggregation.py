"""Aggregation modes on a hand-computed example, and the normaliser rules."""

from __future__ import annotations

import pytest
import torch

from rlguard.core_losses import aggregate, default_normalisers

# two sequences: lengths 3 and 1; the third row is empty padding.
VALUES = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0], [100.0] * 4], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", {}, ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum", {}, (1 + 2 + 3 + 4) / 2),
        ("seq-mean-token-sum-norm", {}, (1 + 2 + 3 + 4) / (2 * 4)),  # max_length defaults to T = 4
        ("seq-mean-token-sum-norm", {"max_length": 10}, (1 + 2 + 3 + 4) / (2 * 10)),
        ("token-mean", {"num_tokens": 8}, (1 + 2 + 3 + 4) / 8),
        ("seq-mean-token-mean", {"num_sequences": 5}, ((1 + 2 + 3) / 3 + 4) / 5),
        ("seq-mean-token-sum", {"num_sequences": 2.5}, (1 + 2 + 3 + 4) / 2.5),
    ],
)
def test_modes_by_hand(mode: str, kwargs: dict[str, float], expected: float) -> None:
    out = aggregate(VALUES, MASK, mode, **kwargs)  # type: ignore[arg-type]
    assert float(out) == pytest.approx(expected, rel=1e-15)


def test_count_mask_sets_the_normalisers_but_not_the_sum() -> None:
    dropped = MASK.clone()
    dropped[0, 1] = 0  # a correction removed the token with value 2
    out = aggregate(VALUES, dropped, "seq-mean-token-mean", count_mask=MASK)
    assert float(out) == pytest.approx(((1 + 3) / 3 + 4) / 2, rel=1e-15)


def test_default_normalisers_count_tokens_and_nonempty_rows() -> None:
    tokens, seqs = default_normalisers(MASK)
    assert (float(tokens), float(seqs)) == (4.0, 2.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_all_masked_gives_zero_with_zero_gradient(mode: str) -> None:
    values = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    out = aggregate(values, torch.zeros(2, 3, dtype=torch.float64), mode)  # type: ignore[arg-type]
    out.backward()
    assert float(out.detach()) == 0.0
    assert values.grad is not None and bool((values.grad == 0).all())


def test_unknown_mode_lists_the_modes() -> None:
    with pytest.raises(ValueError, match=r"aggregation must be one of .*'token-mean'.*got 'mean'"):
        aggregate(VALUES, MASK, "mean")  # type: ignore[arg-type]
