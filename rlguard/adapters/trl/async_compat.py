"""What TRL 1.16's ``trl.experimental.async_grpo.AsyncGRPOTrainer`` needs to run on CPU, behind one module.

Each item names the CUDA-only or vLLM-only call it routes around (paths in site-packages, TRL 1.16):

- :func:`use_torch_tree_attention`: the trainer loads the policy with ``attn_implementation="tree_fa3"``
  (``async_grpo_trainer.py``, ``create_model_from_path``), TRL's tree-packing attention, which calls the CUDA-only
  FlashAttention-3 kernel ``flash_attn_varlen_func`` (``packing.py``, ``tree_attention``). The policy is switched to
  :func:`tree_attention_torch`, a pure-PyTorch varlen attention with the same arguments, registered under its own
  name through transformers' public ``AttentionInterface`` (TRL's registration is left as it is);
- :func:`cpu_safe_trainer_init`: ``AsyncGRPOTrainer.__init__`` calls ``get_peak_flops_per_device``, which calls
  ``torch.cuda.get_device_name`` (``trainer/utils.py``) and raises without CUDA: on CPU the peak is unknown (None,
  TRL's own "MFU disabled" answer); and ``AsyncRolloutWorker.__init__`` refuses to start unless vLLM is importable
  (``async_rollout_worker.py``, ``is_vllm_available()``), although its child talks to the server over HTTP only
  (aiohttp): the check is answered true while the trainer is built, so any server speaking vLLM's HTTP API works;
- :func:`ensure_response_schema`: the rollout worker's child calls TRL's ``add_response_schema``, which refuses a
  chat template it does not know unless the tokenizer has a ``response_schema``; without tools nothing is parsed,
  so a schema of plain assistant text is set.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

try:
    import trl
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from trl.import_utils import TRLExperimentalWarning

    with warnings.catch_warnings():  # the user chose the experimental trainer; said once in TRL's docs, not here
        warnings.simplefilter("ignore", TRLExperimentalWarning)
        import trl.experimental.async_grpo.async_grpo_trainer as trainer_module
        import trl.experimental.async_grpo.async_rollout_worker as worker_module
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"rlguard.adapters.trl's async support needs TRL 1.16: pip install 'rlguard[trl]' ({err})."
    ) from err

__all__ = [
    "STEP_ACCOUNTING",
    "TREE_ATTENTION_TORCH",
    "check_async_trl_compatibility",
    "check_rollout_dataset_slot",
    "cpu_safe_trainer_init",
    "ensure_response_schema",
    "install_rollout_collator",
    "record_step_accounting",
    "set_rollout_max_staleness",
    "trainer_module",
    "tree_attention_torch",
    "use_torch_tree_attention",
    "worker_module",
]

#: the name :func:`tree_attention_torch` is registered under in transformers' ``AttentionInterface``
TREE_ATTENTION_TORCH = "rlguard_tree_torch"

#: a response schema of plain assistant text (no tool calls): transformers' legacy ``response_schema`` format
_TEXT_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}},
}


def tree_attention_torch(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *,
    tree_kv_index: Tensor,
    tree_cu_seqlens_q: Tensor,
    tree_cu_seqlens_k: Tensor,
    tree_max_seqlen_q: int,
    tree_max_seqlen_k: int,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """TRL's tree attention (``packing.tree_attention``) in plain PyTorch: softmax attention per segment.

    ``query``/``key``/``value`` are ``(1, H, N, D)`` (``H_kv`` heads for key and value, GQA repeats them); segment
    ``s`` queries the packed positions ``cu_q[s]:cu_q[s+1]`` and attends to the keys ``key[tree_kv_index]`` at
    ``cu_k[s]:cu_k[s+1]`` (its shared prefix, then its own tokens). Causal as FlashAttention's varlen kernel: with
    ``Lq`` queries and ``Lk`` keys, query ``i`` sees keys ``j <= i + Lk - Lq`` (bottom-right aligned), and with a
    ``sliding_window`` ``w`` only the last ``w`` of them. Returns ``(1, N, H, D)`` and no weights.
    """
    if softcap:
        raise NotImplementedError(f"tree_attention_torch has no logit soft-capping (softcap={softcap}).")
    q = query.transpose(1, 2)[0]  # (N, H, D)
    k = key.transpose(1, 2)[0].index_select(0, tree_kv_index)  # (Nk, H_kv, D)
    v = value.transpose(1, 2)[0].index_select(0, tree_kv_index)  # (Nk, H_kv, D)
    groups = q.size(1) // k.size(1)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(q.size(-1))
    out = torch.empty_like(q)
    cu_q, cu_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for s in range(len(cu_q) - 1):
        qs = q[cu_q[s] : cu_q[s + 1]].transpose(0, 1)  # (H, Lq, D)
        ks = k[cu_k[s] : cu_k[s + 1]].repeat_interleave(groups, dim=1).transpose(0, 1)  # (H, Lk, D)
        vs = v[cu_k[s] : cu_k[s + 1]].repeat_interleave(groups, dim=1).transpose(0, 1)  # (H, Lk, D)
        lq, lk = qs.size(1), ks.size(1)
        i = torch.arange(lq, device=q.device).unsqueeze(1) + (lk - lq)  # each query's own key position
        j = torch.arange(lk, device=q.device).unsqueeze(0)
        allowed = j <= i  # (Lq, Lk)
        if sliding_window:
            allowed = allowed & (j > i - sliding_window)
        scores = (qs @ ks.transpose(1, 2)) * scale  # (H, Lq, Lk)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[cu_q[s] : cu_q[s + 1]] = (scores.softmax(dim=-1) @ vs).transpose(0, 1)
    return out.unsqueeze(0), None


def use_torch_tree_attention(model: Any) -> None:
    """Run ``model`` (loaded by ``AsyncGRPOTrainer`` with TRL's ``"tree_fa3"``) with :func:`tree_attention_torch`:
    registered under :data:`TREE_ATTENTION_TORCH` (with no mask, as TRL registers its own) and set on the model
    with transformers' ``set_attn_implementation``."""
    AttentionInterface.register(TREE_ATTENTION_TORCH, tree_attention_torch)
    AttentionMaskInterface.register(TREE_ATTENTION_TORCH, lambda **kwargs: None)
    model.set_attn_implementation(TREE_ATTENTION_TORCH)


@contextlib.contextmanager
def cpu_safe_trainer_init(*, cpu: bool) -> Iterator[None]:
    """While ``AsyncGRPOTrainer.__init__`` runs: the rollout worker's vLLM import check answered true (its child
    speaks HTTP only), and with ``cpu`` the device's peak FLOPs unknown (None) instead of
    ``torch.cuda.get_device_name`` raising. Both module attributes are restored on exit."""
    saved = {
        (worker_module, "is_vllm_available"): getattr(worker_module, "is_vllm_available"),  # noqa: B009
        (trainer_module, "get_peak_flops_per_device"): getattr(trainer_module, "get_peak_flops_per_device"),  # noqa: B009
    }
    worker_module.is_vllm_available = lambda *args, **kwargs: True  # type: ignore[attr-defined]
    if cpu:
        trainer_module.get_peak_flops_per_device = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def ensure_response_schema(tokenizer: Any, *, tools: bool) -> None:
    """Give ``tokenizer`` a response schema of plain assistant text when it has none and no tools are used, so that
    the rollout worker's ``add_response_schema`` does not refuse its chat template. With tools, TRL's own schema
    for known templates is needed and nothing is set."""
    if tools or getattr(tokenizer, "response_schema", None) is not None:
        return
    if getattr(tokenizer, "response_template", None) is not None:
        return
    tokenizer.response_schema = dict(_TEXT_RESPONSE_SCHEMA)


def check_async_trl_compatibility() -> None:
    """Raise ``RuntimeError`` naming the supported range if the installed trl is not 1.16 or ``AsyncGRPOTrainer``
    lacks what ``GuardedAsyncGRPOTrainer`` overrides or reads: ``compute_loss``, ``_sync_weight`` (wrapped, to know
    when the weights reached the server), ``model_version``, ``rollout_queue``, and the per-step accounting of
    :func:`record_step_accounting`."""
    from rlguard.adapters.trl.compat import SUPPORTED_TRL, _in_range

    cls = trainer_module.AsyncGRPOTrainer
    missing = [name for name in ("compute_loss", "_sync_weight", "_log_step_metrics") if not hasattr(cls, name)]
    if not _in_range(trl.__version__, (1, 16)) or missing:
        raise RuntimeError(
            f"rlguard's GuardedAsyncGRPOTrainer supports trl{SUPPORTED_TRL}; the installed trl is {trl.__version__}"
            f"{' and its AsyncGRPOTrainer lacks ' + ', '.join(missing) if missing else ''}. Install a supported trl."
        )


#: where TRL 1.16's AsyncGRPOTrainer keeps its rollout dataset (private: set by ``get_train_dataloader`` on the main
#: process, None before and elsewhere), whose ``max_staleness`` its ``__iter__`` reads for every sample it takes
ROLLOUT_DATASET_SLOT = "_rollout_dataset"


def check_rollout_dataset_slot(trainer: Any) -> None:
    """Raise ``RuntimeError`` unless ``trainer`` (a built ``AsyncGRPOTrainer``) has the slot of its rollout dataset
    (:data:`ROLLOUT_DATASET_SLOT`) and TRL's ``RolloutQueueDataset`` takes ``max_staleness``: how rlguard sets
    the staleness bound in force (:func:`set_rollout_max_staleness`)."""
    dataset_class = getattr(trainer_module, "RolloutQueueDataset", None)
    takes = dataset_class is not None and "max_staleness" in inspect.signature(dataset_class.__init__).parameters
    if not hasattr(trainer, ROLLOUT_DATASET_SLOT) or not takes:
        raise RuntimeError(
            f"rlguard sets the staleness bound on TRL's rollout dataset (AsyncGRPOTrainer.{ROLLOUT_DATASET_SLOT}, a "
            f"RolloutQueueDataset taking max_staleness), which the installed trl {trl.__version__} lacks. "
            "Install trl 1.16."
        )


def set_rollout_max_staleness(trainer: Any, bound: int) -> None:
    """Set ``bound`` as the ``max_staleness`` of ``trainer``'s rollout dataset, which drops each sample older than it
    as it takes it from the queue (TRL's ``RolloutQueueDataset.__iter__``, counted as ``sample/dropped_stale_total``);
    nothing where the trainer has no dataset yet or none on this process (it takes samples on the main process
    only). ``RuntimeError`` if the dataset has no ``max_staleness``."""
    dataset = getattr(trainer, ROLLOUT_DATASET_SLOT, None)
    if dataset is None:
        return
    if not hasattr(dataset, "max_staleness"):
        raise RuntimeError(
            f"TRL's rollout dataset ({type(dataset).__name__}) has no max_staleness, through which rlguard sets the "
            f"staleness bound; the installed trl is {trl.__version__}. Install trl 1.16."
        )
    dataset.max_staleness = int(bound)


def install_rollout_collator(loader: Any, wrap: Any) -> None:
    """Replace the collator of ``loader`` (what TRL 1.16's ``AsyncGRPOTrainer.get_train_dataloader`` returns:
    accelerate's dispatcher over a ``DataLoader`` whose ``collate_fn`` is TRL's ``DataCollatorForRollout``) by
    ``wrap(collator)``, before the loader is iterated. ``RuntimeError`` if the loader is not built so."""
    base = getattr(loader, "base_dataloader", loader)  # accelerate's DataLoaderAdapter keeps the torch one there
    collator_class = getattr(trainer_module, "DataCollatorForRollout", None)
    collate = getattr(base, "collate_fn", None)
    if collator_class is None or not isinstance(collate, collator_class):
        raise RuntimeError(
            f"rlguard carries each sample's policy version through TRL's rollout collator (a DataLoader whose "
            f"collate_fn is DataCollatorForRollout); the installed trl {trl.__version__} builds "
            f"{type(base).__name__} with {type(collate).__name__}. Install trl 1.16."
        )
    base.collate_fn = wrap(collate)


#: AsyncGRPOTrainer's per-step counters that its compute_loss adds to (flushed by _log_step_metrics)
STEP_ACCOUNTING = ("_step_forward_tokens", "_step_trained_tokens", "_step_seq_len_weighted", "_step_samples")


def record_step_accounting(trainer: Any, inputs: Any, forward_s: float) -> None:
    """What TRL 1.16's ``AsyncGRPOTrainer.compute_loss`` adds to its per-step counters after the loss (its
    throughput metrics, ``perf/*`` and ``batch/*``): forwarded and trained tokens, samples, forward time."""
    forward_tokens = float(inputs["global_n_forward_tokens"][0])
    mean_seq_len = float(inputs["mean_seq_len"][0])
    trainer._step_forward_tokens += forward_tokens
    trainer._step_trained_tokens += float(inputs["global_n_tokens"][0])
    trainer._step_seq_len_weighted += mean_seq_len * forward_tokens
    trainer._step_samples += forward_tokens / mean_seq_len
    trainer._step_forward_s += forward_s
