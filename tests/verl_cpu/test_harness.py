"""The verl CPU harness without Ray: registration, the gloo fix, the version gate, the overrides against verl's own
config, and the rollout server's sampling, log-probs and weight loading."""

from __future__ import annotations

import asyncio
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="needs verl (pip install 'rlguard[verl]')")
pytest.importorskip("transformers", reason="needs transformers")

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # verl imports ray.experimental.state, deprecated by Ray
    import rlguard.verl_cpu as verl_cpu
    from rlguard.verl_cpu.example import compute_score, example_overrides, write_example


def test_registered_in_verls_registries() -> None:
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from rlguard.verl_cpu.platform import PlatformCPU
    from rlguard.verl_cpu.rollout import HFReplica, HFServerAdapter

    assert PlatformRegistry.get("cpu") is PlatformCPU
    assert get_rollout_replica_class("hf") is HFReplica
    assert get_rollout_class("hf", "async") is HFServerAdapter
    platform = PlatformCPU()
    assert (platform.current_device(), platform.communication_backend_name()) == ("cpu", "gloo")
    assert platform.ray_resource_options(1) == {"num_gpus": 1}  # logical GPUs as worker slots


def test_gloo_backend_deduplicated(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl builds "cpu:gloo,cpu:gloo" on CPU, which torch refuses; the wrapper asks for "cpu:gloo" instead."""
    import verl.utils.device as device

    seen: list[Any] = []

    def original(timeout_second: Any = None, backend: str | None = None) -> None:
        seen.append(backend)

    wrapped = verl_cpu._dedupe_backend(original)
    monkeypatch.setattr(device, "get_device_name", lambda: "cpu")
    wrapped()
    wrapped(backend="cpu:gloo,cpu:custom")  # an explicit backend is left alone
    monkeypatch.setattr(device, "get_device_name", lambda: "cuda")
    wrapped()
    assert seen == ["cpu:gloo", "cpu:gloo,cpu:custom", None]
    with pytest.raises(ValueError, match="Duplicate device type cpu"):  # what the fix avoids
        torch.distributed.init_process_group(
            "cpu:gloo,cpu:gloo",
            rank=0,
            world_size=1,
            store=torch.distributed.HashStore(),  # type: ignore[attr-defined]
        )
    import verl.utils.distributed as distributed

    assert getattr(distributed.initialize_global_process_group_ray, "rlguard_cpu", False)


def test_version_gate_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verl_cpu, "version", lambda name: "0.10.2")
    with pytest.raises(RuntimeError, match=r"supports verl >=0.9.1,<0.10.*found verl 0.10.2.*pip install"):
        verl_cpu.check_verl()
    monkeypatch.undo()
    import verl.workers.rollout.base as rollout_base

    monkeypatch.delattr(rollout_base, "_ROLLOUT_REGISTRY")
    with pytest.raises(RuntimeError, match="_ROLLOUT_REGISTRY"):
        verl_cpu.check_verl()


def test_overrides_compose_with_verls_config(tmp_path: Path) -> None:
    """Every override of a CPU run and of the example resolves in verl's own ppo_trainer.yaml."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    overrides = example_overrides(tmp_path) + verl_cpu.cpu_overrides(2)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    assert cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.trainer.n_gpus_per_node == 2 and cfg.ray_kwargs.ray_init.num_gpus == 2
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    with pytest.raises(ValueError, match="workers must be >= 1; got 0"):
        verl_cpu.cpu_overrides(0)


def test_compute_score() -> None:
    assert compute_score("rlguard/addition", "12", "12") == 1.0
    assert compute_score("rlguard/addition", "21", "12") == 0.5  # both digits, wrong order
    with pytest.raises(ValueError, match="data_source 'rlguard/addition'; got 'gsm8k'"):
        compute_score("gsm8k", "12", "12")


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_example(tmp_path_factory.mktemp("example"), n_train=8, n_val=2)


def _server(model_dir: Path) -> Any:
    from verl.workers.config import HFModelConfig

    from rlguard.verl_cpu.rollout import HFRolloutServer

    config = types.SimpleNamespace(prompt_length=8, response_length=4, seed=0)
    return HFRolloutServer(config, HFModelConfig(path=str(model_dir)), replica_rank=0)


def test_example_prompts_tokenize_as_bos_plus_characters(example: Path) -> None:
    import pandas as pd
    from transformers import AutoTokenizer

    from rlguard.tasks.tiny import CharTokenizer

    row = pd.read_parquet(example / "train.parquet").iloc[0]
    tokenizer = AutoTokenizer.from_pretrained(example / "model")
    ids = tokenizer.apply_chat_template(list(row["prompt"]), tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids  # type: ignore[call-overload,index]
    chars = CharTokenizer()
    assert list(ids) == [chars.BOS, *chars.encode(row["prompt"][0]["content"])]


def test_rollout_server_logprobs_and_weights(example: Path) -> None:
    """The server's log-probs are the model's at temperature T, and loading new weights changes what it samples from;
    ``extra_fields["global_steps"]`` is an int (verl's V1 trainer calls int() on it)."""
    server = _server(example / "model")
    prompt = [1, *range(3, 7)]
    out = asyncio.run(server.generate(prompt, {"temperature": 0.7, "logprobs": True}, request_id="a"))
    assert 1 <= len(out.token_ids) <= 4 and out.extra_fields == {"global_steps": 0}
    with torch.no_grad():
        ids = torch.tensor([prompt + out.token_ids])
        logits = server.model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7  # (R, V)
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids).unsqueeze(-1)).squeeze(-1)
    assert out.log_probs == pytest.approx(expected.tolist(), abs=1e-5)
    no_logprobs = asyncio.run(server.generate(prompt, {"temperature": 1.0}, request_id="b"))
    assert no_logprobs.log_probs is None

    state = {k: torch.zeros_like(v) for k, v in server.model.state_dict().items()}
    assert asyncio.run(server.update_weights(state, 7)) == 1
    after = asyncio.run(server.state())
    assert after["global_steps"] == 7 and all(float(v.abs().sum()) == 0.0 for v in after["weights"].values())
    greedy = asyncio.run(server.generate(prompt, {"temperature": 0.0, "logprobs": True}, request_id="c"))
    assert greedy.extra_fields["global_steps"] == 7
    # zero weights: uniform logits, log-prob -log(V) for every token
    vocab = server.model.config.vocab_size
    assert greedy.log_probs == pytest.approx([-float(torch.log(torch.tensor(float(vocab))))] * len(greedy.log_probs))
    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(server.generate(prompt, {}, request_id="d", image_data=[object()]))
