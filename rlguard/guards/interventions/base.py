"""What every intervention shares: the :class:`StepContext` it reads and the :class:`Intervention` base class.

Each intervention proposes an outcome and controls for the step (a :class:`Proposal`) from the detectors' findings
and alarms.

The guard acts on the proposal that comes first in ``halt > rollback > skip > a step that changes the LR > a step
that changes the clip range > a step`` (:data:`~rlguard.guards.decision.LOGGED_ACTIONS`); the LR and clip scales of
all interventions are carried in the decision's controls whatever the outcome. Interventions are keyword-only
dataclasses with private state (``_s_*``) saved in ``state_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from rlguard.guards.decision import Proposal
from rlguard.guards.events import SEVERITY_LEVEL, Finding, Severity
from rlguard.guards.fields import NON_NEGATIVE, Range
from rlguard.guards.state import PrivateState

__all__ = ["CONSEQUENCES", "Intervention", "Proposal", "StepContext", "findings_at_least"]

#: the detectors whose critical finding says the run is losing control (reward or entropy collapse, a KL blow-up, a
#: ratio or gradient-norm explosion), as opposed to the evidence of a cause: what a remedy by cause escalates on
CONSEQUENCES: tuple[str, ...] = (
    "reward_collapse",
    "entropy_collapse",
    "kl_ref_blowup",
    "kl_old_blowup",
    "ratio_explosion",
    "grad_norm_explosion",
)


@dataclass(frozen=True)
class StepContext:
    """What interventions see.

    Attributes:
        step: the optimizer step.
        stats: the reduced stats.
        findings: this step's findings by detector (after warm-up, before patience).
        alarms: raised alarms by detector (after patience and hysteresis).
        alarm_age: steps each raised alarm has been at ``critical`` (0 if only ``warn``).
        consecutive_skips: poisoned batches skipped in a row before this one (``Proposal.poisoned``: a batch
            skipped for carrying no signal breaks the row, as an applied step does).
        last_healthy_step: the last step with no finding and no alarm, or None.
        capabilities: what the bound actuator can do (``Actuator.capabilities``); None for a guard bound to none.
        handed_over: intervention -> the detectors whose findings it leaves to the enabled intervention that
            answers their cause (:data:`~rlguard.guards.interventions.causes.CAUSES`, :func:`handed_over`).
        judged_clean: the detectors whose condition a healthy snapshot is known to predate: they judged (past
            their warm-up) an observation without a finding, or, for this step's finding beyond an absolute bound
            (which needs no baseline), had any observation without one; None where not tracked (every snapshot is
            taken as such).
    """

    step: int
    stats: Mapping[str, float]
    findings: Mapping[str, Finding]
    alarms: Mapping[str, Severity]
    alarm_age: Mapping[str, int]
    consecutive_skips: int
    last_healthy_step: int | None
    capabilities: frozenset[str] | None = None
    handed_over: Mapping[str, frozenset[str]] = field(default_factory=dict)
    judged_clean: frozenset[str] | None = None

    def yields(self, intervention: str) -> bool:
        """Whether ``intervention`` holds back this step: a detector whose cause another enabled intervention
        answers found something (``lr_backoff`` leaves a train-inference gap to ``mismatch_remedy``)."""
        return any(n in self.findings for n in self.handed_over.get(intervention, ()))

    def gap_in_ratio(self, explained_by: tuple[str, ...]) -> bool:
        """Whether a finding of ``explained_by`` (``mismatch_growth``) this step means the ratios to pi_old carry
        the train-inference gap: true unless pi_old is recomputed by the trainer, which the capability
        ``rollout_correction`` declares (the engine's log-probs then arrive beside pi_old, not as pi_old, and the
        ratio measures the update alone)."""
        return not self.pi_old_recomputed and any(n in self.findings for n in explained_by)

    @property
    def pi_old_recomputed(self) -> bool:
        """Whether the trainer recomputes pi_old and passes the engine's log-probs beside it (the actuator
        declares ``rollout_correction``); false for a guard bound to no actuator."""
        return self.capabilities is not None and "rollout_correction" in self.capabilities


@dataclass(kw_only=True)
class Intervention(PrivateState):
    """Base class; subclasses set ``name`` and implement :meth:`propose`.

    ``enabled_by_default = False`` makes an intervention opt-in: it runs only where a
    :class:`~rlguard.guards.GuardConfig` names it (a preset, or the user's config).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    enabled_by_default: ClassVar[bool] = True
    #: fields under an earlier name: old name -> new name, or "" for a field that no longer exists (a config that
    #: sets it gets a DeprecationWarning saying which)
    renamed_fields: ClassVar[dict[str, str]] = {}
    #: the range of each number a config may set (:func:`rlguard.guards.fields.field_range`): every factor, scale,
    #: count and number of steps of an intervention is ``>= 0``
    field_ranges: ClassVar[dict[str, Range]] = {"*": NON_NEGATIVE}

    def propose(self, ctx: StepContext) -> Proposal | None:
        """The proposal for this step, or None."""
        raise NotImplementedError

    def on_rollback(self, step: int) -> None:
        """Called when the guard decides to roll back (state that must not survive it)."""


def findings_at_least(findings: Mapping[str, Finding], on: tuple[str, ...], severity: Severity) -> list[str]:
    """The detectors of ``on`` with a finding of at least ``severity`` this step, in ``on``'s order."""
    level = SEVERITY_LEVEL[severity]
    return [n for n in on if n in findings and SEVERITY_LEVEL[findings[n].severity] >= level]
