"""``GuardedGRPOConfig(logprobs_from_hidden=True)``: TRL's log-probs and entropies from rlguard's chunked function.

Two references, both computed by other code than the one under test:

- float64 model: the model's own full-logits forward (``fused_lm_head=False``, every logit materialised) divided
  by the temperature, through a plain log-softmax; log-probs, entropies and every parameter's gradient at 1e-10;
- float32 model: TRL's own fused LM head kernel (the same trainer without the flag), through
  ``GuardedGRPOTrainer._compute_loss``: loss, gradients and logged metrics at float32 tolerance.

Every comparison also checks that the flag's path ran and TRL's kernel did not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

import trl.trainer.utils as trl_utils
from transformers import LlamaConfig, LlamaForCausalLM

from rlguard.adapters.trl.logprobs import check_hidden_logprobs_supported, use_hidden_logprobs
from rlguard.core_losses import logprobs_from_logits
from rlguard.tasks.hf import (
    make_tiny_llama,
    save_tiny_llama,
)
from tests.helpers.trl_hidden import TEMPERATURE, B, P, T, policy_inputs, tiny_trainer, token_batch


@pytest.fixture
def no_trl_kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """TRL's chunked log-prob kernel fails if called: the flag's path must not use it."""

    class Refuse:
        @staticmethod
        def apply(*args: Any) -> None:
            raise AssertionError("TRL's fused LM head kernel was called with logprobs_from_hidden=True")

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Refuse)
    yield


def _reference(model: LlamaForCausalLM, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of the completion tokens from the full logits of the model's own forward."""
    logits = model(input_ids=ids, attention_mask=mask, fused_lm_head=False).logits[:, P - 1 : -1]  # (B, T, V)
    logprobs, entropies = logprobs_from_logits(logits / TEMPERATURE, ids[:, P:], compute_entropy=True)
    assert entropies is not None
    keep = mask[:, P:].to(logprobs.dtype)  # TRL's head gives 0 where the label is masked
    return logprobs * keep, entropies * keep


