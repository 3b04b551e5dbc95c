"""The task: reverse a 32-symbol string and shift every symbol by one place in a 60-symbol alphabet.

A prompt is ``<bos> s_1 .. s_n <sep>``; the answer is ``shift(s_n) .. shift(s_1) <eos>`` with ``shift`` the
next symbol of the alphabet (cyclically), so the completion is ``n + 1`` tokens (33 for ``n = 32``). The verifier
gives partial credit by position (:meth:`ReverseShiftTask.reward`). The vocabulary is 4 special tokens and 60
symbols (64 ids). Everything is built from a seed; nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PAD, BOS, SEP, EOS = 0, 1, 2, 3
NUM_SPECIAL = 4


@dataclass(frozen=True)
class ReverseShiftTask:
    """Prompts of ``length`` random symbols from an alphabet of ``alphabet`` symbols (ids ``4 .. 4 + alphabet``).

    Attributes:
        length: symbols per prompt (the answer has as many, then ``<eos>``).
        alphabet: number of symbols; the vocabulary is ``alphabet + 4``.
    """

    length: int = 32
    alphabet: int = 60

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"length must be >= 1; got {self.length}.")
        if self.alphabet < 2:
            raise ValueError(f"alphabet must be >= 2 symbols; got {self.alphabet}.")

    @property
    def vocab_size(self) -> int:
        """Special tokens plus symbols."""
        return NUM_SPECIAL + self.alphabet

    @property
    def prompt_length(self) -> int:
        """``<bos>``, the symbols, ``<sep>``."""
        return self.length + 2

    @property
    def max_new_tokens(self) -> int:
        """The answer's symbols and ``<eos>``: the generation budget."""
        return self.length + 1

    def prompts(self, n: int, seed: int) -> Tensor:
        """``n`` prompts ``(n, length + 2)`` as ids, reproducible from ``seed``."""
        gen = torch.Generator().manual_seed(seed)
        symbols = torch.randint(NUM_SPECIAL, self.vocab_size, (n, self.length), generator=gen)
        return torch.cat([torch.full((n, 1), BOS), symbols, torch.full((n, 1), SEP)], dim=1)

    def answers(self, prompts: Tensor) -> Tensor:
        """The correct completions ``(n, length + 1)`` of ``prompts`` ``(n, length + 2)``, ending in ``<eos>``."""
        symbols = prompts[:, 1:-1].flip(-1) - NUM_SPECIAL  # (n, length), 0-based
        shifted = (symbols + 1) % self.alphabet + NUM_SPECIAL
        return torch.cat([shifted, torch.full((prompts.shape[0], 1), EOS)], dim=1)

    def reward(self, completion: Tensor, answer: Tensor) -> float:
        """Partial credit: matching positions over ``max(len(completion), len(answer))``, both cut at ``<eos>``.

        ``completion`` and ``answer`` are 1-D id tensors; ``<eos>`` and what follows it do not count, so the exact
        answer scores 1.0, a missing or extra symbol costs its share, and an empty completion scores 0.
        """
        c, a = _before_eos(completion), _before_eos(answer)
        width = max(len(c), len(a))
        if width == 0:
            return 1.0
        k = min(len(c), len(a))
        return float((c[:k] == a[:k]).sum()) / width

    def rewards(self, completions: Tensor, answers: Tensor) -> Tensor:
        """:meth:`reward` of each row: completions ``(B, T)``, answers ``(B, length + 1)`` -> ``(B,)``."""
        return torch.tensor([self.reward(c, a) for c, a in zip(completions, answers, strict=True)])


def _before_eos(ids: Tensor) -> Tensor:
    """The ids before the first ``<eos>`` (all of them if there is none)."""
    stops = (ids == EOS).nonzero()
    return ids[: int(stops[0, 0])] if len(stops) else ids
