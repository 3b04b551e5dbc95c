"""``rlguard.doctor.stream.JsonlFollower``: a growing JSONL log read by what was appended, equal to what
``read_log`` reads of the file as it stands; truncation and rotation read again from the start, and said; and
``rlguard watch`` on a growing log reads each appended byte once (time per appended record, not per record of the
log)."""

from __future__ import annotations

import io
import json
import math
import os
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from rlguard.doctor import LogInputError, read_log
from rlguard.doctor.stream import JsonlFollower
from rlguard.watch import watch
from tests.helpers.profiles import examples
from tests.helpers.synthetic import healthy_stream


def _flat(step: int, stats: dict[str, float]) -> str:
    return json.dumps({"step": step, **stats}) + "\n"


def _verl(step: int, stats: dict[str, float]) -> str:
    return json.dumps({"step": step, "data": {f"actor/{k}": v for k, v in stats.items()}}) + "\n"


STREAM = healthy_stream(40, seed=1)
LOGS: dict[str, str] = {
    "flat": "".join(_flat(s, x) for s, x in enumerate(STREAM, 1)),
    "verl": "".join(_verl(s, x) for s, x in enumerate(STREAM, 1)),
    "torn last line": "".join(_flat(s, x) for s, x in enumerate(STREAM, 1)) + '{"step": 41, "grad',
    "a last line without its newline": "".join(_flat(s, x) for s, x in enumerate(STREAM, 1)).rstrip("\n"),
    "a bad last line": "".join(_flat(s, x) for s, x in enumerate(STREAM, 1)) + "{oops\n",
    "blank lines, nulls, text, a step twice": (
        '\n{"step": 1, "grad_norm": 1.0, "loss": null}\n\n{"step": 2, "grad_norm": "NaN", "x": "text"}\n'
        '{"step": 2, "grad_norm": 2.0}\n{"step": 3, "loss": null}\n{"grad_norm": 3.0}\n'
    ),
}


def _follow_in_pieces(path: Path, text: str, pieces: int) -> JsonlFollower:
    """Write ``text`` to ``path`` in ``pieces`` cuts at arbitrary byte offsets (mid-line too), polling after each."""
    data = text.encode()
    follower = JsonlFollower(path)
    path.write_bytes(b"")
    cuts = sorted({len(data) * k // pieces for k in range(1, pieces + 1)})
    done = 0
    for cut in cuts:
        with path.open("ab") as fh:
            fh.write(data[done:cut])
        done = cut
        follower.poll()
    return follower


@pytest.mark.parametrize("name", list(LOGS))
@pytest.mark.parametrize("pieces", [1, 7, 50])
def test_the_follower_reads_what_read_log_reads(tmp_path: Path, name: str, pieces: int) -> None:
    path = tmp_path / "metrics.jsonl"
    follower = _follow_in_pieces(path, LOGS[name], pieces)
    whole = read_log(path)
    followed = follower.log()
    assert (followed.format, followed.rows) == (whole.format, whole.rows)
    assert followed.report.to_dict() == whole.report.to_dict()
    assert follower.bytes_read == path.stat().st_size  # every byte read once


def test_a_bad_line_with_lines_after_it_is_bad_input_at_every_poll(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_flat(1, STREAM[0]) + "{oops\n")
    follower = JsonlFollower(path)
    follower.poll()  # the bad line may be a torn last line: not yet an error
    with path.open("a") as fh:
        fh.write(_flat(2, STREAM[1]))
    for _ in range(2):
        with pytest.raises(LogInputError, match=r"line 2: not JSON"):
            follower.poll()
    with pytest.raises(LogInputError, match=r"line 2: not JSON"):
        read_log(path)  # as the reader says


def test_each_poll_reads_only_what_was_appended_whatever_the_log_s_size(tmp_path: Path) -> None:
    """The cost of a poll: the bytes appended since the last, the same at 100 and at 20,000 steps."""
    appended: dict[int, list[int]] = {}
    for size in (100, 20_000):
        path = tmp_path / f"log{size}.jsonl"
        path.write_text("".join(_flat(s, {"grad_norm": 1.0, "loss": 0.5}) for s in range(1, size + 1)))
        follower = JsonlFollower(path)
        follower.poll()
        reads = []
        for s in range(size + 1, size + 11):
            with path.open("a") as fh:
                fh.write(_flat(s, {"grad_norm": 1.0, "loss": 0.5}))
            before = follower.bytes_read
            follower.poll()
            reads.append(follower.bytes_read - before)
        appended[size] = reads
        assert follower.steps == size + 10
    line = len(_flat(100_001, {"grad_norm": 1.0, "loss": 0.5}))
    assert all(abs(n - line) <= 3 for n in appended[100] + appended[20_000]), appended  # one line each, not the log


def test_a_truncated_log_is_read_again_from_the_start_and_said(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_flat(s, x) for s, x in enumerate(STREAM, 1)))
    follower = JsonlFollower(path)
    follower.poll()
    path.write_text(_flat(1, STREAM[0]) + _flat(2, STREAM[1]))  # a new run over the old file
    follower.poll()
    assert [s for s, _ in follower.log().rows] == [1, 2]
    assert len(follower.restarts) == 1 and "shorter" in follower.restarts[0]


def test_a_rotated_log_is_read_again_from_the_start_and_said(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_flat(s, x) for s, x in enumerate(STREAM[:10], 1)))
    follower = JsonlFollower(path)
    follower.poll()
    os.rename(path, tmp_path / "metrics.jsonl.1")
    path.write_text("".join(_flat(s, x) for s, x in enumerate(STREAM, 100)))  # longer than the old one
    follower.poll()
    assert follower.log().rows[0][0] == 100 and follower.steps == len(STREAM)
    assert len(follower.restarts) == 1 and "rotated" in follower.restarts[0]


