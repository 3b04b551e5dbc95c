"""What a judgement of ``rlguard watch`` costs on a growing log does not grow with the log: the table handed to the
judgement is a snapshot that shares the follower's arrays (``Columns.copy``), the steps with a stat are kept from
the last judgement (``CanonicalRows(previous=...)``) and the live view reads each stat's last values, not its
series. Work is counted in bytes allocated (tracemalloc), not in wall time. And what it judges is what a
judgement from scratch says of the same prefix, at each judgement, on random logs and on real ones."""

from __future__ import annotations

import json
import math
import random
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.doctor.columns import Columns
from rlguard.doctor.diagnose import Diagnosis
from rlguard.doctor.fold import DoctorFold
from rlguard.doctor.readers import LogInputError
from rlguard.doctor.stream import JsonlFollower
from rlguard.watch import live_view
from tests.helpers.profiles import examples
from tests.helpers.synthetic import healthy_stream

#: ``shared/`` beside the checkout or an ancestor of it (as tests/doctor/test_fold.py finds it)
SHARED = next(
    (p / "shared" for p in Path(__file__).resolve().parents if (p / "shared" / "doctor_foreign").is_dir()),
    Path("/nonexistent/shared"),
)


def _line(step: int, stats: dict[str, float]) -> str:
    return json.dumps({"step": step, **{k: (v if v == v else "NaN") for k, v in stats.items()}}) + "\n"


def _records(n: int, *, sparse: bool, seed: int = 3, evaluation: str = "eval_runtime") -> list[str]:
    """``n`` steps of a healthy run as JSONL lines; ``sparse``: a first record of the run's arguments (no stat) and
    an ``evaluation`` key every 10 steps in a record of its own, merged into its step's row (no stat is then logged
    at every row: the rows that hold one are kept by number)."""
    lines = [json.dumps({"step": 0, "args/learning_rate": 1e-6}) + "\n"] if sparse else []
    for step, stats in enumerate(healthy_stream(n, seed=seed), 1):
        lines.append(_line(step, stats))
        if sparse and step % 10 == 0:
            lines.append(json.dumps({"step": step, evaluation: 0.5 + 1e-4 * step}) + "\n")
    return lines


def _allocated_by_a_judgement(tmp_path: Path, n: int, *, sparse: bool, evaluation: str = "eval_runtime") -> int:
    """Peak bytes allocated by one judgement of the watch's fold and its live view, after 20 records appended to
    an ``n``-step log already judged (the 20 steps' feed included: the same at any ``n``)."""
    lines = _records(n + 20, sparse=sparse, evaluation=evaluation)
    path = tmp_path / f"{n}-{sparse}-{evaluation}.jsonl"
    cut = len(lines) - 20 - (2 if sparse else 0)
    path.write_text("".join(lines[:cut]))
    follower, fold = JsonlFollower(path), DoctorFold(path)
    follower.poll()
    fold.judge(follower.log(), final=False)
    with path.open("a") as fh:
        fh.write("".join(lines[cut:]))
    follower.poll()
    tracemalloc.start()
    try:
        d = fold.judge(follower.log(), final=False)
        live_view(path, d, None, "watching")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("sparse", [False, True], ids=["every-row", "sparse"])
def test_a_judgement_allocates_no_more_on_a_ten_times_longer_log(tmp_path: Path, sparse: bool) -> None:
    """A judgement of a 10,000-step log allocates less than twice what one of a 1,000-step log does (any copy or
    read of the table, the steps or a stat's series per judgement allocates 8 bytes a row or more: ten times as
    much: 2.9 MB against 0.34 MB when the table was copied and the live view read each series; about 0.11 MB at
    both lengths now)."""
    short = _allocated_by_a_judgement(tmp_path, 1_000, sparse=sparse)
    long = _allocated_by_a_judgement(tmp_path, 10_000, sparse=sparse)
    assert long < 2 * short, (short, long)


