"""`rlguard doctor` and `rlguard report` on the log of a real stock ``trl.GRPOTrainer`` run (tiny Llama, CPU).

The run saves checkpoints, so the doctor finds ``checkpoint-N/trainer_state.json`` in the output folder as a user
would point it there; every key TRL 1.16 logs must be mapped or known (none unrecognised). A second run is driven
to collapse by a jump of the learning rate, and the doctor must find it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from transformers import TrainerCallback, TrainerControl, TrainerState
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

pytestmark = [
    pytest.mark.slow,
    # transformers deprecated the name; TRL 1.16 still calls it while generating
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

STEPS = 6


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Output folder of a 6-step GRPO run with beta > 0 (TRL logs ``kl``), checkpoints at steps 3 and 6."""
    model_dir = save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    out = tmp_path_factory.mktemp("grpo-run")
    args = GRPOConfig(
        output_dir=str(out),
        **cpu_training_arguments(),
        use_vllm=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        learning_rate=1e-3,
        beta=0.04,
        max_steps=STEPS,
        logging_steps=1,
        save_strategy="steps",
        save_steps=3,
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(64)
    )
    trainer.train()
    return out


def test_doctor_reads_a_real_trl_trainer_state(trl_run: Path) -> None:
    result = CliRunner().invoke(app, ["doctor", str(trl_run), "--json"])
    # 6 steps lie inside every baselined detector's warm-up: no critical finding, and the doctor says it could not
    # judge (exit 3) instead of reassuring
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    unchecked = {name: c["why"] for name, c in doc["coverage"].items() if not c["checked"]}
    assert {"entropy_collapse", "reward_collapse", "grad_norm_spike"} <= set(unchecked), unchecked
    assert doc["format"] == "trl" and doc["steps"] == STEPS
    assert doc["path"] == str(trl_run / f"checkpoint-{STEPS}" / "trainer_state.json")
    mapped = doc["mapped_keys"]
    for key, name in (
        ("reward", "reward_mean"),
        ("reward_std", "reward_std"),
        ("frac_reward_zero_std", "frac_zero_std_groups"),
        ("entropy", "entropy"),
        ("kl", "kl_ref"),
        ("clip_ratio/region_mean", "clip_frac"),
        ("grad_norm", "grad_norm"),
        ("completions/mean_length", "length_mean"),
        ("completions/clipped_ratio", "truncated_frac"),
    ):
        assert mapped.get(key) == name, (key, mapped)
    assert doc["unrecognised_keys"] == [], doc["unrecognised_keys"]
    assert all(f["severity"] != "critical" for f in doc["findings"])


def test_doctor_table_and_report_on_the_real_run(trl_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    state = trl_run / f"checkpoint-{STEPS}" / "trainer_state.json"
    result = runner.invoke(app, ["doctor", str(state), "--html", str(tmp_path / "doctor.html")])
    assert result.exit_code == 3 and "could not judge" in result.stdout, result.output
    assert f"trl, {STEPS} steps (1 to {STEPS})" in result.stdout
    assert (tmp_path / "doctor.html").is_file()
    result = runner.invoke(app, ["report", str(trl_run), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    for name in ("reward_mean", "entropy", "kl_ref", "grad_norm"):
        assert (tmp_path / "report" / f"report_{name}.png").is_file(), name


class _LearningRateJump(TrainerCallback):
    """From ``step`` on, the constant scheduler's learning rate is ``lr``: a healthy start, then a collapse."""

    def __init__(self, step: int, lr: float) -> None:
        self.step, self.lr = step, lr

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.global_step == self.step:
            scheduler = kwargs["lr_scheduler"]
            scheduler.base_lrs = [self.lr for _ in scheduler.base_lrs]


def test_doctor_finds_the_entropy_collapse_of_a_real_run(tmp_path: Path) -> None:
    """24 steps at lr 1e-3 (past the entropy detector's 20-step warm-up), then lr 3.0: the policy turns
    deterministic (entropy 0) within a few steps; the doctor must say so, critical, after the jump."""
    jump, steps = 24, 34
    model_dir = save_tiny_llama(tmp_path / "model")
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        **cpu_training_arguments(),
        use_vllm=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        beta=0.04,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=addition_reward,
        args=args,
        train_dataset=addition_dataset(256),
        callbacks=[_LearningRateJump(jump, 3.0)],
    )
    trainer.train()
    trainer.save_state()
    result = CliRunner().invoke(app, ["doctor", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 1, result.output
    found = {f["detector"]: f for f in json.loads(result.stdout)["findings"]}
    assert "entropy_collapse" in found, found
    assert found["entropy_collapse"]["severity"] == "critical"
    assert jump < found["entropy_collapse"]["step"] <= steps
