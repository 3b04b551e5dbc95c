"""Detectors of a run that stopped learning: the reward's spread gone (advantage collapse) and stats that stopped
changing (frozen values). Both judge a run of records that is too long to be chance, by one rule
(:func:`chance_of_run`).

The rule: an event (the reward's std at zero; a stat equal, bit for bit, to its previous record) happened ``E``
times in the run's ``N`` healthy records. With a uniform prior on its chance per record, the chance that the next
``L`` records are all events is Laplace's rule of succession applied ``L`` times,
``prod_{j<L} (E + 1 + j) / (N + 2 + j)`` (the Beta(E + 1, N - E + 1) posterior's ``E[p ** L]``): it includes the
log's rounding (a stat logged with few decimals repeats more often, and its own rate says so), a small batch's
chance of groups without variance, and how little a short history tells. One such run anywhere among the ``t``
records seen has chance at most ``t`` times that (the union bound over where it starts). A run is evidence when
that chance is at most ``ALPHA``, 1/370: the false-alarm rate of a Shewhart 3-sigma limit, the rate the
consequence rule's run rules are built on (:mod:`rlguard.guards.consequence.rule`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from rlguard.guards.detectors.base import Detector, _RewardLevel
from rlguard.guards.events import Finding

__all__ = ["ALPHA", "AdvantageCollapse", "FrozenValues", "chance_of_run", "run_needed"]

#: the chance of a false alarm a run of events may have: a Shewhart 3-sigma limit's, 2 * Phi(-3) = 1/370
ALPHA = 2 * 0.5 * math.erfc(3 / math.sqrt(2))


def chance_of_run(events: int, records: int, run: int, seen: int) -> float:
    """Upper bound on the chance of ``run`` events in a row somewhere among ``seen`` records, when the run's healthy
    records showed ``events`` events in ``records``: ``seen * prod_{j<run} (events + 1 + j) / (records + 2 + j)``
    (the rule of succession, ``run`` times; the union bound over where the run starts). Capped at 1."""
    chance = float(max(seen, 1))
    for j in range(run):
        chance *= (events + 1 + j) / (records + 2 + j)
    return min(1.0, chance)


def run_needed(events: int, records: int, seen: int, alpha: float = ALPHA) -> int:
    """The shortest run of events whose :func:`chance_of_run` (with ``seen`` records) is at most ``alpha``, for a
    message (at most 10,000: a rate of events near 1 needs runs longer than any log)."""
    run = 1
    while run < 10_000 and chance_of_run(events, records, run, seen) > alpha:
        run += 1
    return run


@dataclass(kw_only=True)
class AdvantageCollapse(_RewardLevel, Detector):
    """The reward's standard deviation (``reward_std``) at zero on more records in a row than chance explains, while
    the reward is below the top of its range. TRL logs the std over the step's rewards (``nanstd(rewards)``,
    ``GRPOTrainer._generate_and_score_completions``; older versions the mean of the groups' std): either is 0
    only when every group has one reward.

    GRPO's advantage is ``(r - mean) / (std + eps)`` over a group (DeepSeekMath, arXiv 2402.03300, eq. 3): a group
    whose rewards are all equal has advantage 0 and gives no gradient, and a step whose groups all do (std 0)
    changes nothing but the KL term (DAPO's dynamic sampling filters such groups for that reason, arXiv 2503.14476,
    sec. 3.2). Zero means at most ``zero_std``: TRL's ``eps`` (``std + 1e-4``), below which the normalised
    advantages are at most half their size and vanish as the std does (a log rounded to four decimals writes 0).
    A small batch (one prompt a step) has groups without variance by chance: the run's own rate says how long a
    run of them is not chance (:func:`chance_of_run`). At a converged reward (top 20% of its range,
    :func:`~rlguard.guards.consequence.rule.converged`, as ``zero_variance_groups``) the groups are solved:
    nothing left to learn, a warning.

    Attributes:
        zero_std: reward std at or below which a record carries no advantage.
        alpha: chance of the run below which it is a finding (:data:`ALPHA`).
        converged_failing: see :func:`~rlguard.guards.consequence.rule.converged`.
        level_window: recent reward observations whose median is the reward level.
    """

    name = "advantage_collapse"
    finding_class = "signal"
    source = (
        "GRPO group-normalised advantage (DeepSeekMath, arXiv 2402.03300); DAPO dynamic sampling, arXiv 2503.14476; "
        "a run of zero-std records beyond chance (rule of succession, union bound, alpha 1/370)"
    )
    summary = (
        "reward_std <= 1e-4 on more records in a row than the run's own rate explains (chance <= 1/370): no "
        "gradient; a warning at a converged reward (top 20% of its range)"
    )

    warmup: int = 10
    patience: int = 1
    zero_std: float = 1e-4
    alpha: float = ALPHA
    converged_failing: float = 0.2
    level_window: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._s_zeros = 0  # healthy records with std at zero
        self._s_records = 0  # healthy records
        self._s_run = 0  # zero-std records in a row, the current one included
        self._s_flagged = False  # the current run reached a finding (its records do not teach the baseline)
        self._init_level()

    def reads(self) -> tuple[str, ...]:
        return ("reward_std",)

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        self._see_reward(stats)
        std = stats.get("reward_std")
        if std is None or not math.isfinite(std):
            return None
        std = float(std)
        if std > self.zero_std:
            if not self._s_flagged:
                self._s_zeros += self._s_run
                self._s_records += self._s_run
            self._s_records += 1
            self._s_run, self._s_flagged = 0, False
            return None
        self._s_run += 1
        seen = self._s_records + self._s_run
        # a run that reached a finding stays one until it ends: a longer run is no likelier than the one that did
        if not armed or (
            not self._s_flagged and chance_of_run(self._s_zeros, self._s_records, self._s_run, seen) > self.alpha
        ):
            return None
        self._s_flagged = True
        top = self._converged()
        need = run_needed(self._s_zeros, self._s_records, seen, self.alpha)
        head = (
            f"reward_std {std:.3g} <= {self.zero_std:g} on {self._s_run} records in a row (the run's own rate "
            f"{self._s_zeros}/{self._s_records} makes {need} in a row chance <= {self.alpha:.2g}): every group has "
            f"one reward, so GRPO's advantages are 0 and the step has no gradient; {self._level()}"
        )
        if top:
            return Finding(
                "warn",
                float(self._s_run),
                float(need),
                head + ". Converged: nothing left to learn (stop, or use harder prompts).",
            )
        return Finding(
            "critical",
            float(self._s_run),
            float(need),
            head + ". Mode collapse or a reward that cannot tell answers apart: check the completions for one "
            "repeated answer, raise the temperature or entropy_coef, or roll back; filter such groups (DAPO "
            "dynamic sampling).",
        )


#: the stats whose exact repetition is judged: what the policy does (its evaluation, measured on a fixed set, first;
#: its completions' length and entropy) and what its update does (the gradient norm). Not the loss: GRPO's loss is
#: exactly 0 whenever every advantage is (each group one reward, no KL term), which a small batch gives by chance on
#: most steps while the policy still moves (the loss of rasbt's ch. 7 runs is 0 on more than half of their steps); that
#: condition is ``advantage_collapse``'s, read from ``reward_std``
FROZEN_STATS: tuple[str, ...] = ("eval_score", "eval_loss", "length_mean", "entropy", "grad_norm")


@dataclass(kw_only=True)
class FrozenValues(_RewardLevel, Detector):
    """A stat that was changing repeats its value bit for bit on more records in a row than chance explains:
    a policy that no longer changes (deterministic, locked into one answer: one completion length, an evaluation
    that scores the same every time) or an update that is gone (a constant gradient norm).

    Each stat of ``stats`` keeps the rate at which it repeated its previous value over the run's healthy records
    (a stat logged with few decimals repeats more often, and its rate says so); ``L`` repeats in a row are a finding
    when :func:`chance_of_run` is at most ``alpha``. A stat that has not changed at least once among its healthy
    records (constant from the start: a setting, or a stat the run does not compute) is no evidence. At a converged
    reward (:func:`~rlguard.guards.consequence.rule.converged`) a frozen stat is a warning: a solved task leaves no
    gradient.

    Attributes:
        stats: the canonical stats judged, in order (the first frozen one is reported).
        alpha: chance of the run below which it is a finding (:data:`ALPHA`).
        converged_failing: see :func:`~rlguard.guards.consequence.rule.converged`.
        level_window: recent reward observations whose median is the reward level.
    """

    name = "frozen_values"
    finding_class = "signal"
    source = (
        "exact repetition beyond chance: the run's own repeat rate (rule of succession), union bound over the "
        "records, alpha 1/370 (a Shewhart 3-sigma limit)"
    )
    summary = (
        "a stat that was changing (eval metric, length, entropy, grad norm) repeats its value exactly "
        "on more records in a row than its own repeat rate explains (chance <= 1/370); a warning at a converged reward"
    )

    warmup: int = 10
    patience: int = 1
    stats: tuple[str, ...] = FROZEN_STATS
    alpha: float = ALPHA
    converged_failing: float = 0.2
    level_window: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        n = len(self.stats)
        self._s_last = [0.0] * n  # the stat's previous finite value
        self._s_seen = [0] * n  # 1 once it has one
        self._s_repeats = [0] * n  # healthy records equal to their previous one
        self._s_pairs = [0] * n  # healthy records after a first one
        self._s_run = [0] * n  # repeats in a row, the current one included
        self._s_flagged = [0] * n  # 1 once the current run reached a finding
        self._init_level()

    def reads(self) -> tuple[str, ...]:
        return self.stats

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        self._see_reward(stats)
        finding: Finding | None = None
        last, seen, runs, flagged = self._s_last, self._s_seen, self._s_run, self._s_flagged
        for i, name in enumerate(self.stats):
            value = stats.get(name)
            if value is None or not math.isfinite(value):
                continue
            value = float(value)
            if value != last[i] and seen[i] and not runs[i] and not flagged[i]:
                # most records: a changed value after a changed one, what :meth:`_see` does there (no run to count)
                self._s_pairs[i] += 1
                runs[i], flagged[i], last[i] = 0, 0, value
                continue
            found = self._see(i, name, value, armed)
            finding = finding or found
        return finding

    def _see(self, i: int, name: str, value: float, armed: bool) -> Finding | None:
        if not self._s_seen[i]:
            self._s_seen[i], self._s_last[i] = 1, value
            return None
        if value != self._s_last[i]:
            if not self._s_flagged[i]:
                self._s_repeats[i] += self._s_run[i]
                self._s_pairs[i] += self._s_run[i]
            self._s_pairs[i] += 1
            self._s_run[i], self._s_flagged[i], self._s_last[i] = 0, 0, value
            return None
        self._s_run[i] += 1
        repeats, pairs, run = self._s_repeats[i], self._s_pairs[i], self._s_run[i]
        seen = pairs + run
        if not armed or pairs - repeats < 1:
            return None
        if not self._s_flagged[i] and chance_of_run(repeats, pairs, run, seen) > self.alpha:
            return None
        self._s_flagged[i] = 1
        need = run_needed(repeats, pairs, seen, self.alpha)
        head = (
            f"{name} has been {value:.6g} exactly on {run + 1} records in a row; it repeated on {repeats} of its "
            f"{pairs} healthy records before, which makes {need} repeats in a row chance <= {self.alpha:.2g}: "
            f"the policy no longer changes or the gradient is gone; {self._level()}"
        )
        if self._converged():
            return Finding("warn", float(run + 1), float(need + 1), head + ". Converged: nothing left to learn.")
        return Finding(
            "critical",
            float(run + 1),
            float(need + 1),
            head + ". Check for a collapsed policy (one repeated answer), a zero learning rate or a detached loss; "
            "roll back to before it froze.",
        )
