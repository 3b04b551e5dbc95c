"""Properties of every reader (JSONL, verl JSONL, TRL's trainer_state.json, a wandb CSV, TensorBoard) under
random bytes, truncation and mutation: the doctor never raises anything but its own ``LogInputError`` (exit 2),
never exits 0 unless it read every record, and a judged value made NaN is found.

Truncations and mutations are of small real logs read from ``../shared/doctor_foreign`` at test time (skipped where
absent, never copied into the repository). The number of examples is bounded in ``make test`` and larger in ``make
test-integration`` (:mod:`tests.helpers.profiles`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.doctor import EXIT_OK, LogInputError, diagnose, read_log
from tests.helpers.doctor_logs import WRITERS
from tests.helpers.logs_extra import jsonl_text, rows
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


@examples(quick=6, long=200)
@given(fraction=st.floats(0.2, 0.95), key=st.sampled_from(["actor/grad_norm", "actor/pg_loss", "critic/score/mean"]))
def test_a_judged_value_made_nan_in_a_real_log_is_critical(
    tmp_path_factory: pytest.TempPathFactory, fraction: float, key: str
) -> None:
    """A NaN written into a judged stat of a real verl log (its logger would write null; a flat JSONL writes NaN):
    the doctor must find it (``nonfinite``)."""
    lines = _real("verl").decode().splitlines()
    carrying = [i for i, line in enumerate(lines) if f'"{key}"' in line]
    if not carrying:
        pytest.skip(f"no {key} in the log")
    i = carrying[int(fraction * (len(carrying) - 1))]
    record = json.loads(lines[i])
    (record["data"] if isinstance(record.get("data"), dict) else record)[key] = math.nan
    lines[i] = json.dumps(record)
    path = tmp_path_factory.mktemp("nan") / "log.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    d = diagnose(path)
    assert d.exit_code == 1 and any(f.detector == "nonfinite" for f in d.findings)


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
