"""A run that stopped learning (``rlguard.guards.detectors.stalls``): the run rule's chance against its formula
written out, the reward's std at zero beyond chance (advantage collapse) and stats that stopped changing (frozen
values), the converged case a warning, and what chance explains left alone."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Mapping
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from rlguard.guards.detectors import AdvantageCollapse, FrozenValues
from rlguard.guards.detectors.stalls import ALPHA, chance_of_run, run_needed
from rlguard.guards.events import Finding
from tests.helpers.profiles import examples


def _feed(det: AdvantageCollapse | FrozenValues, rows: list[dict[str, float]]) -> list[tuple[int, str]]:
    """Each row through ``check`` (armed after the detector's warm-up); (position, severity) of each finding."""
    out: list[tuple[int, str]] = []
    for i, stats in enumerate(rows):
        f = det.check(i, stats, armed=i >= det.warmup)
        if f is not None:
            out.append((i, f.severity))
    return out


def test_the_chance_of_a_run_is_the_rule_of_succession_and_the_union_bound() -> None:
    # 2 events in 10 healthy records; a run of 5 among 40 records: 40 * 3/12 * 4/13 * 5/14 * 6/15 * 7/16
    expected = 40 * Fraction(3, 12) * Fraction(4, 13) * Fraction(5, 14) * Fraction(6, 15) * Fraction(7, 16)
    assert math.isclose(chance_of_run(2, 10, 5, 40), float(expected), rel_tol=1e-12)
    assert chance_of_run(0, 0, 0, 1) == 1.0  # capped
    assert math.isclose(ALPHA, 1 / 370.398, rel_tol=1e-4)  # 2 * Phi(-3)
    # 0 of 6, 12 records seen: 12 * k! 7! / (k + 7)! = 12 / C(k + 7, 7) <= 1/370.4 needs C >= 4445: C(15, 7) = 6435
    need = run_needed(0, 6, 12)
    assert need == 8 and chance_of_run(0, 6, need, 12) <= ALPHA < chance_of_run(0, 6, need - 1, 12)


def _grpo_step(rng: random.Random, reward: float, std: float) -> dict[str, float]:
    return {"reward_mean": reward + rng.gauss(0, 0.02), "reward_std": std}


def test_reward_std_at_zero_after_a_healthy_start_is_critical_once_chance_cannot_explain_it() -> None:
    """Healthy for 12 records (std 0.3), then every group has one reward (std 0) at a reward of 0.3: critical
    after k zeros in a row, not before: (12 + k) / C(k + 13, 13) <= 1/370.4 first at k = 5 (17 / 8568)."""
    rng = random.Random(0)
    rows = [_grpo_step(rng, 0.3, 0.3 + rng.gauss(0, 0.02)) for _ in range(12)]
    rows += [_grpo_step(rng, 0.3, 0.0) for _ in range(10)]
    found = _feed(AdvantageCollapse(), rows)
    assert found[0] == (12 + 5 - 1, "critical"), found
    assert all(sev == "critical" for _, sev in found) and len(found) == 10 - 4


def test_groups_without_variance_by_chance_are_no_finding() -> None:
    """One prompt a step: all samples agree on 30% of the steps (a small batch). Over 2,000 steps the run's own rate
    explains the runs of zeros that occur (the longest is a handful): no finding."""
    rng = random.Random(1)
    rows = [_grpo_step(rng, 0.4, 0.0 if rng.random() < 0.3 else 0.4) for _ in range(2000)]
    assert _feed(AdvantageCollapse(), rows) == []


def test_a_converged_reward_without_variance_is_a_warning() -> None:
    """Every group solved (reward 1.0, std 0) is success, not a collapse: a warning that says converged."""
    rng = random.Random(2)
    det = AdvantageCollapse()
    rows = [_grpo_step(rng, 0.6 + 0.02 * i, 0.3) for i in range(12)] + [{"reward_mean": 1.0, "reward_std": 0.0}] * 8
    found = _feed(det, rows)
    assert found and {sev for _, sev in found} == {"warn"}
    f = det.check(99, {"reward_mean": 1.0, "reward_std": 0.0}, armed=True)
    assert f is not None and "Converged" in f.message


def test_a_stat_that_stops_changing_is_critical_and_one_constant_from_the_start_is_not() -> None:
    """Completion length moving for 12 records, then one 9-token answer: critical after k repeats, (11 + k) /
    C(k + 12, 12) <= 1/370.4 first at k = 5 (16 / 6188); a stat constant from its first record (a setting, a
    stat the run does not compute) never is, and the loss is not judged (exactly 0 whenever every advantage is)."""
    rng = random.Random(3)
    rows = [{"length_mean": 120 + rng.gauss(0, 5), "grad_norm": 1.0, "loss": rng.gauss(0, 0.05)} for _ in range(12)]
    rows += [{"length_mean": 9.0, "grad_norm": 1.0, "loss": 0.0}] * 10
    det = FrozenValues()
    found = _feed(det, rows)
    assert found[0] == (12 + 5, "critical"), found
    f = det.check(30, rows[-1], armed=True)
    assert f is not None and f.message.startswith("length_mean has been 9 exactly on"), f
    assert _feed(FrozenValues(), [{"loss": r["loss"]} for r in rows]) == []


def test_a_coarsely_logged_stat_needs_a_longer_run() -> None:
    """A stat logged with one decimal repeats often by chance: its own repeat rate sets the run needed, so the runs
    that chance makes over 2,000 records are no finding, and a run much longer than those is."""
    rng = random.Random(4)
    rows = [{"grad_norm": round(0.5 + rng.gauss(0, 0.05), 1)} for _ in range(2000)]
    longest = max(len(list(g)) for _, g in itertools.groupby(r["grad_norm"] for r in rows))
    assert longest >= 5  # chance repeats a coarse value several times in a row
    assert _feed(FrozenValues(), rows) == []
    frozen = _feed(FrozenValues(), rows + [{"grad_norm": 0.7}] * 60)
    assert frozen and frozen[0][0] > 2000 + longest


def test_frozen_at_a_converged_reward_is_a_warning() -> None:
    rng = random.Random(5)
    rows = [{"reward_mean": 0.7 + 0.01 * i, "grad_norm": 0.5 + rng.gauss(0, 0.05)} for i in range(12)]
    rows += [{"reward_mean": 1.0, "grad_norm": 0.0}] * 10
    found = _feed(FrozenValues(), rows)
    assert found and {sev for _, sev in found} == {"warn"}


def test_state_round_trips() -> None:
    rng = random.Random(6)
    rows = [{"entropy": rng.gauss(1, 0.05), "reward_mean": 0.3, "reward_std": 0.3} for _ in range(12)]
    for cls in (AdvantageCollapse, FrozenValues):
        a, b = cls(), cls()
        _feed(a, rows)
        b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # as the state file holds it
        tail = {"entropy": 0.0, "reward_mean": 0.3, "reward_std": 0.0}
        got = [(a.check(20 + i, tail, True), b.check(20 + i, tail, True)) for i in range(8)]
        assert all((x is None) == (y is None) for x, y in got) and any(x is not None for x, _ in got), cls


class _EveryStatSeen(FrozenValues):
    """``frozen_values`` taking every finite stat through ``_see`` (no shortcut for a changed value)."""

    def check(self, step: int, stats: Mapping[str, float], armed: bool) -> Finding | None:
        self._see_reward(stats)
        finding: Finding | None = None
        for i, name in enumerate(self.stats):
            value = stats.get(name)
            if value is not None and math.isfinite(value):
                finding = finding or self._see(i, name, float(value), armed)
        return finding


@examples(quick=100, long=2000)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                name: st.one_of(st.sampled_from([0.0, -0.0, 1.0, 2.0]), st.floats(), st.integers(-2, 2))
                for name in ("grad_norm", "entropy", "length_mean", "reward_mean")
            },
        ),
        max_size=120,
    ),
    restore_at=st.integers(0, 120),
)
def test_frozen_values_shortcut_for_a_changed_value_judges_as_every_stat_seen(
    rows: list[dict[str, float]], restore_at: int
) -> None:
    """Runs of repeats (few distinct values, -0.0 equal to 0.0, integers), NaN and missing stats: every finding and
    the state after every record are those of the detector that takes each stat through ``_see``."""
    fast, slow = FrozenValues(warmup=3), _EveryStatSeen(warmup=3)
    for i, stats in enumerate(rows):
        if i == restore_at:
            fast.load_state_dict(json.loads(json.dumps(fast.state_dict())))
            slow.load_state_dict(json.loads(json.dumps(slow.state_dict())))
        assert fast.check(i, stats, i >= 3) == slow.check(i, stats, i >= 3)
        assert repr(fast.state_dict()) == repr(slow.state_dict())