def _each_poll(action: Callable[[int], None], polls: int) -> Callable[[float], None]:
    count = [0]

    def sleep(_: float) -> None:
        if count[0] < polls:
            action(count[0])
        else:
            time.sleep(0.01)  # the job has stopped writing: wait for the idle end without spinning
        count[0] += 1

    return sleep


def test_watch_reads_each_appended_byte_once(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    stream = healthy_stream(200, seed=2)
    path.write_text("".join(_flat(s, x) for s, x in enumerate(stream[:50], 1)))

    def append(i: int) -> None:
        with path.open("a") as fh:
            fh.writelines(_flat(s, stream[s - 1]) for s in range(51 + 5 * i, 56 + 5 * i))

    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    result = watch(path, console=console, interval=0.001, idle=1.0, sleep=_each_poll(append, 30))
    assert result.diagnosis is not None and result.diagnosis.steps[-1] == 200
    assert result.bytes_read == path.stat().st_size  # before: the whole log at each of the 30 changes


def test_watch_says_when_the_log_was_truncated(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    stream = healthy_stream(60, seed=2)
    path.write_text("".join(_flat(s, x) for s, x in enumerate(stream, 1)))
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, width=200)

    def restart(_: int) -> None:
        path.write_text("".join(_flat(s, x) for s, x in enumerate(stream[:30], 1)))

    result = watch(path, console=console, interval=0.001, idle=1.0, sleep=_each_poll(restart, 1))
    assert result.diagnosis is not None and result.diagnosis.steps[-1] == 30
    # the message may wrap after the tmp_path, whatever its length: read with its whitespace collapsed
    assert result.restarts and "read again from the start" in " ".join(buffer.getvalue().split())


@examples(quick=40, long=400)
@given(
    name=st.sampled_from(sorted(LOGS)),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
    tail=st.sampled_from(["", "\n", "{", '{"step": 99, "grad_norm": 1}', "not json\n", "\n\n", '{"step": -1}\n']),
)
def test_the_follower_agrees_with_read_log_however_the_log_is_cut(
    tmp_path_factory: pytest.TempPathFactory, name: str, cuts: list[int], tail: str
) -> None:
    """Whatever the writes and wherever a poll falls: the same rows and account as ``read_log``, or the same
    refusal (a bad line, a negative step, no step at all)."""
    data = (LOGS[name] + tail).encode()
    path = tmp_path_factory.mktemp("cut") / "metrics.jsonl"
    path.write_bytes(b"")
    follower = JsonlFollower(path)
    done = 0
    followed: object
    try:
        for cut in sorted({min(c, len(data)) for c in cuts} | {len(data)}):
            with path.open("ab") as fh:
                fh.write(data[done:cut])
            done = cut
            follower.poll()
        log = follower.log()
        followed = (log.format, log.rows, log.report.to_dict())
    except LogInputError:
        followed = LogInputError
    try:
        whole = read_log(path)
        expected: object = (whole.format, whole.rows, whole.report.to_dict())
    except LogInputError:
        expected = LogInputError
    assert followed == expected


def test_watch_work_per_appended_record_does_not_grow_with_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts of work, not wall time: each poll parses only the record appended (one), and the steps judged over
    the whole watch stay within (1 + 1 / REJUDGE_GROWTH) times the log's steps: the log is judged again when it
    grew by REJUDGE_GROWTH of its steps, so the judgements' sizes grow geometrically and their sum is bounded
    (n / (1 - 1 / (1 + g)) = 11 n). The time rule (REJUDGE_EVERY) is turned off: it only adds judgements while
    they are cheap next to the poll interval."""
    from rlguard import watch as watch_module
    from rlguard.doctor.steps import StepRule

    monkeypatch.setattr(watch_module, "REJUDGE_EVERY", math.inf)
    stream = healthy_stream(200, seed=3)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_flat(s, x) for s, x in enumerate(stream[:50], 1)))
    reader = watch_module._Reader(path, {}, StepRule(), None)
    first, _ = reader.read(final=True)
    assert first is not None and reader.follower is not None
    parsed, judged = [], [len(first.steps)]
    for step in range(51, 201):
        with path.open("a") as fh:
            fh.write(_flat(step, stream[step - 1]))
        before = reader.follower.records
        d, error = reader.read()
        assert error is None
        parsed.append(reader.follower.records - before)
        if d is not None:
            judged.append(len(d.steps))
    assert parsed == [1] * 150  # never the records before it again
    bound = (1 + 1 / watch_module.REJUDGE_GROWTH) * 200
    assert sum(judged) <= bound, (sum(judged), judged)
    assert len(judged) <= 2 + math.log(200 / 50) / math.log(1 + watch_module.REJUDGE_GROWTH)
    final, _ = reader.read(final=True)
    assert final is not None and list(final.steps) == list(range(1, 201))


def _judged(follower: JsonlFollower) -> object:
    try:
        log = follower.log()
    except LogInputError:
        return LogInputError
    return log.format, log.rows, log.report.to_dict()


def _read(path: Path) -> object:
    try:
        whole = read_log(path)
    except LogInputError:
        return LogInputError
    return whole.format, whole.rows, whole.report.to_dict()


@examples(quick=40, long=400)
@given(
    name=st.sampled_from(sorted(LOGS)),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
    tail=st.sampled_from(
        [
            '{"step": 99, "grad_norm": 1}',
            '{"step": 99, "grad_norm": 1} \t\r\n{"step": 100, "grad_norm": 2}\n',
            '{"step": 99, "grad_norm": 1} x\n{"step": 100, "grad_norm": 2}\n',
            '{"step": 99, "grad_norm": 1}}',
            '{"step": 99, "grad_norm": 1}\x0c\n',
            '{"step": -1}',
            '{"step": 40, "grad_norm": 9}\n',
        ]
    ),
)
def test_the_follower_agrees_with_read_log_at_every_poll(
    tmp_path_factory: pytest.TempPathFactory, name: str, cuts: list[int], tail: str
) -> None:
    """Read at every poll, wherever it falls (a last line half-written, or a whole JSON object whose newline is
    not written yet, then completed by whitespace, by more than whitespace, or not at all): what ``read_log`` reads
    of the file as it stands at that poll."""
    data = (LOGS[name] + tail).encode()
    path = tmp_path_factory.mktemp("poll") / "metrics.jsonl"
    path.write_bytes(b"")
    follower = JsonlFollower(path)
    done = 0
    for cut in sorted({min(c, len(data)) for c in cuts} | {len(data)}):
        with path.open("ab") as fh:
            fh.write(data[done:cut])
        done = cut
        try:
            follower.poll()
        except LogInputError:
            assert _read(path) is LogInputError
            return
        assert _judged(follower) == _read(path), cut


def test_a_whole_record_before_its_newline_is_read_once(tmp_path: Path) -> None:
    """A last line that is a whole JSON object is read as its record at once; its newline and whitespace read
    nothing again; more than whitespace after it has the file read again from the start, and said."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(_flat(1, STREAM[0]) + _flat(2, STREAM[1]).rstrip("\n"))
    follower = JsonlFollower(path)
    follower.poll()
    before = follower.records
    assert [s for s, _ in follower.log().rows] == [1, 2] and follower.records == before + 1
    with path.open("a") as fh:
        fh.write("  \n" + _flat(3, STREAM[2]))
    follower.poll()
    assert _judged(follower) == _read(path) and follower.records == 3 and not follower.restarts
    assert follower.bytes_read == path.stat().st_size
    with path.open("a") as fh:
        fh.write('{"step": 4, "loss": 1}')
    follower.poll()
    assert _judged(follower) == _read(path)
    with path.open("a") as fh:
        fh.write(' {"step": 5}\n')  # the line was no record after all: not JSON, torn (the last line)
    follower.poll()
    assert _judged(follower) == _read(path)
    assert len(follower.restarts) == 1 and "read again from the start" in follower.restarts[0]


def _allocated_by_a_read(tmp_path: Path, n: int, tail: str) -> int:
    """Peak bytes allocated by ``log()`` of an ``n``-step log whose last line (``tail``) has no newline yet."""
    path = tmp_path / f"{n}-{len(tail)}.jsonl"
    path.write_text("".join(_flat(s, {"grad_norm": 1.0, "loss": 0.5, "reward": 0.1}) for s in range(1, n + 1)) + tail)
    follower = JsonlFollower(path)
    follower.poll()
    tracemalloc.start()
    try:
        follower.log()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("tail", ['{"step": 100001, "grad', '{"step": 100001, "grad_norm": 2.0}'])
def test_a_read_with_a_half_written_last_line_allocates_no_more_on_a_longer_log(tmp_path: Path, tail: str) -> None:
    """``log()`` while the writer is mid-line (a torn line, or a whole object before its newline) allocates less
    on a 20,000-step log than on a 1,000-step one, by less than one column's copy (8 bytes a row; the follower was
    deep-copied to read the last line: its table is 4 columns, 32 bytes a row, and more). What a whole object
    may add per row: its row appended to the table's arrays, which CPython grows by 1/16 of their size at once
    (0.5 byte a row a column)."""
    short = _allocated_by_a_read(tmp_path, 1_000, tail)
    long = _allocated_by_a_read(tmp_path, 20_000, tail)
    assert long - short < 8 * (20_000 - 1_000), (short, long)
