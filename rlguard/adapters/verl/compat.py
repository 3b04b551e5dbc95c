"""Every version gate and every patch of verl internals, in one place (``docs/design.md``, "Adapters").

rlguard's verl adapter relies on these parts of verl 0.9.1 that are not a declared extension point; each is
checked at start-up (:func:`check_verl_compatibility` on import of :mod:`rlguard.adapters.verl`,
:func:`check_verl_trainer` when a :class:`~rlguard.adapters.verl.driver.VerlGuardDriver` starts), so that a change
upstream fails with a clear message before training, not at the first rollback:

- ``verl.models.transformers.monkey_patch.is_trl_available`` rebound (:func:`patch_verl_trl_value_head_check`);
- ``verl.utils.tracking.Tracking`` replaced while a legacy ``RayPPOTrainer.fit`` runs (:func:`guarded_tracking`);
- the driver calls the trainer's private ``_save_checkpoint``, ``_load_checkpoint`` (overridden) and
  ``_shutdown_dump_executor`` and uses ``checkpoint_manager.sleep_replicas``/``update_weights`` and the actor
  worker group's ``set_loss_fn``/``load_checkpoint``;
- :mod:`rlguard.adapters.verl.main_ppo` subclasses the classes behind verl's Ray task runners (Ray's
  ``ActorClass.__ray_metadata__.modified_class``, :func:`task_runner_class`) and gives the legacy ``TaskRunner.run``
  the guarded trainer under its global name ``RayPPOTrainer`` (:func:`bind_legacy_trainer`), checked before the
  run starts;
- the actor's LR scale (:mod:`rlguard.adapters.verl.worker`): the guarded V1 trainer overrides verl's private
  ``_init_resource_pool_mgr`` and the guarded legacy task runner verl's ``add_actor_rollout_worker`` to put the
  guarded worker class into ``role_worker_mapping`` where verl maps its stock ``ActorRolloutRefWorker``
  (:func:`use_lr_worker`, read through Ray's ``__ray_metadata__.modified_class.__ray_actor_class__``,
  :func:`ray_actor_class`); the V1 override is taken only where the trainer class still builds its mapping with
  verl's own method (:func:`v1_maps_stock_workers`), and checked when it runs. The worker reads the FSDP engine's
  ``optimizer`` and ``lr_scheduler`` (a torch ``LambdaLR``), checked at the first call;
- the guarded asynchronous trainers override verl's private step methods (:data:`ONE_STEP_OFF_PRIVATE`,
  :data:`FULLY_ASYNC_PRIVATE`, checked when the guarded class is built) and their task runners rebind the names
  verl's ``run`` builds its trainer and worker mapping from (:func:`rebind_run_global`; for the fully async task
  runner the trainer's and the worker mapping's names in ``_create_trainer``/``_initialize_components``).

verl's public extension points rlguard uses, needing no gate: ``core_algos.register_policy_loss`` and the
``verl.plugins`` entry-point group.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from typing import Any

__all__ = [
    "LR_SCALE_METHOD",
    "STALENESS_BOUND_METHOD",
    "SUPPORTED_VERL",
    "bind_legacy_trainer",
    "check_fully_async_rollouter",
    "check_fully_async_trainer",
    "check_one_step_off_trainer",
    "check_verl_compatibility",
    "check_verl_trainer",
    "guarded_tracking",
    "patch_verl_trl_value_head_check",
    "ray_actor_class",
    "rebind_run_global",
    "task_runner_class",
    "use_lr_worker",
    "v1_maps_stock_workers",
    "worker_sets_lr",
]

SUPPORTED_VERL = ">=0.9.1,<0.10"
#: the actor worker's method that sets the LR scale (:class:`rlguard.adapters.verl.worker.GuardedActorRolloutRefWorker`)
LR_SCALE_METHOD = "rlguard_set_lr_scale"
#: the fully async rollouter's method that sets the staleness bound
#: (:func:`rlguard.adapters.verl.fully_async_rollouter.guarded_fully_async_rollouter_class`)
STALENESS_BOUND_METHOD = "rlguard_set_staleness_bound"
#: verl's roles (``verl.trainer.ppo.utils.Role``) whose worker holds the trained actor
ACTOR_ROLES = ("Actor", "ActorRollout", "ActorRolloutRef")
#: the actor strategies whose engine (verl's FSDP engine) has the ``LambdaLR`` the worker scales
LR_SCALE_STRATEGIES = ("fsdp", "fsdp2")
#: what the driver calls on a verl trainer (``RayPPOTrainer`` or a V1 trainer) beyond its public ``fit``
_TRAINER_PRIVATE = ("_save_checkpoint", "_load_checkpoint")
#: what the guarded one-step-off trainer overrides or calls on verl's ``OneStepOffRayTrainer``, with the parameters
#: it passes (``fit_step`` returns the task generating the next batch; ``_fit_postprocess_step`` logs ``self.metrics``)
ONE_STEP_OFF_PRIVATE = {
    "fit_step": ("batch_data_future", "continuous_iterator"),
    "_async_gen_next_batch": ("continuous_iterator",),
    "_fit_postprocess_step": (),
}

#: what the guarded fully async trainer overrides or calls on verl's ``FullyAsyncTrainer``, with the parameters it
#: passes: the step's batch (``_fit_generate``), the cycle's aggregate (``_fit_log_aggregated_training_metrics``,
#: ``_fit_postprocess_step``), the queue (``set_message_queue_client``), checkpoints (``_save_checkpoint``; the
#: coroutine ``load_checkpoint``)
FULLY_ASYNC_PRIVATE = {
    "fit_step": ("batch_dict",),
    "_fit_generate": ("batch",),
    "_fit_compute_log_prob": ("batch",),
    "_fit_log_aggregated_training_metrics": ("rollout_reset_timing_raw",),
    "_fit_postprocess_step": (),
    "_fit_update_local_step": (),
    "_save_checkpoint": (),
    "_shutdown_dump_executor": (),
    "set_message_queue_client": ("message_queue_client",),
    "set_rollouter": ("rollouter",),
}
#: the coroutines among them, and verl's ``fit``
FULLY_ASYNC_COROUTINES = ("fit", "fit_step", "_fit_generate", "load_checkpoint", "set_rollouter")
#: what the guarded rollouter calls on verl's ``FullyAsyncRollouter`` (coroutines): the derivation of its sample
#: budget from ``staleness_threshold`` (``set_max_required_samples``)
FULLY_ASYNC_ROLLOUTER_COROUTINES = ("set_max_required_samples",)


def check_verl_compatibility() -> None:
    """Raise ``RuntimeError`` if the installed verl is outside :data:`SUPPORTED_VERL`."""
    version = metadata.version("verl")
    parts = version.split(".")
    try:
        ok = (int(parts[0]), int(parts[1])) == (0, 9) and int(parts[2].split("+")[0].split("rc")[0] or 0) >= 1
    except (ValueError, IndexError):
        ok = False
    if not ok:
        raise RuntimeError(
            f"rlguard's verl adapter supports verl{SUPPORTED_VERL}; the installed verl is {version}. Install a "
            "supported verl (pip install 'rlguard[verl]')."
        )


def check_verl_trainer(trainer: Any) -> None:
    """Raise ``RuntimeError`` if ``trainer`` lacks a private method the guard's driver calls."""
    missing = [name for name in _TRAINER_PRIVATE if not callable(getattr(trainer, name, None))]
    if missing:
        raise RuntimeError(
            f"the verl guard's driver needs {', '.join(missing)} on {type(trainer).__name__} (verl{SUPPORTED_VERL}'s "
            "RayPPOTrainer and V1 trainers have them). Install a supported verl."
        )


