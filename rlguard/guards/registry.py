"""Detectors and interventions by name, from the plugin manager (:mod:`rlguard.plugins`): the built-ins are a
plugin like any third-party one, registered here on first use."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import cast

import pluggy

from rlguard.guards.adaptive_entropy import AdaptiveEntropy
from rlguard.guards.detectors import BUILTIN_DETECTORS, Detector
from rlguard.guards.entropy_control import EntropyControl
from rlguard.guards.interventions import BUILTIN_INTERVENTIONS, Intervention
from rlguard.guards.recovery import Recovery
from rlguard.guards.remedies import MismatchRemedy
from rlguard.guards.trust_region import TrustRegion
from rlguard.hookspecs import hookimpl
from rlguard.plugins import collect, ensure_registered, plugin_manager

__all__ = [
    "collect_detectors",
    "collect_interventions",
    "detector_registry",
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
        # the last five: opt-in
        return (*BUILTIN_INTERVENTIONS, TrustRegion, EntropyControl, AdaptiveEntropy, Recovery, MismatchRemedy)


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


def with_plugin_stats(step: int, stats: Mapping[str, float]) -> Mapping[str, float]:
    """``stats`` plus what the plugins' ``rlguard_step_stats`` hooks return for ``step``; a plugin may add names,
    not replace them."""
    results = cast("list[Mapping[str, float] | None]", plugin_manager().hook.rlguard_step_stats(step=step, stats=stats))
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
