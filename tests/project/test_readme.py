"""Every quick start of the README runs as written: each code block is classified (tests/helpers/readme_blocks.py; a
block no test runs fails here), the TRL one trains on the embedded tiny Llama and a local dataset (its free names bound
to them, its config scaled to two optimizer steps on the CPU), the log one then judges that run's folder, the install,
make and benchmark lines name what exists, the links name files, and the verl CPU example prints the verl quick start.
The verl quick start runs in integration_tests/test_readme_verl.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.readme_blocks import README, ROOT, block, commands, readme_blocks

STEPS = 2


def test_every_block_is_a_known_quick_start_and_the_readme_is_short() -> None:
    kinds = [b.kind for b in readme_blocks()]
    assert sorted(kinds) == sorted(["install", "trl", "verl", "log", "make", "benchmark"])
    assert len(README.read_text().splitlines()) <= 200


def test_make_and_benchmark_lines_name_what_exists() -> None:
    """(The install lines are CI's own commands: tests/project/test_install_page.py.)"""
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    assert {words[1] for words in commands(block("make"))} <= targets
    for words in commands(block("benchmark")):
        assert (ROOT / words[1]).is_file()
        out = subprocess.run([sys.executable, words[1], "--help"], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0 and all(flag in out.stdout for flag in words[2:]), out.stderr


@pytest.fixture(scope="module")
def trl_quick_start(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The TRL block run as written in a fresh folder: ``model``, ``reward_funcs`` and ``dataset`` are the tiny
    model, the addition reward and a local dataset; ``GuardedGRPOConfig`` gets two CPU steps on top of the block's
    own arguments, and a checkpoint at the end (so that its folder holds TRL's ``trainer_state.json``)."""
    pytest.importorskip("trl")
    import rlguard.adapters.trl as trl_adapter
    from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

    folder = tmp_path_factory.mktemp("readme")
    real = trl_adapter.GuardedGRPOConfig
    tiny = {
        **cpu_training_arguments(),
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 4,
        "max_steps": STEPS,
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": STEPS,
        "disable_tqdm": True,
    }
    namespace: dict[str, Any] = {
        "model": str(save_tiny_llama(folder / "model")),
        "reward_funcs": addition_reward,
        "dataset": addition_dataset(16),
    }
    cwd = Path.cwd()
    os.chdir(folder)
    trl_adapter.GuardedGRPOConfig = lambda **kwargs: real(**{**tiny, **kwargs})  # type: ignore[misc,assignment]
    try:
        exec(compile(block("trl").code, str(README), "exec"), namespace)
    finally:
        trl_adapter.GuardedGRPOConfig = real  # type: ignore[misc]
        os.chdir(cwd)
    namespace["folder"] = folder
    return namespace


@pytest.mark.slow
def test_trl_quick_start_trains_the_paper_s_gspo_under_the_guard(trl_quick_start: dict[str, Any]) -> None:
    trainer = trl_quick_start["trainer"]
    mapping = trainer.rlguard_mapping
    assert (mapping.objective, mapping.kwargs["clip_low"], mapping.kwargs["clip_high"]) == ("gspo", 3e-4, 4e-4)
    assert trainer.rlguard_guard is not None and trainer.state.global_step == STEPS
    logged = [r for r in trainer.state.log_history if "train_runtime" not in r]
    assert len(logged) == STEPS and "rlguard/clip_frac" in logged[-1] and "rlguard/guard/lr_scale" in logged[-1]
    assert (trl_quick_start["folder"] / "out" / f"checkpoint-{STEPS}" / "trainer_state.json").is_file()


@pytest.mark.slow
def test_log_quick_start_judges_the_trl_run(trl_quick_start: dict[str, Any]) -> None:
    env = {**os.environ, "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))}
    for words in commands(block("log")):
        assert words[0] == "rlguard"
        done = subprocess.run(words, cwd=trl_quick_start["folder"], env=env, capture_output=True, text=True)
        # every logged step, from the metrics file the guarded trainer writes (not the last checkpoint's state): read
        # and mapped, but shorter than every detector's warm-up
        assert done.returncode == 3, done.stdout + done.stderr
        assert f"rlguard_metrics.jsonl: jsonl, {STEPS} steps" in done.stdout and "could not judge" in done.stdout


def test_every_relative_link_names_a_file_of_the_repository() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if not re.match(r"\w+://", link)]
    assert local, "the README links its docs pages"
    missing = [link for link in local if not (ROOT / link).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # verl imports ray.experimental.state, deprecated by Ray
def test_the_cpu_example_prints_the_verl_quick_start(tmp_path: Path) -> None:
    """``python -m rlguard.verl_cpu example DIR --guarded`` prints the README's verl command with the example's and
    the CPU's overrides in place of ``<your verl overrides>``."""
    pytest.importorskip("verl")
    from rlguard.verl_cpu.__main__ import GUARDED, LOSS_MODE, example_command

    printed = example_command(str(tmp_path), guarded=True)
    (readme,) = commands(block("verl"), {"your verl overrides": printed[3 : -1 - len(GUARDED)]})
    assert readme == printed and readme[-3:] == [LOSS_MODE, *GUARDED]
    stock = example_command(str(tmp_path), steps=2)
    assert stock[:3] == ["python", "-m", "verl.trainer.main_ppo"] and "trainer.total_training_steps=2" in stock
    assert LOSS_MODE in stock and not set(GUARDED) & set(stock)
