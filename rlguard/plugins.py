"""The plugin manager: built-ins and third-party plugins go through the same hooks.

Built-ins are registered directly; third-party plugins come from the ``rlguard`` entry-point group unless
``RLGUARD_DISABLE_PLUGIN_AUTOLOAD=1``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar, cast

import pluggy

from rlguard import hookspecs
from rlguard.hookspecs import hookimpl

if TYPE_CHECKING:
    from rlguard.core_losses.objective import Objective
    from rlguard.guards.detectors import Detector
    from rlguard.guards.interventions import Intervention

T = TypeVar("T")

ENTRY_POINT_GROUP = "rlguard"
DISABLE_AUTOLOAD_ENV = "RLGUARD_DISABLE_PLUGIN_AUTOLOAD"


class _Builtins:
    """The built-in objectives, detectors and interventions, registered as a plugin like any other."""

    @hookimpl
    def rlguard_add_objectives(self) -> tuple[type, ...]:
        from rlguard.core_losses.objectives import BUILTIN_OBJECTIVES

        return BUILTIN_OBJECTIVES

    @hookimpl
    def rlguard_add_detectors(self) -> tuple[type, ...]:
        from rlguard.guards.detectors import BUILTIN_DETECTORS

        return BUILTIN_DETECTORS

    @hookimpl
    def rlguard_add_interventions(self) -> tuple[type, ...]:
        from rlguard.guards.entropy_control import EntropyControl
        from rlguard.guards.interventions import BUILTIN_INTERVENTIONS
        from rlguard.guards.recovery import Recovery
        from rlguard.guards.trust_region import TrustRegion

        return (*BUILTIN_INTERVENTIONS, TrustRegion, EntropyControl, Recovery)


def make_plugin_manager(*, autoload: bool | None = None) -> pluggy.PluginManager:
    """A new manager with the specs, the built-ins and (unless disabled) the entry-point plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(_Builtins(), name="rlguard.builtin")
    if autoload is None:
        autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in {"1", "true", "yes"}
    if autoload:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager, built on first use."""
    return make_plugin_manager()


def _collect(pm: pluggy.PluginManager, hook_name: str, base: type[T], kind: str) -> Mapping[str, type[T]]:
    """``{name: class}`` from every plugin's implementation of ``hook_name``; duplicates and non-subclasses raise."""
    found: dict[str, tuple[type[T], str]] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        plugin = impl.plugin_name
        returned = cast("Iterable[object]", impl.function())
        for cls in returned:
            name = str(getattr(cls, "name", ""))
            if not (isinstance(cls, type) and issubclass(cls, base) and name):
                raise TypeError(
                    f"plugin {plugin!r} returned {cls!r} from {hook_name}; expected a subclass of "
                    f"{base.__module__}.{base.__qualname__} with a non-empty class attribute `name`."
                )
            if name in found and found[name][0] is not cls:
                raise ValueError(
                    f"{kind} name {name!r} is registered twice: by plugin {found[name][1]!r} "
                    f"({found[name][0].__qualname__}) and by plugin {plugin!r} ({cls.__qualname__}). "
                    f"Rename one, or set {DISABLE_AUTOLOAD_ENV}=1 to load no third-party plugins."
                )
            found[name] = (cls, plugin)
    return MappingProxyType({name: cls for name, (cls, _) in sorted(found.items())})


def collect_objectives(pm: pluggy.PluginManager) -> Mapping[str, type[Objective]]:
    """``{name: Objective subclass}`` from every plugin's ``rlguard_add_objectives``; duplicates raise."""
    from rlguard.core_losses.objective import Objective

    return _collect(pm, "rlguard_add_objectives", Objective, "objective")


def collect_detectors(pm: pluggy.PluginManager) -> Mapping[str, type[Detector]]:
    """``{name: Detector subclass}`` from every plugin's ``rlguard_add_detectors``; duplicates raise."""
    from rlguard.guards.detectors import Detector

    return _collect(pm, "rlguard_add_detectors", Detector, "detector")


def collect_interventions(pm: pluggy.PluginManager) -> Mapping[str, type[Intervention]]:
    """``{name: Intervention subclass}`` from every plugin's ``rlguard_add_interventions``; duplicates raise."""
    from rlguard.guards.interventions import Intervention

    return _collect(pm, "rlguard_add_interventions", Intervention, "intervention")


@functools.cache
def objective_registry() -> Mapping[str, type[Objective]]:
    """The objectives of :func:`plugin_manager`, collected once per process."""
    return collect_objectives(plugin_manager())


@functools.cache
def detector_registry() -> Mapping[str, type[Detector]]:
    """The detectors of :func:`plugin_manager`, collected once per process."""
    return collect_detectors(plugin_manager())


@functools.cache
def intervention_registry() -> Mapping[str, type[Intervention]]:
    """The interventions of :func:`plugin_manager`, collected once per process."""
    return collect_interventions(plugin_manager())


__all__ = [
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "collect_detectors",
    "collect_interventions",
    "collect_objectives",
    "detector_registry",
    "hookimpl",
    "intervention_registry",
    "make_plugin_manager",
    "objective_registry",
    "plugin_manager",
]
