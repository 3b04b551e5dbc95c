"""Properties of every reader (JSONL, verl JSONL, TRL's trainer_state.json, a wandb CSV, TensorBoard) and of the
watch under random bytes, truncation and mutation: the doctor never raises anything but its own ``LogInputError``
(exit 2), never exits 0 unless it read every record, and a judged value made NaN is found; the watch of a log
written in pieces ends with the doctor's verdict on the file as it was left.

Truncations and mutations are of small real logs read from ``../shared/doctor_foreign`` at test time (skipped where
absent, never copied into the repository). The number of examples is bounded in ``make test`` and larger in ``make
test-integration`` (:mod:`tests.helpers.profiles`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from rlguard.doctor import EXIT_OK, LogInputError, diagnose, read_log
from rlguard.metrics import METRICS
from rlguard.watch import watch
from tests.helpers.doctor_logs import WRITERS
from tests.helpers.logs_extra import jsonl_text, rows, write_events
from tests.helpers.profiles import examples

#: ``shared/`` beside the checkout or an ancestor of it (``../shared`` from the main checkout, ``../../shared`` from
#: a worktree)
SHARED = next(
    (p / "shared" for p in Path(__file__).resolve().parents if (p / "shared" / "doctor_foreign").is_dir()),
    Path("/nonexistent/shared"),
)
#: the smallest real log of each text format (name -> path), read in place
REAL = {
    "verl": SHARED / "doctor_foreign" / "verl-ppo-tutorial-qwen05b.verl.jsonl",
    "trl": SHARED / "doctor_foreign" / "gemma3-1b-gsm8k.trainer_state.json",
    "csv": SHARED / "doctor_foreign2" / "taubench-gptoss-20b-grpo.csv",
}
SUFFIX = {"verl": ".jsonl", "trl": ".json", "csv": ".csv"}


def _real(kind: str) -> bytes:
    path = REAL[kind]
    if not path.is_file():
        pytest.skip(f"no {path} (the real logs)")
    return path.read_bytes()


def _exit(path: Path) -> int:
    """The doctor's exit code for ``path``: 2 for a LogInputError, anything else raised fails the test."""
    try:
        return diagnose(path).exit_code
    except LogInputError:
        return 2


@examples(quick=30, long=500)
@given(data=st.binary(max_size=2048), suffix=st.sampled_from([".jsonl", ".csv", ".json", ""]))
def test_random_bytes_are_read_or_refused(tmp_path_factory: pytest.TempPathFactory, data: bytes, suffix: str) -> None:
    path = tmp_path_factory.mktemp("bytes") / f"log{suffix}"
    path.write_bytes(data)
    try:
        read_log(path)
    except LogInputError as err:
        assert "\n" not in str(err).strip()  # one line a user can act on


