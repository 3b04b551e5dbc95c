"""The CPU routes around AsyncGRPOTrainer's CUDA-only calls: the pure-PyTorch tree attention against a float64
softmax-attention reference and against the model's own attention, and the two patches restored."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from rlguard.adapters.trl.async_compat import (
    TREE_ATTENTION_TORCH,
    cpu_safe_trainer_init,
    ensure_response_schema,
    trainer_module,
    tree_attention_torch,
    use_torch_tree_attention,
    worker_module,
)
from rlguard.tasks.hf import make_tiny_llama, make_tokenizer


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention of the last ``Lq`` of ``Lk`` positions, float64, written out: (Lq, H, D)."""
    lq, lk = q.size(0), k.size(0)
    out = torch.zeros(lq, q.size(1), q.size(2), dtype=torch.float64)
    for h in range(q.size(1)):
        for i in range(lq):
            own = i + lk - lq
            scores = [float(q[i, h] @ k[j, h]) / math.sqrt(q.size(2)) for j in range(own + 1)]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            out[i, h] = sum(w / total * v[j, h] for j, w in enumerate(weights))
    return out


def test_tree_attention_matches_the_reference_with_a_shared_prefix() -> None:
    """Segment 0 is a whole sequence (5 tokens); segment 1 queries its 2 own tokens and attends to segment 0's
    first 3 (its shared prompt) and then to itself, as TRL's packer lays a tree out."""
    torch.manual_seed(0)
    heads, dim, n = 2, 4, 7
    query, key, value = (torch.randn(1, heads, n, dim, dtype=torch.float64) for _ in range(3))
    kv_index = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 5, 6])
    out, weights = tree_attention_torch(
        None,  # type: ignore[arg-type]  # the module is not read
        query,
        key,
        value,
        None,
        tree_kv_index=kv_index,
        tree_cu_seqlens_q=torch.tensor([0, 5, 7], dtype=torch.int32),
        tree_cu_seqlens_k=torch.tensor([0, 5, 10], dtype=torch.int32),
        tree_max_seqlen_q=5,
        tree_max_seqlen_k=5,
    )
    assert weights is None and out.shape == (1, n, heads, dim)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (N, H, D)
    first = reference_attention(q[:5], k[:5], v[:5])
    second = reference_attention(q[5:], k[kv_index[5:]], v[kv_index[5:]])
    torch.testing.assert_close(out[0], torch.cat([first, second]), rtol=1e-12, atol=1e-12)


def test_tree_attention_refuses_softcap() -> None:
    x = torch.zeros(1, 1, 1, 2)
    with pytest.raises(NotImplementedError, match="softcap"):
        tree_attention_torch(
            None,  # type: ignore[arg-type]
            x, x, x, None,
            tree_kv_index=torch.tensor([0]),
            tree_cu_seqlens_q=torch.tensor([0, 1]),
            tree_cu_seqlens_k=torch.tensor([0, 1]),
            tree_max_seqlen_q=1,
            tree_max_seqlen_k=1,
            softcap=30.0,
        )  # fmt: skip


def test_packed_model_logits_equal_the_models_own_attention() -> None:
    """Two sequences packed in one row with the tree kwargs give the logits of two separate eager forwards."""
    model = make_tiny_llama(seed=0).double().eval()
    a, b = torch.tensor([[1, 5, 7, 9, 4]]), torch.tensor([[1, 6, 8]])
    with torch.no_grad():
        separate = torch.cat([model(input_ids=a).logits[0], model(input_ids=b).logits[0]])
        use_torch_tree_attention(model)
        assert model.config._attn_implementation == TREE_ATTENTION_TORCH
        packed = model(
            input_ids=torch.cat([a, b], dim=1),
            position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]]),
            tree_kv_index=torch.arange(8),
            tree_cu_seqlens_q=torch.tensor([0, 5, 8], dtype=torch.int32),
            tree_cu_seqlens_k=torch.tensor([0, 5, 8], dtype=torch.int32),
            tree_max_seqlen_q=5,
            tree_max_seqlen_k=5,
        ).logits[0]
    torch.testing.assert_close(packed, separate, rtol=1e-10, atol=1e-10)


def test_cpu_safe_trainer_init_patches_and_restores() -> None:
    def vllm() -> Any:
        return getattr(worker_module, "is_vllm_available")  # noqa: B009  # not in the module's __all__

    def flops() -> Any:
        return getattr(trainer_module, "get_peak_flops_per_device")  # noqa: B009

    before = (vllm(), flops())
    with cpu_safe_trainer_init(cpu=True):
        assert vllm()() is True
        assert flops()(None, "float32") is None
    assert (vllm(), flops()) == before
    with cpu_safe_trainer_init(cpu=False):
        assert flops() is before[1]  # on an accelerator, TRL's own peak


def test_ensure_response_schema_only_without_tools_and_schema() -> None:
    tokenizer = make_tokenizer()
    ensure_response_schema(tokenizer, tools=True)
    assert getattr(tokenizer, "response_schema", None) is None
    ensure_response_schema(tokenizer, tools=False)
    assert tokenizer.response_schema["properties"]["content"] == {"type": "string"}
    mine = {"type": "object"}
    tokenizer.response_schema = mine
    ensure_response_schema(tokenizer, tools=False)
    assert tokenizer.response_schema is mine