def test_a_judgement_of_a_log_with_an_auto_mapped_evaluation_allocates_no_more_on_a_longer_log(
    tmp_path: Path,
) -> None:
    """As above, with an evaluation key that the doctor maps by its values (``eval_accuracy`` -> ``eval_score``): the
    summaries of its values are kept by the fold (:class:`~rlguard.doctor.keyvalues.ValueIndex`), not read again
    from every row: 8.9 MB at 10,000 steps against 0.91 MB at 1,000 when they were, 0.13 MB at both now)."""
    short = _allocated_by_a_judgement(tmp_path, 1_000, sparse=True, evaluation="eval_accuracy")
    long = _allocated_by_a_judgement(tmp_path, 10_000, sparse=True, evaluation="eval_accuracy")
    assert long < 2 * short, (short, long)


def test_a_copy_allocates_per_key_not_per_row() -> None:
    """A copy of a 50,000-row table of 20 keys allocates under 16 KB (a dict per key map, not 8 MB of floats)."""
    table = Columns()
    for step in range(50_000):
        table.append(step, {f"k{i}": step + 0.5 * i for i in range(20)})
    tracemalloc.start()
    try:
        table.copy()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16_000, peak


def _dict_rows(table: Columns) -> list[tuple[int, dict[str, float]]]:
    return [(step, dict(row)) for step, row in table]


def _same(a: list[tuple[int, dict[str, float]]], b: list[tuple[int, dict[str, float]]]) -> bool:
    """Rows equal, a NaN equal to a NaN."""
    return len(a) == len(b) and all(
        sa == sb
        and ra.keys() == rb.keys()
        and all(ra[k] == rb[k] or (math.isnan(ra[k]) and math.isnan(rb[k])) for k in ra)
        for (sa, ra), (sb, rb) in zip(a, b, strict=True)
    )


@given(
    records=st.lists(
        st.tuples(
            st.integers(0, 2),  # steps forward (0: merged into the last row)
            st.dictionaries(st.sampled_from("abcd"), st.sampled_from([0.0, 1.5, -2.0, math.nan]), min_size=1),
            st.booleans(),  # a snapshot after it
        ),
        min_size=1,
        max_size=60,
    )
)
@examples(quick=40, long=400)
def test_a_snapshot_reads_the_table_as_it_was_whatever_is_appended_after(
    records: list[tuple[int, dict[str, float], bool]],
) -> None:
    """Snapshots taken between appends (merges into their last row, keys first seen or first missing after them)
    read back the rows they were taken with, equal to a table built from those rows; a snapshot appended to reads
    as a table of its own."""
    table, step = Columns(), 0
    taken: list[tuple[Columns, list[tuple[int, dict[str, float]]]]] = []
    for forward, values, snap in records:
        step += forward if len(table) else 1
        table.append(step, values)
        if snap:
            taken.append((table.copy(), _dict_rows(table)))
    for snapshot, rows in taken:
        assert _same(_dict_rows(snapshot), rows)
        assert list(snapshot.steps) == [s for s, _ in rows] and len(snapshot) == len(rows)
        rebuilt = Columns()
        for s, row in rows:
            rebuilt.append(s, row)
        assert snapshot == rebuilt
    if taken:
        snapshot, rows = taken[0]
        snapshot.append(rows[-1][0] + 1, {"a": 7.0})
        assert _same(_dict_rows(snapshot), [*rows, (rows[-1][0] + 1, {"a": 7.0})])
        assert _same(_dict_rows(table), _dict_rows(table.copy()))


def _view(d: Diagnosis) -> object:
    """What the watch shows and decides from a diagnosis: its JSON, its steps and each stat's series."""
    return (
        json.dumps(d.to_dict(), sort_keys=True),
        list(d.steps),
        {name: [v if v == v else None for v in values] for name, values in d.series.items()},
        {name: (values[-1] if values[-1] == values[-1] else None) for name, values in d.series.items()},
    )


