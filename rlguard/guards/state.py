"""Checkpointable private state, shared by detectors and interventions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from rlguard.guards.robust import RollingWindow


class PrivateState:
    """Saves every attribute named ``_s_*`` (rolling windows as lists) and lists constructor defaults.

    Subclasses are dataclasses: thresholds are fields, state is created in ``__post_init__`` as ``_s_*``.
    """

    def state_dict(self) -> dict[str, Any]:
        """Baselines and counters, JSON-ready."""
        return {
            k: (list(v.values) if isinstance(v, RollingWindow) else v)
            for k, v in vars(self).items()
            if k.startswith("_s_")
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        for k, v in state.items():
            cur = getattr(self, k, None)
            if isinstance(cur, RollingWindow):
                setattr(self, k, RollingWindow(cur.values.maxlen or len(v), v))
            else:
                setattr(self, k, v)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Constructor arguments and their defaults."""
        return {f.name: f.default for f in fields(cls) if f.init}  # type: ignore[arg-type]
