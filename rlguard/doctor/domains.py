"""The values each canonical stat can take, and why (:data:`DOMAINS`): a logged series must fit before the doctor
maps a key onto the stat by its name alone (:mod:`rlguard.doctor.keys`). The stats: :data:`rlguard.metrics.METRICS`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from rlguard.metrics import STALENESS_BUCKETS

__all__ = ["DOMAINS", "Domain"]


@dataclass(frozen=True)
class Domain:
    """The values a canonical stat can take, and why: a logged series must fit before the doctor maps a key onto
    the stat by its name alone (``rlguard/doctor/keys.py``).

    Attributes:
        low, high: every finite value lies in ``[low, high]``.
        median: the series' median lies in this closed interval.
        not_a_fraction: some value exceeds 1 (a series that stays within ``[0, 1]`` is a fraction, not this stat).
        why: the principle, said when a key is refused.
    """

    low: float = -math.inf
    high: float = math.inf
    median: tuple[float, float] = (-math.inf, math.inf)
    not_a_fraction: bool = False
    why: str = ""

    def misfit(self, values: Sequence[float]) -> str | None:
        """Why the finite ``values`` do not fit (the first bound they break, with the values), or None."""
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return "no finite value"
        return self.misfit_of(min(finite), max(finite), statistics.median(finite))

    def misfit_of(self, lo: float, hi: float, mid: float) -> str | None:
        """:meth:`misfit` of finite values whose smallest is ``lo``, largest ``hi`` and median ``mid``."""
        if lo < self.low or hi > self.high:
            return f"values {lo:.4g}..{hi:.4g} outside [{self.low:g}, {self.high:g}]: {self.why}"
        if not self.median[0] <= mid <= self.median[1]:
            return f"median {mid:.4g} outside [{self.median[0]:g}, {self.median[1]:g}]: {self.why}"
        if self.not_a_fraction and hi <= 1.0:
            return f"values {lo:.4g}..{hi:.4g} never above 1, a fraction: {self.why}"
        return None


_NONNEGATIVE = Domain(low=0.0, why="an entropy, a norm, a length, a count or a rate is >= 0")
_FRACTION = Domain(low=0.0, high=1.0, why="a fraction lies in [0, 1]")
#: KL >= 0; its k1 estimate can dip below 0 on a batch, its median over a run does not
_KL = Domain(median=(0.0, math.inf), why="a KL is >= 0 (its k1 estimate on average)")
#: pi/pi_old = exp(log-ratio) >= 0, and its mean under pi_old is 1 (E_old[pi/pi_old] = 1)
_RATIO = Domain(low=0.0, median=(0.5, 2.0), not_a_fraction=True, why="a ratio is >= 0 and its mean is near 1")
#: canonical name -> the values it can take; a name not listed can take any value (loss, reward_mean)
DOMAINS: dict[str, Domain] = {
    **dict.fromkeys(
        ("entropy", "grad_norm", "lr", "update_ratio", "reward_std", "length_mean", "length_max", "nonfinite"),
        _NONNEGATIVE,
    ),
    **dict.fromkeys(("mismatch_logp_abs_mean", "mismatch_logp_abs_max"), _NONNEGATIVE),
    **dict.fromkeys(("staleness_mean", "staleness_max", "stale_dropped", "policy_version"), _NONNEGATIVE),
    **dict.fromkeys(("staleness_steps_mean", "staleness_steps_max"), _NONNEGATIVE),
    "clip_log_width": _NONNEGATIVE,
    **dict.fromkeys(("staleness_bound", *(name for name, _, _ in STALENESS_BUCKETS)), _NONNEGATIVE),
    **dict.fromkeys(("clip_frac", "clip_frac_low", "clip_frac_high", "masked_frac", "truncated_frac"), _FRACTION),
    **dict.fromkeys(("frac_zero_std_groups", "frac_zero_std_solved", "repetition_rate"), _FRACTION),
    **dict.fromkeys(("mismatch_prob_abs_mean", "mismatch_prob_abs_max"), _FRACTION),
    **dict.fromkeys(("kl_ref", "kl_old", "mismatch_kl"), _KL),
    **dict.fromkeys(("ratio_mean", "seq_ratio_mean"), _RATIO),
    **dict.fromkeys(
        ("ratio_max", "seq_ratio_max"),
        Domain(low=0.0, median=(0.5, math.inf), not_a_fraction=True, why="the largest ratio is >= their mean, 1"),
    ),
    **dict.fromkeys(
        ("ratio_min", "seq_ratio_min"),
        Domain(low=0.0, median=(0.0, 2.0), why="the smallest ratio is >= 0 and <= their mean, 1"),
    ),
    "mismatch_prob_corr": Domain(low=-1.0, high=1.0, why="a correlation lies in [-1, 1]"),
}
