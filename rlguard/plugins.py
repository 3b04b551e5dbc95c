"""The plugin manager: built-ins and third-party plugins go through the same hooks.

Built-ins are registered directly; third-party plugins come from the ``rlguard`` entry-point group unless
``RLGUARD_DISABLE_PLUGIN_AUTOLOAD=1``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import cast

import pluggy

from rlguard import hookspecs
from rlguard.hookspecs import hookimpl

ENTRY_POINT_GROUP = "rlguard"
DISABLE_AUTOLOAD_ENV = "RLGUARD_DISABLE_PLUGIN_AUTOLOAD"


class _BuiltinObjectives:
    """The built-in objectives, registered as a plugin like any other."""

    @hookimpl
    def rlguard_add_objectives(self) -> tuple[type, ...]:
        from rlguard.core_losses.objectives import BUILTIN_OBJECTIVES

        return BUILTIN_OBJECTIVES


def make_plugin_manager(*, autoload: bool | None = None) -> pluggy.PluginManager:
    """A new manager with the specs, the built-ins and (unless disabled) the entry-point plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(_BuiltinObjectives(), name="rlguard.builtin")
    if autoload is None:
        autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in {"1", "true", "yes"}
    if autoload:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager, built on first use."""
    return make_plugin_manager()


def collect_objectives(pm: pluggy.PluginManager) -> Mapping[str, type]:
    """``{name: Objective subclass}`` from every plugin's ``rlguard_add_objectives``; duplicates raise."""
    from rlguard.core_losses.objective import Objective

    found: dict[str, tuple[type, str]] = {}
    for impl in pm.hook.rlguard_add_objectives.get_hookimpls():
        plugin = impl.plugin_name
        returned = cast("Iterable[object]", impl.function())
        for cls in returned:
            if not (isinstance(cls, type) and issubclass(cls, Objective) and cls.name):
                raise TypeError(
                    f"plugin {plugin!r} returned {cls!r} from rlguard_add_objectives; expected a subclass of "
                    "rlguard.core_losses.Objective with a non-empty class attribute `name`."
                )
            if cls.name in found and found[cls.name][0] is not cls:
                raise ValueError(
                    f"objective name {cls.name!r} is registered twice: by plugin {found[cls.name][1]!r} "
                    f"({found[cls.name][0].__qualname__}) and by plugin {plugin!r} ({cls.__qualname__}). "
                    f"Rename one, or set {DISABLE_AUTOLOAD_ENV}=1 to load no third-party plugins."
                )
            found[cls.name] = (cls, plugin)
    return MappingProxyType({name: cls for name, (cls, _) in sorted(found.items())})


@functools.cache
def objective_registry() -> Mapping[str, type]:
    """The objectives of :func:`plugin_manager`, collected once per process."""
    return collect_objectives(plugin_manager())


__all__ = [
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "collect_objectives",
    "hookimpl",
    "make_plugin_manager",
    "objective_registry",
    "plugin_manager",
]
