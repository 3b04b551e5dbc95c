"""verl's platform interface for CPU: tensors on ``"cpu"``, collectives over gloo, Ray's logical GPUs as slots.

verl 0.9.1 knows CUDA, NPU and ROCm. This class, registered in verl's platform registry as ``"cpu"`` and
selected with ``VERL_PLATFORM=cpu``, answers verl's device calls for the CPU: ``current_device()`` is ``"cpu"``
(verl moves tensors to it; ``0`` would mean ``cuda:0``), memory and cache calls are no-ops, the backend is gloo.

verl's resource pools always request one accelerator per worker (``bundle["GPU"] = 1``); this platform keeps
Ray's ``"GPU"`` resource name, so a CPU-only Ray cluster started with logical GPUs
(``+ray_kwargs.ray_init.num_gpus=<workers>``) schedules the workers. Ray then sets ``CUDA_VISIBLE_DEVICES`` in
each worker, which a CPU build of torch ignores.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase

__all__ = ["PlatformCPU", "cpu_device_module"]


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` with the memory, seeding and stream calls verl makes on its device module (no-ops on CPU)."""
    module = types.ModuleType("rlguard_verl_cpu_device")
    for name in ("current_device", "device_count", "is_available", "synchronize", "set_device", "Stream", "stream"):
        if hasattr(torch.cpu, name):
            setattr(module, name, getattr(torch.cpu, name))
    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        setattr(module, name, _zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "ipc_collect"):
        setattr(module, name, _none)
    extra: dict[str, Any] = {
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_device_name": lambda *args, **kwargs: "CPU",
        "mem_get_info": lambda *args, **kwargs: (0, 0),
        "get_rng_state": torch.get_rng_state,
        "set_rng_state": torch.set_rng_state,
    }
    for name, value in extra.items():
        setattr(module, name, value)
    return module


class PlatformCPU(PlatformBase):  # type: ignore[misc]  # verl's class, untyped
    """verl's platform interface for CPU (see the module docstring)."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = cpu_device_module()

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:  # type: ignore[override]  # verl moves tensors to this; 0 would mean cuda:0
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical GPUs as worker slots (see the module docstring)

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
