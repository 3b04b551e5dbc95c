"""``GuardedGRPOConfig(logprobs_from_hidden=True)``: TRL's per-token log-probs and entropies computed by
:func:`rlguard.core_losses.logprobs_from_hidden` from the model's last hidden states and the LM head weight.

TRL 1.16 patches the policy's ``forward`` (``trl.trainer.utils.add_fused_lm_head``) so that
``model(..., labels=labels, fused_lm_head=True)`` returns per-token ``log_probs`` and ``entropy`` from its own
chunked kernel, and ``GRPOTrainer._get_per_token_logps_and_entropies`` reads them. :func:`use_hidden_logprobs`
wraps that forward once more: the fused call runs the backbone and rlguard's chunked function instead, and every
other call (generation, ``fused_lm_head=False``) is TRL's. TRL's own code around the call is unchanged: batch
chunking (``batch_size``), multimodal input slicing, autocast, ``logits_to_keep``.

The temperature is exact: logits ``h W^T / tau = (h / tau) W^T``, so the hidden states are divided by it. What
the swap cannot express is refused with an error: an LM head with a bias or that is not a plain ``nn.Linear`` (a
LoRA-adapted head), final-logit soft-capping, logit scaling, MoE router auxiliary losses, DeepSpeed ZeRO-3 and
FSDP (sharded LM head). The reference model keeps TRL's kernel (it runs without gradients).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

try:
    from trl.trainer.utils import FusedCausalLMOutput
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"rlguard.adapters.trl.logprobs needs TRL: pip install 'rlguard[trl]' ({err}).") from err

from rlguard.adapters.trl.compat import install_forward
from rlguard.core_losses import (
    FusedLossOutput,
    Objective,
    RolloutBatch,
    logprobs_from_hidden,
    objective_from_hidden,
)

__all__ = ["FUSED_REQUEST", "FusedRequest", "check_hidden_logprobs_supported", "use_hidden_logprobs"]

#: attribute of the policy (PEFT's base model) through which ``_compute_loss`` hands its forward a
#: :class:`FusedRequest` (``fused_objective=True``)
FUSED_REQUEST = "rlguard_fused_request"


@dataclass
class FusedRequest:
    """The objective, the batch without log-probs and the normalisers of one micro-batch, for the policy's next
    ``fused_lm_head=True`` forward to compute with :func:`~rlguard.core_losses.objective_from_hidden`; that forward
    stores the result in ``output``."""

    objective: Objective
    batch: RolloutBatch  # (B, T) over the completion tokens
    normalisers: dict[str, Any]
    output: FusedLossOutput | None = None


#: text-config attributes that change the logits beyond ``h W^T / temperature`` (TRL's kernel applies them).
_LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)
_FLAG = "logprobs_from_hidden=True"


def check_hidden_logprobs_supported(model: Any, *, zero3: bool = False, fsdp: bool = False) -> None:
    """Raise ``NotImplementedError``/``ValueError`` naming the setting if rlguard's log-probs cannot replace TRL's
    for ``model`` (a ``transformers`` causal LM, PEFT's base model unwrapped)."""
    if zero3 or fsdp:
        raise NotImplementedError(
            f"{_FLAG} does not support {'DeepSpeed ZeRO-3' if zero3 else 'FSDP'} yet: the LM head weight is sharded "
            "and rlguard's backward recomputes from the full weight. Use logprobs_from_hidden=False (TRL's chunked "
            "kernel gathers the head) or ZeRO-2 / DDP."
        )
    text_config = model.config.get_text_config()
    for name in _LOGIT_TRANSFORMS:
        value = getattr(text_config, name, None)
        if value is not None and value != 1.0:
            raise NotImplementedError(
                f"{_FLAG}: the model's config sets {name}={value!r}, a transform of the logits that "
                "logprobs_from_hidden does not apply. Use logprobs_from_hidden=False for this model."
            )
    if getattr(text_config, "output_router_logits", False):
        raise NotImplementedError(
            f"{_FLAG}: the model's config sets output_router_logits=True (MoE auxiliary loss), which rlguard's head "
            "does not compute. Use logprobs_from_hidden=False for MoE models with router_aux_loss_coef."
        )
    _lm_head_weight(model)


def _lm_head_weight(model: Any) -> Tensor:
    """The ``(V, H)`` weight of a bias-free ``nn.Linear`` LM head, or a ``ValueError`` naming what was found."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"{_FLAG} needs the LM head to be a plain torch.nn.Linear; got {type(head).__name__} (e.g. a LoRA-adapted "
            "head). Leave the LM head out of the adapter's target modules or use logprobs_from_hidden=False."
        )
    if head.bias is not None:
        raise ValueError(
            f"{_FLAG} needs an LM head without bias; this model's head has a bias of shape {tuple(head.bias.shape)}. "
            "Use logprobs_from_hidden=False."
        )
    return head.weight


def use_hidden_logprobs(model: Any, temperature: float, *, chunk_size: int | None = None) -> None:
    """Make ``model(..., labels=labels, fused_lm_head=True)`` compute its ``log_probs`` and ``entropy`` with
    :func:`~rlguard.core_losses.logprobs_from_hidden`; apply after TRL's ``add_fused_lm_head`` (the trainer's
    ``__init__``), before PEFT or DDP wrap the model.

    Output contract of TRL's fused head: ``log_probs`` and ``entropy`` ``(B, L - 1)`` (``(B, L)`` with
    ``shift_labels``), in float32 (float64 for a float64 model), zero where the label is ``-100``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be positive; got {temperature}.")
    check_hidden_logprobs_supported(model)
    trl_forward = model.forward

    @functools.wraps(type(model).forward)
    def forward(
        self: Any,
        *args: Any,
        fused_lm_head: bool = False,
        labels: Tensor | None = None,
        shift_labels: Tensor | None = None,
        num_items_in_batch: Tensor | int | None = None,
        **kwargs: Any,
    ) -> Any:
        if not fused_lm_head:
            return trl_forward(
                *args, labels=labels, shift_labels=shift_labels, num_items_in_batch=num_items_in_batch, **kwargs
            )
        if kwargs.get("output_router_logits"):
            raise NotImplementedError(
                f"{_FLAG} does not compute the MoE router auxiliary loss; use logprobs_from_hidden=False."
            )
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state  # (B, L, H), through the final norm
        if shift_labels is None:
            if labels is None:
                raise ValueError("fused_lm_head=True needs labels (or shift_labels).")
            hidden, targets = hidden[:, :-1], labels[:, 1:]
        else:
            targets = shift_labels
        weight = _lm_head_weight(self)
        hidden, targets = hidden.to(weight.device), targets.to(weight.device)
        mask = targets != -100  # (B, L - 1)
        request: FusedRequest | None = getattr(self, FUSED_REQUEST, None)
        if request is not None:
            return _fused_objective(request, hidden / temperature, weight, targets, mask, chunk_size)
        # only the scored positions go through the head; logits h W^T / tau = (h / tau) W^T
        with torch.autocast(hidden.device.type, enabled=False):
            logprobs, entropy = logprobs_from_hidden(
                (hidden[mask] / temperature).unsqueeze(0), weight, targets[mask].unsqueeze(0), chunk_size=chunk_size
            )  # (1, N), (1, N)
        assert entropy is not None
        # masked_scatter keeps an all-masked micro-batch connected to the graph, as TRL's head does
        log_probs = logprobs.new_zeros(mask.shape).masked_scatter(mask, logprobs[0])
        entropies = entropy.new_zeros(mask.shape).masked_scatter(mask, entropy[0])
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(
            loss=-log_probs.sum() / count, log_probs=log_probs, entropy=entropies, label_mask=mask
        )

    install_forward(model, forward)


