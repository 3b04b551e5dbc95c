"""What a collapse-benchmark run is: the stressors, the run configuration and the result.

See :mod:`rlguard.bench.collapse` for the design, the stressors and the collapse definition.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from rlguard.bench.collapse.verdict import CollapseVerdict, trailing_mean
from rlguard.core_losses import get_objective

OBJECTIVES: tuple[str, ...] = ("grpo", "dapo", "gspo")


GUARDS: tuple[str, ...] = ("off", "default", "stable")


STRESSORS: tuple[str, ...] = ("none", "mismatch", "high_lr", "stale", "moe")


GuardName = Literal["off", "default", "stable"]


class RunFields(Protocol):
    """The fields of a run configuration that :func:`check_run_fields` checks (both benchmarks' ``RunConfig``)."""

    @property
    def objective(self) -> str: ...
    @property
    def guard(self) -> str: ...
    @property
    def num_prompts(self) -> int: ...
    @property
    def minibatches(self) -> int: ...
    @property
    def iterations(self) -> int: ...


def check_run_fields(config: RunFields, guards: Iterable[str]) -> None:
    """The checks both collapse benchmarks' ``RunConfig`` make: a known objective, a guard among ``guards``,
    ``num_prompts`` divisible by ``minibatches``, at least one rollout batch. Raises ``ValueError`` naming the
    field, its value and what is accepted."""
    get_objective(config.objective)  # unknown name -> ValueError listing the names
    if config.guard not in guards:
        raise ValueError(f"guard must be one of {list(guards)}; got {config.guard!r}.")
    if config.minibatches < 1 or config.num_prompts % config.minibatches:
        raise ValueError(
            f"num_prompts ({config.num_prompts}) must be divisible by minibatches ({config.minibatches}), "
            "which must be >= 1."
        )
    if config.iterations < 1:
        raise ValueError(f"iterations must be >= 1; got {config.iterations}.")


def _cpu() -> str:
    """``vendor family/model/stepping (model name)`` from /proc/cpuinfo, or :func:`platform.processor`."""
    info: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if not line.strip():
                break  # the first processor is enough
            name, _, value = line.partition(":")
            info.setdefault(name.strip(), value.strip())
    if "vendor_id" not in info:
        return platform.processor() or platform.machine()
    fms = "/".join(info.get(k, "?") for k in ("cpu family", "model", "stepping"))
    return f"{info['vendor_id']} {fms} ({info.get('model name', '?')})"


def numerics() -> dict[str, str]:
    """What, besides the code and the config, decides a run's floating-point results: the torch build, the CPU
    kernels ATen dispatches to, the CPU (MKL picks its kernels by CPU model), MKL's reproducibility mode and the
    thread count. A run is chaotic: a last-bit difference at the first step (another CPU) grows into a different
    curve within 50-100 batches, so curves are comparable bit for bit only between equal fingerprints."""
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpu(),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "threads": str(torch.get_num_threads()),
    }


# the fields of :func:`numerics` that change kernels; the thread count is recorded, not compared (the grid runs one
# thread per run, and these models are too small for ATen to split an op across threads)
NUMERICS_COMPARED: tuple[str, ...] = ("torch", "cpu_capability", "cpu", "mkl_cbwr")


def same_numerics(recorded: dict[str, str], here: dict[str, str]) -> bool:
    """Whether a run recorded under ``recorded`` (:func:`numerics`; empty for old rows) should reproduce bit for
    bit under ``here``. An empty fingerprint is never the same: nothing says where that run was made."""
    return bool(recorded) and all(recorded.get(k) == here.get(k) for k in NUMERICS_COMPARED)


@dataclass(frozen=True)
class Stressor:
    """One documented cause of collapse and its strength (see the module docstring).

    Attributes:
        name: ``none``, ``mismatch``, ``high_lr``, ``stale`` or ``moe``.
        mismatch_noise: rollout-engine weight noise, times each tensor's RMS (``mismatch``).
        mismatch_bf16: the engine computes its log-probs from bfloat16 logits (``mismatch``).
        lr_multiplier: learning-rate factor (``high_lr``).
        stale_steps: age in rollout batches of the policy that samples (``stale``).
        router_noise: rollout-engine router weight noise, times the router's RMS (``moe``).
    """

    name: str = "none"
    mismatch_noise: float = 0.3
    mismatch_bf16: bool = True
    lr_multiplier: float = 5.0
    stale_steps: int = 8
    router_noise: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in STRESSORS:
            raise ValueError(f"stressor must be one of {list(STRESSORS)}; got {self.name!r}.")
        for knob in ("mismatch_noise", "router_noise"):
            if not getattr(self, knob) >= 0:
                raise ValueError(f"{knob} must be >= 0; got {getattr(self, knob)!r}.")
        if not self.lr_multiplier > 0:
            raise ValueError(f"lr_multiplier must be > 0; got {self.lr_multiplier!r}.")
        if self.stale_steps < 0:
            raise ValueError(f"stale_steps must be >= 0 (0 is on-policy); got {self.stale_steps!r}.")


