"""The consequence rule's hindsight in the doctor's fold is incremental (``rlguard.guards.consequence.index``): a
judgement reads the steps added since the last one, not the whole timeline, and its verdict is the judgement from
scratch, on the 42 real logs fed record by record through the watch's path and on random appended chunks."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, SupportsIndex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.doctor import diagnose
from rlguard.doctor.diagnose import diagnose_log
from rlguard.doctor.fold import DoctorFold, _Sparse
from rlguard.doctor.readers import LogInputError, MetricLog, read_log
from rlguard.doctor.stream import JsonlFollower
from tests.helpers.counted import Counted
from tests.helpers.profiles import PROFILE, examples
from tests.helpers.synthetic import failing_stream, healthy_stream

#: ``shared/`` beside the checkout or an ancestor of it (as tests/doctor/test_fold.py finds it)
SHARED = next(
    (p / "shared" for p in Path(__file__).resolve().parents if (p / "shared" / "doctor_foreign").is_dir()),
    Path("/nonexistent/shared"),
)
REAL = sorted(
    p for folder in ("doctor_foreign", "doctor_foreign2") for p in (SHARED / folder).glob("*") if p.name != "README.md"
)


def _line(step: int, stats: dict[str, float]) -> str:
    return json.dumps({"step": step, **{k: (v if v == v else "NaN") for k, v in stats.items()}}) + "\n"


def _cuts(n: int, seed: int) -> list[int]:
    """The record counts after which the watch judges: every one under the long profile; the first 20, then 25
    spread over the log and 10 at random otherwise (each judgement reads the whole table: quadratic in all)."""
    if PROFILE == "long":
        return list(range(1, n + 1))
    rng = random.Random(seed)
    return sorted({*range(1, min(n, 20) + 1), *range(20, n, max(n // 25, 1)), *rng.sample(range(1, n + 1), min(n, 10))})


def _judge(fold: DoctorFold, log: MetricLog, path: Path) -> None:
    try:
        fold.judge(log, final=False)
    except LogInputError:  # too little read yet: the doctor refuses it alike
        with pytest.raises(LogInputError):
            diagnose_log(log, path)


@pytest.mark.skipif(not REAL, reason="needs ../shared/doctor_foreign and doctor_foreign2")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_the_watchs_fold_fed_record_by_record_ends_on_the_doctors_json(tmp_path: Path, path: Path) -> None:
    """A JSONL log appended line by line and followed as ``rlguard watch`` follows it; another log (which the watch
    reads whole at each change) grown row by row as the fold is handed it; judged after each record (``_cuts``).
    The last judgement prints as ``rlguard doctor --json`` on the whole file (``json.dumps(diagnose(...).to_dict(),
    indent=2)``), byte for byte."""
    if path.suffix == ".jsonl":
        grown = tmp_path / path.name
        lines = path.read_bytes().splitlines(keepends=True)
        grown.write_bytes(b"")
        follower, fold = JsonlFollower(grown), DoctorFold(grown)
        at = 0
        for cut in _cuts(len(lines), len(lines)):
            with grown.open("ab") as fh:
                fh.write(b"".join(lines[at:cut]))
            at = cut
            follower.poll()
            _judge(fold, follower.log(), grown)
        got = fold.judge(follower.log(), final=True)
        want = diagnose(grown)
    else:
        try:
            whole = read_log(path)
        except LogInputError:  # a file the doctor refuses (two runs in one CSV): nothing for the watch to grow
            with pytest.raises(LogInputError):
                diagnose(path)
            return
        rows, fold = list(whole.rows), DoctorFold(path)
        for cut in _cuts(len(rows), len(rows)):
            _judge(fold, MetricLog(whole.format, whole.path, rows[:cut], whole.report), path)
        got, want = fold.judge(whole, final=True), diagnose(path)
    assert json.dumps(got.to_dict(), indent=2) == json.dumps(want.to_dict(), indent=2)


class CountedSparse(_Sparse[Any]):
    """The fold's findings by step (``_Sparse``), counting the reads of its items by position in ``Counted``."""

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, SupportsIndex):
            Counted.reads += 1
        return super().__getitem__(k)

    def __iter__(self) -> Any:
        Counted.reads += len(self)
        return super().__iter__()


def _counted_sparse(sparse: _Sparse[Any]) -> CountedSparse:
    counted = CountedSparse()
    counted.__dict__.update(sparse.__dict__)
    return counted


def test_a_judgement_reads_the_steps_added_since_the_last_not_the_timeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After 2,000 steps of a run with findings, 20 steps appended: the judgement reads the kept timeline's
    findings and observed detectors at the new steps and near the findings it labels, far fewer positions than
    the 2,000 kept (reading the timeline whole at each judgement reads them all, for each of the 24 detectors)."""
    stream = failing_stream("entropy_collapse", 2100, 1900, seed=3)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_line(s, x) for s, x in enumerate(stream[:2000], 1)))
    follower, fold = JsonlFollower(path), DoctorFold(path)
    follower.poll()
    fold.judge(follower.log(), final=False)
    monkeypatch.setattr(fold, "_findings", _counted_sparse(fold._findings))
    monkeypatch.setattr(fold, "_observed", Counted(fold._observed))
    for first in range(2001, 2101, 20):
        with path.open("a") as fh:
            fh.write("".join(_line(s, stream[s - 1]) for s in range(first, first + 20)))
        follower.poll()
        Counted.reads = 0
        d = fold.judge(follower.log(), final=False)
        assert any(f.severity == "critical" for f in d.findings)
        assert Counted.reads <= 200, Counted.reads
        assert d.to_dict() == diagnose_log(follower.log(), path).to_dict()


@given(
    mode=st.sampled_from(["healthy", "grad_spike", "reward_collapse", "entropy_collapse", "nonfinite"]),
    chunks=st.lists(st.integers(1, 120), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
@examples(quick=6, long=60)
def test_judged_in_random_appended_chunks_equals_judged_from_scratch(
    tmp_path_factory: pytest.TempPathFactory, mode: str, chunks: Sequence[int], seed: int
) -> None:
    """A run appended in chunks of random sizes, judged after each: each judgement (the fold's kept index, brought
    up to date, with its last step judged by a copy and forgotten) equals a new fold's on the log so far."""
    stream = healthy_stream(400, seed=seed) if mode == "healthy" else failing_stream(mode, 400, 150, seed=seed)
    path = tmp_path_factory.mktemp("chunks") / "metrics.jsonl"
    path.write_text("")
    follower, fold = JsonlFollower(path), DoctorFold(path)
    at = 0
    for size in [*chunks, 400]:
        with path.open("a") as fh:
            fh.write("".join(_line(s, stream[s - 1]) for s in range(at + 1, min(at + size, 400) + 1)))
        at = min(at + size, 400)
        follower.poll()
        try:
            want = DoctorFold(path).judge(follower.log(), final=False).to_dict()
        except LogInputError:
            continue
        assert fold.judge(follower.log(), final=False).to_dict() == want, at
