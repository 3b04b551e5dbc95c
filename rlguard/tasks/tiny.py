"""A tiny verifiable task (single-digit addition), a character tokenizer and a GRU language model.

Everything is built from code with a seed: nothing is downloaded. ``demo_batch`` produces one realistic
off-policy GRPO batch: completions sampled from pi_old, the policy after one update, a frozen reference, and an
"inference engine" that computes the same model's log-probs from bfloat16 logits, as engines in lower
precision do, so that the rollout-mismatch statistics are not zero.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlguard.core_losses import PolicyBatch, group_advantages, logprobs_from_logits


class CharTokenizer:
    """Characters ``0-9 + =`` plus ``<pad>``, ``<bos>``, ``<eos>``."""

    PAD, BOS, EOS = 0, 1, 2
    _CHARS = "0123456789+="

    def __init__(self) -> None:
        self.vocab = ["<pad>", "<bos>", "<eos>", *self._CHARS]
        self._ids = {c: i for i, c in enumerate(self.vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Characters to ids; unknown characters raise ``ValueError``."""
        try:
            return [self._ids[c] for c in text]
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} is not in the vocabulary {self._CHARS!r}") from None

    def decode(self, ids: list[int]) -> str:
        """Ids to text, stopping at ``<eos>`` and skipping ``<pad>``/``<bos>``."""
        out = []
        for i in ids:
            if i == self.EOS:
                break
            if i > self.EOS:
                out.append(self.vocab[i])
        return "".join(out)


@dataclass(frozen=True)
class AdditionTask:
    """Prompts ``"a+b="`` with single digits.

    Reward 1 for the exact sum; otherwise partial credit ``0.5 * (share of the answer's digits that occur in
    the completion)``, so that even a random policy sees reward differences within a group.
    """

    def prompts(self, n: int, seed: int) -> list[tuple[str, int]]:
        """``n`` prompts with their answers."""
        rng = random.Random(seed)
        return [(f"{a}+{b}=", a + b) for a, b in ((rng.randrange(10), rng.randrange(10)) for _ in range(n))]

    def reward(self, completion: str, answer: int) -> float:
        """1.0 when the completion is exactly the answer, else the partial credit in ``[0, 0.5]``."""
        target = str(answer)
        if completion == target:
            return 1.0
        return 0.5 * len(set(target) & set(completion)) / len(set(target))


class TinyLM(nn.Module):
    """Embedding, one GRU layer, linear head. ``forward``: ids ``(B, S)`` -> logits ``(B, S, V)``."""

    def __init__(self, vocab_size: int, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, ids: Tensor) -> Tensor:
        h, _ = self.rnn(self.embed(ids))
        return self.head(h)  # type: ignore[no-any-return]


def make_tiny_model(seed: int = 0, hidden: int = 32) -> TinyLM:
    """A randomly initialised :class:`TinyLM` for :class:`CharTokenizer`, reproducible from ``seed``."""
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        return TinyLM(CharTokenizer().vocab_size, hidden)


@dataclass(frozen=True)
class Rollouts:
    """Sampled completions of a group of prompts.

    Attributes:
        input_ids: ``(B, P + T)`` prompt then completion ids, padded with ``<pad>``.
        prompt_length: P, the same for every prompt of the task.
        mask: ``(B, T)`` 1 for completion tokens up to and including ``<eos>``.
        rewards: ``(B,)``.
        group_ids: ``(B,)`` prompt index of each completion.
        completions: decoded completion texts.
    """

    input_ids: Tensor
    prompt_length: int
    mask: Tensor
    rewards: Tensor
    group_ids: Tensor
    completions: list[str]


@torch.no_grad()
def sample_rollouts(
    model: TinyLM, *, num_prompts: int = 4, group_size: int = 4, max_new_tokens: int = 4, seed: int = 0
) -> Rollouts:
    """Sample ``group_size`` completions per prompt from ``model`` (temperature 1)."""
    tok, task = CharTokenizer(), AdditionTask()
    prompts = task.prompts(num_prompts, seed)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([[tok.BOS, *tok.encode(p)] for p, _ in prompts for _ in range(group_size)])
    prompt_length = ids.shape[1]
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    mask = torch.zeros(ids.shape[0], max_new_tokens)
    for t in range(max_new_tokens):
        probs = torch.softmax(model(ids)[:, -1].float(), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, tok.PAD), nxt)
        mask[:, t] = (~done).float()
        done = done | (nxt == tok.EOS)
        ids = torch.cat([ids, nxt.unsqueeze(-1)], dim=1)
    completions = [tok.decode(row[prompt_length:].tolist()) for row in ids]
    answers = [a for _, a in prompts for _ in range(group_size)]
    rewards = torch.tensor([task.reward(c, a) for c, a in zip(completions, answers, strict=True)])
    group_ids = torch.arange(num_prompts).repeat_interleave(group_size)
    return Rollouts(ids, prompt_length, mask, rewards, group_ids, completions)


def sequence_logprobs(
    model: TinyLM, rollouts: Rollouts, *, logits_dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor]:
    """Log-probs and entropies ``(B, T)`` of the sampled completion tokens under ``model``.

    ``logits_dtype`` rounds the logits first (e.g. ``torch.bfloat16`` imitates a low-precision engine).
    """
    logits = model(rollouts.input_ids[:, :-1])[:, rollouts.prompt_length - 1 :]  # (B, T, V)
    if logits_dtype is not None:
        logits = logits.to(logits_dtype)
    logprobs, entropies = logprobs_from_logits(
        logits, rollouts.input_ids[:, rollouts.prompt_length :], compute_entropy=True
    )
    assert entropies is not None
    return logprobs, entropies


def demo_batch(
    seed: int = 0, *, num_prompts: int = 4, group_size: int = 4, drift: float = 0.05
) -> tuple[PolicyBatch, Rollouts]:
    """One off-policy batch of the addition task, ready for any objective.

    pi_old samples; the current policy is pi_old with Gaussian noise of scale ``drift`` added to every weight
    (ratios spread around 1 in both directions, as after a few optimizer steps, so that clipping acts); the
    reference is pi_old; the engine's log-probs are pi_old's computed from bf16 logits.
    """
    model = make_tiny_model(seed)
    rollouts = sample_rollouts(model, num_prompts=num_prompts, group_size=group_size, seed=seed)
    adv = group_advantages(rollouts.rewards, rollouts.group_ids).advantages
    with torch.no_grad():
        old, _ = sequence_logprobs(model, rollouts)
        engine, _ = sequence_logprobs(model, rollouts, logits_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen), alpha=drift)
    logprobs, entropies = sequence_logprobs(model, rollouts)
    batch = PolicyBatch(
        logprobs=logprobs,
        advantages=adv,
        mask=rollouts.mask,
        old_logprobs=old,
        ref_logprobs=old,
        rollout_logprobs=engine,
        entropies=entropies,
    )
    return batch, rollouts