def _missing_methods(base: type, methods: Mapping[str, tuple[str, ...]]) -> list[str]:
    """``name(params)`` of each of ``methods`` that ``base`` lacks or whose parameters (after ``self``) do not start
    with ``params``."""
    missing = []
    for name, params in methods.items():
        method = getattr(base, name, None)
        found = tuple(inspect.signature(method).parameters)[1:] if callable(method) else None
        if found is None or found[: len(params)] != params:
            missing.append(f"{name}({', '.join(params)})")
    return missing


def check_one_step_off_trainer(base: type) -> None:
    """Raise ``RuntimeError`` if ``base`` lacks a coroutine ``fit`` or one of :data:`ONE_STEP_OFF_PRIVATE` with its
    parameters (verl's one-step-off trainer's private step methods, which the guarded trainer builds on)."""
    problems = [] if inspect.iscoroutinefunction(getattr(base, "fit", None)) else ["a coroutine fit"]
    problems += _missing_methods(base, ONE_STEP_OFF_PRIVATE)
    if problems:
        raise RuntimeError(
            f"the guarded one-step-off trainer needs {', '.join(problems)} on {base.__name__} (verl{SUPPORTED_VERL}'s "
            "OneStepOffRayTrainer has them). Install 'rlguard[verl]'."
        )