def _follow_and_compare(path: Path, lines: list[bytes], cuts: list[int]) -> int:
    """Append ``lines`` to ``path`` up to each of ``cuts``, judged by one fold as the watch judges (``final=False``)
    and by a new fold (from scratch) of the same read: equal at each judgement, and each earlier judgement still
    reads as it did when it was made. Returns the judgements compared."""
    path.write_bytes(b"")
    follower, fold = JsonlFollower(path), DoctorFold(path)
    earlier: list[tuple[Diagnosis, object]] = []
    at = compared = 0
    for cut in cuts:
        with path.open("ab") as fh:
            fh.write(b"".join(lines[at:cut]))
        at = cut
        follower.poll()
        try:
            want = DoctorFold(path).judge(follower.log(), final=False)
        except LogInputError:
            continue
        got = fold.judge(follower.log(), final=False)
        assert _view(got) == _view(want), cut
        earlier.append((got, _view(got)))
        compared += 1
    for d, seen in earlier:  # the follower went on appending to the table they read
        assert _view(d) == seen
    return compared


@given(
    chunks=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    sparse=st.booleans(),
    seed=st.integers(0, 2**16),
)
@examples(quick=6, long=60)
def test_the_incremental_watch_judges_each_prefix_as_from_scratch(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[int], sparse: bool, seed: int
) -> None:
    """Random appended chunks (a record may be cut mid-line) of a run whose stats are logged at every row or only
    on some (arguments first, an evaluation record of its own at some steps, merged into its step's row)."""
    rng = random.Random(seed)
    lines = [line.encode() for line in _records(150, sparse=sparse, seed=seed)]
    data = b"".join(lines)
    cuts, at = [], 0
    for size in chunks:
        at = min(at + size * rng.randint(40, 400), len(data))
        cuts.append(at)
    cuts.append(len(data))
    path = tmp_path_factory.mktemp("prefix") / "metrics.jsonl"
    _follow_and_compare(path, [data[k : k + 1] for k in range(len(data))], cuts)


REAL = [
    SHARED / "doctor_foreign" / name
    for name in (
        "opd-qwen3-4b-gjvwlq13.verl.jsonl",
        "dstack-ppo-qwen7b-rm.verl.jsonl",
        "verl-ppo-gemma2-2b-gsm8k.verl.jsonl",
    )
]


