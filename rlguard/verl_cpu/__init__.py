"""verl on CPU: stock ``python -m verl.trainer.main_ppo`` without a GPU, for trying a pipeline and for CI.

Set two environment variables and add verl overrides; nothing in verl is edited::

    export VERL_PLATFORM=cpu VERL_USE_EXTERNAL_MODULES=rlguard.verl_cpu
    python -m verl.trainer.main_ppo ... $(python -m rlguard.verl_cpu overrides)

verl imports the modules of ``VERL_USE_EXTERNAL_MODULES`` on ``import verl`` in every process (driver, task
runner, Ray workers), so this module registers, everywhere:

- a CPU platform in verl's platform registry (:class:`~rlguard.verl_cpu.platform.PlatformCPU`),
  selected by ``VERL_PLATFORM=cpu``; ``VERL_ENGINE_DEVICE=cuda`` (set here) picks verl's FSDP engine, whose
  computations then run on the CPU;
- the rollout ``hf`` (``actor_rollout_ref.rollout.name=hf``): Hugging Face ``generate()`` in a Ray actor per
  replica, given the actor's weights after every update (:mod:`rlguard.verl_cpu.rollout`), through
  verl's public ``RolloutReplicaRegistry`` and its rollout-class registry;
- the gloo fix: verl builds the process-group backend ``"cpu:gloo,<device>:<backend>"``, which on CPU is
  ``"cpu:gloo,cpu:gloo"`` and torch refuses (``Duplicate device type cpu``); on CPU the workers get ``"cpu:gloo"``.

:func:`cpu_overrides` lists the overrides a CPU run needs (Ray's logical GPUs and CPUs, ``sdpa`` attention, no
padding removal, the ``hf`` rollout, float32); ``python -m rlguard.verl_cpu overrides [WORKERS]`` prints
them, ``python -m rlguard.verl_cpu example DIR`` writes a tiny model, data and reward to try.

Private verl names used (checked against the installed verl at import, which fails with the fix if they moved):
``verl.workers.rollout.base._ROLLOUT_REGISTRY`` and the ``backend`` argument of
``verl.utils.distributed.initialize_global_process_group_ray`` (rebound in ``verl.utils.distributed`` and in
``verl.workers.engine_workers``, which imports it by name).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from importlib.metadata import version
from typing import Any

__all__ = ["ROLLOUT_NAME", "SUPPORTED_VERL", "check_verl", "cpu_environment", "cpu_overrides", "install"]

ROLLOUT_NAME = "hf"
SUPPORTED_VERL = (">=0.9.1", "<0.10")
_MODULE = __name__


def check_verl() -> str:
    """The installed verl's version, after checking it is one this harness was written for (the private names it
    uses exist there); raises ``RuntimeError`` with the fix otherwise."""
    from packaging.version import Version

    found = version("verl")
    low, high = (Version(bound.lstrip("<>=")) for bound in SUPPORTED_VERL)
    if not low <= Version(found) < high:
        raise RuntimeError(
            f"{_MODULE} supports verl {','.join(SUPPORTED_VERL)} (it uses private names of verl's rollout and "
            f"process-group code); found verl {found}. Install a supported verl (pip install 'rlguard[verl]') or "
            f"unset VERL_USE_EXTERNAL_MODULES={_MODULE}."
        )
    import verl.utils.distributed as distributed
    import verl.workers.rollout.base as rollout_base

    registry = getattr(rollout_base, "_ROLLOUT_REGISTRY", None)
    init = getattr(distributed, "initialize_global_process_group_ray", None)
    if not isinstance(registry, dict) or init is None or "backend" not in inspect.signature(init).parameters:
        raise RuntimeError(
            f"verl {found} does not have the names {_MODULE} relies on (verl.workers.rollout.base._ROLLOUT_REGISTRY, "
            "initialize_global_process_group_ray(backend=...)); reinstall verl from rlguard's verl extra."
        )
    return found


def _dedupe_backend(init: Any) -> Any:
    """``init`` (verl's ``initialize_global_process_group_ray``) with backend ``"cpu:gloo"`` on the CPU platform."""

    @functools.wraps(init)
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: str | None = None) -> Any:
        from verl.utils.device import get_device_name

        if backend is None and get_device_name() == "cpu":
            backend = "cpu:gloo"  # verl would build "cpu:gloo,cpu:gloo"
        return init(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray.rlguard_cpu = True  # type: ignore[attr-defined]
    return initialize_global_process_group_ray


def install() -> None:
    """Register the CPU platform, the ``hf`` rollout and the gloo fix in this process (idempotent; what importing
    this module does). Raises ``RuntimeError`` on an unsupported verl."""
    check_verl()
    import verl.utils.distributed as distributed
    import verl.workers.rollout.base as rollout_base
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from rlguard.verl_cpu.platform import PlatformCPU

    if PlatformRegistry.get("cpu") is not PlatformCPU:
        PlatformRegistry.register(platform="cpu")(PlatformCPU)
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{_MODULE}.rollout.HFServerAdapter"
    modules = [distributed, sys.modules.get("verl.workers.engine_workers")]
    for module in modules:
        init = getattr(module, "initialize_global_process_group_ray", None)
        if init is not None and not getattr(init, "rlguard_cpu", False):
            setattr(module, "initialize_global_process_group_ray", _dedupe_backend(init))  # noqa: B010
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
        # verl registers its FSDP engine for cuda and npu; on the CPU platform the same class runs over gloo
        os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")


def _load_replica() -> type:
    from rlguard.verl_cpu.rollout import HFReplica

    return HFReplica


def cpu_environment() -> dict[str, str]:
    """The environment variables of a CPU run (add them to ``os.environ`` before starting verl)."""
    return {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": _MODULE, "VERL_ENGINE_DEVICE": "cuda"}


def cpu_overrides(workers: int = 1, *, ray_cpus: int = 16) -> list[str]:
    """verl overrides for a CPU run with ``workers`` actor processes (one rollout replica each).

    Ray: verl's resource pools ask for one accelerator and 3 CPUs per worker, so the local Ray cluster is started
    with ``workers`` logical GPUs and ``ray_cpus`` logical CPUs (scheduling slots, not cores). Model: ``sdpa``
    attention (verl's default is flash-attention), no padding removal, float32 parameters and compute.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1; got {workers}.")
    return [
        f"trainer.n_gpus_per_node={workers}",
        "trainer.nnodes=1",
        f"+ray_kwargs.ray_init.num_gpus={workers}",
        f"ray_kwargs.ray_init.num_cpus={ray_cpus}",
        "+ray_kwargs.ray_init.include_dashboard=false",
        # the V1 trainer's TransferQueue starts 8 storage processes by default; one holds a small run's data
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        "actor_rollout_ref.rollout.agent.num_workers=1",  # each agent-loop and reward worker is a process
        "reward.num_workers=1",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",  # FSDP1 refuses CPU parameters with sync_module_states
        "actor_rollout_ref.ref.strategy=fsdp2",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    ]


def __dir__() -> list[str]:
    return sorted(__all__)


install()
