"""The plugin manager: built-ins and third-party plugins go through the same hooks (``docs/design.md``, "Plugins").

The host is the pytest/pluggy four lines: create the manager, add the specs, load the entry points (unless
``RLGUARD_DISABLE_PLUGIN_AUTOLOAD=1``), register the built-ins; this module sits below every layer and imports none
of them: each layer registers its own built-ins into the manager when it first reads a registry
(:func:`ensure_registered`) and collects classes with :func:`collect` — objectives in
:mod:`rlguard.core_losses.registry`, detectors and interventions in :mod:`rlguard.guards.registry`.

Entry points are loaded per kind, when that kind is first collected (:func:`load_plugins`): the
``rlguard.objectives``, ``rlguard.detectors`` and ``rlguard.interventions`` groups each for their kind, the
``rlguard`` group (any hook) for every kind. So ``rlguard doctor``, which reads detectors, never imports an
objective plugin's module (nor the torch it imports). A plugin whose module fails to load is skipped with one
:class:`PluginLoadWarning` line (its name and the error), and that line is given again where a name it might have
registered is asked for (:func:`plugin_failures`); so is one whose hook raises or returns what is not a class of its
kind when collected (:func:`collect`).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Literal, TypeVar, cast

import pluggy

from rlguard import hookspecs
from rlguard.hookspecs import hookimpl

T = TypeVar("T")

ENTRY_POINT_GROUP = "rlguard"
DISABLE_AUTOLOAD_ENV = "RLGUARD_DISABLE_PLUGIN_AUTOLOAD"

Kind = Literal["objective", "detector", "intervention", "guard"]
#: what each kind loads: its own group and the ``rlguard`` group; a guard's relay (the per-step hooks) sees the
#: detectors' and interventions' plugins
GROUPS: Mapping[Kind, tuple[str, ...]] = MappingProxyType(
    {
        "objective": (ENTRY_POINT_GROUP, "rlguard.objectives"),
        "detector": (ENTRY_POINT_GROUP, "rlguard.detectors"),
        "intervention": (ENTRY_POINT_GROUP, "rlguard.interventions"),
        "guard": (ENTRY_POINT_GROUP, "rlguard.detectors", "rlguard.interventions"),
    }
)
#: the hooks a module of a kind's own group may implement: any other would be seen or not depending on which kind
#: was collected first, so such a module is refused
_OWN_HOOKS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "rlguard.objectives": frozenset({"rlguard_add_objectives"}),
        "rlguard.detectors": frozenset({"rlguard_add_detectors", "rlguard_step_stats", "rlguard_on_decision"}),
        "rlguard.interventions": frozenset({"rlguard_add_interventions", "rlguard_step_stats", "rlguard_on_decision"}),
    }
)


class PluginLoadWarning(UserWarning):
    """An entry point's plugin failed to load and was skipped."""


@dataclass(frozen=True)
class PluginFailure:
    """An entry point whose plugin failed to load: its ``name``, ``group`` and ``value`` (``module[:attr]``), and
    the ``error`` (its type and message)."""

    name: str
    group: str
    value: str
    error: str

    @property
    def line(self) -> str:
        return f"rlguard plugin {self.name!r} ({self.group}: {self.value}) failed to load and is skipped: {self.error}"


class PluginManager(pluggy.PluginManager):
    """pluggy's manager with rlguard's specs; it loads each entry-point group when a kind that needs it is first
    collected (:func:`load_plugins`), unless ``autoload`` is off."""

    def __init__(self, *, autoload: bool) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.autoload = autoload
        self.loaded_groups: set[str] = set()
        self.failures: list[PluginFailure] = []
        #: the registered name of each plugin loaded from an entry point -> that entry point (group, name, value)
        self.entry_points: dict[str, tuple[str, str, str]] = {}


def make_plugin_manager(*, autoload: bool | None = None) -> PluginManager:
    """A new manager with the specs; entry points load per kind on first use (unless disabled), built-ins join
    on first use."""
    if autoload is None:
        autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in {"1", "true", "yes"}
    return PluginManager(autoload=autoload)


@functools.cache
def plugin_manager() -> PluginManager:
    """The process-wide manager, built on first use."""
    return make_plugin_manager()


