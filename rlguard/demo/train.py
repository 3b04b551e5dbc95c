"""The demo's model preparation and TRL runs (imports TRL; :mod:`rlguard.demo.runs` holds the framework-free parts)."""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PrinterCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.demo.runs import WARM_START, DemoConfig, ProgressHook, RunSpec, RunSummary
from rlguard.guards.events import EVENTS_FILE, METRICS_FILE
from rlguard.metrics import canonical_stats
from rlguard.tasks.hf import (
    addition_accuracy,
    addition_dataset,
    addition_reward,
    cpu_training_arguments,
    make_tiny_llama,
    make_tokenizer,
    warm_start,
)


def warm_started_model(path: Path, config: DemoConfig, on_progress: ProgressHook | None = None) -> tuple[Path, float]:
    """Save the tiny Llama, warm-started for ``config.warm_start_steps`` steps, and its tokenizer to ``path``;
    return the path and the seconds the warm start took."""
    model = make_tiny_llama(config.seed)
    total = config.warm_start_steps

    def on_step(step: int, loss: float) -> None:
        if on_progress is not None:
            on_progress(WARM_START, step, total, {"loss": loss})

    start = time.perf_counter()
    warm_start(model, steps=total, seed=config.seed, on_step=on_step)
    seconds = time.perf_counter() - start
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path, seconds


def grpo_config(output_dir: Path, spec: RunSpec, config: DemoConfig) -> GuardedGRPOConfig:
    """The run's TRL configuration: CPU, no tqdm, a log every step, no checkpoint; the objective alone, which gives
    its paper's clip range and aggregation (:class:`~rlguard.adapters.trl.GuardedGRPOConfig`)."""
    return GuardedGRPOConfig(
        output_dir=str(output_dir),
        objective=spec.objective,
        guard=spec.guard,
        **cpu_training_arguments(),
        use_vllm=False,
        per_device_train_batch_size=config.prompts_per_step * config.num_generations,
        num_generations=config.num_generations,
        num_iterations=config.num_iterations,
        steps_per_generation=config.steps_per_generation,
        max_completion_length=4,
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant",
        beta=config.beta,
        max_steps=config.steps,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=config.seed,
    )


class ProgressCallback(TrainerCallback):
    """Calls ``hook(label, step, max_steps, stats)`` after every logged training step (TRL's tqdm is off)."""

    def __init__(self, label: str, hook: ProgressHook) -> None:
        self.label = label
        self.hook = hook

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and "train_runtime" not in logs:
            self.hook(self.label, state.global_step, state.max_steps, canonical_stats(logs))


def train_run(
    model_dir: Path, output_dir: Path, spec: RunSpec, config: DemoConfig, on_progress: ProgressHook | None = None
) -> RunSummary:
    """Train a copy of the model in ``model_dir`` with ``GuardedGRPOTrainer``; keep its log in ``output_dir``."""
    start = time.perf_counter()
    for name in (EVENTS_FILE, METRICS_FILE):  # a rerun into the same folder starts anew, nothing moved aside
        (output_dir / name).unlink(missing_ok=True)
    dataset = addition_dataset(config.steps * config.prompts_per_step, seed=config.seed)
    callbacks = [] if on_progress is None else [ProgressCallback(spec.label, on_progress)]
    trainer_class = GuardedGRPOTrainer if spec.fault is None else with_lr_spike(config.fault_at, config.lr_spike)
    trainer = trainer_class(
        model=str(model_dir),
        reward_funcs=addition_reward,
        args=grpo_config(output_dir, spec, config),
        train_dataset=dataset,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # with tqdm off, transformers prints every log dict
    model = trainer.model
    assert model is not None
    before = addition_accuracy(model)
    trainer.train()
    trainer.save_state()  # output_dir/trainer_state.json: what `rlguard report` and `rlguard doctor` read
    after = addition_accuracy(model)
    rows = [(int(r["step"]), canonical_stats(r)) for r in trainer.state.log_history if "train_runtime" not in r]
    names = sorted({n for _, stats in rows for n in stats})
    guard = trainer.rlguard_guard
    return RunSummary(
        spec=spec,
        folder=output_dir,
        steps=[step for step, _ in rows],
        series={n: [stats.get(n, math.nan) for _, stats in rows] for n in names},
        events=list(guard.events) if guard is not None else [],
        accuracy_before=before,
        accuracy_after=after,
        seconds=time.perf_counter() - start,
    )


def with_lr_spike(at: int, factor: float) -> type[GuardedGRPOTrainer]:
    """``GuardedGRPOTrainer`` whose learning rate is ``factor`` times the schedule's at optimizer step ``at`` only
    (through ``Trainer.create_scheduler``, transformers' extension point for the schedule): the demo's fault, the
    same with and without a guard."""

    class LRSpikeTrainer(GuardedGRPOTrainer):
        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            scheduler = super().create_scheduler(num_training_steps, optimizer)
            if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):  # "constant" is one
                raise TypeError(f"the LR spike needs a LambdaLR schedule; got {type(scheduler).__name__}.")
            # LambdaLR: optimizer step s (1-based) runs at base_lr * lambda(s - 1), set by the scheduler step before
            scheduler.lr_lambdas = [_spiked(f, at - 1, factor) for f in scheduler.lr_lambdas]
            return scheduler

    return LRSpikeTrainer


def _spiked(schedule: Callable[[int], float], at: int, factor: float) -> Callable[[int], float]:
    """``schedule`` times ``factor`` at scheduler step ``at`` only."""
    return lambda step: schedule(step) * (factor if step == at else 1.0)


@contextmanager
def demo_environment() -> Iterator[None]:
    """The demo's process settings, restored on exit: one torch thread (the tiny model's matrices are too small to
    share: two threads made the demo several times slower on a 2-core machine); transformers' info
    logs and progress bars, the deprecation warning TRL 1.16 triggers while generating, and the adapter's line on
    each objective's paper settings (the demo asks for them), hidden (a user of the demo cannot act on them)."""
    from transformers.utils import logging as hf_logging

    adapter_log = logging.getLogger("rlguard.adapters.trl")
    level = adapter_log.level
    adapter_log.setLevel(logging.ERROR)
    verbosity, bars, threads = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), torch.get_num_threads()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # as above; hides "Loading weights" bars
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            yield
    finally:
        adapter_log.setLevel(level)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # as above
        torch.set_num_threads(threads)


__all__ = [
    "ProgressCallback",
    "demo_environment",
    "grpo_config",
    "train_run",
    "warm_started_model",
    "with_lr_spike",
]