def _weighted_grads(model: torch.nn.Module, logprobs: torch.Tensor, entropies: torch.Tensor) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    w_lp, w_ent = torch.randn(2, *logprobs.shape, generator=g, dtype=logprobs.dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    objective = (w_lp * logprobs + w_ent * entropies).sum()
    return list(torch.autograd.grad(objective, params, allow_unused=True, materialize_grads=True))


@pytest.mark.parametrize("batch_size", [None, 2])
def test_float64_equals_the_full_logits(tmp_path: Path, no_trl_kernel: None, batch_size: int | None) -> None:
    trainer = tiny_trainer(make_tiny_llama(seed=1).double(), tmp_path, logprobs_from_hidden=True)
    model: Any = trainer.model
    ids, mask = token_batch(0)
    logprobs, entropies, aux = trainer._get_per_token_logps_and_entropies(
        model, ids, mask, T, batch_size=batch_size, compute_entropy=True
    )
    assert aux is None and logprobs.dtype == entropies.dtype == torch.float64 and logprobs.shape == (B, T)
    want_lp, want_ent = _reference(model, ids, mask)
    torch.testing.assert_close(logprobs, want_lp, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(entropies, want_ent, rtol=1e-10, atol=1e-12)
    assert (entropies[mask[:, P:].bool()] > 0.1).all()  # a real distribution, not a degenerate one
    got = _weighted_grads(model, logprobs, entropies)
    want = _weighted_grads(model, *_reference(model, ids, mask))
    assert sum(float(w.abs().sum()) for w in want) > 0
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_a_micro_batch_with_no_completion_token_still_backpropagates(tmp_path: Path, no_trl_kernel: None) -> None:
    trainer = tiny_trainer(make_tiny_llama().double(), tmp_path, logprobs_from_hidden=True)
    ids, mask = token_batch(1)
    mask[:, P:] = 0
    logprobs, entropies, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, mask, T, compute_entropy=True
    )
    assert not logprobs.any() and not entropies.any()
    (logprobs.sum() + entropies.sum()).backward()  # connected to the graph, gradient zero
    assert all(p.grad is None or not p.grad.any() for p in trainer.model.parameters())  # type: ignore[union-attr]


def test_generation_and_plain_forward_are_unchanged(tmp_path: Path) -> None:
    model = make_tiny_llama().double()
    ids, mask = token_batch(2)
    before = model(input_ids=ids, attention_mask=mask).logits
    trainer = tiny_trainer(model, tmp_path, logprobs_from_hidden=True)
    after = trainer.model(input_ids=ids, attention_mask=mask).logits  # type: ignore[misc]
    torch.testing.assert_close(after, before, rtol=0, atol=0)


# ---------------------------------------------------------------- float32: the same loss as TRL's own kernel


@pytest.mark.parametrize(("loss_type", "level"), [("dapo", "token"), ("grpo", "sequence")])
def test_loss_gradients_and_metrics_equal_trl_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loss_type: str, level: str
) -> None:
    model_dir = save_tiny_llama(tmp_path / "model")
    settings = {"loss_type": loss_type, "importance_sampling_level": level, "beta": 0.04, "epsilon": 0.1}
    settings["use_bias_correction_kl"] = False
    inputs = policy_inputs(3)
    results = []
    for flag in (False, True):
        trainer = tiny_trainer(str(model_dir), tmp_path / str(flag), logprobs_from_hidden=flag, **settings)
        trainer.current_gradient_accumulation_steps = 1
        params = [p for p in trainer.model.parameters() if p.requires_grad]  # type: ignore[union-attr]
        with monkeypatch.context() as patch:
            if flag:
                patch.setattr(trl_utils, "_ChunkedLogProbFunction", None)  # any call to TRL's kernel fails
            loss = trainer._compute_loss(trainer.model, inputs)  # type: ignore[arg-type]
        grads = torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)
        metrics = {k: v[0] for k, v in trainer._metrics["train"].items()}
        results.append((loss.detach(), grads, metrics))
    (trl_loss, trl_grads, trl_metrics), (loss, grads, metrics) = results
    assert loss.dtype == trl_loss.dtype == torch.float32
    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=0.0)
    scale = max(float(g.abs().max()) for g in trl_grads)
    assert scale > 0
    for a, b in zip(grads, trl_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0.0, atol=1e-5 * scale)
    assert metrics.keys() == trl_metrics.keys() and "entropy" in metrics and "kl" in metrics
    assert 0.0 < trl_metrics["clip_ratio/region_mean"] < 1.0  # the clip binds on some tokens only
    for key, value in trl_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


# ---------------------------------------------------------------- what the flag refuses
def _llama(**changes: Any) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=20, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, **changes
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
        ({"logit_scale": 0.5}, "logit_scale=0.5"),
        ({"output_router_logits": True}, "output_router_logits=True"),
    ],
)
def test_logit_transforms_are_refused(changes: dict[str, Any], match: str) -> None:
    model = _llama()
    for key, value in changes.items():
        setattr(model.config, key, value)
    with pytest.raises(NotImplementedError, match=match):
        use_hidden_logprobs(model, 1.0)


def test_lm_heads_it_cannot_use_are_refused() -> None:
    model = _llama()
    model.lm_head = torch.nn.Linear(8, 20, bias=True)
    with pytest.raises(ValueError, match=r"LM head without bias; .* bias of shape \(20,\)"):
        check_hidden_logprobs_supported(model)
    model.lm_head = torch.nn.Sequential(torch.nn.Linear(8, 20, bias=False))
    with pytest.raises(ValueError, match=r"plain torch\.nn\.Linear; got Sequential"):
        check_hidden_logprobs_supported(model)


def test_sharded_heads_and_bad_temperature_are_refused() -> None:
    model = _llama()
    with pytest.raises(NotImplementedError, match="DeepSpeed ZeRO-3"):
        check_hidden_logprobs_supported(model, zero3=True)
    with pytest.raises(NotImplementedError, match="FSDP"):
        check_hidden_logprobs_supported(model, fsdp=True)
    with pytest.raises(ValueError, match=r"temperature must be positive; got 0\.0"):
        use_hidden_logprobs(model, 0.0)
