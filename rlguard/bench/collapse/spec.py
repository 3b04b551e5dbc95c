"""What a collapse-benchmark run is, whatever its task: the run configuration and stressor every task extends, the
rollout batch and trainer pass a task hands the loop, the result, and the numerics fingerprint.

A task (:mod:`rlguard.bench.collapse.tiny`, :mod:`rlguard.bench.collapse_long.spec`) subclasses
:class:`BaseRunConfig` with its model's fields and calibrated defaults, and implements the hooks the loop
(:func:`rlguard.bench.collapse.loop.run_one`) calls: :meth:`~BaseRunConfig.make_model`,
:meth:`~BaseRunConfig.warm_start`, :meth:`~BaseRunConfig.engine`, :meth:`~BaseRunConfig.sample` and
:meth:`~BaseRunConfig.trainer_pass`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import torch
from torch import Tensor, nn

from rlguard.bench.collapse.verdict import CollapseVerdict
from rlguard.core_losses import get_objective

GUARDS: tuple[str, ...] = ("off", "default", "stable")
GuardName = Literal["off", "default", "stable"]

#: where the objective's old log-probs (pi_old) come from. ``engine``: the inference engine's, as reported with
#: the samples (no recomputation). ``trainer``: recomputed by the trainer's model before the batch's first update,
#: as verl does by default (``actor.compute_log_prob``); the engine's are then the batch's ``rollout_logprobs``.
OLD_LOGPROBS: tuple[str, ...] = ("engine", "trainer")
OldLogprobs = Literal["engine", "trainer"]


@dataclass(frozen=True)
class BaseStressor:
    """One documented cause of collapse and its strength; a task subclasses it with its calibrated defaults and
    applies it in its engine (:meth:`BaseRunConfig.engine`).

    Attributes:
        name: one of the task's :attr:`NAMES`.
        lr_multiplier: learning-rate factor (``high_lr``).
        stale_steps: age in rollout batches of the policy that samples (``stale``).
        mismatch_noise: rollout-engine weight noise, times each tensor's RMS (``mismatch``).
        router_noise: rollout-engine router weight noise, times the router's RMS (``moe``).
    """

    NAMES: ClassVar[tuple[str, ...]] = ("none", "mismatch", "high_lr", "stale", "moe")
    #: the default grid's stressors (``--stressors`` unset): all of :attr:`NAMES` unless a task keeps some opt-in
    GRID: ClassVar[tuple[str, ...] | None] = None

    name: str = "none"
    lr_multiplier: float = 5.0
    stale_steps: int = 8
    mismatch_noise: float = 0.3
    router_noise: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in self.NAMES:
            raise ValueError(f"stressor must be one of {list(self.NAMES)}; got {self.name!r}.")
        for knob in ("mismatch_noise", "router_noise"):
            if not getattr(self, knob) >= 0:
                raise ValueError(f"{knob} must be >= 0; got {getattr(self, knob)!r}.")
        if not self.lr_multiplier > 0:
            raise ValueError(f"lr_multiplier must be > 0; got {self.lr_multiplier!r}.")
        if self.stale_steps < 0:
            raise ValueError(f"stale_steps must be >= 0 (0 is on-policy); got {self.stale_steps!r}.")

    @property
    def lr_factor(self) -> float:
        """What the base learning rate is multiplied by."""
        return self.lr_multiplier if self.name == "high_lr" else 1.0

    @property
    def max_age(self) -> int | None:
        """The staleness bound of an asynchronous-pipeline stressor (its batches' ages are drawn, :func:`draw_age`);
        None for the others."""
        return None

    @property
    def history_length(self) -> int:
        """How many past policies the engine may need (the loop's ``history``'s ``maxlen``)."""
        return self.stale_steps + 1


def draw_age(gen: torch.Generator, bound: int) -> int:
    """A batch's policy age under an asynchronous pipeline with staleness bound ``bound``: uniform in ``0..bound``.

    The model: generation runs ahead of training on a queue, each batch is consumed at a uniformly random point
    of the window the bound allows, and TRL's and verl's pipelines drop (TRL: ``max_staleness``) or never produce
    (verl: ``staleness_threshold``) the older ones. One draw per batch whatever the bound, so that runs of one seed
    see the same draws whether or not a guard lowered the bound.
    """
    if bound < 0:
        raise ValueError(f"bound must be >= 0 policy versions; got {bound!r}.")
    u = float(torch.rand((), generator=gen))  # [0, 1)
    return min(int(u * (bound + 1)), bound)


class RolloutBatch(Protocol):
    """What the loop reads of a task's rollout batch of ``B`` completions (``T`` completion positions)."""

    @property
    def mask(self) -> Tensor: ...  # (B, T) 1 for completion tokens up to and including <eos>
    @property
    def rewards(self) -> Tensor: ...  # (B,)
    @property
    def group_ids(self) -> Tensor: ...  # (B,) prompt index
    @property
    def engine_logprobs(self) -> Tensor: ...  # (B, T) the log-probs the engine reported for its samples
    @property
    def engine_routing(self) -> Tensor | None: ...  # (B, T, layers, k) experts the engine chose; None: dense

    def select(self, idx: Tensor) -> RolloutBatch:
        """The completions ``idx`` ``(b,)`` of the batch."""
        ...


@dataclass(frozen=True)
class TrainerPass:
    """The trainer's forward over a rollout batch: log-probs and entropies ``(B, T)`` (with grad) and the experts
    it chose ``(B, T, layers, k)`` (None for a dense model)."""

    logprobs: Tensor
    entropies: Tensor
    routing: Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class BaseRunConfig:
    """One training run of a grid: the fields the harness reads; a task subclass adds its model's fields and
    gives the calibrated defaults.

    Attributes:
        objective: objective name for :func:`~rlguard.core_losses.get_objective` (its paper's defaults).
        guard: ``off``, or the preset of :class:`~rlguard.guards.GuardConfig` that acts (``default``, ``stable``).
        stressor: the perturbation and its strength (the task's :class:`BaseStressor`).
        seed: seeds the model, the warm start, the prompts and the sampling (same data order in every cell).
        old_logprobs: where pi_old comes from (:data:`OLD_LOGPROBS`): ``engine`` or ``trainer``.
        iterations: rollout batches. num_prompts, group_size: prompts per batch, completions per prompt.
        minibatches: optimizer steps per rollout batch, each on ``num_prompts / minibatches`` prompts.
        lr: Adam learning rate before the stressor's factor. max_grad_norm: gradient clipping (TRL's default).
        warm_start_steps, warm_start_lr: supervised steps before RL (0: none) and their learning rate.
        window, warmup, min_peak, drop, entropy_drop, solved: the collapse definition's constants
            (:func:`~rlguard.bench.collapse.verdict.collapse_verdict`).
    """

    task: ClassVar[str] = ""  # the task's name on the command line and in runs.jsonl
    #: the guard also receives the trainer-vs-engine gap of each batch's first minibatch as ``mismatch_*`` stats
    #: when pi_old is the engine's (a framework that reports the gap, as verl's ``rollout_probs_diff``); with
    #: ``old_logprobs="trainer"`` the step's own mismatch stats are that gap already.
    guard_sees_engine_gap: ClassVar[bool] = False

    objective: str = "grpo"
    guard: GuardName = "off"
    stressor: BaseStressor
    seed: int = 0
    old_logprobs: OldLogprobs = "engine"
    iterations: int
    num_prompts: int = 8
    group_size: int = 8
    minibatches: int = 2
    lr: float
    max_grad_norm: float = 1.0
    warm_start_steps: int
    warm_start_lr: float
    window: int = 10
    warmup: int = 0
    min_peak: float
    drop: float = 0.5
    entropy_drop: float = 0.1
    solved: float = 0.95

    def __post_init__(self) -> None:
        get_objective(self.objective)  # unknown name -> ValueError listing the names
        if self.guard not in GUARDS:
            raise ValueError(f"guard must be one of {list(GUARDS)}; got {self.guard!r}.")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"old_logprobs must be one of {list(OLD_LOGPROBS)}; got {self.old_logprobs!r}.")
        if self.minibatches < 1 or self.num_prompts % self.minibatches:
            raise ValueError(
                f"num_prompts ({self.num_prompts}) must be divisible by minibatches ({self.minibatches}), "
                "which must be >= 1."
            )
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1; got {self.iterations}.")

    # -- the task's hooks ---------------------------------------------------------------------------------------
    def make_model(self) -> nn.Module:
        """The randomly initialised policy of this run (reproducible from ``seed``)."""
        raise NotImplementedError(f"{type(self).__name__} does not define make_model().")

    def warm_start_key(self) -> tuple[Any, ...]:
        """What the warm-started weights depend on (equal keys: equal weights), for the warm-start cache."""
        raise NotImplementedError(f"{type(self).__name__} does not define warm_start_key().")

    def warm_start(self, model: nn.Module) -> None:
        """The supervised steps before RL, in place."""
        raise NotImplementedError(f"{type(self).__name__} does not define warm_start().")

    def engine(
        self, model: nn.Module, gen: torch.Generator, history: deque[dict[str, Tensor]], age: int = 0
    ) -> nn.Module:
        """The policy that samples the next rollout batch under the stressor: ``model`` itself (an exact engine)
        or a copy with other numerics or older weights. ``history`` (``maxlen = stressor.history_length``) is the
        loop's, emptied after a rollback; ``gen`` draws the engine's noise; ``age``: the policy age the loop drew
        for an asynchronous-pipeline stressor (:func:`draw_age`)."""
        raise NotImplementedError(f"{type(self).__name__} does not define engine().")

    def sample(self, engine: nn.Module, iteration: int) -> RolloutBatch:
        """Rollout batch ``iteration`` sampled by ``engine``, with the engine's log-probs."""
        raise NotImplementedError(f"{type(self).__name__} does not define sample().")

    def trainer_pass(self, model: nn.Module, rollouts: RolloutBatch) -> TrainerPass:
        """The trainer's log-probs and entropies of the sampled tokens (with grad)."""
        raise NotImplementedError(f"{type(self).__name__} does not define trainer_pass().")

    # -- identity and serialisation -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Every field, for ``runs.jsonl`` (:meth:`from_json` reads it back)."""
        return dataclasses.asdict(self)

    def key(self) -> str:
        """The run's identity in ``runs.jsonl`` (every field of its configuration)."""
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def stressor_type(cls) -> type[BaseStressor]:
        """The task's stressor class (the type of the ``stressor`` field's default)."""
        default = cls.__dataclass_fields__["stressor"].default_factory
        if not (isinstance(default, type) and issubclass(default, BaseStressor)):
            raise TypeError(f"{cls.__name__}.stressor needs a default_factory that is a BaseStressor subclass.")
        return default

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BaseRunConfig:
        """Inverse of :meth:`to_json`; fields a row lacks (recorded before they existed) take their defaults."""
        config = dict(data)
        config["stressor"] = cls.stressor_type()(**config.get("stressor", {}))
        return cls(**config)


