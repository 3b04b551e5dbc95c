"""The TRL adapter's actuators (``docs/design.md``, "Actuator contract"): how a decision acts on transformers'
``Trainer`` under DDP (:class:`TrainerActuator`) and under DeepSpeed ZeRO-1/2/3 (:class:`ZeroActuator`).

Both only supply the mechanism; :func:`rlguard.guards.actuation.apply_decision` decides what runs. The objective's
controls go to a trainer that takes them (:class:`ControlledTrainer`: ``GuardedGRPOTrainer``, which applies them to
its configured objective with :meth:`~rlguard.core_losses.Objective.with_controls`); on a stock ``GRPOTrainer`` the
actuators do not declare ``clip``, ``beta`` and ``entropy_coef``, so such schedules are refused and such proposals
recorded only.

Under DeepSpeed, :class:`~rlguard.adapters.trl.compat.GuardedEngineWrapper` calls the guard between
``engine.backward`` and ``engine.step`` (:class:`~rlguard.adapters.trl.callback.StabilityCallback` installs it)
and :class:`ZeroActuator` carries out its decision:

=================  ================================  ================================  ==========================
decision           ZeRO-2                            ZeRO-3                            how
=================  ================================  ================================  ==========================
``grad_norm``      yes                               yes                               [1]
``skip``           yes                               yes                               [2]
``lr_scale``       yes                               yes                               [3]
``clip_scale``     yes                               yes                               as without DeepSpeed
``rollback``       yes (engine checkpoint on disk)   yes (engine checkpoint on disk)   [4]
``halt``           yes                               yes                               [5]
guard state        yes                               yes                               as without DeepSpeed
=================  ================================  ================================  ==========================

1. After ``engine.backward``, before ``engine.step``: the 2-norm of the reduced gradient partitions the ZeRO
   optimizer holds for its update (``averaged_gradients``), summed over ranks with one all-reduce and divided by
   the loss scale: the norm of the full averaged gradient, as without DeepSpeed, before the engine clips it with
   ``gradient_clipping`` (``args.max_grad_norm`` is left alone: the DeepSpeed config's ``"auto"`` reads it).
2. ``engine.step()`` runs with the ZeRO optimizer's ``step`` replaced, for that call, by the clean-up of
   DeepSpeed's own overflow branch (gradient partitions and ``param.grad`` dropped, micro-step counter reset,
   loss scale untouched): fp32 master weights, model weights and optimizer state (Adam's moments and step) stay
   bit-identical. Unlike an overflow the step counts: the engine's ``global_steps`` advance with the Trainer's
   ``global_step`` and the LR scheduler steps (the engine's, with DeepSpeed's optimizer, or the Trainer's), as
   without DeepSpeed. For a skipped step the Trainer logs the guard's norm as ``grad_norm`` (DeepSpeed's own norm
   otherwise; the two agree to float32 rounding).
3. Each param group's LR of the engine's optimizer is multiplied inside that same optimizer ``step`` and restored
   before the engine steps its scheduler, so the scale never compounds.
4. ``snapshot``: ``engine.save_checkpoint(<folder>, tag="rlguard_snapshot")`` on every rank (collective; weights,
   ZeRO partitions, optimizer state) before the step's update, into ``StabilityCallback(snapshot_dir=)`` or
   ``<output_dir>/rlguard_snapshot`` (not host memory: the state is partitioned), a folder every rank can read:
   each rank writes its own partition (:meth:`ZeroActuator.snapshot_cost`), over the previous snapshot's files.
   ``rollback``: the step is skipped as in [2], then ``engine.load_checkpoint`` of that tag (optimizer state,
   not the scheduler's) on every rank; the engine's step counters are kept, so the schedule stays a function of
   ``global_step``. Without a snapshot: halt.
5. The step is skipped as in [2]; the callback's ``on_pre_optimizer_step`` sets ``control.should_training_stop``
   on every rank.

Stage 1 uses the same optimizer class and code as stage 2 (untested). Refused when training starts
(:func:`~rlguard.adapters.trl.compat.check_deepspeed_compatibility` raises ``NotImplementedError`` before anything
changes): stage 0 and ZeRO-Offload of the optimizer (``offload_optimizer``, whose gradients live in CPU buffers of
another layout). Untested: fp16/bf16 (the norm is divided by the loss scale; a skip leaves the loss scale as it is)
and pipeline parallelism. The skip clean-up
mirrors private code of deepspeed 0.19 (``_pre_step``, ``_overflow_clean_up``, ``averaged_gradients``);
``integration_tests/test_trl_guard_deepspeed.py`` checks its effect bit for bit (weights, optimizer state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from rlguard.adapters.trl.compat import EngineStepApplying
from rlguard.core_losses import Controls
from rlguard.guards.actuation import SnapshotCost, TorchActuator

__all__ = [
    "ControlledTrainer",
    "TrainerActuator",
    "ZeroActuator",
    "set_trl_off_policy_mask",
    "set_trl_rollout_correction",
    "trainer_capabilities",
]

#: the DeepSpeed engine's step counters, kept across a rollback (the schedule follows the trainer's global_step)
_ENGINE_COUNTERS = ("global_steps", "global_samples", "skipped_steps", "micro_steps")
_ENGINE_SNAPSHOT_TAG = "rlguard_snapshot"
_BASE = frozenset({"snapshot", "restore", "drop_update", "lr_scale", "stop"})
_OBJECTIVE = frozenset({"clip", "beta", "entropy_coef"})


@runtime_checkable
class ControlledTrainer(Protocol):
    """A trainer whose objective takes the guard's controls: what the TRL actuators call (``GuardedGRPOTrainer``)."""

    def rlguard_set_controls(self, controls: Controls) -> None:
        """The objective as configured, with ``controls``, from the next loss on."""


