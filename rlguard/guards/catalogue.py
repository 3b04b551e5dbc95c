"""What the guard can do, as data: every registered detector and intervention with its defaults, which presets run
each intervention, and the cause table (``rlguard detectors`` prints it as tables or JSON)."""

from __future__ import annotations

from typing import Any

from rlguard.guards.config import PRESETS, GuardConfig
from rlguard.guards.guard import Guard
from rlguard.guards.interventions.causes import CAUSES
from rlguard.guards.registry import detector_registry, intervention_registry

__all__ = ["catalogue"]


def catalogue() -> dict[str, Any]:
    """``{"detectors", "interventions", "presets", "remedies"}``, JSON-ready (defaults may need ``default=str``)."""
    dets, acts = detector_registry(), intervention_registry()
    running = {p: set(Guard(GuardConfig.preset(p)).interventions) for p in PRESETS}
    return {
        "detectors": [
            {"name": n, "summary": c.summary, "source": c.source, "defaults": c.defaults()} for n, c in dets.items()
        ],
        "interventions": [
            {
                "name": n,
                "summary": c.summary,
                "presets": [p for p in PRESETS if n in running[p]],
                "defaults": c.defaults(),
            }
            for n, c in acts.items()
        ],
        "presets": list(PRESETS),
        "remedies": [
            {
                "cause": c.diagnosis,
                "diagnosed_by": c.diagnosed_by,
                "remedies": c.remedies,
                "intervention": c.answer,
                "yields": list(c.yields),
            }
            for c in CAUSES
        ],
    }
