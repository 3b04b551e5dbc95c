"""One verl actor update on CPU with ``loss_mode=rlguard.gspo``, through verl's own ``TrainingWorker``.

Run under ``torchrun --nproc_per_node=N integration_tests/verl_worker.py OUT_JSON [MODEL_DIR]``; rank 0 writes the
metrics of every mini-batch to ``OUT_JSON``. Every process builds the same global batch (fixed seeds) and
verl's worker takes its data-parallel share, as the Ray dispatch would, so 1 and 2 processes must agree.

What it takes to run verl 0.9.1 on CPU (verl has no CPU platform and falls back to CUDA):
- a CPU platform (``rlguard.verl_cpu.platform.PlatformCPU``) registered with ``verl.plugin.platform`` before
  anything calls ``get_platform``, whose
  ``current_device()`` is ``"cpu"`` (verl moves tensors to it; ``0`` would mean cuda:0);
- verl's FSDP engine class registered for device ``"cpu"`` too (verl registers it for cuda and npu);
- ``torch.distributed.init_process_group("gloo")`` before verl's worker, which would build "cpu:gloo,cpu:gloo";
- ``attn_implementation="sdpa"`` (verl's default is flash_attention_2) and ``use_remove_padding=False``;
- with TRL >= 1.0 installed, rlguard's fix of verl's ``apply_monkey_patch`` (applied on import of the adapter).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import torch

# verl imports this module's losses on `import verl` (the documented alternative to the entry point).
os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", "rlguard.adapters.verl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from verl.plugin.platform import PlatformRegistry, set_platform

from rlguard.verl_cpu.platform import PlatformCPU

BATCH = 8  # sequences in the global batch (one prompt per group, rollout_n=1)
MINI_BATCH = 4  # sequences per mini-batch: two optimizer steps
MICRO_BATCH_PER_RANK = 1  # gradient accumulation inside each mini-batch
PROMPT_LEN, RESPONSE_LEN, VOCAB = 6, 10, 64


if PlatformRegistry.get("cpu") is not PlatformCPU:  # rlguard's CPU platform (rlguard.verl_cpu), without Ray
    PlatformRegistry.register(platform="cpu")(PlatformCPU)
set_platform(PlatformCPU())


def register_cpu_engine() -> None:
    """verl registers its FSDP engine for cuda and npu only; the same class runs on CPU over gloo."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    if "cpu" not in EngineRegistry._engines["language_model"]["fsdp2"]:
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
            FSDPEngineWithLMHead
        )


def tiny_model_dir(path: str) -> str:
    """A 2-layer Qwen2 with random weights (seed 0), saved with ``save_pretrained``; nothing is downloaded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def global_batch() -> dict[str, torch.Tensor]:
    """The same left-padded prompts and right-padded responses on every rank, as verl's trainer builds them."""
    g = torch.Generator().manual_seed(1)
    prompt_lens = torch.randint(2, PROMPT_LEN + 1, (BATCH,), generator=g)
    response_lens = torch.randint(3, RESPONSE_LEN + 1, (BATCH,), generator=g)
    prompts = torch.randint(1, VOCAB, (BATCH, PROMPT_LEN), generator=g)
    responses = torch.randint(1, VOCAB, (BATCH, RESPONSE_LEN), generator=g)
    prompt_mask = torch.arange(PROMPT_LEN).flip(0).unsqueeze(0) < prompt_lens.unsqueeze(1)  # left padding
    response_mask = torch.arange(RESPONSE_LEN).unsqueeze(0) < response_lens.unsqueeze(1)  # right padding
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    input_ids = torch.cat([prompts, responses], dim=1) * attention_mask
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    scores = torch.randn(BATCH, generator=g)
    advantages = (scores - scores.mean()) / (scores.std() + 1e-6)  # one advantage per sequence, as GRPO's
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "prompts": prompts * prompt_mask,
        "responses": responses * response_mask,
        "response_mask": response_mask.long(),
        "advantages": advantages.unsqueeze(1) * response_mask,
    }