def check_fully_async_trainer(base: type) -> None:
    """Raise ``RuntimeError`` if ``base`` lacks one of :data:`FULLY_ASYNC_PRIVATE` with its parameters or one of
    :data:`FULLY_ASYNC_COROUTINES` is not a coroutine (verl's ``FullyAsyncTrainer``, which the guarded fully async
    trainer builds on)."""
    problems = [
        f"a coroutine {name}"
        for name in FULLY_ASYNC_COROUTINES
        if not inspect.iscoroutinefunction(getattr(base, name, None))
    ]
    problems += _missing_methods(base, FULLY_ASYNC_PRIVATE)
    if problems:
        raise RuntimeError(
            f"the guarded fully async trainer needs {', '.join(problems)} on {base.__name__} (verl{SUPPORTED_VERL}'s "
            "FullyAsyncTrainer has them). Install 'rlguard[verl]'."
        )


def check_fully_async_rollouter(base: type) -> None:
    """Raise ``RuntimeError`` if one of :data:`FULLY_ASYNC_ROLLOUTER_COROUTINES` is not a coroutine of ``base``
    taking no argument (verl's ``FullyAsyncRollouter``, which the guarded rollouter builds on)."""
    problems = [
        f"a coroutine {name}()"
        for name in FULLY_ASYNC_ROLLOUTER_COROUTINES
        if not inspect.iscoroutinefunction(getattr(base, name, None)) or _required_arguments(getattr(base, name)) != 1
    ]
    if problems:
        raise RuntimeError(
            f"the guarded fully async rollouter needs {', '.join(problems)} on {base.__name__} "
            f"(verl{SUPPORTED_VERL}'s FullyAsyncRollouter has them). Install 'rlguard[verl]'."
        )


def _required_arguments(method: Callable[..., Any]) -> int:
    """How many arguments ``method`` requires (``self`` included; Ray's tracing adds an optional keyword one)."""
    return sum(
        p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in inspect.signature(method).parameters.values()
    )


@contextmanager
def guarded_tracking(log_hook: Callable[[Callable[..., None], dict[str, Any], int, Any], None]) -> Iterator[None]:
    """Within the block, ``verl.utils.tracking.Tracking`` (what ``RayPPOTrainer.fit`` instantiates) is a subclass
    whose ``log(data, step, backend)`` calls ``log_hook(verl_log, data, step, backend)`` instead."""
    import verl.utils.tracking as tracking

    base: type = tracking.Tracking

    class GuardedTracking(base):  # type: ignore[valid-type, misc]  # verl's class, untyped
        def log(self, data: dict[str, Any], step: int, backend: Any = None) -> None:
            log_hook(super().log, data, step, backend)

    setattr(tracking, "Tracking", GuardedTracking)  # noqa: B010  # rebinding verl's name is the point
    try:
        yield
    finally:
        setattr(tracking, "Tracking", base)  # noqa: B010


_VALUE_HEAD_MODULES = ("trl.experimental.ppo", "trl")


def _trl_value_head_available() -> bool:
    """True when TRL is installed and still has ``AutoModelForCausalLMWithValueHead`` where verl imports it."""
    from verl.utils.import_utils import is_trl_available

    if not is_trl_available():
        return False
    for module in _VALUE_HEAD_MODULES:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
            try:
                if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                    return True
            except ImportError:
                continue
    return False


def patch_verl_trl_value_head_check() -> None:
    """Let verl 0.9.1's ``apply_monkey_patch`` run with TRL >= 1.0 installed.

    ``apply_monkey_patch`` (verl/models/transformers/monkey_patch.py), called for every model verl's FSDP engine
    builds, imports ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo`` or ``trl`` whenever TRL
    is installed, only to replace that class's ``state_dict``; TRL 1.x removed the class, so the import raises and
    the engine fails. This rebinds the ``is_trl_available`` name in that one module to "TRL is installed and has
    the class": the patch still runs wherever the class exists, and is skipped where no model of that class can
    exist. Nothing else in verl or TRL changes. Idempotent.
    """
    from verl.models.transformers import monkey_patch

    # verl's module imports the name without re-exporting it, and types it as functools.cache's wrapper
    monkey_patch.is_trl_available = _trl_value_head_available  # type: ignore[attr-defined, assignment]


def _modified_class(actor_class: Any) -> Any:
    return getattr(getattr(actor_class, "__ray_metadata__", None), "modified_class", None)


def ray_actor_class(actor_class: Any) -> type:
    """The class a ``ray.remote(cls)`` actor class was made from (``cls``); ``RuntimeError`` if Ray keeps it
    elsewhere."""
    cls = getattr(_modified_class(actor_class), "__ray_actor_class__", None)
    if not isinstance(cls, type):
        raise RuntimeError(
            f"cannot find the class behind Ray actor {actor_class!r} (__ray_metadata__.modified_class."
            f"__ray_actor_class__); this Ray release differs from the ones rlguard supports with verl{SUPPORTED_VERL}."
            " Install 'rlguard[verl]'."
        )
    return cls


