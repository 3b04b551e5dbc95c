"""Helpers of ``test_trl_async_guard.py``: the CPU stand-in server as a subprocess, a conversational addition task
(the rollout worker renders prompts through the chat template), and faults injected into
``GuardedAsyncGRPOTrainer`` at chosen optimizer steps (``poison``: NaN log-probs, as ``trl_guard_faults.py``).
"""

from __future__ import annotations

import contextlib
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoTokenizer, TrainerCallback

from rlguard.adapters.trl.async_stand_in import StateDictWeightTransfer, wait_for_server
from rlguard.adapters.trl.async_trainer import GuardedAsyncGRPOTrainer
from rlguard.tasks.hf import addition_dataset, addition_reward

#: renders each message's content, nothing else (the tiny tokenizer has no chat template)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def chat_addition_dataset(n: int) -> Dataset:
    """``addition_dataset`` with conversational prompts (one user message)."""
    rows = addition_dataset(n)
    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": p}] for p in rows["prompt"]], "answer": rows["answer"]}
    )


def chat_addition_reward(completions: list[list[dict[str, str]]], answer: list[int], **kwargs: Any) -> list[float]:
    """``addition_reward`` of each completion's last message (module-level: the rollout child imports it)."""
    return addition_reward([c[-1]["content"] for c in completions], answer)


def chat_spread_reward(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
    """A reward that differs between almost any two completions (their characters' codes, mod 7, over 6), so that
    every group has a spread and every step a gradient: a stable gradient-norm baseline for the spike detector
    (the addition reward of a random-init model is 0 for most groups, whose steps then have no gradient)."""
    texts = [c[-1]["content"] for c in completions]
    return [sum(ord(ch) for ch in text) % 7 / 6 for text in texts]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def stand_in_server(model_dir: Path) -> Iterator[str]:
    """``python -m rlguard.adapters.trl.async_stand_in`` on a free port; its URL, killed on exit."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "rlguard.adapters.trl.async_stand_in",
        "--model",
        str(model_dir),
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(url)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=30)


def server_weights(url: str, path: Path) -> dict[str, torch.Tensor]:
    """The weights the server generates with (``/rlguard/save_weights``)."""
    requests.post(f"{url}/rlguard/save_weights", json={"path": str(path)}, timeout=60).raise_for_status()
    return load_file(str(path))


class ServerWeightsProbe(TrainerCallback):
    """After each optimizer step (after the trainer's callbacks): the server's weights and the trainer's, by step."""

    def __init__(self, trainer: Any, url: str, folder: Path) -> None:
        self.trainer, self.url, self.folder = trainer, url, folder
        self.served: dict[int, dict[str, torch.Tensor]] = {}
        self.own: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        self.served[step] = server_weights(self.url, self.folder / f"served-{step}.safetensors")
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        self.own[step] = {n: p.detach().clone() for n, p in model.named_parameters()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bit for bit, over ``a``'s names."""
    return all(torch.equal(t, b[n]) for n, t in a.items())


class GradSpike(TrainerCallback):
    """Before the guard judges each optimizer step up to ``at``: the gradients scaled to norm ``base`` (a steady
    baseline for the spike detector, whose robust z over a few random-init steps' norms can be anything), and at
    step ``at`` to ``10 * base``: 10x the detector's rolling median, between its 5x warning and its 20x critical,
    with a robust z of log(10) / 0.05 (its sigma floor) = 46 >= 6. A step without gradient (norm 0) is left alone.
    Pass it in ``callbacks=``, so that it runs before the guard's callback."""

    def __init__(self, at: int, base: float = 1.0) -> None:
        self.at = at
        self.base = base

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        step = state.global_step + 1
        if step > self.at:
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        if not (math.isfinite(norm) and norm > 0):
            return
        target = self.base * (10.0 if step == self.at else 1.0)
        for g in grads:
            g.mul_(target / norm)


def faulty_trainer(poison_at: set[int]) -> type[GuardedAsyncGRPOTrainer]:
    """``GuardedAsyncGRPOTrainer`` whose policy log-probs of the first loss token are NaN at the steps ``poison_at``."""

    class Faulty(GuardedAsyncGRPOTrainer):
        def rlguard_policy_logprobs(self, model: Any, inputs: dict[str, Any]) -> Any:
            logprobs, entropies, outputs = super().rlguard_policy_logprobs(model, inputs)
            if self.state.global_step + 1 in poison_at and torch.is_grad_enabled():
                first = torch.zeros_like(logprobs, dtype=torch.bool)
                first[0] = True
                logprobs = logprobs + torch.where(first, math.nan, 0.0)  # reaches the gradient too
            return logprobs, entropies, outputs

    return Faulty


def build(model_dir: Path, url: str, args: Any, poison_at: set[int], **kwargs: Any) -> GuardedAsyncGRPOTrainer:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    return faulty_trainer(poison_at)(
        model=str(model_dir),
        reward_funcs=chat_spread_reward,
        args=args,
        train_dataset=chat_addition_dataset(64),
        processing_class=tokenizer,
        weight_transfer=StateDictWeightTransfer(url, Path(args.output_dir) / "weights"),
        **kwargs,
    )
