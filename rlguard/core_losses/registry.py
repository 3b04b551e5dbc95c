"""Objectives by name: ``get_objective("gspo", clip_low=3e-4)`` and ``list_objectives()``.

The registry is the plugin manager's (:mod:`rlguard.plugins`): the built-in objectives are a plugin like any
third-party one, registered here on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pluggy

from rlguard.core_losses.objective import Objective
from rlguard.core_losses.objectives import BUILTIN_OBJECTIVES
from rlguard.hookspecs import hookimpl
from rlguard.plugins import collect, ensure_registered, plugin_failures, plugin_manager

__all__ = ["collect_objectives", "get_objective", "list_objectives", "objective_class", "objective_registry"]

BUILTIN_PLUGIN_NAME = "rlguard.builtin.objectives"


class _BuiltinObjectives:
    """The built-in objectives, registered as a plugin like any other."""

    @hookimpl
    def rlguard_add_objectives(self) -> tuple[type[Objective], ...]:
        return BUILTIN_OBJECTIVES


def collect_objectives(pm: pluggy.PluginManager) -> Mapping[str, type[Objective]]:
    """``{name: Objective subclass}`` from every plugin of ``pm`` (built-ins included); duplicates raise."""
    ensure_registered(pm, _BuiltinObjectives(), BUILTIN_PLUGIN_NAME)
    return collect(pm, "rlguard_add_objectives", Objective, "objective")


@functools.cache
def objective_registry() -> Mapping[str, type[Objective]]:
    """The objectives of the process-wide plugin manager, collected once per process."""
    return collect_objectives(plugin_manager())


def list_objectives() -> list[str]:
    """Sorted names of every registered objective, built-in and from plugins."""
    return sorted(objective_registry())


def objective_class(name: str) -> type[Objective]:
    """The class registered under ``name``; unknown names raise ``ValueError`` listing the known ones and the
    plugins of objectives that failed to load."""
    registry = objective_registry()
    if name not in registry:
        failed = "".join(f" {line}." for line in plugin_failures(plugin_manager(), "objective"))
        raise ValueError(f"unknown objective {name!r}; registered objectives: {', '.join(sorted(registry))}.{failed}")
    return registry[name]


def get_objective(name: str, **hyperparameters: Any) -> Objective:
    """Construct the objective registered under ``name`` with ``hyperparameters`` (keyword arguments).

    Unknown names and unknown or invalid hyper-parameters raise ``ValueError`` naming what is accepted.
    """
    cls = objective_class(name)
    accepted = set(cls.hyperparameters())
    unknown = sorted(set(hyperparameters) - accepted)
    if unknown:
        raise ValueError(
            f"objective {name!r} does not take {', '.join(map(repr, unknown))}; "
            f"it accepts: {', '.join(sorted(accepted))}."
        )
    return cls(**hyperparameters)
