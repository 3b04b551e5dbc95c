"""Detectors and interventions by name, from the plugin manager (:mod:`rlguard.plugins`): the built-ins are a
plugin like any third-party one, registered here on first use."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import pluggy

from rlguard.guards.detectors import BUILTIN_DETECTORS, Detector
from rlguard.guards.fields import check_fields
from rlguard.guards.interventions import BUILTIN_INTERVENTIONS, OPT_IN_INTERVENTIONS, Intervention
from rlguard.hookspecs import hookimpl
from rlguard.plugins import (
    collect,
    ensure_registered,
    load_plugins,
    make_plugin_manager,
    plugin_failures,
    plugin_manager,
)

if TYPE_CHECKING:
    from rlguard.guards.config import GuardConfig

__all__ = [
    "build_members",
    "check_members",
    "collect_detectors",
    "collect_interventions",
    "detector_registry",
    "guard_plugin_manager",
    "intervention_registry",
    "with_plugin_stats",
]

BUILTIN_PLUGIN_NAME = "rlguard.builtin.guards"


class _BuiltinGuards:
    """The built-in detectors and interventions, registered as a plugin like any other."""

    @hookimpl
    def rlguard_add_detectors(self) -> tuple[type[Detector], ...]:
        return BUILTIN_DETECTORS

    @hookimpl
    def rlguard_add_interventions(self) -> tuple[type[Intervention], ...]:
        return (*BUILTIN_INTERVENTIONS, *OPT_IN_INTERVENTIONS)


def collect_detectors(pm: pluggy.PluginManager) -> Mapping[str, type[Detector]]:
    """``{name: Detector subclass}`` from every plugin of ``pm`` (built-ins included); duplicates raise."""
    ensure_registered(pm, _BuiltinGuards(), BUILTIN_PLUGIN_NAME)
    return collect(pm, "rlguard_add_detectors", Detector, "detector")


def collect_interventions(pm: pluggy.PluginManager) -> Mapping[str, type[Intervention]]:
    """``{name: Intervention subclass}`` from every plugin of ``pm`` (built-ins included); duplicates raise."""
    ensure_registered(pm, _BuiltinGuards(), BUILTIN_PLUGIN_NAME)
    return collect(pm, "rlguard_add_interventions", Intervention, "intervention")


@functools.cache
def detector_registry() -> Mapping[str, type[Detector]]:
    """The detectors of the process-wide plugin manager, collected once per process."""
    return collect_detectors(plugin_manager())


@functools.cache
def intervention_registry() -> Mapping[str, type[Intervention]]:
    """The interventions of the process-wide plugin manager, collected once per process."""
    return collect_interventions(plugin_manager())


def guard_plugin_manager(*own: object) -> pluggy.PluginManager:
    """A plugin manager for one guard: the process-wide manager's plugins (entry points and built-ins), then
    ``own`` (that guard's alerts; None entries are skipped). pluggy's host pattern: the guard keeps the manager's
    relay (``pm.hook``) and calls its hooks through it, so a plugin of one guard never sees another's decisions."""
    shared = load_plugins(plugin_manager(), "guard")
    pm = make_plugin_manager(autoload=False)
    for plugin in shared.get_plugins():
        pm.register(plugin, name=shared.get_name(plugin))
    for plugin in own:
        if plugin is not None:
            pm.register(plugin, name=f"rlguard.guard.{id(plugin)}")
    return pm


def build_members(
    registry: Mapping[str, type], overrides: Mapping[str, dict[str, Any] | None], kind: str, where: str = "GuardConfig"
) -> dict[str, Any]:
    """The detectors or interventions (``kind``) a guard runs: each registered class, unless ``overrides`` switches
    it off (None) or it is opt-in and not named, built with its overrides (types and ranges checked strictly; an
    error names ``where.<kind>s[name].<field>``). An unknown name is refused with the lines of the guard's plugins
    that failed to load."""
    unknown = set(overrides) - set(registry)
    if unknown:
        failed = "".join(f" {line}." for line in plugin_failures(plugin_manager(), "guard"))
        raise ValueError(f"unknown {kind}(s) {sorted(unknown)}; registered: {', '.join(registry)}.{failed}")
    built = {}
    for name, cls in registry.items():
        if (name in overrides and overrides[name] is None) or (
            name not in overrides and not getattr(cls, "enabled_by_default", True)
        ):
            continue
        at = f"{where}.{kind}s[{name!r}]"
        given = _renamed(cls, dict(overrides.get(name) or {}), at)
        # the overrides' types, strictly, against the class's fields (a JSON "5" is not a number)
        params = check_fields(cls, given, where=at)
        try:
            built[name] = cls(**params)
        except TypeError as err:
            accepted = cls.defaults() if hasattr(cls, "defaults") else {}
            raise ValueError(f"bad parameters for {kind} {name!r}: {err}; accepted: {accepted}.") from None
    return built


def check_members(config: GuardConfig, where: str = "GuardConfig") -> None:
    """Refuse the detector and intervention overrides of ``config`` that ``Guard(config)`` would refuse (a NaN, a
    negative or an out-of-range threshold, a wrong type, an unknown name), naming ``where.<kind>s[name].<field>``
    and what it accepts; keeps nothing. For the entry points that take a config long before the guard is built
    (``GuardedGRPOConfig``, verl's command line): the error comes before the model is loaded."""
    build_members(detector_registry(), config.detectors, "detector", where)
    if not config.observe_only:
        build_members(intervention_registry(), config.interventions, "intervention", where)


def with_plugin_stats(hook: pluggy.HookRelay, step: int, stats: Mapping[str, float]) -> Mapping[str, float]:
    """``stats`` plus what the ``rlguard_step_stats`` hooks of ``hook`` (a guard's relay) return for ``step``; a
    plugin may add names, not replace them."""
    if not hook.rlguard_step_stats.get_hookimpls():  # no plugin adds stats (the doctor's guard): no call to make
        return stats
    results = cast("list[Mapping[str, float] | None]", hook.rlguard_step_stats(step=step, stats=stats))
    extra: dict[str, float] = {}
    for result in results:
        for name, value in (result or {}).items():
            if name in stats or name in extra:
                raise ValueError(
                    f"a plugin's rlguard_step_stats returned {name!r} for step {step}, which the step already has: "
                    "a plugin adds stats under new names, it does not replace the step's own."
                )
            extra[name] = float(value)
    return {**stats, **extra} if extra else stats


def _renamed(cls: type, given: dict[str, Any], where: str) -> dict[str, Any]:
    """``given`` with the fields ``cls`` renamed (``renamed_fields``) under their new names, each with a
    ``DeprecationWarning``; a field that no longer exists is dropped."""
    for old, new in getattr(cls, "renamed_fields", {}).items():
        if old not in given:
            continue
        value = given.pop(old)
        if new:
            given.setdefault(new, value)
        what = f"is now {new!r}" if new else "no longer exists: the cause table (rlguard detectors) decides it"
        warnings.warn(f"{where}: {old!r} {what}.", DeprecationWarning, stacklevel=4)
    return given