@examples(quick=10, long=200)
@given(data=st.binary(min_size=1, max_size=512))
def test_random_bytes_in_a_tensorboard_file_are_read_or_refused(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("tb") / "events.out.tfevents.1.host"
    path.write_bytes(data)
    try:
        log = read_log(path)
    except LogInputError:
        return
    assert log.report.partial or log.report.bytes_read == len(data)


def _whole_at(data: bytes, cut: int, kind: str) -> bool:
    """Whether ``data[:cut]`` holds whole records only: it ends at the end of a line (whitespace aside); a TRL
    state is one JSON document, whole only uncut."""
    head = data[:cut]
    if kind == "trl":
        return head.strip() == data.strip()
    tail = head[head.rfind(b"\n") + 1 :]
    line_end = data.find(b"\n", cut)
    full_line = data[cut - len(tail) : line_end if line_end >= 0 else len(data)]
    return not tail.strip() or tail.rstrip(b"\r") == full_line.rstrip(b"\r")


@examples(quick=8, long=300)
@given(kind=st.sampled_from(["verl", "trl", "csv"]), share=st.floats(0, 1))
def test_a_truncated_real_log_exits_0_only_when_cut_between_records(
    tmp_path_factory: pytest.TempPathFactory, kind: str, share: float
) -> None:
    data = _real(kind)
    cut = round(share * len(data))
    path = tmp_path_factory.mktemp("cut") / f"log{SUFFIX[kind]}"
    path.write_bytes(data[:cut])
    code = _exit(path)
    assert code in (0, 1, 2, 3)
    if code == EXIT_OK:  # a CSV row cut inside its last cell keeps its cells: its fixed format shows the cut
        assert _whole_at(data, cut, kind), (kind, cut)


def _judged_keys(path: Path) -> list[str]:
    """The raw keys of a log that the doctor maps onto a judged stat (the metric table's, ``rlguard.metrics``)."""
    judged = {m.name for m in METRICS if m.judged}
    return sorted(raw for raw, canonical in diagnose(path).keys.mapped.items() if canonical in judged)


def _with_nan(data: bytes, kind: str, key: str, fraction: float) -> bytes:
    """``data`` (a real log of ``kind``) with the value of ``key`` in one of the records holding it made NaN (as a
    flat JSONL, TRL's json or a CSV writes NaN)."""
    if kind == "csv":
        lines = data.decode().splitlines()
        column = next(csv.reader([lines[0]])).index(key)
        rows_holding = [i for i, line in enumerate(lines[1:], 1) if next(csv.reader([line]))[column].strip()]
        i = rows_holding[int(fraction * (len(rows_holding) - 1))]
        cells = next(csv.reader([lines[i]]))
        cells[column] = "nan"
        lines[i] = ",".join(cells)
        return ("\n".join(lines) + "\n").encode()
    if kind == "trl":
        state: dict[str, Any] = json.loads(data)
        entries: list[dict[str, Any]] = [r for r in state["log_history"] if key in r]
        entries[int(fraction * (len(entries) - 1))][key] = math.nan
        return json.dumps(state).encode()
    records: list[dict[str, Any]] = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    carrying = [r for r in records if key in (r["data"] if isinstance(r.get("data"), dict) else r)]
    record = carrying[int(fraction * (len(carrying) - 1))]
    (record["data"] if isinstance(record.get("data"), dict) else record)[key] = math.nan
    return "".join(json.dumps(r) + "\n" for r in records).encode()


@examples(quick=8, long=300)
@given(kind=st.sampled_from(["verl", "trl", "csv"]), fraction=st.floats(0, 1), pick=st.floats(0, 1))
def test_a_judged_value_made_nan_in_a_real_log_is_critical(
    tmp_path_factory: pytest.TempPathFactory, kind: str, fraction: float, pick: float
) -> None:
    """A NaN written into any judged stat of a real log of each text format, at any record that holds it: the
    doctor must find it (``nonfinite``, critical): a changed judged value changes the verdict."""
    data = _real(kind)
    keys = _judged_keys(REAL[kind])
    key = keys[int(pick * (len(keys) - 1))]
    path = tmp_path_factory.mktemp("nan") / f"log{SUFFIX[kind]}"
    path.write_bytes(_with_nan(data, kind, key, fraction))
    d = diagnose(path)
    assert d.exit_code == 1 and any(f.detector == "nonfinite" for f in d.findings), (kind, key, d.read.lines())


@examples(quick=6, long=200)
@given(
    fmt=st.sampled_from(sorted(WRITERS)),
    drop=st.integers(1, 60),
    step=st.integers(5, 55),
)
def test_every_format_reports_what_it_did_not_read(
    tmp_path_factory: pytest.TempPathFactory, fmt: str, drop: int, step: int
) -> None:
    """A synthetic log in each format, its last ``drop`` bytes cut: exit 0 never with damage, and a NaN loss at
    ``step`` in the whole log always critical (but verl's, whose logger writes a NaN as null)."""
    from tests.helpers.synthetic import healthy_stream

    stream = healthy_stream(60, seed=step)
    stream[step - 1]["loss"] = math.nan
    writer, name = WRITERS[fmt]
    folder = tmp_path_factory.mktemp(fmt)
    written = writer(stream, folder / name)
    assert _exit(written) == (0 if fmt == "verl" else 1)
    files = [written] if written.is_file() else sorted(written.rglob("events.out.tfevents.*"))
    data = files[-1].read_bytes()
    files[-1].write_bytes(data[: max(0, len(data) - drop)])
    try:
        d = diagnose(written)
    except LogInputError:
        return
    assert not (d.exit_code == EXIT_OK and d.read.partial)
    whole_lines = fmt in ("verl", "jsonl") and drop == 1  # only the last newline cut: every record is whole
    if fmt in ("verl", "jsonl", "trl", "tensorboard") and not whole_lines:  # framed records: a cut is a torn one
        assert d.exit_code != EXIT_OK


def test_the_interleaved_refusal_holds_for_any_pairing(tmp_path: Path) -> None:
    """Two writers in one file without a run column, any pattern of interleaving: refused, never merged."""
    first, second = rows(30, seed=1, nan_at=20), rows(30, seed=2)
    merged = [r for pair in zip(first, second, strict=True) for r in pair]
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(merged), encoding="utf-8")
    with pytest.raises(LogInputError, match="two runs written into one file"):
        read_log(path)


def _record_ends(data: bytes) -> set[int]:
    """The offsets at which the records of a TensorBoard event file end (TFRecord framing: an 8-byte length, its
    4-byte CRC, the data, the data's 4-byte CRC)."""
    ends, at = {0}, 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        at += 12 + length + 4
        ends.add(at)
    return ends


