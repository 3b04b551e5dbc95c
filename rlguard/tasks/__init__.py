"""Embedded tiny tasks, tokenizer and model factory: demos, benchmarks and tests run with no download."""

from rlguard.tasks.tiny import (
    AdditionTask,
    CharTokenizer,
    Rollouts,
    TinyLM,
    demo_batch,
    make_tiny_model,
    sample_rollouts,
    sequence_logprobs,
)

__all__ = [
    "AdditionTask",
    "CharTokenizer",
    "Rollouts",
    "TinyLM",
    "demo_batch",
    "make_tiny_model",
    "sample_rollouts",
    "sequence_logprobs",
]
