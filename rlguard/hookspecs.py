"""pluggy hook specifications of rlguard: the extension points third-party packages implement.

A plugin is a module or object with functions marked ``@hookimpl`` whose names match the specs below, exposed
through the ``rlguard`` entry-point group::

    # pyproject.toml of your package
    [project.entry-points.rlguard]
    my_objectives = "my_package.rlguard_plugin"

Hooks are called with keyword arguments only, so a spec can gain arguments without breaking implementations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from rlguard.core_losses.objective import Objective
    from rlguard.guards.detectors import Detector
    from rlguard.guards.interventions import Intervention

PROJECT_NAME = "rlguard"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def rlguard_add_objectives() -> Sequence[type[Objective]]:  # type: ignore[empty-body]
    """Return objective classes to register.

    Each is a subclass of :class:`rlguard.core_losses.Objective` (a frozen, keyword-only dataclass) with a
    unique class attribute ``name``; ``get_objective(name, **hyperparameters)`` constructs it. A name that
    another plugin already registered raises ``ValueError`` naming both plugins.
    """


@hookspec
def rlguard_add_detectors() -> Sequence[type[Detector]]:  # type: ignore[empty-body]
    """Return detector classes to register.

    Each is a subclass of :class:`rlguard.guards.Detector` (a keyword-only dataclass whose fields are its
    thresholds) with a unique class attribute ``name``; every ``Guard`` runs it unless its config switches it
    off (``GuardConfig(detectors={name: None})``). Duplicate names raise ``ValueError``.
    """


@hookspec
def rlguard_add_interventions() -> Sequence[type[Intervention]]:  # type: ignore[empty-body]
    """Return intervention classes to register.

    Each is a subclass of :class:`rlguard.guards.Intervention` with a unique ``name`` whose ``propose`` turns
    a step's findings and alarms into a ``Proposal``; the guard acts on the proposal of highest priority.
    """