def load_plugins(pm: pluggy.PluginManager, kind: Kind) -> pluggy.PluginManager:
    """Load the entry-point groups ``kind`` needs into ``pm`` (each group once; a manager not made here loads
    none) and return ``pm``. A plugin that fails to load is skipped with a :class:`PluginLoadWarning`."""
    if isinstance(pm, PluginManager) and pm.autoload:
        for group in GROUPS[kind]:
            if group not in pm.loaded_groups:
                pm.loaded_groups.add(group)
                _load_group(pm, group)
    return pm


def plugin_failures(pm: pluggy.PluginManager, kind: Kind) -> tuple[str, ...]:
    """The lines of the plugins of ``kind``'s groups that failed to load into ``pm``."""
    failures = pm.failures if isinstance(pm, PluginManager) else []
    return tuple(f.line for f in failures if f.group in GROUPS[kind])


def _load_group(pm: PluginManager, group: str) -> None:
    for ep in entry_points(group=group):
        if pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
            foreign = sorted(_implemented(pm, plugin) - _OWN_HOOKS[group]) if group in _OWN_HOOKS else []
            if foreign:
                raise TypeError(
                    f"a plugin of the {group} group implements {', '.join(foreign)}: register the module that "
                    f"does under that hook's own group, or under {ENTRY_POINT_GROUP!r}"
                )
        except Exception as err:  # an ImportError, or whatever the plugin's module raised
            _fail(pm, PluginFailure(ep.name, group, ep.value, f"{type(err).__name__}: {err}"))
            continue
        if pm.is_registered(plugin):
            continue
        name = ep.name if pm.get_plugin(ep.name) is None else f"{ep.name} ({group})"
        pm.register(plugin, name=name)
        pm.entry_points[name] = (group, ep.name, ep.value)


def _fail(pm: PluginManager, failure: PluginFailure) -> None:
    """Record ``failure`` on ``pm`` and say it in one :class:`PluginLoadWarning` line."""
    pm.failures.append(failure)
    warnings.warn(failure.line, PluginLoadWarning, stacklevel=3)


def _implemented(pm: pluggy.PluginManager, plugin: object) -> set[str]:
    """The names of the hooks ``plugin`` implements (marked with ``@hookimpl``)."""
    return {name for name in dir(plugin) if pm.parse_hookimpl_opts(plugin, name) is not None}


def _classes(returned: object, base: type[T], plugin: str, hook_name: str) -> list[type[T]]:
    """What a plugin's ``hook_name`` returned, checked: subclasses of ``base`` with a non-empty ``name``."""
    classes = list(cast("Iterable[object]", returned))
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, base) and str(getattr(cls, "name", ""))):
            raise TypeError(
                f"plugin {plugin!r} returned {cls!r} from {hook_name}; expected a subclass of "
                f"{base.__module__}.{base.__qualname__} with a non-empty class attribute `name`."
            )
    return cast("list[type[T]]", classes)


def ensure_registered(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Register the built-in ``plugin`` under ``name`` unless it already is (idempotent)."""
    if pm.get_plugin(name) is None:
        pm.register(plugin, name=name)


def collect(
    pm: pluggy.PluginManager, hook_name: str, base: type[T], kind: Literal["objective", "detector", "intervention"]
) -> Mapping[str, type[T]]:
    """``{name: class}`` from every plugin's implementation of ``hook_name`` (the entry points of ``kind`` loaded
    first); duplicates raise. A plugin loaded from an entry point whose hook raises or returns what is not a
    subclass of ``base`` is skipped in one :class:`PluginLoadWarning` line, as one that fails to import; any other
    plugin's (a built-in, one registered by hand) raises."""
    load_plugins(pm, kind)
    found: dict[str, tuple[type[T], str]] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        plugin = impl.plugin_name
        try:
            returned = _classes(impl.function(), base, plugin, hook_name)
        except Exception as err:
            if not (isinstance(pm, PluginManager) and plugin in pm.entry_points):
                raise
            group, ep_name, value = pm.entry_points[plugin]
            _fail(pm, PluginFailure(ep_name, group, value, f"{type(err).__name__}: {err}"))
            continue
        for cls in returned:
            name = str(getattr(cls, "name", ""))
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
    "GROUPS",
    "Kind",
    "PluginFailure",
    "PluginLoadWarning",
    "PluginManager",
    "collect",
    "ensure_registered",
    "hookimpl",
    "load_plugins",
    "make_plugin_manager",
    "plugin_failures",
    "plugin_manager",
]