@dataclass
class RunResult:
    """One run's outcome. Curves have one value per rollout batch; ``clip_frac_mean`` is the mean over optimizer
    steps (None for runs recorded before it was); ``numerics`` is the :func:`numerics` fingerprint of the process
    that ran it (empty for runs recorded before it was).

    Attributes:
        config: the run. rewards, entropies: mean reward and token entropy of each batch.
        verdict: :func:`~rlguard.bench.collapse.verdict.collapse_verdict` of the curves.
        halted, nonfinite: the guard halted the run; a loss, gradient or weight became non-finite.
        interventions: ``skips``, ``rollbacks``, ``lr_backoffs`` and ``clip_changes`` (the guard's, 0 when off).
        lengths, clip_fracs: mean completion tokens and clip fraction (mean over the minibatches) of each batch.
        logp_gaps, routed_differently: trainer vs engine before each batch's first update: mean
            ``|log pi_trainer - log pi_engine|`` and share of tokens routed to other experts.
        ages: each batch's policy age in versions under an asynchronous-pipeline stressor (empty otherwise).
        wall_s: seconds the run took.
    """

    config: BaseRunConfig
    rewards: list[float]
    entropies: list[float]
    verdict: CollapseVerdict
    halted: bool = False
    nonfinite: bool = False
    interventions: dict[str, int] = field(default_factory=dict)
    lengths: list[float] = field(default_factory=list)
    clip_fracs: list[float] = field(default_factory=list)
    logp_gaps: list[float] = field(default_factory=list)
    routed_differently: list[float] = field(default_factory=list)
    ages: list[float] = field(default_factory=list)
    clip_frac_mean: float | None = None
    wall_s: float = 0.0
    numerics: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The run with its curves, for ``runs.jsonl`` (:meth:`from_json` reads it back)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("config", "verdict")}
        return {
            "task": self.config.task,
            "config": self.config.to_json(),
            "verdict": dataclasses.asdict(self.verdict),
            **{k: dict(v) if isinstance(v, dict) else v for k, v in data.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], config_type: type[BaseRunConfig]) -> RunResult:
        """Inverse of :meth:`to_json`, for a run of ``config_type``'s task. Also reads the rows recorded before one
        result type served both tasks: the short task's counters (``skips`` ...) at the top level, the long task's
        rows without ``clip_frac_mean`` or ``numerics``."""
        task = data.get("task", config_type.task)
        if task != config_type.task:
            raise ValueError(f"this row is a run of the {task!r} task, not of {config_type.task!r}.")
        rest = {k: v for k, v in data.items() if k not in ("task", "config", "verdict")}
        counters = {k: rest.pop(k) for k in ("skips", "rollbacks", "lr_backoffs", "clip_changes") if k in rest}
        if counters:
            rest["interventions"] = counters
        return cls(config=config_type.from_json(data["config"]), verdict=CollapseVerdict(**data["verdict"]), **rest)


# -- numerics -------------------------------------------------------------------------------------------------------
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
