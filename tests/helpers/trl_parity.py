"""Parity with TRL's real ``GRPOTrainer._compute_loss``: a ``GuardedGRPOTrainer`` built from a real config, float64
inputs whose log-probs and entropies are functions of one leaf ``theta`` (the stub both losses share), and the
comparison of stock TRL's loss, gradient and metrics with rlguard's. Imports TRL: import it after
``pytest.importorskip("trl")``."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from trl.trainer.grpo_trainer import GRPOTrainer

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments

RTOL, ATOL = 1e-6, 1e-12
B, T, P = 8, 6, 3
# per row: completion length, advantage sign, log-ratio scale, and whether the ratio moves towards sign(A) (where the
# clip binds) or away from it (the unclipped branch, and the dual clip for A < 0)
LENGTHS = (T, 1, 0, 4, T, 2, 5, 3)  # full, one token, empty, ...
ADV_SIGNS = (1, 1, 1, -1, -1, -1, -1, 1)
SCALES = (0.5, 0.05, 0.3, 0.5, 0.02, 1.2, 0.3, 0.25)
TOWARDS = (1, 1, 1, -1, 1, 1, -1, 1)
GA, SPG = 2, 4

BASE: dict[str, Any] = {
    **cpu_training_arguments(),
    "use_vllm": False,
    "per_device_train_batch_size": B,
    "num_generations": 2,
    "max_completion_length": T + 2,  # the generation budget exceeds the padded width, as it does in TRL batches
    "gradient_accumulation_steps": GA,
    "steps_per_generation": SPG,
    "save_strategy": "no",
    "disable_tqdm": True,
}

_TRAINERS: dict[tuple[Any, ...], GuardedGRPOTrainer] = {}


def config(tmp: Path | str = "unused", *, expect: tuple[str, ...] = (), **overrides: Any) -> GuardedGRPOConfig:
    """A config; the UserWarnings it emits must match ``expect`` (regexes), one each, in any order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = GuardedGRPOConfig(output_dir=str(tmp), **{**BASE, **overrides})
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    unexpected = [m for m in messages if not any(_search(p, m) for p in expect)]
    missing = [p for p in expect if not any(_search(p, m) for m in messages)]
    assert not unexpected and not missing, f"unexpected warnings {unexpected}, missing {missing}"
    return args


def _search(pattern: str, text: str) -> bool:
    return re.search(pattern, text) is not None


def trainer_for(model_dir: Path, expect: tuple[str, ...] = (), **overrides: Any) -> GuardedGRPOTrainer:
    """A GuardedGRPOTrainer on the tiny model (cached per config), in training mode, GA set as Trainer does."""
    key = (str(model_dir), tuple(sorted((k, repr(v)) for k, v in overrides.items())))
    if key not in _TRAINERS:
        args = config(model_dir.parent / "out", expect=expect, **overrides)
        _TRAINERS[key] = GuardedGRPOTrainer(
            model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(8)
        )
    trainer = _TRAINERS[key]
    trainer.model.train()  # type: ignore[union-attr]
    trainer.current_gradient_accumulation_steps = GA  # set by Trainer's training loop
    for mode in ("train", "eval"):
        trainer._metrics[mode].clear()
    return trainer