def trainer_capabilities(trainer: object) -> frozenset[str]:
    """What the guard can do to ``trainer``: everything, the objective's controls only on a
    :class:`ControlledTrainer` (``kept_gradient`` where it changes its objective); a rollout correction against
    vLLM's log-probs where TRL samples with vLLM (on a stock ``GRPOTrainer`` through TRL's own
    ``vllm_importance_sampling_*`` settings, which TRL reads at its next generation); the off-policy mask on a
    ``ControlledTrainer`` (its objective applies it) and on a stock ``GRPOTrainer`` through TRL's own
    ``off_policy_mask_threshold``, which TRL 1.16's ``_compute_loss`` reads at every loss
    (:func:`set_trl_off_policy_mask`); and the pipeline's capabilities a ``ControlledTrainer`` declares in its
    ``rlguard_pipeline_capabilities`` (``GuardedAsyncGRPOTrainer``: ``staleness_bound`` and ``drop_stale``, which its
    ``rlguard_set_controls`` carries out)."""
    can = set(_BASE)
    if isinstance(trainer, ControlledTrainer):
        can |= _OBJECTIVE | {"off_policy_mask"} | set(getattr(trainer, "rlguard_pipeline_capabilities", ()))
        objective = getattr(trainer, "rlguard_configured_objective", None)
        if objective is not None and objective.applies_kept_gradient():
            can.add("kept_gradient")
    elif hasattr(trainer, "off_policy_mask_threshold"):
        can.add("off_policy_mask")
    if getattr(trainer, "use_vllm", False) and hasattr(trainer, "vllm_importance_sampling_correction"):
        can.add("rollout_correction")
        if isinstance(trainer, ControlledTrainer):  # the geometric mask has no TRL setting: our objective applies it
            can.add("rollout_mask")
    return frozenset(can)


def _set_controls(trainer: object, controls: Controls) -> None:
    if isinstance(trainer, ControlledTrainer):  # capabilities declare the objective's controls only then
        trainer.rlguard_set_controls(controls)
        return
    if controls.rollout_is_cap is not None and getattr(trainer, "use_vllm", False):
        set_trl_rollout_correction(trainer, controls)
    if hasattr(trainer, "off_policy_mask_threshold"):
        set_trl_off_policy_mask(trainer, controls)


def set_trl_rollout_correction(trainer: Any, controls: Controls) -> None:
    """A stock ``GRPOTrainer`` with vLLM: the guard's rollout correction as TRL's own ``token_truncate``
    importance sampling, ``min(pi_old / mu, rollout_is_cap)`` (TIS, the core's ``rollout_is="token"``); a
    correction the user configured stays as configured. The geometric mask has no TRL counterpart and is not
    carried out on a stock trainer."""
    if trainer.vllm_importance_sampling_correction:
        return
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = "token_truncate"
    trainer.vllm_importance_sampling_clip_min = None
    trainer.vllm_importance_sampling_clip_max = controls.rollout_is_cap


def set_trl_off_policy_mask(trainer: Any, controls: Controls) -> None:
    """A stock ``GRPOTrainer``: the guard's ``off_policy_mask_delta`` as TRL's own ``off_policy_mask_threshold``
    (DeepSeek-V3.2's mask, arXiv 2512.02556, eq. 9; TRL 1.16's ``_compute_loss`` reads the attribute at every loss
    and takes vLLM's log-probs as the behaviour's where it has them, else pi_old's, as the core does). A threshold
    the user configured (``args.off_policy_mask_threshold``) stays as configured; neutral controls restore it.
    TRL keeps the KL term of a masked sequence, which the core drops: the two agree with ``beta=0``."""
    configured = trainer.args.off_policy_mask_threshold
    trainer.off_policy_mask_threshold = configured if configured is not None else controls.off_policy_mask_delta