@examples(quick=8, long=300)
@given(share=st.floats(0, 1))
def test_a_truncated_tensorboard_file_exits_0_only_when_cut_between_records(
    tmp_path_factory: pytest.TempPathFactory, share: float
) -> None:
    """A TensorBoard event file with a NaN loss at step 70, cut anywhere: exit 0 only at a record's end (before
    the NaN), and never a clean bill of a file cut inside a record."""
    pytest.importorskip("tensorboard")
    folder = tmp_path_factory.mktemp("tbcut")
    path = folder / "tb" / "events.out.tfevents.1.host"
    records = [(int(r["step"]), {k: v for k, v in r.items() if k != "step"}) for r in rows(80, nan_at=70)]
    data = write_events(path, records).read_bytes()
    cut = round(share * len(data))
    path.write_bytes(data[:cut])
    code = _exit(path.parent)
    assert code in (0, 1, 2, 3)
    if code == EXIT_OK:
        assert cut in _record_ends(data), cut


@examples(quick=4, long=80)
@given(
    kind=st.sampled_from(["verl", "trl", "csv"]),
    pieces=st.lists(st.floats(0, 1), min_size=1, max_size=4),
    end=st.one_of(st.just(1.0), st.floats(0, 1)),
    last=st.integers(0, 400),
    nan=st.booleans(),
)
def test_the_watch_of_a_growing_real_log_ends_with_the_doctor_s_verdict(
    tmp_path_factory: pytest.TempPathFactory, kind: str, pieces: list[float], end: float, last: int, nan: bool
) -> None:
    """A real log (with a NaN in a judged stat, or not) written while ``rlguard watch`` follows it, in pieces cut
    anywhere (the last piece ``last`` bytes: too little growth for the watch's schedule to judge at once), and left
    whole or cut: the watch ends with the doctor's exit code for the file as it was left, and exits 0 only when
    that file holds whole records."""
    data = _real(kind)
    if nan:
        data = _with_nan(data, kind, _judged_keys(REAL[kind])[0], 0.5)
    left = round(end * len(data))
    offsets = sorted({round(p * left) for p in pieces} | {max(0, left - last), left})
    path = tmp_path_factory.mktemp("watched") / f"log{SUFFIX[kind]}"
    path.write_bytes(b"")

    def write_next(_: float) -> None:  # the watch's sleep: the job writes on between two polls
        if offsets:
            path.write_bytes(data[: offsets.pop(0)])  # TRL rewrites its state whole; the others only grow

    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    result = watch(path, console=console, interval=0.001, idle=0.001, sleep=write_next)
    left = path.stat().st_size  # the watch may end first: TRL's state can say that training ended
    assert result.exit_code == _exit(path), (kind, left, result.ended, result.error)
    if result.exit_code == EXIT_OK:
        assert _whole_at(data, left, kind), (kind, left)


#: any value a JSON record or a CSV cell can hold, huge integers (beyond int64 and float range) included
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**400), 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=2),
)


def _with_value(data: bytes, kind: str, at: float, pick: float, value: Any) -> bytes:
    """``data`` (a real log of ``kind``) with one value of one record replaced by ``value``: that of the key at
    ``pick`` (0 to 1) of the record's, or its step (``pick`` < 0)."""
    if kind == "csv":
        table = list(csv.reader(data.decode().splitlines()))
        row = table[1 + int(at * (len(table) - 2))]
        row[0 if pick < 0 else int(pick * (len(row) - 1))] = "" if value is None else str(value)
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(table)
        return out.getvalue().encode()
    if kind == "trl":
        state: dict[str, Any] = json.loads(data)
        records: list[dict[str, Any]] = state["log_history"]
    else:
        records = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    record = records[int(at * (len(records) - 1))]
    keys = sorted(record)
    record["step" if pick < 0 else keys[int(pick * (len(keys) - 1))]] = value
    if kind == "trl":
        return json.dumps(state).encode()
    return "".join(json.dumps(r) + "\n" for r in records).encode()


@examples(quick=12, long=500)
@given(
    kind=st.sampled_from(["verl", "trl", "csv"]),
    at=st.floats(0, 1),
    pick=st.one_of(st.just(-1.0), st.floats(0, 1)),
    value=ANY_VALUE,
)
def test_any_value_put_anywhere_in_a_real_log_is_read_or_refused(
    tmp_path_factory: pytest.TempPathFactory, kind: str, at: float, pick: float, value: Any
) -> None:
    """A mutation of a real log (any value, at any record and key, the step included): read, or refused as bad
    input in one line (``LogInputError``), never another exception (an internal error, exit 4)."""
    path = tmp_path_factory.mktemp("mutated") / f"log{SUFFIX[kind]}"
    path.write_bytes(_with_value(_real(kind), kind, at, pick, value))
    try:
        d = diagnose(path)
    except LogInputError as err:
        assert "\n" not in str(err).strip()
        return
    assert d.exit_code in (0, 1, 3)
