"""The observations counted for the warm-ups (``rlguard.doctor.warmups``): counted once per set of stat names where
the names settle a detector's verdict, the same counts as asking every detector's ``observes`` at every step; and
the steps grouped by their names (``rlguard.doctor.canonical``: from a table's columns, or from the steps' dicts)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.doctor import canonical
from rlguard.doctor.canonical import CanonicalRows, NameSet, name_sets
from rlguard.doctor.columns import Columns
from rlguard.doctor.warmups import count_observations, enough_observations, fit_warmups
from rlguard.guards import Guard, GuardConfig
from rlguard.guards.detectors import Detector
from tests.helpers.profiles import examples

_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 1e308, -1e308, math.nan, math.inf, -math.inf]),  # 1e308: sums overflow
)


@dataclass(kw_only=True)
class _Above(Detector):
    """Overrides ``observes`` alone (a finite ``x`` above 0.5): asked at every step."""

    name = "above"
    metric: str = "x"

    def observes(self, stats: Mapping[str, float]) -> bool:
        value = stats.get("x")
        return value is not None and value > 0.5


@dataclass(kw_only=True)
class _Named(Detector):
    """Overrides both: observes every step that logs ``y``, finite or not; its names settle it."""

    name = "named"
    metric: str = "y"

    def observes(self, stats: Mapping[str, float]) -> bool:
        return "y" in stats

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool | None:
        return "y" in names


@dataclass(kw_only=True)
class _Unread(Detector):
    """Default ``observes`` of a stat no step logs, counting the times it is asked."""

    name = "unread"
    metric: str = "never_logged"
    asked: int = 0

    def observes(self, stats: Mapping[str, float]) -> bool:
        self.asked += 1
        return super().observes(stats)

    def observed_with(self, names: frozenset[str], *, finite: bool) -> bool | None:
        return super().observed_with(names, finite=finite)


def _detectors(preset: str) -> dict[str, Detector]:
    """A guard's detectors and the plugins above (their own ``x``, ``y``; also ``reward_mean``, ``entropy``)."""
    detectors = dict(Guard(GuardConfig.preset(preset)).detectors)
    detectors.update({"above": _Above(), "named": _Named(), "unread": _Unread(), "plain_reward": _Plain()})
    return detectors


@dataclass(kw_only=True)
class _Plain(Detector):
    """The default ``observes`` and ``observed_with`` of ``reward_mean``."""

    name = "plain_reward"
    metric: str = "reward_mean"


def _asked_at_every_step(
    detectors: Mapping[str, Detector],
    rows: Iterable[Mapping[str, float]],
    counts: Mapping[str, int],
    enough: Mapping[str, int],
) -> dict[str, int]:
    """The definition: each detector's ``observes`` asked at every step, counted up to ``enough``."""
    out = dict(counts)
    for stats in rows:
        for name, det in detectors.items():
            if out[name] < enough[name] and det.observes(stats):
                out[name] += 1
    return out


_NAMES = ("x", "y", "reward_mean", "entropy", "grad_norm", "kl_ref", "loss", "frac_zero_std_groups")
#: a log's steps: a few sets of names, each step one of them with its own values
_STEPS = st.lists(st.sets(st.sampled_from(_NAMES), max_size=6), min_size=1, max_size=3).flatmap(
    lambda sets: st.lists(
        st.sampled_from(sets).flatmap(lambda names: st.fixed_dictionaries({n: _VALUES for n in sorted(names)})),
        max_size=60,
    )
)


