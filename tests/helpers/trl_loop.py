"""The part of transformers' ``Trainer`` loop around one optimizer step, driving ``StabilityCallback`` through the
callback events in the trainer's order. Imports transformers: import it after ``pytest.importorskip("trl")``."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from rlguard.adapters.trl import StabilityCallback


class Loop:
    """The part of ``Trainer``'s loop around one optimizer step, with a linear model and Adam."""

    def __init__(self, callback: StabilityCallback, tmp_path: Path, max_grad_norm: float = 1.0) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 2)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
        self.args.max_grad_norm = max_grad_norm
        self.args.logging_steps = 1
        self.state, self.control, self.callback = TrainerState(), TrainerControl(), callback
        # the trainer the callback reads its metrics from and logs to: TRL's per-mode metric lists only
        callback.attach(SimpleNamespace(_metrics={"train": defaultdict(list)}))
        callback.on_train_begin(self.args, self.state, self.control, model=self.model, optimizer=self.optimizer)

    def step(self, scale: float = 1.0) -> None:
        self.model(torch.ones(4, 3)).pow(2).sum().mul(scale).backward()
        kw: dict[str, Any] = {"model": self.model, "optimizer": self.optimizer, "lr_scheduler": None}
        self.callback.on_pre_optimizer_step(self.args, self.state, self.control, **kw)
        self.lr_used = [g["lr"] for g in self.optimizer.param_groups]
        self.optimizer.step()
        self.callback.on_optimizer_step(self.args, self.state, self.control, **kw)
        self.model.zero_grad()
        self.state.global_step += 1

    def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]

    def adam_steps(self) -> list[float]:
        return [float(s["step"]) for s in self.optimizer.state.values()]
