"""The guard on verl's driver: :func:`guarded_trainer_class` adds a :class:`VerlGuardDriver` to a verl trainer class:
``GuardedPPOTrainerSync`` for verl 0.9.1's default V1 trainer (registered by :func:`register_v1_trainer` in the
process that runs ``TaskRunnerV1``, and running as verl's ``sync`` trainer) and ``GuardedRayPPOTrainer`` for the
legacy ``RayPPOTrainer`` (``trainer.use_v1=false``). ``python -m rlguard.adapters.verl.main_ppo <verl overrides>``
runs either (:mod:`rlguard.adapters.verl.main_ppo`); both are built on first access (verl's trainers need Ray and,
for V1, TransferQueue) and take ``guard=`` (default: ``+trainer.rlguard_guard`` of the config, else ``"default"``).

The driver wraps the ``Tracking`` logger ``fit`` creates (a V1 ``fit``'s ``self.logger`` in ``on_train_begin``; for
the legacy ``fit``, a ``Tracking`` subclass for the length of ``fit``), so the guard sees what the loggers see, once
per step, after that step's update (:func:`driver_stats`). It carries out each decision: the objective's controls
through verl's ``set_loss_fn``, the rollout correction as verl's own ``algorithm.rollout_correction``, ``lr_scale``
through :class:`~rlguard.adapters.verl.worker.GuardedActorRolloutRefWorker`, snapshots and rollbacks as verl
checkpoints, a halt by returning from ``fit``. What each does, what verl 0.9.1 does not allow and why:
``docs/guides/verl.md``, "What each decision does on the driver". Tested on stand-in trainers
(tests/adapters/verl/test_driver.py, tests/adapters/verl/test_rollout_correction.py) and end to end with Ray on CPU
(integration_tests/test_verl_main_ppo.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping
from functools import cache, partial
from numbers import Real
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rlguard._deprecated import renamed
from rlguard.adapters.verl.compat import LR_SCALE_METHOD, LR_SCALE_STRATEGIES, check_verl_trainer, worker_sets_lr
from rlguard.adapters.verl.mapping import (
    engine_log_probs_beside_pi_old,
    rollout_correction_fields,
)
from rlguard.adapters.verl.settings import GUARDED_TARGET, check_trainer_config, resolve_guard_setting
from rlguard.adapters.verl.state import driver_state, read_driver_state
from rlguard.core_losses import Objective, get_objective
from rlguard.guards import Decision, Guard, GuardConfig
from rlguard.guards.actuation import bind_guard
from rlguard.guards.decision import Controls, tracker_metrics
from rlguard.guards.events import EVENTS_FILE
from rlguard.guards.guard import make_guard
from rlguard.guards.state import GUARD_STATE_FILE, missing_state_message, read_state_file, write_state_file
from rlguard.metrics import canonical_stats

__all__ = [
    "GUARDED_TARGET",
    "GuardHalt",
    "VerlGuardDriver",
    "driver_stats",
    "v1_mode",
]

#: the capabilities of the controls verl applies outside the policy loss, through its own keys (the actor's
#: ``kl_loss_coef``, ``entropy_coeff``; ``algorithm.rollout_correction``, whose weights the loss receives: never also
#: the objective's own ``rollout_is``) or an asynchronous pipeline applies (its staleness bound, its drops); the rest
#: go to the workers' loss, which applies them to the objective; and of the LR scale (sent by its own call)
_VERL_KEYS = ("beta", "entropy_coef", "rollout_correction", "rollout_mask", "staleness_bound", "drop_stale")
_OWN_CALL = ("lr_scale",)
_STEP_FOLDER = re.compile(r"^global_step_(\d+)$")


class GuardHalt(Exception):
    """Raised by the driver's logger to end ``fit`` after logging the step the guard halted on."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(f"rlguard halted training at step {decision.step}: {decision.reason}")
        self.decision = decision