@dataclass
class TrainerActuator(TorchActuator):
    """transformers' ``Trainer`` without DeepSpeed: the decision is applied in ``on_pre_optimizer_step`` and the trainer
    runs ``optimizer.step()`` right after (``owns_step=False``): a dropped update is gradients set to None (weights and
    Adam's state untouched, the scheduler still steps); the LR scale is undone in ``on_optimizer_step``
    (:meth:`~rlguard.guards.actuation.torch_actuator.TorchActuator.finish_step`), which also measures the update's size
    with ``measure_update``."""

    trainer: object = None
    stop_requested: bool = field(init=False, default=False)

    @property
    def capabilities(self) -> frozenset[str]:  # type: ignore[override]
        return trainer_capabilities(self.trainer) | ({"update_ratio"} if self.measure_update else set())

    def set_controls(self, controls: Controls) -> None:
        _set_controls(self.trainer, controls)

    def stop(self) -> None:
        self.stop_requested = True


class ZeroActuator:
    """A DeepSpeed engine at the accumulation boundary, after ``engine.backward`` and before ``engine.step``
    (:class:`~rlguard.adapters.trl.compat.GuardedEngineWrapper` calls the guard there).

    ``snapshot``/``restore``: ``engine.save_checkpoint``/``load_checkpoint`` of one tag in ``folder`` (collective;
    not CPU memory: the state is partitioned), keeping the engine's step counters; ``drop_update`` and
    ``set_lr_scale`` take effect inside :meth:`apply_update`'s ``engine.step()``
    (:class:`~rlguard.adapters.trl.compat.EngineStepApplying`).
    """

    def __init__(self, engine: Any, folder: Path, trainer: object) -> None:
        self.engine = engine
        self.folder = folder
        self.trainer = trainer
        self.capabilities = trainer_capabilities(trainer)
        self.snapshot_step: int | None = None
        self.stop_requested = False
        self.grad_norm: Tensor | None = None
        self._drop = False
        self._lr_scale = 1.0

    def snapshot(self, step: int) -> None:
        self.engine.save_checkpoint(str(self.folder), tag=_ENGINE_SNAPSHOT_TAG, save_latest=False)
        self.snapshot_step = step

    def snapshot_cost(self) -> SnapshotCost:
        """What one rank's engine checkpoint costs, estimated from the parameters' count (``N``, ZeRO-3's full
        sizes) and the data-parallel ranks (``W``): on disk its ZeRO partition, fp32 weights and Adam's two
        moments (``12 N / W`` bytes), and under ZeRO-1/2 on the first rank the module's weights in their dtype.
        Host memory: nothing is kept between steps; saving copies one tensor at a time off the accelerator (at
        most a flat fp32 partition, ``4 N / W``), and a rollback's ``load_checkpoint`` reads this rank's optimizer
        partition file whole (``12 N / W``, the peak, and what is checked against the budget).
        ``benchmarks/guard_memory.md`` has the measured sizes."""
        params = list(self.engine.module.parameters())
        numel = sum(int(getattr(p, "ds_numel", p.numel())) for p in params)
        itemsize = params[0].element_size() if params else 4
        ranks = max(int(getattr(self.engine, "dp_world_size", 1)), 1)
        rank = self.engine.global_rank if hasattr(self.engine, "global_rank") else 0
        disk = 12 * numel // ranks
        if self.engine.zero_optimization_stage() < 3 and rank == 0:
            disk += numel * itemsize
        return SnapshotCost(
            host_bytes=12 * numel // ranks,
            disk_bytes=disk,
            model_bytes=numel * itemsize,
            ranks=ranks,
            estimated=True,
            where=f"a DeepSpeed engine checkpoint in {self.folder}",
        )

    def has_snapshot(self) -> bool:
        return self.snapshot_step is not None

    def set_lr_scale(self, scale: float) -> None:
        self._lr_scale = scale

    def drop_update(self) -> None:
        self._drop = True

    def apply_update(self) -> None:
        assert self.grad_norm is not None, "set grad_norm before apply_decision"
        step = EngineStepApplying(
            self.engine.optimizer, drop=self._drop, lr_scale=self._lr_scale, grad_norm=self.grad_norm
        )
        with step:
            self.engine.step()
        self._drop, self._lr_scale = False, 1.0

    def restore(self) -> bool:
        # no local existence check: every rank must take the same (collective) path
        engine = self.engine
        counters = {name: getattr(engine, name) for name in _ENGINE_COUNTERS if hasattr(engine, name)}
        path, _ = engine.load_checkpoint(
            str(self.folder), tag=_ENGINE_SNAPSHOT_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        for name, value in counters.items():
            setattr(engine, name, value)
        return path is not None

    def set_controls(self, controls: Controls) -> None:
        _set_controls(self.trainer, controls)

    def take_update_ratio(self) -> float | None:
        """None: the update's size is not measured under DeepSpeed (the weights are partitioned)."""
        return None

    def stop(self) -> None:
        self.stop_requested = True
