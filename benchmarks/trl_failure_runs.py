"""Real TRL GRPO runs of the embedded tiny model, healthy and driven to fail, judged by `rlguard doctor`.

    python benchmarks/trl_failure_runs.py --out runs/           # 6 runs of 40 steps (a few minutes on 1 CPU)
    python benchmarks/trl_failure_runs.py --out runs/ --quick   # 2 runs of 24 steps (healthy, lr spike)

Each run is a stock ``trl.GRPOTrainer`` (beta 0.04, so TRL logs ``kl``) on the single-digit sums of
:mod:`rlguard.tasks.hf`, from the tiny Llama warm-started for 100 supervised steps as in ``rlguard demo``; its
``trainer_state.json`` is written to ``OUT/<run>/``. The failures: a one-step x100 learning-rate spike, prompts
too hard for any completion to be rewarded, ``steps_per_generation`` (4) > ``gradient_accumulation_steps`` (1)
with a learning-rate jump (the generation stats land on every 4th step only), and a learning-rate jump that
collapses the policy. Prints one row per run: what was done to it, the doctor's findings and its exit code.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """One run.

    Attributes:
        what: what is done to it.
        healthy: whether it should train well (no critical finding) or fail (a critical finding).
        lr_at: step -> learning rate from that step on (a constant schedule otherwise).
        steps_per_generation: TRL's optimizer steps per generated batch.
        impossible: reward only a sum + 1000 (no completion of a few characters earns it: every group is 0).
    """

    what: str
    healthy: bool
    lr_at: dict[int, float] = field(default_factory=dict)
    steps_per_generation: int = 1
    impossible: bool = False


LR = 5e-4
SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario("lr 5e-4, a generation per step", True),
    "healthy_spg2": Scenario("lr 5e-4, steps_per_generation=2 (the demo's setting)", True, steps_per_generation=2),
    "lr_spike": Scenario("lr x100 for one step at step 16", False, lr_at={16: 100 * LR, 17: LR}),
    "too_hard": Scenario("no completion can be rewarded (sum + 1000)", False, impossible=True),
    "spg4_lr_jump": Scenario("steps_per_generation=4, lr 0.3 from step 16", False, {16: 0.3}, steps_per_generation=4),
    "lr_jump": Scenario("lr 3.0 from step 16: the policy collapses", False, lr_at={16: 3.0}),
}
QUICK = ("healthy", "lr_spike")


def _impossible_reward(completions: list[str], answer: list[int], **kwargs: Any) -> list[float]:
    """1 only for ``answer + 1000``, which a 4-character completion of a sum never writes."""
    return [float(c.strip() == str(int(a) + 1000)) for c, a in zip(completions, answer, strict=True)]


def run(name: str, scenario: Scenario, model_dir: Path, out: Path, steps: int) -> tuple[Path, str]:
    """Train one scenario; return its ``trainer_state.json`` and, if training crashed, the error (the log up to
    the crash is saved: a user diagnoses exactly that)."""
    from transformers import TrainerCallback, TrainerControl, TrainerState
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments

    class LearningRates(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
            if state.global_step in scenario.lr_at:
                scheduler = kwargs["lr_scheduler"]
                scheduler.base_lrs = [scenario.lr_at[state.global_step] for _ in scheduler.base_lrs]

    args = GRPOConfig(
        output_dir=str(out / name),
        **cpu_training_arguments(),
        use_vllm=False,
        per_device_train_batch_size=32,
        num_generations=8,
        steps_per_generation=scenario.steps_per_generation,
        max_completion_length=4,
        learning_rate=LR,
        lr_scheduler_type="constant",
        beta=0.04,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    reward: Callable[..., list[float]] = _impossible_reward if scenario.impossible else addition_reward
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward,
        args=args,
        train_dataset=addition_dataset(32 * steps),
        callbacks=[LearningRates()],
    )
    crash = ""
    try:
        trainer.train()
    except RuntimeError as err:  # NaN weights: sampling from a non-finite distribution fails inside generate
        crash = str(err).splitlines()[0]
    trainer.save_state()
    return out / name / "trainer_state.json", crash


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="2 runs of 24 steps")
    parser.add_argument("--runs", default="", help=f"comma-separated subset of {', '.join(SCENARIOS)}")
    args = parser.parse_args(argv)
    import torch

    from rlguard.doctor import diagnose
    from rlguard.tasks.hf import make_tiny_llama, make_tokenizer, warm_start

    torch.set_num_threads(1)
    names = QUICK if args.quick else tuple(SCENARIOS)
    if args.runs:
        names = tuple(args.runs.split(","))
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            parser.error(f"unknown run(s) {unknown}; runs: {', '.join(SCENARIOS)}")
    steps = 24 if args.quick else args.steps
    model_dir = args.out / "model"
    if not (model_dir / "config.json").is_file():
        model = make_tiny_llama(0)
        warm_start(model, steps=100, seed=0)
        model_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(model_dir)
        make_tokenizer().save_pretrained(model_dir)
    failures = 0
    print("| run | what was done | expected | rlguard doctor: findings (severity @step) | exit | ok | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        scenario = SCENARIOS[name]
        start = time.perf_counter()
        state, crash = run(name, scenario, model_dir, args.out, steps)
        seconds = time.perf_counter() - start
        d = diagnose(state)
        findings = "; ".join(f"{f.detector} {f.severity} @{f.severity_step}" for f in d.findings) or "no finding"
        ok = (d.exit_code == 0) if scenario.healthy else (d.exit_code == 1)
        failures += not ok
        expected = "trains" if scenario.healthy else "fails"
        if crash:
            findings += f" (training crashed: {crash})"
        print(
            f"| {name} | {scenario.what} | {expected} | {findings} | {d.exit_code} | {'yes' if ok else 'NO'} | "
            f"{seconds:.0f} |"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
