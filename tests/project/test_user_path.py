"""The TRL user's path, end to end: TRL's own example script ``trl/scripts/grpo.py`` (its ``TrlParser`` and
``main``) with rlguard's config class in place of ``GRPOConfig`` and ``GuardedGRPOTrainer`` in place of
``GRPOTrainer`` (the two edits a user makes to a copy of the script), driven by rlguard's flags from the command
line and from a YAML ``--config``, on the embedded tiny Llama and a local dataset (nothing is downloaded). Also the
install hint of each adapter whose framework is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import trl
from trl import DatasetMixtureConfig, ModelConfig, TrlParser
from trl.scripts import grpo as trl_grpo_script

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.guards import GuardConfig
from rlguard.tasks.hf import addition_dataset, checkpointing_argument, save_tiny_llama

STEPS = 2


class RecordingTrainer(GuardedGRPOTrainer):
    """``GuardedGRPOTrainer`` that keeps its instances, so the test can look at the trainer ``main`` built."""

    instances: list[GuardedGRPOTrainer] = []  # noqa: RUF012  # the test's record

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        RecordingTrainer.instances.append(self)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model and a local dataset folder (``train.jsonl``) that ``load_dataset`` reads offline."""
    root = tmp_path_factory.mktemp("user-path")
    data = root / "addition"
    data.mkdir()
    addition_dataset(16).to_json(str(data / "train.jsonl"))
    return {"model": save_tiny_llama(root / "model"), "data": data}


def run_trl_script(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> GuardedGRPOTrainer:
    """TRL's ``grpo.py``: its parser with ``GuardedGRPOConfig``, then its ``main`` with ``GuardedGRPOTrainer``."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(trl, "GRPOTrainer", RecordingTrainer)  # the script's `from trl import GRPOTrainer`
    RecordingTrainer.instances.clear()
    types = (trl_grpo_script.GRPOScriptArguments, GuardedGRPOConfig, ModelConfig, DatasetMixtureConfig)
    script_args, training_args, model_args, dataset_args = TrlParser(types).parse_args_and_config(  # type: ignore[arg-type]
        argv, fail_with_unknown_args=True
    )
    assert isinstance(training_args, GuardedGRPOConfig)
    trl_grpo_script.main(script_args, training_args, model_args, dataset_args)
    (trainer,) = RecordingTrainer.instances
    return trainer


def common_flags(inputs: dict[str, Path], out: Path) -> list[str]:
    """What any run of the script on this machine needs: model, data, reward, a CPU and a tiny budget."""
    return [
        "--model_name_or_path", str(inputs["model"]), "--dataset_name", str(inputs["data"]),
        "--reward_funcs", "rlguard.tasks.hf.addition_reward", "--output_dir", str(out),
        "--use_cpu", "--bf16", "False", f"--{checkpointing_argument()}", "False", "--report_to", "none",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
        "--max_steps", str(STEPS), "--logging_steps", "1", "--save_strategy", "no", "--disable_tqdm", "True",
    ]  # fmt: skip


def assert_paper_gspo_guarded(trainer: GuardedGRPOTrainer) -> None:
    """The run trained the paper's GSPO under an acting guard, and TRL's and rlguard's keys reached the logs."""
    kwargs = trainer.rlguard_mapping.kwargs
    assert (trainer.rlguard_mapping.objective, kwargs["clip_low"], kwargs["clip_high"]) == ("gspo", 3e-4, 4e-4)
    assert kwargs["aggregation"] == "seq-mean-token-mean"
    assert trainer.rlguard_guard is not None
    assert trainer.state.global_step == STEPS
    steps = [r for r in trainer.state.log_history if "train_runtime" not in r]
    assert len(steps) == STEPS  # one log per optimizer step
    for key in ("rlguard/clip_frac", "rlguard/guard/lr_scale", "clip_ratio/low_min", "clip_ratio/high_max", "reward"):
        assert key in steps[-1], key
    assert (Path(trainer.args.output_dir) / "model.safetensors").is_file()  # type: ignore[arg-type]  # the script saved the model


def test_trl_grpo_script_from_the_command_line(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [*common_flags(inputs, tmp_path / "cli"), "--objective", "gspo", "--guard", "default"]
    trainer = run_trl_script(argv, monkeypatch)
    assert trainer.args.guard == "default"  # type: ignore[attr-defined]
    assert_paper_gspo_guarded(trainer)


def test_trl_grpo_script_from_a_yaml_config(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "grpo.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            objective: gspo
            guard:
              preset: strict
              snapshot_interval: 3
            """
        )
    )
    trainer = run_trl_script([*common_flags(inputs, tmp_path / "yaml"), "--config", str(config)], monkeypatch)
    guard = trainer.args.guard  # type: ignore[attr-defined]
    assert isinstance(guard, GuardConfig) and guard.snapshot_interval == 3
    assert guard.detectors == GuardConfig.preset("strict").detectors
    assert_paper_gspo_guarded(trainer)
    # the JSON form on the command line overrides the YAML's guard
    argv = [*common_flags(inputs, tmp_path / "json"), "--config", str(config), "--guard", '{"snapshot_interval": 2}']
    types = (trl_grpo_script.GRPOScriptArguments, GuardedGRPOConfig, ModelConfig, DatasetMixtureConfig)
    _, args, _, _ = TrlParser(types).parse_args_and_config(argv)  # type: ignore[arg-type]
    assert isinstance(args.guard, GuardConfig) and args.guard.snapshot_interval == 2
    assert json.loads(args.to_json_string())["objective"] == "gspo"


def test_trl_grpo_script_with_trls_adaptive_entropy(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's own ``--use_adaptive_entropy`` flags through the script: the guard's controller runs in place of
    TRL's (an observe-only guard joins where none is configured), with TRL's settings: the entropy (about 2.7 nats
    on the tiny Llama) stays below the target 2.8, so the coefficient rises by delta at every step."""
    flags = ["--use_adaptive_entropy", "True", "--entropy_target", "2.8", "--entropy_coef_delta", "0.3"]
    trainer = run_trl_script([*common_flags(inputs, tmp_path / "ae"), *flags], monkeypatch)
    assert trainer.rlguard_guard is not None and "adaptive_entropy" in trainer.rlguard_guard.interventions
    steps = [r for r in trainer.state.log_history if "train_runtime" not in r]
    assert all(r["entropy"] < 2.8 for r in steps)
    assert [r["entropy_coef"] for r in steps] == pytest.approx([0.3 * (i + 1) for i in range(STEPS)], abs=1e-12)


BLOCKER = """
import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
import {adapter}
"""


@pytest.mark.parametrize(
    ("adapter", "missing", "hint"),
    [
        ("rlguard.adapters.trl", "trl", "rlguard.adapters.trl needs TRL: pip install 'rlguard[trl]'"),
        ("rlguard.adapters.trl", "transformers", "rlguard.adapters.trl needs transformers: pip install 'rlguard[trl]'"),
        ("rlguard.adapters.verl", "verl", "rlguard.adapters.verl needs verl: pip install 'rlguard[verl]'"),
    ],
)
def test_a_missing_framework_gives_an_install_hint(adapter: str, missing: str, hint: str) -> None:
    """``import rlguard.adapters.verl`` without verl gave a bare ModuleNotFoundError."""
    code = BLOCKER.format(missing=missing, adapter=adapter)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert f"ImportError: {hint}" in result.stderr.splitlines()[-1], result.stderr[-2000:]