def driver_stats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Canonical stats of one step's metrics as ``fit`` logs them, through the metric table (which also reads the
    guarded loss's ``rlguard/<name>`` metrics, logged by verl's trainers as ``actor/rlguard/<name>``)."""
    return canonical_stats({k: float(v) for k, v in metrics.items() if isinstance(v, Real) and not isinstance(v, bool)})


class VerlGuardDriver:
    """The guard on verl's driver: observes each training step's metrics and acts on the trainer.

    ``trainer`` needs what ``RayPPOTrainer`` has: ``config``, ``global_steps``, ``actor_rollout_wg``
    (``set_loss_fn``, ``load_checkpoint``), ``checkpoint_manager`` (``sleep_replicas``, ``update_weights``),
    ``use_critic``/``critic_wg`` and ``_save_checkpoint``.

    Args:
        trainer: the trainer acted on.
        guard: a preset name, a ``GuardConfig`` or a ``Guard``; events go to
            ``<trainer.default_local_dir>/events.jsonl`` unless its config names a file.
    """

    def __init__(self, trainer: Any, guard: str | GuardConfig | Guard = "default") -> None:
        self.trainer = trainer
        check_verl_trainer(trainer)
        check_trainer_config(trainer.config)
        self.guard = make_guard(guard)
        #: the workers' loss mode (``rlguard.<name>``), read before verl's ``algorithm.rollout_correction.bypass_mode``
        #: (the default of its asynchronous trainers) rewrites the driver's copy to ``"bypass_mode"`` at the first
        #: batch (``rollout_corr_helper.apply_bypass_mode``); the workers keep the loss they were built with
        self.loss_mode = str(trainer.config.actor_rollout_ref.actor.policy_loss.loss_mode)
        #: the guard's events file: opened at the first training step, which tells a fresh run from a resume
        self.events_path = Path(self.guard.config.events_path or self.checkpoint_root / EVENTS_FILE)
        #: the controls in force in the workers (all but the LR scale, sent on its own)
        self.controls = Controls()
        self.lr_scale = 1.0  # the actor's LR scale in force (sent to the workers)
        self._next_lr_scale = 1.0
        self._workers_lr_scale: float | None = 1.0  # what the workers hold; None: unknown (after a load)
        self.discarded: set[int] = set()  # checkpoints holding weights a rollback threw away
        self.halted: Decision | None = None
        self._step = 0
        self._rollback_to: int | None = None
        self._restored_from: Path | None = None
        #: the run's own ``algorithm.rollout_correction`` (None: none), and the fields the driver set over it
        self.configured_rollout_correction = _plain(trainer.config.algorithm.get("rollout_correction", None))
        self._rollout_fields: dict[str, Any] = {}
        bind_guard(self.guard, self, where="verl's driver")

    # -- the actuator (rlguard.guards.actuation.contract.Actuator) ----------------------------------------------------
    @property
    def capabilities(self) -> frozenset[str]:
        """Snapshot (a verl checkpoint), restore (rollback), stop, the clip range; ``beta`` with ``use_kl_loss``
        and ``entropy_coef`` where verl computes entropies; ``lr_scale`` where the actor's worker is rlguard's
        (:func:`sets_actor_lr`); ``rollout_correction`` where the engine's log-probs arrive beside a recomputed
        pi_old (:func:`~rlguard.adapters.verl.mapping.engine_log_probs_beside_pi_old`). Not ``drop_update`` (verl
        logs a step after its update): recorded only."""
        actor = self.trainer.config.actor_rollout_ref.actor
        can = {"snapshot", "restore", "stop", "clip"}
        if sets_actor_lr(self.trainer):
            can.add("lr_scale")
        if actor.get("use_kl_loss", False):
            can.add("beta")
        if actor.get("calculate_entropy", False) or actor.get("entropy_coeff", 0.0) != 0.0:
            can.add("entropy_coef")  # verl computes entropies only then (ray_trainer / v1 trainer_base)
        if _loss_objective(self.loss_mode).applies_kept_gradient():
            can.add("kept_gradient")  # the workers' loss applies it (with_controls), like the clip range
        if engine_log_probs_beside_pi_old(self.trainer.config):
            can.add("rollout_correction")  # verl's algorithm.rollout_correction (push_rollout_correction)
        return frozenset(can)

    def snapshot(self, step: int) -> None:
        if not _nonempty(self.step_folder(step) / "actor"):
            self.trainer._save_checkpoint()

    def has_snapshot(self) -> bool:
        return self.rollback_folder(self._rollback_to) is not None

    def set_lr_scale(self, scale: float) -> None:
        """The scale of the actor's next updates (sent in :meth:`on_log` once the decision is carried out)."""
        self._next_lr_scale = scale

    def drop_update(self) -> None:
        raise NotImplementedError("verl's driver judges a step after its update (not in its capabilities).")

    def apply_update(self) -> None:
        """verl has applied the update already."""

    def restore(self) -> bool:
        folder = self.rollback_folder(self._rollback_to)
        if folder is None:
            return False
        self.rollback(folder, self._step)
        self._restored_from = folder
        return True

    def set_controls(self, controls: Controls) -> None:
        values = controls.without(_OWN_CALL)
        if values != self.controls:
            self.controls = values
            self.push_controls()
            self.push_rollout_correction()

    @property
    def restored_step(self) -> int | None:
        """The checkpoint step the last judged step rolled back to (None: that step did not roll back); an
        asynchronous trainer drops the samples its rollout generated before the restored weights reached it."""
        return None if self._restored_from is None else _step_of(self._restored_from)

    def stop(self) -> None:
        """``fit`` returns after logging this step (see :func:`rlguard.adapters.verl.trainers.guarded_tracking_for`)."""

    @property
    def checkpoint_root(self) -> Path:
        """``trainer.default_local_dir`` as verl resolves it (relative to the working directory)."""
        return Path(os.path.abspath(self.trainer.config.trainer.default_local_dir))

    def on_log(self, data: Mapping[str, Any], step: int) -> dict[str, float]:
        """Judge a training step from the metrics ``fit`` logs and act; returns the guard's metrics to log.

        Records that are not a training step (validation before training) are ignored.
        """
        if "training/global_step" not in data:
            return {}
        if self.guard.events_log is None:
            # verl's first step is 1, or the step after the checkpoint it resumed from
            self.guard.open_events(self.events_path, resume_step=step - 1 if step > 1 else None)
        decision = self.guard.observe(step, driver_stats(data))
        self._step, self._rollback_to, self._restored_from = step, decision.rollback_to, None
        self._next_lr_scale = 1.0  # a decision restates its scale; none (1) is the scheduler's LR
        applied = self.guard.apply(decision, self)
        if "lr_scale" in self.capabilities:
            self.lr_scale = self._next_lr_scale
            self.push_lr_scale()
        if applied.outcome == "halt":
            self.halted = decision
            if decision.outcome == "rollback":
                why = f"no checkpoint at or before step {decision.rollback_to} (set trainer.save_freq)"
                self.halted = dataclasses.replace(decision, outcome="halt", reason=f"{decision.reason}; {why}")
        folder = self.step_folder(step)
        if folder.is_dir():
            self.save(folder)  # this step's checkpoint also holds the guard's judgement of the step
        restored = None if self._restored_from is None else _step_of(self._restored_from)
        # verl logs a step after its update: a skip is recorded, never carried out
        return tracker_metrics(decision, skipped=False, rollback_to=restored, halted=applied.outcome == "halt")

    # -- acting on verl -------------------------------------------------------------------------------------
    def actor_config(self) -> Any:
        """The actor config the workers build (``omega_conf_to_dataclass``) with the driver's controls."""
        from verl.utils.config import omega_conf_to_dataclass

        config = omega_conf_to_dataclass(self.trainer.config.actor_rollout_ref.actor)
        loss_controls = self.controls.without(_VERL_KEYS).to_dict()
        policy_loss = dataclasses.replace(config.policy_loss, loss_mode=self.loss_mode, controls=loss_controls)
        actor: dict[str, Any] = {"policy_loss": policy_loss}
        if self.controls.beta is not None:
            actor["kl_loss_coef"] = self.controls.beta
        if self.controls.entropy_coef is not None:
            actor["entropy_coeff"] = self.controls.entropy_coef
        return dataclasses.replace(config, **actor)

    def push_controls(self) -> None:
        """Send every actor worker verl's ``ppo_loss`` bound to :meth:`actor_config` (``set_loss_fn``)."""
        from verl.workers.utils.losses import ppo_loss

        self.trainer.actor_rollout_wg.set_loss_fn(partial(ppo_loss, config=self.actor_config()))

    def push_rollout_correction(self) -> None:
        """Set verl's ``algorithm.rollout_correction`` to the run's own with the guard's rollout correction over it
        (:func:`~rlguard.adapters.verl.mapping.rollout_correction_fields`), or back to the run's own; unchanged
        fields are not written. verl's trainers read it afresh for every batch (``_compute_advantage``;
        ``compute_rollout_correction_and_add_to_batch`` on ``old_log_probs`` and ``rollout_log_probs``), so it applies
        from the next step, as the loss's controls do."""
        configured = self.configured_rollout_correction
        fields = rollout_correction_fields(self.controls, configured)
        if fields == self._rollout_fields:
            return
        algorithm = self.trainer.config.algorithm
        node = None if configured is None and not fields else OmegaConf.create({**(configured or {}), **fields})
        with open_dict(algorithm):
            algorithm.rollout_correction = node
        self._rollout_fields = fields

    def push_lr_scale(self) -> None:
        """Send the actor workers :attr:`lr_scale` (``rlguard_set_lr_scale``) unless they hold it already."""
        if self._workers_lr_scale != self.lr_scale:
            getattr(self.trainer.actor_rollout_wg, LR_SCALE_METHOD)(self.lr_scale)
            self._workers_lr_scale = self.lr_scale

    def step_folder(self, step: int) -> Path:
        """verl's checkpoint folder of ``step``."""
        return self.checkpoint_root / f"global_step_{step}"

    def rollback_folder(self, healthy_step: int | None) -> Path | None:
        """The newest ``global_step_<N>`` with an actor checkpoint, ``N <= healthy_step`` and not discarded."""
        if healthy_step is None or not self.checkpoint_root.is_dir():
            return None
        candidates = [
            (_step_of(p), p)
            for p in self.checkpoint_root.iterdir()
            if _STEP_FOLDER.match(p.name)
            and _step_of(p) <= healthy_step
            and _step_of(p) not in self.discarded
            and _nonempty(p / "actor")
        ]
        return max(candidates)[1] if candidates else None

    def rollback(self, folder: Path, step: int) -> None:
        """Load ``folder``'s actor (and critic) checkpoint into the workers, sync the rollout replicas and save
        the restored state as ``step``'s checkpoint, so that ``resume_mode=auto`` resumes from it. The checkpoints
        between the two hold discarded weights and are never rolled back to."""
        trainer = self.trainer
        restored = _step_of(folder)
        later = [_step_of(p) for p in self.checkpoint_root.iterdir() if _STEP_FOLDER.match(p.name)]
        self.discarded |= {n for n in later if restored < n < step}
        trainer.checkpoint_manager.sleep_replicas()
        trainer.actor_rollout_wg.load_checkpoint(str(folder / "actor"), del_local_after_load=False)
        self._workers_lr_scale = None  # the load restored the scheduler as saved: on_log sends the scale again
        if trainer.use_critic:
            trainer.critic_wg.load_checkpoint(str(folder / "critic"), del_local_after_load=False)
        trainer.checkpoint_manager.update_weights(trainer.global_steps)
        trainer._save_checkpoint()

    # -- checkpoints ----------------------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """Write the guard's state and the workers' controls to ``folder/rlguard_guard.json``."""
        folder.mkdir(parents=True, exist_ok=True)
        state = driver_state(self.guard.state_dict(), self.controls, self.lr_scale, self.discarded)
        write_state_file(folder / GUARD_STATE_FILE, state)  # atomically

    def load(self, folder: Path) -> bool:
        """Restore :meth:`save` from ``folder``, validated (the file's path in every error), and send the controls
        (and the LR scale) to the workers; False, warned about with what it costs, if none was saved."""
        path = folder / GUARD_STATE_FILE
        self._workers_lr_scale = None  # the workers' scheduler was loaded as saved: the scale is sent again
        if not path.is_file():
            warnings.warn(missing_state_message(path, _step_of(folder)), UserWarning, stacklevel=2)
            return False
        guard, controls, lr_scale, discarded = read_driver_state(read_state_file(path), str(path))
        self.guard.load_state_dict(guard, source=f"{path}: guard")
        self.controls = controls
        self.discarded = discarded
        self.push_controls()
        self.push_rollout_correction()
        self.lr_scale = lr_scale
        if "lr_scale" in self.capabilities:
            self.push_lr_scale()
        return True