@examples(quick=60, long=600)
@given(
    steps=_STEPS,
    preset=st.sampled_from(["default", "monitor"]),
    enough_at=st.lists(st.integers(0, 70), min_size=1, max_size=40),
    start_at=st.lists(st.integers(0, 70), min_size=1, max_size=40),
)
def test_counted_per_set_of_names_equals_asking_every_step(
    steps: list[dict[str, float]], preset: str, enough_at: list[int], start_at: list[int]
) -> None:
    """The counts equal the definition's, from any counts already made and up to any ``enough``: detectors whose
    names settle them, one overriding ``observes`` alone, one overriding both, NaN, infinities, sums that overflow."""
    detectors = _detectors(preset)
    enough = {name: enough_at[i % len(enough_at)] for i, name in enumerate(detectors)}
    counts = {name: start_at[i % len(start_at)] for i, name in enumerate(detectors)}
    expected = _asked_at_every_step(detectors, steps, counts, enough)
    assert count_observations(detectors, name_sets(steps), counts, enough) == expected
    table = Columns()
    for step, stats in enumerate(steps):
        table.append(step, stats or {"epoch": 1.0})  # a step of no stat: left out of the canonical rows
    rows = CanonicalRows(table, {"x": "x", "y": "y"})
    assert len(rows) == sum(1 for stats in steps if stats)
    for start in {0, len(rows) // 2, len(rows)}:
        want = _asked_at_every_step(detectors, [stats for _, stats in rows.iter_from(start, len(rows))], counts, enough)
        assert count_observations(detectors, rows.name_sets(start, len(rows)), counts, enough) == want


def test_a_detector_whose_stat_the_log_lacks_is_not_asked_at_each_step() -> None:
    """Its names settle it: the count reads neither its ``observes`` nor the steps' dicts (the count before: every
    step's dict, asked)."""
    table = Columns()
    for step in range(3000):
        table.append(step, {"reward_mean": 0.1 * (step % 7), "entropy": math.nan if step % 5 == 0 else 1.0})
    rows = CanonicalRows(table, {})
    unread = _Unread()
    detectors: dict[str, Detector] = {"unread": unread, "plain_reward": _Plain()}
    enough = {"unread": 10, "plain_reward": 10_000}
    got = count_observations(detectors, rows.name_sets(0, len(rows)), dict.fromkeys(detectors, 0), enough)
    assert got == {"unread": 0, "plain_reward": 3000} and unread.asked == 0


def test_fit_warmups_counts_the_steps_of_its_stats() -> None:
    """``fit_warmups`` on dict rows: a quarter of the observations of a detector whose stat is logged, none fitted
    where it is not."""
    guard = Guard(GuardConfig.preset("monitor"))
    own = guard.detectors["reward_collapse"].warmup
    fitted = fit_warmups(guard, [{"reward_mean": 0.5 + 0.001 * k} for k in range(40)])
    assert fitted == {"reward_collapse": own} and guard.detectors["reward_collapse"].warmup == 10
    enough = enough_observations({"a": 50}, {"a": None})
    assert enough == {"a": 200}


#: raw keys of a few stats at several priorities (TRL's, a bare canonical name, rlguard's own, verl's) and one of none
_KEYS = ("reward", "reward_mean", "rlguard/reward_mean", "kl", "kl_ref", "entropy", "actor/entropy", "epoch")


@examples(quick=60, long=600)
@given(
    rows_given=st.lists(
        st.tuples(st.lists(st.sampled_from(_KEYS), unique=True, max_size=5), st.lists(_VALUES, min_size=5)),
        max_size=50,
    ),
    chunk=st.sampled_from([1, 3, 7, 1 << 16]),
    cut=st.integers(0, 60),
    span=st.tuples(st.integers(0, 60), st.integers(0, 60)),
)
def test_steps_grouped_from_the_columns_equal_the_groups_of_their_dicts(
    monkeypatch: pytest.MonkeyPatch,
    rows_given: list[tuple[list[str], list[float]]],
    chunk: int,
    cut: int,
    span: tuple[int, int],
) -> None:
    """``CanonicalRows.name_sets`` (from the columns' presence and values) puts each step in the group of its own
    names and finiteness, once, its stats in order: keys of one stat at several priorities, steps of no stat left
    out, a snapshot whose arrays go on past its rows, any range, chunks of any size."""
    monkeypatch.setattr(canonical, "_CHUNK_COLUMNS", chunk)
    table = Columns()
    for step, (keys, values) in enumerate(rows_given):
        table.append(step, dict(zip(keys, values, strict=False)) or {"epoch": 1.0})
        if step == cut:
            snapshot = table.copy()  # later rows appended past its end
    for judged in (table, snapshot) if cut < len(rows_given) else (table,):
        rows = CanonicalRows(judged, {})
        start, stop = sorted(min(k, len(rows)) for k in span)
        _assert_grouped(rows, start, stop, chunk)


def _groups(steps: Iterable[Mapping[str, float]]) -> dict[tuple[frozenset[str], bool], list[str]]:
    """Each step's ``repr`` (NaN reads equal) by its names and whether every value is finite, in order."""
    out: dict[tuple[frozenset[str], bool], list[str]] = {}
    for stats in steps:
        out.setdefault((frozenset(stats), all(math.isfinite(v) for v in stats.values())), []).append(repr(stats))
    return out


def _assert_grouped(rows: CanonicalRows, start: int, stop: int, chunk: int) -> None:
    """``rows.name_sets(start, stop)``: chunk by chunk, the groups of the chunk's steps as read by ``rows[k]``."""
    sets = iter(rows.name_sets(start, stop))
    for a in range(start, stop, chunk):
        b = min(a + chunk, stop)
        got: dict[tuple[frozenset[str], bool], list[str]] = {}
        while sum(map(len, got.values())) < b - a:
            names, finite, size, stats = next(sets)
            assert (names, finite) not in got and size > 0
            got[names, finite] = [repr(member) for member in stats]
            assert len(got[names, finite]) == size
        assert got == _groups(rows[k][1] for k in range(a, b))
    assert next(sets, None) is None


def test_steps_of_more_stats_than_a_code_holds_are_grouped_from_their_dicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over 62 stats logged at some steps of a chunk and not others: grouped from the steps' dicts, the same groups."""
    rng = random.Random(0)
    table = Columns()
    for step in range(200):
        table.append(step, {f"k{j}": rng.choice([1.0, 2.0, math.inf]) for j in range(70) if rng.random() < 0.7})
    rows = CanonicalRows(table, {f"k{j}": f"s{j}" for j in range(70)})
    grouped: list[int] = []

    def spied(steps: Iterable[Mapping[str, float]]) -> Iterator[NameSet]:
        grouped.append(1)
        return name_sets(steps)

    monkeypatch.setattr(canonical, "name_sets", spied)
    _assert_grouped(rows, 0, len(rows), 1 << 16)
    _assert_grouped(rows, 5, len(rows) - 10, 1 << 16)
    assert grouped  # from the dicts