def make_inputs(
    seed: int,
    *,
    old: bool = True,
    ref: bool = True,
    sampling: bool = False,
    token_adv: bool = False,
    tool_mask: bool = False,
) -> tuple[torch.Tensor, dict[str, Any], Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    """``(theta, inputs, policy)``: ``policy()`` returns fresh ``(logprobs, entropies)`` (B, T) from ``theta``."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)

    def policy() -> tuple[torch.Tensor, torch.Tensor]:
        return -F.softplus(theta) - 0.05, 1.5 * torch.sigmoid(theta)

    logprobs = policy()[0].detach()
    completion_mask = (torch.arange(T).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).long()  # (B, T)
    signs = torch.tensor(ADV_SIGNS, dtype=torch.float64).unsqueeze(1)  # (B, 1)
    drift = (torch.tensor(SCALES, dtype=torch.float64) * torch.tensor(TOWARDS)).unsqueeze(1) * signs  # (B, 1)
    log_ratio = drift * (0.5 + torch.rand(B, T, generator=g, dtype=torch.float64))  # (B, T) log pi/pi_old
    advantages = signs * (0.5 + torch.rand(B, T if token_adv else 1, generator=g, dtype=torch.float64))
    advantages = advantages if token_adv else advantages.squeeze(-1)
    inputs: dict[str, Any] = {
        "prompt_ids": torch.randint(3, 15, (B, P), generator=g),
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(3, 15, (B, T), generator=g),
        "completion_mask": completion_mask,
        "advantages": advantages,
        # the generation batch holds SPG micro-batches on every process: more tokens than this one
        "num_items_in_batch": completion_mask.sum() * SPG + 3,
    }
    if old:
        inputs["old_per_token_logps"] = logprobs - log_ratio
    if ref:
        inputs["ref_per_token_logps"] = logprobs + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    if sampling:
        base = inputs.get("old_per_token_logps", logprobs)
        inputs["sampling_per_token_logps"] = base + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    if tool_mask:
        inputs["tool_mask"] = (torch.rand(B, T, generator=g) > 0.3).long()
    return theta, inputs, policy


def run(
    trainer: GuardedGRPOTrainer,
    fn: Callable[..., torch.Tensor],
    theta: torch.Tensor,
    inputs: dict[str, Any],
    policy: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    aux: Callable[[], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, d loss / d theta)`` of ``fn(trainer, model, inputs)`` with the shared log-prob stub."""

    def stub(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        logprobs, entropies = policy()
        return logprobs, entropies, None if aux is None else aux()

    trainer._get_per_token_logps_and_entropies = stub  # type: ignore[method-assign]
    try:
        loss = fn(trainer, trainer.model, inputs)
        (grad,) = torch.autograd.grad(loss, theta)
    finally:
        del trainer._get_per_token_logps_and_entropies
    return loss.detach(), grad


def assert_parity(
    trainer: GuardedGRPOTrainer, seed: int = 0, **input_options: Any
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Stock TRL and rlguard on the same inputs: equal loss and gradient. Returns TRL's loss and metrics."""
    theta, inputs, policy = make_inputs(seed, **input_options)
    mode = "train" if trainer.model.training else "eval"  # type: ignore[union-attr]
    trainer._metrics[mode].clear()
    trl_loss, trl_grad = run(trainer, GRPOTrainer._compute_loss, theta, inputs, policy)
    trl_metrics = {k: list(v) for k, v in trainer._metrics[mode].items()}
    trainer._metrics[mode].clear()
    ours_loss, ours_grad = run(trainer, GuardedGRPOTrainer._compute_loss, theta, inputs, policy)
    ours_metrics = {k: list(v) for k, v in trainer._metrics[mode].items()}
    assert_trl_metrics_kept(trl_metrics, ours_metrics)
    assert trl_loss.dtype == torch.float64
    assert trl_grad.abs().sum() > 0, "degenerate case: TRL's gradient is zero"
    torch.testing.assert_close(ours_loss, trl_loss.to(ours_loss.dtype), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ours_grad, trl_grad, rtol=RTOL, atol=ATOL)
    return trl_loss, trl_metrics


def assert_trl_metrics_kept(trl: dict[str, list[float]], ours: dict[str, list[float]]) -> None:
    """Every key TRL's loss logs is logged by rlguard with TRL's value (its meaning kept), NaN where TRL's is."""
    missing = sorted(set(trl) - set(ours))
    assert not missing, f"TRL's keys {missing} are not logged by GuardedGRPOTrainer"
    for key, values in trl.items():
        torch.testing.assert_close(
            torch.tensor(ours[key], dtype=torch.float64),
            torch.tensor(values, dtype=torch.float64),
            rtol=RTOL,
            atol=ATOL,
            equal_nan=True,
            msg=lambda m, key=key: f"{key}: {m}",  # type: ignore[misc]
        )


def assert_some_clipped(metrics: dict[str, list[float]], key: str = "clip_ratio/region_mean") -> None:
    (value,) = metrics[key]
    assert 0.0 < value < 1.0, f"{key}={value}: the clip range should bind on some tokens and not on others"
