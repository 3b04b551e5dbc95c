"""The plugin manager: built-ins and third-party plugins go through the same hooks (``docs/design.md``, "Plugins").

The host is the pytest/pluggy four lines: create the manager, add the specs, load the ``rlguard`` entry points
(unless ``RLGUARD_DISABLE_PLUGIN_AUTOLOAD=1``), register the built-ins. This module sits below every layer and
imports none of them: each layer registers its own built-ins into the manager when it first reads a registry
(:func:`ensure_registered`) and collects classes with :func:`collect` — objectives in
:mod:`rlguard.core_losses.registry`, detectors and interventions in :mod:`rlguard.guards.registry`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TypeVar, cast

import pluggy

from rlguard import hookspecs
from rlguard.hookspecs import hookimpl

T = TypeVar("T")

ENTRY_POINT_GROUP = "rlguard"
DISABLE_AUTOLOAD_ENV = "RLGUARD_DISABLE_PLUGIN_AUTOLOAD"


def make_plugin_manager(*, autoload: bool | None = None) -> pluggy.PluginManager:
    """A new manager with the specs and (unless disabled) the entry-point plugins; built-ins join on first use."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    if autoload is None:
        autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in {"1", "true", "yes"}
    if autoload:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager, built on first use."""
    return make_plugin_manager()


def ensure_registered(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Register the built-in ``plugin`` under ``name`` unless it already is (idempotent)."""
    if pm.get_plugin(name) is None:
        pm.register(plugin, name=name)


def collect(pm: pluggy.PluginManager, hook_name: str, base: type[T], kind: str) -> Mapping[str, type[T]]:
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


__all__ = [
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "collect",
    "ensure_registered",
    "hookimpl",
    "make_plugin_manager",
    "plugin_manager",
]
