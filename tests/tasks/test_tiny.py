"""The embedded tiny task: tokenizer round trip, rewards, sampling shapes and the demo batch."""

from __future__ import annotations

import pytest
import torch

from rlguard.tasks import AdditionTask, CharTokenizer, demo_batch, make_tiny_model, sample_rollouts


def test_tokenizer_round_trip_and_unknown_character() -> None:
    tok = CharTokenizer()
    assert tok.decode(tok.encode("7+5=")) == "7+5="
    assert tok.decode([*tok.encode("12"), tok.EOS, *tok.encode("99")]) == "12"
    with pytest.raises(ValueError, match="'x' is not in the vocabulary"):
        tok.encode("x")


def test_reward_exact_and_partial_credit() -> None:
    task = AdditionTask()
    assert task.reward("12", 12) == 1.0
    assert task.reward("21", 12) == 0.5  # both digits present, wrong order
    assert task.reward("1", 12) == 0.25
    assert task.reward("", 12) == 0.0


def test_rollout_mask_covers_tokens_up_to_eos() -> None:
    r = sample_rollouts(make_tiny_model(0), num_prompts=3, group_size=2, max_new_tokens=5, seed=1)
    completion_ids = r.input_ids[:, r.prompt_length :]
    tok = CharTokenizer()
    for row, m in zip(completion_ids.tolist(), r.mask, strict=True):
        n = row.index(tok.EOS) + 1 if tok.EOS in row else len(row)
        assert m.tolist() == [1.0] * n + [0.0] * (len(row) - n)
    assert r.group_ids.tolist() == [0, 0, 1, 1, 2, 2]


def test_demo_batch_is_reproducible_and_off_policy() -> None:
    a, _ = demo_batch(5)
    b, _ = demo_batch(5)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=0)
    assert a.old_logprobs is not None and a.rollout_logprobs is not None
    assert float((a.logprobs.detach() - a.old_logprobs).abs().max()) > 0.05  # ratios differ from 1
    assert float((a.old_logprobs - a.rollout_logprobs).abs().max()) > 0  # bf16 engine mismatch
    assert a.logprobs.requires_grad
