"""An opt-in intervention, in the ``rlguard.interventions`` group: it halves the learning rate while the plugin's
detector finds the loss too high, and runs only where a ``GuardConfig`` names it."""

from __future__ import annotations

from dataclasses import dataclass

from rlguard.guards import Intervention, Proposal, StepContext
from rlguard.hookspecs import hookimpl


@dataclass(kw_only=True)
class HalveLROnLoss(Intervention):
    """LR x ``factor`` on each step with a ``loss_above`` finding."""

    name = "halve_lr_on_loss"
    summary = "LR x factor while loss_above finds the loss too high"
    enabled_by_default = False  # GuardConfig(interventions={..., "halve_lr_on_loss": {}}) turns it on
    factor: float = 0.5

    def propose(self, ctx: StepContext) -> Proposal | None:
        if "loss_above" in ctx.findings:
            return Proposal("step", "loss too high", {"lr_scale": self.factor})
        return None


@hookimpl
def rlguard_add_interventions() -> list[type[Intervention]]:
    return [HalveLROnLoss]
