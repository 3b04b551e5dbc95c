"""The torch-free half of the plugin: a detector, in the ``rlguard.detectors`` group, which the doctor, the watch
and every guard load (``rlguard.guards`` imports without torch, so this runs in the core install)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlguard.guards import Detector, Finding
from rlguard.hookspecs import hookimpl


@dataclass(kw_only=True)
class LossAbove(Detector):
    """Critical where the step's ``loss`` is at or above ``limit``: a run whose loss left the range it trains in."""

    name = "loss_above"
    source = "band_plugin (a worked example)"
    summary = "loss >= limit"
    limit: float = 10.0

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        loss = stats.get("loss")
        if armed and loss is not None and loss >= self.limit:
            return Finding("critical", loss, self.limit, f"loss {loss:.3g} >= {self.limit}")
        return None


@hookimpl
def rlguard_add_detectors() -> list[type[Detector]]:
    return [LossAbove]