@pytest.mark.skipif(not all(p.is_file() for p in REAL), reason="needs ../shared/doctor_foreign")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_the_incremental_watch_judges_each_prefix_of_a_real_log_as_from_scratch(tmp_path: Path, path: Path) -> None:
    """Three real verl logs (one with stats on some rows only) appended record by record in 30 chunks."""
    lines = path.read_bytes().splitlines(keepends=True)
    cuts = sorted({*range(1, len(lines), max(len(lines) // 30, 1)), len(lines)})
    assert _follow_and_compare(tmp_path / path.name, lines, cuts) >= 10


def test_a_judgement_during_a_long_critical_episode_reads_the_rewards_appended_not_the_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entropy collapse from step 150 that goes on, judged after each 50 records appended from step 200 to 700:
    the consequence rule asks whether the reward rose over the episode's window at each judgement. The values its
    Mann-Kendall sums read per judgement do not grow with the episode (before: the whole window at each, 120
    values at the first judgement to 570 at the last; now the detectors' own windows, the same at each)."""
    from rlguard.guards import robust

    read = [0]
    sign_sum = robust._sign_sum

    def counted(x: list[float]) -> int:
        read[0] += len(x)
        return sign_sum(x)

    monkeypatch.setattr(robust, "_sign_sum", counted)
    per = _judged_while_collapsed(tmp_path, read.__setitem__, read.__getitem__)
    assert per[-1] <= per[0], per


def _judged_while_collapsed(
    tmp_path: Path, reset: Callable[[int, int], None], count: Callable[[int], int]
) -> list[int]:
    """An entropy collapse from step 150 that goes on, judged after 200 records and then after each 50 appended up
    to 700: ``count(0)`` after each of the later judgements (``reset(0, 0)`` before it). The collapse is found."""
    from tests.helpers.synthetic import failing_stream

    lines = [_line(step, stats) for step, stats in enumerate(failing_stream("entropy_collapse", 700, 150, 1), 1)]
    path = tmp_path / "collapse.jsonl"
    path.write_text("".join(lines[:200]))
    follower, fold = JsonlFollower(path), DoctorFold(path)
    follower.poll()
    fold.judge(follower.log(), final=False)
    per = []
    for k in range(200, 700, 50):
        with path.open("a") as fh:
            fh.write("".join(lines[k : k + 50]))
        follower.poll()
        reset(0, 0)
        d = fold.judge(follower.log(), final=False)
        per.append(count(0))
    assert any(f.detector == "entropy_collapse" and f.severity == "critical" for f in d.findings)
    return per


class _Counted(Sequence[Any]):
    """A detector's findings (``FindingIndex.found``) that count the findings read from them."""

    read = 0

    def __init__(self, found: Sequence[Any]) -> None:
        self._found = found

    def __len__(self) -> int:
        return len(self._found)

    def __getitem__(self, i: Any) -> Any:
        item = self._found[i]
        _Counted.read += len(item) if isinstance(i, slice) else 1
        return item

    def __iter__(self) -> Iterator[Any]:
        for item in self._found:
            _Counted.read += 1
            yield item


def test_a_judgement_during_a_long_critical_episode_reads_the_findings_appended_not_the_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entropy collapse from step 150 that goes on, judged after each 50 records appended from step 200 to 700:
    each record adds a finding of each detector in the condition. The findings the labels, the alarms' replay and
    the excursions read per judgement do not grow with the episode (before: every finding at each judgement, 1,443
    at the first to 8,643 at the last; now those appended and the episode's lone findings, 168 at each)."""
    from rlguard.guards.consequence.index import FindingIndex

    found = FindingIndex.found
    monkeypatch.setattr(FindingIndex, "found", lambda self, name: _Counted(found(self, name)))

    def reset(_: int, value: int) -> None:
        _Counted.read = value

    per = _judged_while_collapsed(tmp_path, reset, lambda _: _Counted.read)
    assert per[-1] <= per[0], per


@given(
    episodes=st.lists(
        st.tuples(
            st.sampled_from(["entropy_collapse", "grad_explosion", "reward_collapse", "kl_ref_blowup", "too_hard"]),
            st.integers(60, 260),  # the step it starts at
            st.integers(3, 120),  # its length: the stats return to the healthy run's after it
        ),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(1, 300), min_size=1, max_size=10),
    seed=st.integers(0, 2**16),
)
@examples(quick=5, long=60)
def test_the_watch_judges_long_critical_episodes_that_start_go_on_end_and_restart_as_from_scratch(
    tmp_path_factory: pytest.TempPathFactory, episodes: list[tuple[str, int, int]], cuts: list[int], seed: int
) -> None:
    """A 300-step run with failures that start, go on (long episodes of critical findings), end (the stats return
    to the healthy run's) and start again (a mode drawn twice), judged by one fold at random records appended, as
    the watch judges (its episodes' labels, alarms and excursions kept between judgements), equals a judgement from
    scratch of each prefix."""
    from tests.helpers.synthetic import FAILURES

    stream = healthy_stream(300, seed=seed)
    for mode, start, length in episodes:
        inject = FAILURES[mode][0]
        for i in range(start, min(start + length, len(stream))):
            inject(stream[i], i, start, 1.0)
    lines = [_line(step, stats).encode() for step, stats in enumerate(stream, 1)]
    path = tmp_path_factory.mktemp("episodes") / "metrics.jsonl"
    assert _follow_and_compare(path, lines, [*sorted(set(cuts)), len(lines)]) >= 1
