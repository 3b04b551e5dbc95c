"""Poisoned micro-batches in verl's own CPU engine, guarded and not: one process, one engine, several updates.

Run as ``torchrun --nproc_per_node=1 integration_tests/verl_guard_worker.py OUT_JSON``. It builds verl's
``TrainingWorker`` (FSDP2, gloo) as ``verl_worker.py`` does, then runs one optimizer step (one mini-batch of 4
sequences, micro-batches of 1) per case from the same initial weights and optimizer state, switching the loss
with verl's ``set_loss_fn``, the channel the guard's driver uses:

- ``clean_plain`` / ``clean_guarded``: the clean batch under ``rlguard.gspo`` and under the guarded config;
- ``poisoned_guarded``: sequence 2 has NaN advantages (a NaN score) and a NaN old log-prob;
- ``without``: the clean sequences only (0, 1, 3), unguarded, with the mini-batch's ``global_batch_size`` of 4:
  the run without the poisoned micro-batch, at the step's normaliser;
- ``poisoned_verl_gspo``: the poisoned batch under verl's own ``gspo`` loss;
- ``poisoned_raise``: the poisoned batch under ``rlguard.gspo`` with ``on_nonfinite=raise``;
- ``clip_guarded`` / ``clip_plain``: the guarded loss with ``clip_scale=0.5`` vs verl's clip ratios halved.

- ``poisoned_old_guarded``: sequence 2 has one NaN old log-prob instead.

Rank 0 writes each case's metrics (or error) and the max |difference| of weights and of gradients between cases.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from functools import partial
from typing import Any

import torch

os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", "rlguard.adapters.verl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import verl_worker  # the CPU platform and engine registration happen on import
from verl_worker import global_batch, old_log_probs, tiny_model_dir, to_no_padding

ROWS = 4  # one mini-batch: one optimizer step of 4 micro-batches
POISONED = 2  # the sequence (and micro-batch) that is poisoned
GUARDED = "rlguard.adapters.verl.GuardedPolicyLossConfig"
_BASE_OVERRIDES = verl_worker.actor_overrides


def guarded_overrides(model_dir: str) -> list[str]:
    """verl_worker's overrides with this module's policy-loss config (clip range wide enough to act rarely)."""
    keep = [o for o in _BASE_OVERRIDES(model_dir) if "policy_loss." not in o]
    return [
        *keep,
        "actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo",
        f"actor_rollout_ref.actor.policy_loss._target_={GUARDED}",
        "+actor_rollout_ref.actor.policy_loss.max_poisoned_frac=0.5",
    ]


def snapshot(engine: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.module.parameters()]


def restore(engine: Any, weights: list[torch.Tensor]) -> None:
    """Initial weights back and a fresh optimizer state (AdamW starts from empty state on its next step)."""
    with torch.no_grad():
        for p, w in zip(engine.module.parameters(), weights, strict=True):
            p.copy_(w)
    engine.optimizer.state.clear()
    engine.optimizer.zero_grad()


def local_weights(engine: Any) -> list[torch.Tensor]:
    """Copies of the full weights (``full_tensor`` of a one-rank DTensor is its storage, not a copy)."""
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in engine.module.parameters()]


def record_grads(engine: Any, into: list[list[torch.Tensor]]) -> None:
    """Append a copy of the (clipped) gradients each ``optimizer.step()`` receives to ``into``."""

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in engine.module.parameters()]
        into.append([(g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone() for g in grads])

    engine.optimizer.register_step_pre_hook(hook)


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))


def train(worker: Any, batch: dict[str, torch.Tensor], loss_config: Any) -> dict[str, Any]:
    """One mini-batch of ``len(batch)`` rows, normalised as a mini-batch of ROWS (verl's ``global_batch_size``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    worker.set_loss_fn(partial(ppo_loss, config=loss_config))
    rows = len(batch["input_ids"])
    data = to_no_padding(batch)
    tu.assign_non_tensor(
        data,
        calculate_entropy=False,
        global_batch_size=ROWS,
        mini_batch_size=rows,
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
        temperature=1.0,
    )
    try:
        output = worker.train_mini_batch(data)
    except ValueError as err:
        return {"error": str(err)}
    metrics = tu.get(output, "metrics")
    return {key: verl_worker._plain(value) for key, value in metrics.items()}


def main(out_path: str) -> None:
    torch.distributed.init_process_group("gloo")
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model_dir(os.path.join(tmp, "model"))
        start = time.perf_counter()
        verl_worker.actor_overrides = guarded_overrides  # build_actor composes these
        worker, guarded = verl_worker.build_actor(model_dir)
        built = time.perf_counter()
        engine = worker.engine
        initial = snapshot(engine)
        stepped: list[list[torch.Tensor]] = []
        record_grads(engine, stepped)

        full = {key: value[:ROWS] for key, value in global_batch().items()}
        noise = 0.05 * torch.randn(ROWS, full["responses"].shape[1], generator=torch.Generator().manual_seed(2))
        full["old_log_probs"] = (old_log_probs(worker, full) + noise) * full["response_mask"]
        poisoned = {key: value.clone() for key, value in full.items()}
        poisoned["advantages"][POISONED] = float("nan")  # a NaN score gives its sequence NaN advantages
        poisoned_old = {key: value.clone() for key, value in full.items()}
        poisoned_old["old_log_probs"][POISONED, 1] = float("nan")
        clean_rows = [r for r in range(ROWS) if r != POISONED]
        without = {key: value[clean_rows] for key, value in full.items()}

        policy = guarded.policy_loss
        plain_policy = verl_worker_plain_policy(policy)
        plain = dataclasses.replace(guarded, policy_loss=plain_policy)
        raising = dataclasses.replace(guarded, policy_loss=dataclasses.replace(plain_policy, on_nonfinite="raise"))
        native = omega_conf_to_dataclass(
            _compose(compose, initialize_config_dir, model_dir, ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"])
        )
        native = dataclasses.replace(guarded, policy_loss=native.policy_loss)
        halved = dataclasses.replace(
            plain, clip_ratio_low=guarded.clip_ratio_low * 0.5, clip_ratio_high=guarded.clip_ratio_high * 0.5
        )
        clip_guarded = dataclasses.replace(
            guarded, policy_loss=dataclasses.replace(policy, controls={"clip_scale": 0.5})
        )

        cases = {
            "clean_plain": (full, plain),
            "clean_guarded": (full, guarded),
            "poisoned_guarded": (poisoned, guarded),
            "poisoned_old_guarded": (poisoned_old, guarded),
            "without": (without, plain),
            "poisoned_verl_gspo": (poisoned, native),
            "poisoned_raise": (poisoned, raising),
            "clip_guarded": (full, clip_guarded),
            "clip_plain": (full, halved),
        }
        results: dict[str, Any] = {}
        weights: dict[str, list[torch.Tensor]] = {}
        grads: dict[str, list[torch.Tensor]] = {}
        for name, (batch, config) in cases.items():
            restore(engine, initial)
            stepped.clear()
            results[name] = train(worker, batch, config)
            weights[name] = local_weights(engine)
            results[name]["optimizer_steps"] = len(stepped)
            if stepped:
                grads[name] = stepped[-1]
            results[name]["finite"] = all(bool(torch.isfinite(w).all()) for w in weights[name])
        trained = time.perf_counter()
        init = [w.full_tensor() if hasattr(w, "full_tensor") else w for w in initial]
        pairs = {
            "poisoned_guarded-without": ("poisoned_guarded", "without"),
            "clean_guarded-clean_plain": ("clean_guarded", "clean_plain"),
            "without-clean_plain": ("without", "clean_plain"),
            "clip_guarded-clip_plain": ("clip_guarded", "clip_plain"),
            "clip_plain-clean_plain": ("clip_plain", "clean_plain"),
        }
        pairs["poisoned_old_guarded-without"] = ("poisoned_old_guarded", "without")
        diffs = {key: max_diff(weights[a], weights[b]) for key, (a, b) in pairs.items()}
        grad_diffs = {key: max_diff(grads[a], grads[b]) for key, (a, b) in pairs.items()}
        grad_max = {name: max(float(g.abs().max()) for g in grads[name]) for name in grads}
        diffs.update({f"{name}-initial": max_diff(weights[name], init) for name in cases})
        if torch.distributed.get_rank() == 0:
            with open(out_path, "w") as f:
                json.dump(
                    {
                        "cases": results,
                        "diffs": diffs,
                        "grad_diffs": grad_diffs,
                        "grad_max": grad_max,
                        "build_s": built - start,
                        "updates_s": trained - built,
                    },
                    f,
                )
    torch.distributed.destroy_process_group()


def verl_worker_plain_policy(policy: Any) -> Any:
    """The guarded config's settings as a plain RLGuardPolicyLossConfig (the unguarded ``rlguard.gspo``)."""
    from rlguard.adapters.verl import RLGuardPolicyLossConfig

    names = {f.name for f in dataclasses.fields(RLGuardPolicyLossConfig) if f.init}
    values = {name: getattr(policy, name) for name in names if name != "_target_"}
    return RLGuardPolicyLossConfig(**values, _target_="rlguard.adapters.verl.RLGuardPolicyLossConfig")


def _compose(compose: Any, initialize_config_dir: Any, model_dir: str, extra: list[str]) -> Any:
    import verl

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    overrides = [o for o in guarded_overrides(model_dir) if "policy_loss." not in o]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*overrides, *extra]).actor_rollout_ref.actor


if __name__ == "__main__":
    main(sys.argv[1])