def actor_overrides(model_dir: str) -> list[str]:
    """Hydra overrides of verl's ppo_trainer.yaml: what a user would put on the command line."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "+actor_rollout_ref.model.load_tokenizer=false",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH_PER_RANK}",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.actor.optim.lr=0.01",
        # RLGUARD_VERL_CLIP narrows the clip range (test_verl_run's GSPO parity needs its clip to act)
        f"actor_rollout_ref.actor.clip_ratio_low={os.environ.get('RLGUARD_VERL_CLIP', '0.02')}",
        f"actor_rollout_ref.actor.clip_ratio_high={os.environ.get('RLGUARD_VERL_CLIP', '0.03')}",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        # RLGUARD_VERL_OBJECTIVE picks another rlguard objective (integration_tests/test_verl_run.py)
        f"actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.{os.environ.get('RLGUARD_VERL_OBJECTIVE', 'gspo')}",
        "actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.RLGuardPolicyLossConfig",
        "+actor_rollout_ref.actor.policy_loss.on_nonfinite=raise",
    ]


def build_actor(model_dir: str) -> tuple[Any, Any]:
    """verl's TrainingWorker for the actor, configured as ActorRolloutRefWorker.init_model does; and its config."""
    from functools import partial

    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=actor_overrides(model_dir))
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor_config.model_config = model_config
    worker_config = TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=actor_config.engine,
        optimizer_config=actor_config.optim,
        checkpoint_config=actor_config.checkpoint,
    )
    engine = worker_config.engine_config
    engine.use_dynamic_bsz = False
    engine.infer_micro_batch_size_per_gpu = MICRO_BATCH_PER_RANK
    engine.micro_batch_size_per_gpu = MICRO_BATCH_PER_RANK
    engine.use_remove_padding = False
    register_cpu_engine()
    worker = TrainingWorker(config=worker_config)
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor_config))
    return worker, actor_config


def rank_rows(rank: int, world_size: int) -> list[int]:
    """Rows of the global batch this rank holds, so that mini-batch k of every run is rows [k*M, (k+1)*M)."""
    per_rank = MINI_BATCH // world_size
    return [k * MINI_BATCH + rank * per_rank + i for k in range(BATCH // MINI_BATCH) for i in range(per_rank)]


def to_no_padding(batch: dict[str, torch.Tensor]) -> Any:
    from tensordict import TensorDict
    from verl.workers.utils.padding import left_right_2_no_padding

    return left_right_2_no_padding(TensorDict(dict(batch), batch_size=[len(batch["input_ids"])]))


def old_log_probs(worker: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """pi_old's log-probs of the responses, as verl's trainer computes them (``_compute_old_log_prob``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    data = to_no_padding(batch)
    tu.assign_non_tensor(data, calculate_entropy=False, compute_loss=False, temperature=1.0)
    output = worker.infer_batch(data)
    return no_padding_2_padding(tu.get(output, "log_probs"), data).float()


def main(out_path: str, model_dir: str | None = None) -> None:
    torch.distributed.init_process_group("gloo")
    rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    with tempfile.TemporaryDirectory() as tmp:
        if model_dir is None:
            shared = [tiny_model_dir(os.path.join(tmp, "model")) if rank == 0 else None]
            torch.distributed.broadcast_object_list(shared, src=0)  # rank 0's directory, for every rank
            model_dir = str(shared[0])
        start = time.perf_counter()
        worker, _ = build_actor(model_dir)
        built = time.perf_counter()

        from verl.utils import tensordict_utils as tu

        full = global_batch()
        rows = rank_rows(rank, world_size)
        local = {key: value[rows] for key, value in full.items()}
        # a behaviour policy a little away from the current one, the same on every rank
        noise = 0.05 * torch.randn(BATCH, RESPONSE_LEN, generator=torch.Generator().manual_seed(2))
        local["old_log_probs"] = (old_log_probs(worker, local) + noise[rows]) * local["response_mask"]
        data = to_no_padding(local)
        tu.assign_non_tensor(
            data,
            calculate_entropy=False,
            global_batch_size=MINI_BATCH,
            mini_batch_size=MINI_BATCH,
            epochs=1,
            seed=0,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
            temperature=1.0,
        )
        output = worker.train_mini_batch(data)
        trained = time.perf_counter()
        metrics = tu.get(output, "metrics")
        if rank == 0:
            result = {
                "world_size": world_size,
                "trl": _trl_version(),
                "build_s": built - start,
                "update_s": trained - built,
                "metrics": {key: _plain(value) for key, value in metrics.items()},
            }
            with open(out_path, "w") as f:
                json.dump(result, f, indent=1)
    torch.distributed.destroy_process_group()


def _trl_version() -> str | None:
    """TRL's version when installed: verl's engine initialised beside it (TRL >= 1.0 needs rlguard's fix)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return None


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