def _actor_role(mapping: Any) -> Any:
    roles = [role for role in mapping if getattr(role, "name", None) in ACTOR_ROLES]
    return roles[0] if len(roles) == 1 else None


def worker_sets_lr(mapping: Any) -> bool:
    """Whether the actor's worker class in verl's ``role_worker_mapping`` (role -> ``ray.remote`` class) has the
    guard's LR call (:data:`LR_SCALE_METHOD`)."""
    role = _actor_role(mapping)
    return role is not None and callable(getattr(ray_actor_class(mapping[role]), LR_SCALE_METHOD, None))


def use_lr_worker(mapping: Any, worker_class: type) -> bool:
    """Map the actor's role in verl's ``role_worker_mapping`` to ``ray.remote(worker_class)`` where it maps verl's
    stock ``ActorRolloutRefWorker`` (any other class is the user's: left alone); True if it did."""
    import ray
    from verl.workers.engine_workers import ActorRolloutRefWorker

    role = _actor_role(mapping)
    if role is None or ray_actor_class(mapping[role]) is not ActorRolloutRefWorker:
        return False
    mapping[role] = ray.remote(worker_class)
    return True


def v1_maps_stock_workers(base: type) -> bool:
    """Whether V1 trainer class ``base`` builds its worker mapping with verl's own ``_init_resource_pool_mgr``
    (stock ``ActorRolloutRefWorker`` for the actor), which the guarded class can then extend."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    own = getattr(PPOTrainer, "_init_resource_pool_mgr", None)
    if not callable(own):
        raise RuntimeError(
            f"verl's V1 PPOTrainer no longer has _init_resource_pool_mgr (verl{SUPPORTED_VERL} does), where the guarded"
            " trainer maps rlguard's actor worker. Install a supported verl."
        )
    return getattr(base, "_init_resource_pool_mgr", None) is own


def task_runner_class(actor_class: Any) -> type:
    """The plain class behind one of verl's ``@ray.remote`` task runners (``TaskRunnerV1``, legacy ``TaskRunner``),
    to subclass; ``RuntimeError`` if Ray keeps it elsewhere."""
    cls = _modified_class(actor_class)
    if not isinstance(cls, type) or not callable(getattr(cls, "run", None)):
        raise RuntimeError(
            f"cannot find the class behind Ray actor {actor_class!r} (ActorClass.__ray_metadata__.modified_class); "
            f"this Ray release differs from the ones rlguard supports with verl{SUPPORTED_VERL}. Install "
            "'rlguard[verl]'."
        )
    return cls


def bind_legacy_trainer(run: Callable[..., Any], trainer_class: type) -> None:
    """Make verl's legacy ``TaskRunner.run`` (``run``, a function or bound method) build ``trainer_class``: ``run``
    builds ``RayPPOTrainer`` by its global name, so that name is rebound in ``run``'s own globals.

    Ray may ship the task runner's class by value (cloudpickle), giving ``run`` a copy of ``main_ppo_v0``'s globals:
    rebinding ``verl.trainer.main_ppo_v0.RayPPOTrainer`` would then change nothing. ``run.__globals__`` is the
    dictionary ``run`` reads, whichever way it arrived (under Ray's method wrapper). Call it in the task-runner
    process, before ``run``.
    """
    why = (
        f"verl's legacy TaskRunner.run no longer builds its trainer as the global RayPPOTrainer (verl"
        f"{SUPPORTED_VERL} does); the guarded legacy trainer cannot be used with this verl. Use the V1 trainer "
        "(trainer.use_v1=true) or install 'rlguard[verl]'."
    )
    rebind_run_global(run, "RayPPOTrainer", trainer_class, why)


def rebind_run_global(run: Callable[..., Any], name: str, value: Any, why: str) -> None:
    """Rebind the global ``name`` in the globals ``run`` (a function or bound method of a verl task runner) reads,
    to ``value``; ``RuntimeError(why)`` if ``run`` does not read that global. verl's task runners build their
    trainer and worker mapping by global name (``TaskRunner.run``: ``RayPPOTrainer``; one-step-off
    ``OneStepTaskRunner.run``: ``OneStepOffRayTrainer``, ``create_role_worker_mapping``). Call it in the
    task-runner process, before ``run``; see :func:`bind_legacy_trainer` for why the globals are ``run``'s own."""
    function = inspect.unwrap(getattr(run, "__func__", run))  # Ray wraps actor methods (tracing)
    names = getattr(getattr(function, "__code__", None), "co_names", ())
    scope = getattr(function, "__globals__", None)
    if name not in names or not isinstance(scope, dict) or name not in scope:
        raise RuntimeError(why)
    scope[name] = value
