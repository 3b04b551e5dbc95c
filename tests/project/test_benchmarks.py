"""The benchmarks run end to end in their --quick mode, print their table and measure sane values."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, *args: str, timeout: int = 600) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_guard_detection_quick() -> None:
    stdout = run_benchmark("guard_detection.py", "--steps", "200")
    assert "entropy_collapse" in stdout and "healthy runs" in stdout
    assert "missed" in stdout


def test_guard_detection_online_consequence_keeps_skipping_lone_spikes() -> None:
    """consequence="online": a lone gradient or ratio spike the stream recovers from is not critical (a warning by
    consequence) and the default preset still skips its step; a sustained failure is still critical."""
    stdout = run_benchmark("guard_detection.py", "--quick", "--steps", "200", "--consequence", "online")
    rows = {cells[0]: cells for line in stdout.splitlines() if (cells := [c.strip() for c in line.split("│")[1:-1]])}
    for mode in ("grad_spike", "ratio_explosion"):
        assert rows[mode][6:8] == ["0/2", "2/2"], rows[mode]  # reached critical, skipped (default)
    for mode in ("entropy_collapse", "kl_ref_blowup", "nonfinite"):
        assert rows[mode][6] == "2/2", rows[mode]


@pytest.mark.slow
def test_logprobs_memory_quick(tmp_path: Path) -> None:
    stdout = run_benchmark("logprobs_memory.py", "--json", str(tmp_path / "out.json"))
    assert "TRL fused GB" in stdout
    (row,) = json.loads((tmp_path / "out.json").read_text())
    assert row["same_result"]  # the four paths agree on the GRPO loss and the entropy
    paths = ("trl_full", "trl_fused", "rlguard", "rlguard_fused", "floor")
    for key in (*(f"{p}_gb" for p in paths), *(f"{p}_s" for p in paths)):
        assert 0.0 < row[key] < 100.0, (key, row[key])


@pytest.mark.slow
@pytest.mark.serial  # its bound is a ratio of two timings: make test runs it alone
def test_guard_overhead_quick(tmp_path: Path) -> None:
    stdout = run_benchmark("guard_overhead.py", "--json", str(tmp_path / "out.json"))
    assert "guard total" in stdout
    result: dict[str, Any] = json.loads((tmp_path / "out.json").read_text())
    assert result["step_ms_no_guard"] > 0 and result["step_ms_guard"] > 0
    assert all(value > 0 for value in result["parts_ms"].values())  # every timed part ran in the guarded run
    # a smoke bound: the guard's cost is a small part of a step even on a loaded CI machine
    assert 0.0 < result["guard_pct_of_step"] < 20.0
    assert math.isclose(result["guard_ms_per_step"] * 100 / result["step_ms_guard"], result["guard_pct_of_step"])


@pytest.mark.slow
def test_collectives_quick(tmp_path: Path) -> None:
    stdout = run_benchmark("collectives.py", "--json", str(tmp_path / "out.json"))
    assert "collectives per optimizer step" in stdout
    result = json.loads((tmp_path / "out.json").read_text())
    stock = result["stock TRL"]
    bare = result["GuardedGRPOTrainer, guard=None"]
    guarded = result["GuardedGRPOTrainer, guard='default'"]
    assert guarded["rlguard guard"] == 1.0  # one collective per step for all guard stats
    assert bare["rlguard guard"] == stock["rlguard guard"] == 0.0
    assert guarded["total"] == bare["total"] + 1.0
    assert bare["rlguard adapter"] == 1.0  # the objective's metrics: one gather per micro-batch (GA = 1)
    assert stock["trl"] > bare["trl"]  # TRL's own loss metrics are gathered one by one


def test_reward_peak_live_counts_every_unguarded_run_once() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import reward_peak_live
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for path in reward_peak_live.LOGS:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        off = [r for r in rows if r["config"]["guard"] == "off"]
        counts = reward_peak_live.replay(path)
        assert sum(counts.values()) == len(off)
        collapsed = sum(n for (verdict, _), n in counts.items() if verdict == "collapsed")
        assert collapsed == sum(bool(r["verdict"]["collapsed"]) for r in off)


@pytest.mark.slow
def test_guard_memory_quick(tmp_path: Path) -> None:
    """2 processes (gloo), DDP: each rank keeps its share of the snapshot (half of 12 bytes a parameter) and a
    float64 vector of its share of the trained parameters; a later snapshot adds nothing; both ranks measure the
    same update_ratio."""
    stdout = run_benchmark("guard_memory.py", "--json", str(tmp_path / "out.json"))
    assert "rlguard snapshot (DDP)" in stdout
    ranks = json.loads((tmp_path / "out.json").read_text())
    mib, n = 2**20, ranks[0]["params"]
    shares = [r["rlguard snapshot (DDP)"] for r in ranks]
    assert sum(s["predicted"] for s in shares) == pytest.approx(12 * n, abs=64)  # the ranks' shares: the whole
    for share in shares:
        assert abs(share["held"] - share["predicted"]) <= 2 * mib and share["again"] <= 2 * mib, share
    for r in ranks:  # each rank got back every tensor, its own and those broadcast from the other rank
        assert all(r[k]["exact"] for k in r if isinstance(r[k], dict) and "exact" in r[k]), r
        assert share["predicted"] <= 6 * n + 12 * 1024 * 1024, share  # 1/2, plus at most one tensor and its moments
    meters = [r["rlguard update_ratio (DDP)"] for r in ranks]
    assert meters[0]["value"] == meters[1]["value"] > 0  # one all_gather: the same ratio on both ranks
    assert sum(m["predicted"] for m in meters) == 8 * n
    old = [r["before: state_dict copied to the CPU"] for r in ranks]
    assert all(o["again"] >= 11 * n for o in old)  # the replaced snapshot held both copies while taking the next


def test_doctor_scale_watch_quick() -> None:
    """The watch's case runs (a half-written last line at each poll, a collapse going on): the fold is fed the
    appended records, never replayed, and the collapse is found; the healthy log, as it grows, is not flagged."""
    stdout = run_benchmark("doctor_scale.py", "--watch", "3000", "--collapse", "500", "--half-line")
    (row,) = [line for line in stdout.splitlines() if line.startswith("| half-written last line, collapsed 500")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "3000" and cells[8] == "0" and int(cells[9]) >= 1 and float(cells[5]) > 0, row
    stdout = run_benchmark("doctor_scale.py", "--watch", "3000")
    (row,) = [line for line in stdout.splitlines() if line.startswith("| healthy | trl | 3000 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[8] == "0" and cells[9] == "0", row


def test_doctor_scale_quick() -> None:
    """A healthy 1,000-step TRL-shaped JSONL is judged with exit 0 and a peak resident set measured."""
    stdout = run_benchmark("doctor_scale.py", "--sizes", "1000")
    (row,) = [line for line in stdout.splitlines() if line.startswith("| trl | 1000 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == "0" and 0 < float(cells[3]) < 120 and 10 < float(cells[4]) < 1000, row
