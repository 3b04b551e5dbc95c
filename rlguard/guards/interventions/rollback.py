"""Roll back to the last healthy snapshot on a slow failure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext

__all__ = ["Rollback", "no_snapshot_before", "rollback_trigger"]


def rollback_trigger(ctx: StepContext, critical: Sequence[str], max_consecutive_skips: int) -> str | None:
    """Why this step rolls back, or None: the detectors with a ``critical`` alarm, or the poisoned batches skipped
    in a row once they reach ``max_consecutive_skips`` (a run whose batches keep being poisoned no longer learns; a
    batch skipped for carrying no signal, ``skip_no_signal``, is not counted: ``StepContext.consecutive_skips``)."""
    if critical:
        return ", ".join(critical)
    if ctx.consecutive_skips >= max_consecutive_skips:
        return f"{ctx.consecutive_skips} poisoned steps skipped in a row"
    return None


def no_snapshot_before(ctx: StepContext, critical: Sequence[str]) -> str | None:
    """Why no snapshot can undo the ``critical`` conditions, or None: there is no healthy step, or a detector of
    ``critical`` found its condition from its first judged observation (never a clean one past its warm-up), so
    every healthy step may already hold it (it may have begun in the warm-up; on a sparse log the snapshots of the
    warm-up are few steps apart from its onset). A rollback to a state that already had the condition cannot help."""
    if ctx.last_healthy_step is None:
        return "no healthy snapshot to roll back to"
    if ctx.judged_clean is None:
        return None
    found = [n for n in critical if n not in ctx.judged_clean]
    if found:
        return f"no snapshot known to be from before the onset ({', '.join(found)} found from its first judged step)"
    return None


@dataclass(kw_only=True)
class Rollback(Intervention):
    """Roll model and optimizer back to the last healthy snapshot on a critical alarm of a slow failure
    (collapse cannot be undone by skipping a step), or after too many poisoned batches skipped in a row.

    ``on`` holds the detectors of a state the weights carry: the policy's reward, entropy (collapsed or blown up),
    KL to the reference, completion length (collapsed or run away) and repetition, and the train-inference gap. A
    snapshot taken before the condition's onset does not have it, so a rollback can undo it; the snapshot is taken
    at a healthy step only (no finding, no alarm), hence before the onset of the excursion that raised the alarm.
    With ``GuardConfig(consequence="online")`` a critical alarm needs a critical finding by the consequence rule
    (unrecoverable, sustained, or followed by lost control), never a lone excursion. Conditions of the data or the
    budget (``zero_variance_groups``, ``truncation``) and per-step faults (``grad_norm_spike``, ``ratio_explosion``:
    a skip) are not in it: restored weights do not change them.

    Attributes:
        on: detectors whose critical alarm rolls back.
        max_consecutive_skips: poisoned batches skipped in a row that also roll back (``Proposal.poisoned``).
        max_rollbacks: after this many rollbacks the guard halts instead.
    """

    name = "rollback"
    summary = (
        "roll back on critical reward or entropy collapse, entropy blow-up, KL blow-up, length collapse or "
        "explosion, repetition or mismatch growth, or 3 poisoned batches skipped in a row"
    )

    on: tuple[str, ...] = (
        "entropy_collapse",
        "entropy_blowup",
        "reward_collapse",
        "kl_ref_blowup",
        "length_collapse",
        "length_explosion",
        "repetition",
        "mismatch_growth",
    )
    max_consecutive_skips: int = 3
    max_rollbacks: int = 3

    def __post_init__(self) -> None:
        self._s_rollbacks = 0

    def propose(self, ctx: StepContext) -> Proposal | None:
        critical = [n for n in self.on if ctx.alarms.get(n) == "critical"]
        why = rollback_trigger(ctx, critical, self.max_consecutive_skips)
        if why is None:
            return None
        if self._s_rollbacks >= self.max_rollbacks:
            return Proposal("halt", f"{why}; {self._s_rollbacks} rollbacks did not help")
        if (none := no_snapshot_before(ctx, critical)) is not None:
            return Proposal("halt", f"{why}; {none}")
        self._s_rollbacks += 1
        return Proposal("rollback", why, rollback_to=ctx.last_healthy_step)
