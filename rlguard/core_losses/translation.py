"""How a framework's settings map onto an objective's fields, declared by the objective (``docs/design.md``,
"Objectives describe themselves").

Pure data, no framework import: the names of a framework's settings and the values its conventions imply. The
adapters (:mod:`rlguard.adapters.trl.mapping`, :mod:`rlguard.adapters.verl.mapping`) read an objective's
``Objective.trl`` and ``Objective.verl`` and never look at its class, so a plugin objective that declares them is
translated exactly like a built-in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = ["TRLMetrics", "Translation"]

#: the families of loss metrics TRL's ``GRPOTrainer._compute_loss`` logs: ``clip_ratio/*`` (its PPO clip),
#: ``cispo_clip_ratio`` (the upper cap of its CISPO), ``vespo/phi_seq_mean`` (VESPO's sequence weight)
TRLMetrics = Literal["clip_ratio", "cispo_clip_ratio", "vespo_phi"]


@dataclass(frozen=True)
class Translation:
    """How one framework's settings set an objective's fields.

    Attributes:
        fields: objective field -> the framework's setting that sets it. TRL: a ``GRPOConfig`` field
            (``epsilon_high`` resolved as TRL does: ``epsilon`` where unset). verl: a key of the actor config
            (``clip_ratio_low``, ...; ``clip_ratio`` where those are null), ``loss_agg_mode`` for the
            aggregation, or ``policy_loss.<key>``.
        fixed: objective fields whose value the framework's convention implies (TRL's CISPO caps the weight at an
            absolute ``epsilon_high``: ``bounds="absolute"``, no lower bound).
        paper: the framework settings that give the paper's values, where they are not the defaults of the fields
            they set (the absolute cap of 5 is CISPO's default relative ``clip_high`` of 4).
        required: framework settings that must be set (verl's own loss refuses to run without them).
        unsupported: framework setting -> why the objective cannot honour it when it is on (raised as
            ``NotImplementedError`` with that reason).
        metrics: TRL only: the family of TRL's loss metrics the objective logs under TRL's keys; None: none.
    """

    fields: Mapping[str, str] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    paper: Mapping[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    unsupported: Mapping[str, str] = field(default_factory=dict)
    metrics: TRLMetrics | None = None

    def __post_init__(self) -> None:
        for name in ("fields", "fixed", "paper", "unsupported"):  # read-only: one instance serves a class
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
