"""Skip the optimizer step of a batch that carries no policy-gradient signal: the step's own stat decides.

With group-relative advantages, ``A_i = (r_i - mean(r_group)) / std(r_group)`` (GRPO, DeepSeekMath arXiv 2402.03300,
sec. 4.1.2; Dr. GRPO, arXiv 2503.20783, without the division), a group whose rewards are all equal has ``A = 0``
for every completion (:func:`~rlguard.core_losses.advantages.group_advantages` sets it exactly). Where every group of
the batch is such a group (``frac_zero_std_groups`` >= 1: the stat is the groups' mean weighted by groups over all
ranks, so 1 only where every group on every rank is all-equal), the policy-gradient term is 0 and the update would be
Adam's momentum, weight decay and the KL or entropy terms alone; DAPO's dynamic sampling (arXiv 2503.14476, sec. 3.2)
filters every such prompt out, so such a batch gives no update there either.

The skip says nothing about the weights (the prompts were too hard or too easy), so it is no poisoned batch
(``Proposal(poisoned=False)``): it breaks the row of poisoned batches skipped in a row that rolls back
(:func:`~rlguard.guards.interventions.rollback.rollback_trigger`), as an applied step does. A run in a too-hard phase
is skipped until its groups differ again, never rolled back for it.

Cost: with a KL penalty (``beta > 0``) or an entropy bonus the skipped step also loses their pull. For group-relative
advantages only: with a critic (GAE) or a batch-wide baseline such a batch still has a signal; switch it off there
(``GuardConfig(interventions={"skip_no_signal": None})``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlguard.guards.interventions.base import Intervention, Proposal, StepContext
from rlguard.guards.signal import NO_SIGNAL_STAT, without_signal

__all__ = ["NO_SIGNAL", "SkipNoSignal"]

#: how the reason of a skip for a batch without signal begins (a replay tells such skips from the others by it)
NO_SIGNAL = "no policy-gradient signal"


@dataclass(kw_only=True)
class SkipNoSignal(Intervention):
    """Skip the optimizer step when every group of the batch has all-equal rewards (all advantages exactly 0).

    Attributes:
        metric: the share of groups whose rewards are all equal (reduced over all ranks, weighted by groups).
    """

    name = "skip_no_signal"
    summary = "skip the optimizer step of a batch whose every group has all-equal rewards (no policy gradient)"

    metric: str = NO_SIGNAL_STAT

    def propose(self, ctx: StepContext) -> Proposal | None:
        # a non-finite share is the nonfinite detector's (skip_step's) to answer; a missing one is no evidence
        if not without_signal(ctx.stats, self.metric):
            return None
        share = ctx.stats[self.metric]
        why = f"{NO_SIGNAL}: every group has all-equal rewards ({self.metric} {share:.0%}), all advantages 0"
        return Proposal("skip", why, poisoned=False)
