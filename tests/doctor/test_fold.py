"""The doctor's judgement as a fold (``rlguard.doctor.fold.DoctorFold``), as ``rlguard watch`` feeds it: its
verdict on a growing log equals ``rlguard doctor``'s (``diagnose_log``) on the same prefix, at every judgement,
and each appended step goes through the guard once."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.doctor.diagnose import diagnose_log
from rlguard.doctor.fold import DoctorFold
from rlguard.doctor.stream import JsonlFollower
from rlguard.doctor.warmups import enough_observations, fit_plan
from rlguard.guards import Guard
from rlguard.guards.decision import Decision
from tests.helpers.synthetic import FAILURES, failing_stream, healthy_stream

#: ``shared/`` beside the checkout or an ancestor of it (as tests/doctor/test_properties.py finds it)
SHARED = next(
    (p / "shared" for p in Path(__file__).resolve().parents if (p / "shared" / "doctor_foreign").is_dir()),
    Path("/nonexistent/shared"),
)


def _line(step: int, stats: dict[str, float], merged: bool = False) -> str:
    record = {"step": step, **{k: (v if v == v else "NaN") for k, v in stats.items()}}
    if merged:  # a second record of the same step (an evaluation logged after the training stats)
        record = {"step": step, "eval_loss": 1.0 + 0.01 * (step % 7)}
    return json.dumps(record) + "\n"


def _grow_and_compare(path: Path, lines: list[str], seed: int, after: tuple[int, ...] = ()) -> DoctorFold:
    """Append ``lines`` to ``path`` in random pieces (cut inside lines too, and after each line numbered in
    ``after``); after each poll the fold's verdict equals the doctor's on the log read so far."""
    rng = random.Random(seed)
    text = "".join(lines)
    ends = [sum(map(len, lines[: k + 1])) for k in after]
    cuts = sorted({*rng.sample(range(1, len(text)), 12), *ends, len(text)})
    path.write_text("")
    follower = JsonlFollower(path)
    fold = DoctorFold(path)
    at, judged = 0, 0
    for cut in cuts:
        with path.open("a") as fh:
            fh.write(text[at:cut])
        at = cut
        follower.poll()
        try:
            log = follower.log()
            want = diagnose_log(log, path).to_dict()
        except Exception as err:  # too little read yet: the fold refuses it the same way
            with pytest.raises(type(err)):
                fold.judge(follower.log(), final=False)
            continue
        got = fold.judge(follower.log(), final=False).to_dict()
        assert got == want, (at, len(text))
        judged += 1
    assert judged >= 3
    return fold


@pytest.mark.parametrize("mode", ["nonfinite", "grad_spike", "reward_collapse", "entropy_collapse", "healthy"])
def test_the_folds_verdict_on_a_growing_log_equals_the_doctors_on_each_prefix(tmp_path: Path, mode: str) -> None:
    """A synthetic run (healthy, or failing from step 120) written in random pieces, some steps logged in two
    records (the second may arrive a poll later, merged into the step already judged by the fold's copy)."""
    assert mode == "healthy" or mode in FAILURES
    stream = healthy_stream(300, seed=5) if mode == "healthy" else failing_stream(mode, 300, 120, seed=5)
    lines, firsts = [], []
    for step, stats in enumerate(stream, 1):
        lines.append(_line(step, stats))
        if step % 9 == 0:
            firsts.append(len(lines) - 1)
            lines.append(_line(step, stats, merged=True))
    # polls between the two records of a step: the step is judged, then merged with its second record
    fold = _grow_and_compare(tmp_path / "metrics.jsonl", lines, seed=len(mode), after=tuple(firsts[3::5]))
    assert fold.replays <= 40  # warm-ups fitted while the log is short, not once per record


def test_each_appended_step_goes_through_the_guard_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the log's first few hundred steps (the warm-ups then no longer change with its length), a judgement
    observes the steps appended since the last one, plus the last step once by a copy of the guard: never the
    steps before them again."""
    stream = healthy_stream(600, seed=2)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_line(s, x) for s, x in enumerate(stream[:400], 1)))
    follower, fold = JsonlFollower(path), DoctorFold(path)
    follower.poll()
    fold.judge(follower.log(), final=False)
    calls: list[int] = []
    original = Guard.observe

    def counted(self: Guard, step: int, stats: dict[str, float]) -> Decision:
        calls.append(step)
        return original(self, step, stats)

    monkeypatch.setattr(Guard, "observe", counted)
    for first in range(401, 601, 20):
        with path.open("a") as fh:
            fh.write("".join(_line(s, stream[s - 1]) for s in range(first, first + 20)))
        follower.poll()
        calls.clear()
        d = fold.judge(follower.log(), final=False)
        assert sorted(calls) == [*range(first - 1, first + 19), first + 19], calls  # 20 new steps, the last twice
        assert d.to_dict() == diagnose_log(follower.log(), path).to_dict()
    assert fold.replays == 0


@pytest.mark.skipif(not (SHARED / "doctor_foreign").is_dir(), reason="needs ../shared/doctor_foreign")
@pytest.mark.parametrize("name", ["verl-ppo-tutorial-qwen05b.verl.jsonl", "opd-qwen3-4b-ry3hgbx5.verl.jsonl"])
def test_the_folds_verdict_equals_the_doctors_on_prefixes_of_real_verl_logs(tmp_path: Path, name: str) -> None:
    lines = (SHARED / "doctor_foreign" / name).read_text().splitlines(keepends=True)
    _grow_and_compare(tmp_path / name, lines, seed=7)


def test_the_doctors_memory_per_step_is_its_columns_and_timeline(tmp_path: Path) -> None:
    """The traced peak of ``diagnose`` grows by at most 400 bytes per step of a 12-key log: the column table (9 bytes
    per key and step, 8 for the step: 116), the fold's timeline (24) and its few findings. A dict of canonical stats
    kept per step (about 1.4 KB here) or the series kept as lists of floats (32 bytes per stat and step) fail it."""
    import tracemalloc

    from rlguard.doctor import diagnose

    levels = {"loss": (0.01, 0.01), "grad_norm": (0.5, 0.1), "reward": (0.5, 0.05), "reward_std": (0.3, 0.02),
              "kl": (0.01, 0.002), "entropy": (0.8, 0.03), "completions/mean_length": (180.0, 10.0),
              "completions/clipped_ratio": (0.02, 0.005), "frac_reward_zero_std": (0.1, 0.02),
              "clip_ratio/region_mean": (0.002, 0.0004), "learning_rate": (1e-6, 0.0), "epoch": (0.0, 0.0)}  # fmt: skip
    rng = random.Random(0)
    peaks = {}
    for n in (1500, 4500):
        path = tmp_path / f"metrics-{n}.jsonl"
        with path.open("w") as fh:
            for s in range(1, n + 1):
                fh.write(json.dumps({"step": s, **{k: abs(m + sd * rng.gauss(0, 1)) for k, (m, sd) in levels.items()}}))
                fh.write("\n")
        tracemalloc.start()
        try:
            diagnose(path)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    per_step = (peaks[4500] - peaks[1500]) / 3000
    assert per_step <= 400, per_step


def test_the_copy_that_judges_the_last_step_leaves_the_folds_guard_as_it_was(tmp_path: Path) -> None:
    """A judgement of a log that may still grow judges its last step by a copy of the guard: after it, the fold's
    guard holds what a guard fed every step but the last holds (a detector's state shared with the copy, lists
    changed in place as ``frozen_values`` keeps its counts, counted the last step twice once it was fed for good)."""
    stream = healthy_stream(400, seed=4)  # long enough that the warm-ups fitted to 399 and 400 records are the same
    lines = [_line(s, x) for s, x in enumerate(stream, 1)]
    growing, before = tmp_path / "growing.jsonl", tmp_path / "before.jsonl"
    growing.write_text("".join(lines))
    before.write_text("".join(lines[:-1]))
    follower, fold = JsonlFollower(growing), DoctorFold(growing)
    follower.poll()
    fold.judge(follower.log(), final=False)
    whole = JsonlFollower(before)
    whole.poll()
    reference = DoctorFold(before)
    reference.judge(whole.log(), final=True)
    assert "frozen_values" in fold._guard.detectors and fold._warmups == reference._warmups
    assert fold._guard.state_dict() == reference._guard.state_dict()


@given(
    st.lists(
        st.tuples(st.integers(0, 120), st.none() | st.integers(0, 30), st.integers(0, 1000)), min_size=1, max_size=30
    )
)
def test_observations_counted_up_to_enough_fit_the_same_warmups(detectors: list[tuple[int, int | None, int]]) -> None:
    """The warm-up counts stop at ``enough_observations``: any count from there on fits the same warm-up as the whole
    count."""
    warmups = {f"d{i}": own for i, (own, _, _) in enumerate(detectors)}
    needs = {f"d{i}": need for i, (_, need, _) in enumerate(detectors)}
    counts = {f"d{i}": seen for i, (_, _, seen) in enumerate(detectors)}
    enough = enough_observations(warmups, needs)
    stopped = {name: min(seen, enough[name]) for name, seen in counts.items()}
    assert fit_plan(warmups, needs, stopped) == fit_plan(warmups, needs, counts)
