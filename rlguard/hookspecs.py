"""pluggy hook specifications of rlguard: the extension points third-party packages implement.

A plugin is a module or object with functions marked ``@hookimpl`` whose names match the specs below, exposed
through the entry-point group of its kind (``rlguard.objectives``, ``rlguard.detectors``, ``rlguard.interventions``:
each loaded when its kind is first collected, :mod:`rlguard.plugins`) or the catch-all ``rlguard`` group::

    # pyproject.toml of your package
    [project.entry-points."rlguard.objectives"]
    band_pg = "my_package.objective"
    [project.entry-points."rlguard.detectors"]
    my_detectors = "my_package.detectors"

Two kinds of hooks (``docs/design.md``, "Plugins"): the ``rlguard_add_*`` hooks return classes, collected once
per process into the registries (a hook rather than a bare entry point because pluggy gives built-ins and third
parties one path, validation at registration, duplicate detection and the autoload switch); the per-step hooks
take part in every optimizer step: :func:`rlguard_step_stats` adds stats before the guard judges the step,
:func:`rlguard_on_decision` sees each decision after it was carried out (alerting, dashboards, audit logs).

Hooks are called with keyword arguments only, so a spec can gain arguments without breaking implementations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from rlguard.core_losses.objective import Objective
    from rlguard.guards.actuation import Applied
    from rlguard.guards.decision import Decision
    from rlguard.guards.detectors import Detector
    from rlguard.guards.interventions import Intervention

PROJECT_NAME = "rlguard"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def rlguard_add_objectives() -> Sequence[type[Objective]]:  # type: ignore[empty-body]
    """Return objective classes to register.

    Each is a subclass of :class:`rlguard.core_losses.Objective` (a frozen, keyword-only dataclass) with a
    unique class attribute ``name``; ``get_objective(name, **hyperparameters)`` constructs it. What the adapters
    and the fused path need is declared on the class (``clip_bounds``, ``trl``, ``verl``, ``token_local``, ...:
    ``docs/guides/plugins.md``). A name that another plugin already registered raises ``ValueError`` naming both
    plugins.
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
    a step's findings and alarms into a ``Proposal`` (an outcome and the controls it sets); the guard acts on the
    proposal of highest precedence and combines every proposal's controls.
    """


@hookspec
def rlguard_step_stats(step: int, stats: Mapping[str, float]) -> Mapping[str, float] | None:
    """Return extra stats for optimizer ``step`` (identical on every rank: compute them from ``stats``, the step's
    reduced stats, or from data every rank holds), or None.

    Called by :meth:`rlguard.guards.Guard.observe` before the detectors run; the returned names join the stats the
    detectors (a plugin's own included) read. A name the step already has raises ``ValueError``.
    """


@hookspec
def rlguard_on_decision(decision: Decision, applied: Applied) -> None:
    """See ``decision`` after :func:`rlguard.guards.actuation.apply_decision` carried it out: its ``step``,
    ``outcome``, ``controls``, ``events`` and ``reason``; ``applied`` says the outcome taken (a rollback without a
    snapshot is a halt) and what the training loop could only record (``record_only``). Called on every rank."""
