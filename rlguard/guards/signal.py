"""Whether a step's batch carries a policy-gradient signal: the one test that the ``skip_no_signal`` intervention
and the update-scale detectors share.

With group-relative advantages, ``A_i = (r_i - mean(r_group)) / std(r_group)`` (GRPO, DeepSeekMath arXiv 2402.03300,
sec. 4.1.2; Dr. GRPO, arXiv 2503.20783, without the division), a group whose rewards are all equal has ``A = 0`` for
every completion. Where every group of the batch is such a group (``frac_zero_std_groups`` >= 1: the stat is the
groups' mean weighted by groups over all ranks, so 1 only where every group on every rank is all-equal), the
policy-gradient term is 0 and the step updates by the KL or entropy terms alone (or not at all).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["NO_SIGNAL_STAT", "without_signal"]

#: the stat that says it: the share of the step's groups whose rewards are all equal
NO_SIGNAL_STAT = "frac_zero_std_groups"


def without_signal(stats: Mapping[str, float], metric: str = NO_SIGNAL_STAT) -> bool:
    """Whether every group of the step's batch has all-equal rewards (``stats[metric]`` >= 1), so that its batch
    carries no policy-gradient signal. A missing or non-finite share is no evidence: False."""
    share = stats.get(metric)
    return share is not None and math.isfinite(share) and share >= 1.0
