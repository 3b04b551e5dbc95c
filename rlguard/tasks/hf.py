"""A tiny Hugging Face model, tokenizer, dataset and reward for the addition task: TRL runs with no download.

``save_tiny_llama(path)`` writes a ~300K-parameter randomly initialised ``LlamaForCausalLM`` and a character-level
``PreTrainedTokenizerFast`` (the vocabulary of :class:`rlguard.tasks.tiny.CharTokenizer`) to ``path``; TRL can load
both from there, including the reference model it rebuilds from ``config._name_or_path`` when ``beta > 0``.

Needs ``transformers``, ``tokenizers`` and ``datasets`` (the ``trl`` extra); ``import rlguard.tasks`` does not
import this module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset  # type: ignore[import-untyped]  # datasets ships no type information
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainingArguments

from rlguard.tasks.tiny import AdditionTask, CharTokenizer

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


def checkpointing_argument() -> str:
    """Name of the activation-checkpointing switch of ``TrainingArguments``: ``activation_checkpointing`` in
    recent transformers 5.x, ``gradient_checkpointing`` before (verl 0.9.1 pins such a release)."""
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def cpu_training_arguments() -> dict[str, Any]:
    """Keyword arguments of ``TrainingArguments``/``GRPOConfig`` for a CPU run: TRL's defaults (bf16 and
    activation checkpointing on) are off, nothing is reported."""
    return {"use_cpu": True, "bf16": False, checkpointing_argument(): False, "report_to": "none"}


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A fast tokenizer with one token per character of :class:`CharTokenizer`'s vocabulary (same ids).

    Encoding prepends ``<bos>``; decoding joins characters without spaces.
    """
    chars = CharTokenizer()
    vocab = {token: i for i, token in enumerate(chars.vocab)}
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, chars.BOS)]
    )
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # its __init__ is not annotated
        tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD, padding_side="left"
    )


def make_tiny_llama(
    seed: int = 0, *, hidden_size: int = 96, num_layers: int = 3, intermediate_size: int = 192
) -> LlamaForCausalLM:
    """A randomly initialised Llama for :func:`make_tokenizer`'s vocabulary; about 280K parameters by default."""
    chars = CharTokenizer()
    config = LlamaConfig(
        vocab_size=chars.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=chars.PAD,
        bos_token_id=chars.BOS,
        eos_token_id=chars.EOS,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = chars.PAD
    model.generation_config.eos_token_id = chars.EOS
    model.generation_config.bos_token_id = chars.BOS
    return model


def save_tiny_llama(path: str | Path, seed: int = 0) -> Path:
    """Write :func:`make_tiny_llama` and :func:`make_tokenizer` to ``path`` (created if missing); return it.

    Pass the path (not the model object) to ``GRPOTrainer`` when ``beta > 0``: TRL loads the reference model from it.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    make_tiny_llama(seed).save_pretrained(out)
    make_tokenizer().save_pretrained(out)
    return out


def addition_dataset(n: int = 64, seed: int = 0) -> Dataset:
    """``n`` rows of ``{"prompt": "a+b=", "answer": a + b}`` (standard, not conversational, prompts)."""
    rows = AdditionTask().prompts(n, seed)
    return Dataset.from_dict({"prompt": [p for p, _ in rows], "answer": [a for _, a in rows]})


def addition_reward(completions: list[str], answer: list[int], **kwargs: Any) -> list[float]:
    """TRL reward function: :meth:`AdditionTask.reward` of each completion (``answer`` is the dataset column)."""
    task = AdditionTask()
    return [task.reward(c.strip(), int(a)) for c, a in zip(completions, answer, strict=True)]
