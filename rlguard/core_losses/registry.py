"""Objectives by name: ``get_objective("gspo", clip_low=3e-4)`` and ``list_objectives()``."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlguard.core_losses.objective import Objective


def _registry() -> dict[str, type[Objective]]:
    from rlguard.plugins import objective_registry

    return dict(objective_registry())


def list_objectives() -> list[str]:
    """Sorted names of every registered objective, built-in and from plugins."""
    return sorted(_registry())


def objective_class(name: str) -> type[Objective]:
    """The class registered under ``name``; unknown names raise ``ValueError`` listing the known ones."""
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown objective {name!r}; registered objectives: {', '.join(sorted(registry))}.")
    return registry[name]


def get_objective(name: str, **hyperparameters: Any) -> Objective:
    """Construct the objective registered under ``name`` with ``hyperparameters`` (keyword arguments).

    Unknown names and unknown or invalid hyper-parameters raise ``ValueError`` naming what is accepted.
    """
    cls = objective_class(name)
    accepted = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(hyperparameters) - accepted)
    if unknown:
        raise ValueError(
            f"objective {name!r} does not take {', '.join(map(repr, unknown))}; "
            f"it accepts: {', '.join(sorted(accepted))}."
        )
    return cls(**hyperparameters)