@dataclass(frozen=True)
class RunConfig:
    """One training run of the grid.

    Attributes:
        objective: objective name for :func:`~rlguard.core_losses.get_objective` (its paper's defaults).
        guard: ``off``, or the preset of :class:`~rlguard.guards.GuardConfig` that acts (``default``, ``stable``).
        stressor: the perturbation.
        seed: seeds the model, the warm start, the prompts and the sampling.
        iterations: rollout batches.
        num_prompts, group_size: prompts per batch and completions per prompt.
        minibatches: optimizer steps per rollout batch (each on ``num_prompts / minibatches`` prompts).
        lr: Adam learning rate (before the stressor's multiplier).
        max_grad_norm: gradient clipping, as TRL's default.
        hidden: model width.
        warm_start_steps: supervised steps before RL (0: none).
        window, warmup, min_peak, drop, entropy_drop, solved: the collapse definition's constants.
    """

    objective: str = "grpo"
    guard: GuardName = "off"
    stressor: Stressor = field(default_factory=Stressor)
    seed: int = 0
    iterations: int = 100
    num_prompts: int = 8
    group_size: int = 8
    minibatches: int = 2
    lr: float = 7e-3
    max_grad_norm: float = 1.0
    hidden: int = 32
    warm_start_steps: int = 100
    warm_start_lr: float = 1e-2
    window: int = 10
    warmup: int = 0
    min_peak: float = 0.3
    drop: float = 0.5
    entropy_drop: float = 0.1
    solved: float = 0.95

    def __post_init__(self) -> None:
        check_run_fields(self, GUARDS)


@dataclass
class RunResult:
    """One run's outcome; :meth:`row` is its CSV row. Curves are per rollout batch; ``numerics`` is the
    :func:`numerics` fingerprint of the process that ran it (empty for runs recorded before it existed)."""

    config: RunConfig
    rewards: list[float]
    entropies: list[float]
    verdict: CollapseVerdict
    skips: int = 0
    rollbacks: int = 0
    lr_backoffs: int = 0
    clip_changes: int = 0
    halted: bool = False
    nonfinite: bool = False
    clip_frac_mean: float = 0.0
    wall_s: float = 0.0
    numerics: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The run with its curves, for ``runs.jsonl`` (:meth:`from_json` reads it back)."""
        data = {k: getattr(self, k) for k in ("rewards", "entropies", "skips", "rollbacks", "lr_backoffs")}
        data |= {k: getattr(self, k) for k in ("clip_changes", "halted", "nonfinite", "clip_frac_mean", "wall_s")}
        if self.numerics:
            data["numerics"] = dict(self.numerics)
        config = dataclasses.asdict(self.config)
        return {"config": config, "verdict": dataclasses.asdict(self.verdict), **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        """Inverse of :meth:`to_json`."""
        config = dict(data["config"])
        config["stressor"] = Stressor(**config["stressor"])
        rest = {k: v for k, v in data.items() if k not in ("config", "verdict")}
        return cls(config=RunConfig(**config), verdict=CollapseVerdict(**data["verdict"]), **rest)

    def row(self) -> dict[str, Any]:
        """The CSV row (one per run)."""
        final = trailing_mean(self.rewards, self.config.window)
        return {
            "objective": self.config.objective,
            "guard": self.config.guard,
            "stressor": self.config.stressor.name,
            "seed": self.config.seed,
            "collapsed": int(self.verdict.collapsed),
            "collapse_reason": self.verdict.reason,
            "collapse_step": "" if self.verdict.step is None else self.verdict.step,
            "final_reward": round(final[-1], 4) if final else math.nan,
            "peak_reward": round(max(final), 4) if final else math.nan,
            "start_reward": round(final[min(len(final), self.config.window) - 1], 4) if final else math.nan,
            "iterations_run": len(self.rewards),
            "skips": self.skips,
            "rollbacks": self.rollbacks,
            "lr_backoffs": self.lr_backoffs,
            "clip_changes": self.clip_changes,
            "halts": int(self.halted),
            "nonfinite": int(self.nonfinite),
            "clip_frac_mean": round(self.clip_frac_mean, 5),
            "wall_s": round(self.wall_s, 2),
        }