def _fused_objective(
    request: FusedRequest, hidden: Tensor, weight: Tensor, targets: Tensor, mask: Tensor, chunk_size: int | None
) -> Any:
    """The fused objective on the last ``T`` positions (the completion), and TRL's output contract from its
    log-probs and entropies. hidden ``(B, L - 1, H)`` already divided by the temperature; targets, mask
    ``(B, L - 1)``."""
    if request.output is not None:
        raise RuntimeError(
            "fused_objective=True computes the loss of a whole micro-batch in one policy forward; this one was "
            "split into several (TRL's batch_size), which the fused path does not support."
        )
    t = request.batch.mask.shape[1]
    with torch.autocast(hidden.device.type, enabled=False):
        out = objective_from_hidden(
            request.objective,
            hidden[:, -t:],
            weight,
            targets[:, -t:].clamp(min=0),  # -100 only where the batch's mask is 0: never scored
            request.batch,
            chunk_size=chunk_size,
            **request.normalisers,
        )
    request.output = out
    log_probs = out.logprobs.new_zeros(mask.shape)
    entropies = out.entropies.new_zeros(mask.shape)
    log_probs[:, -t:], entropies[:, -t:] = out.logprobs, out.entropies
    return FusedCausalLMOutput(loss=out.loss.detach(), log_probs=log_probs, entropy=entropies, label_mask=mask)
