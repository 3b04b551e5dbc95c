"""A tiny Hugging Face model, tokenizer, dataset and reward for the addition task: TRL runs with no download.

``save_tiny_llama(path)`` writes a ~300K-parameter randomly initialised ``LlamaForCausalLM`` and a character-level
``PreTrainedTokenizerFast`` (the vocabulary of :class:`rlguard.tasks.tiny.CharTokenizer`) to ``path``; TRL can load
both from there, including the reference model it rebuilds from ``config._name_or_path`` when ``beta > 0``.

Needs ``transformers``, ``tokenizers`` and ``datasets`` (the ``trl`` extra); ``import rlguard.tasks`` does not
import this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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


def _answer_batch(rows: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``<bos> a+b= answer <eos>`` ids ``(B, S)``, right-padded, and labels ``(B, S)``: the answer and ``<eos>``
    (``-100`` elsewhere, which ``LlamaForCausalLM`` ignores)."""
    chars = CharTokenizer()
    seqs = [([chars.BOS, *chars.encode(p)], [*chars.encode(str(a)), chars.EOS]) for p, a in rows]
    length = max(len(p) + len(a) for p, a in seqs)
    ids = torch.full((len(seqs), length), chars.PAD)
    labels = torch.full((len(seqs), length), -100)
    for row, (prompt, answer) in enumerate(seqs):
        ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        labels[row, len(prompt) : len(prompt) + len(answer)] = torch.tensor(answer)
    return ids, labels


def warm_start(
    model: LlamaForCausalLM,
    *,
    steps: int,
    seed: int = 0,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Supervised pre-training of ``model`` in place: ``steps`` AdamW steps of cross-entropy on the correct answers
    (and ``<eos>``) of random addition prompts; returns the loss of each step (also passed to ``on_step(step,
    loss)``, steps counted from 1).

    A randomly initialised model almost never writes a correct sum, so RL would have little to reinforce; a short
    warm start gives it partly right answers, as a pre-trained model has before RL.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0; got {steps}.")
    task = AdditionTask()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    losses = []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for step in range(steps):
            ids, labels = _answer_batch(task.prompts(batch_size, seed=seed * 100_003 + step))
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(step + 1, losses[-1])
    return losses


@torch.no_grad()
def addition_accuracy(model: torch.nn.Module, max_new_tokens: int = 4) -> float:
    """Share of the 100 sums ``a+b=`` (single digits) that ``model`` (a causal LM over :func:`make_tokenizer`'s
    vocabulary, such as :func:`make_tiny_llama`) answers exactly with greedy decoding."""
    chars, task = CharTokenizer(), AdditionTask()
    pairs = [(a, b) for a in range(10) for b in range(10)]
    prompts = torch.tensor([[chars.BOS, *chars.encode(f"{a}+{b}=")] for a, b in pairs])  # (100, 5), no padding
    was_training = model.training
    model.eval()
    ids = prompts
    for _ in range(max_new_tokens):  # tokens after <eos> are ignored by decode
        next_ids = model(input_ids=ids).logits[:, -1].argmax(dim=-1, keepdim=True)  # (100, 1)
        ids = torch.cat([ids, next_ids], dim=1)
    model.train(was_training)
    completions = [chars.decode(row[prompts.shape[1] :].tolist()) for row in ids]
    return sum(task.reward(c, a + b) == 1.0 for c, (a, b) in zip(completions, pairs, strict=True)) / len(pairs)