def v1_mode(cls: type) -> str | None:
    """The name verl's V1 trainer registry gives ``cls`` or its nearest registered base (``"sync"`` for
    ``PPOTrainerSync`` and its subclasses); None for a class outside that registry (the legacy trainer)."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    for base in cls.__mro__:
        names = [name for name, registered in TRAINER_REGISTRY.items() if registered is base]
        if names and not getattr(base, "rlguard_guarded", False):
            return "sync" if "sync" in names else names[0]
    return None


def sets_actor_lr(trainer: Any) -> bool:
    """Whether ``trainer``'s actor workers take the guard's LR scale: an FSDP actor (``strategy`` fsdp or fsdp2)
    whose worker class in ``trainer.role_worker_mapping`` is rlguard's
    (:class:`~rlguard.adapters.verl.worker.GuardedActorRolloutRefWorker`); for a V1 trainer, which builds that
    mapping in ``init()``, a guarded class that puts rlguard's worker there (``rlguard_lr_worker``)."""
    if trainer.config.actor_rollout_ref.actor.get("strategy") not in LR_SCALE_STRATEGIES:
        return False
    mapping = getattr(trainer, "role_worker_mapping", None)
    if mapping is None:
        return bool(getattr(trainer, "rlguard_lr_worker", False))
    return worker_sets_lr(mapping)


@cache
def _loss_objective(loss_mode: str) -> Objective:
    """The objective of ``rlguard.<name>`` with its defaults (what it declares about itself; an objective is
    frozen, so one per loss mode serves every call: ``capabilities`` reads it at every logged step)."""
    return get_objective(str(loss_mode).removeprefix("rlguard."))


def _plain(node: Any) -> dict[str, Any] | None:
    """A config node (a DictConfig or a mapping: verl's dataclass configs are mappings) as a plain dict, or None."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return None if node is None else dict(node)


def _step_of(folder: Path) -> int:
    match = _STEP_FOLDER.match(folder.name)
    if match is None:
        raise ValueError(f"{folder} is not a verl checkpoint folder (global_step_<N>).")
    return int(match.group(1))


def _nonempty(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


__getattr__ = renamed(__name__, guard_from_spec=resolve_guard_setting)  # its old name here, deprecated
