"""Start-up time of the ``rlguard`` command line, side by side with ``python -c pass``.

Each command and the baseline run in turn (A B A B ...), each in a fresh process, so that a drift of the machine's
speed hits both; the table gives the medians of wall and CPU time (user + system, the kernel's accounting of the
finished child) and the median of the pairwise wall-time differences. The doctor and the watch read a TRL log of
200 steps written from :mod:`tests.helpers.synthetic` into a temporary folder.

    python benchmarks/cli_startup.py              # 7 pairs per command (--markdown: as a markdown table)
    python benchmarks/cli_startup.py --quick      # 2 pairs, for tests/cli/test_startup.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the synthetic streams are the tests' data (tests/helpers/synthetic.py): the repository root on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers.synthetic import healthy_stream


def _write_trl_run(folder: Path, steps: int) -> Path:
    """A TRL ``output_dir``: ``trainer_state.json`` with TRL's keys for a healthy run of ``steps`` steps."""
    keys = {"reward_mean": "reward", "entropy": "entropy", "grad_norm": "grad_norm", "kl_ref": "kl", "loss": "loss"}
    history = [
        {"step": i, **{keys.get(k, f"rlguard/{k}"): v for k, v in stats.items()}}
        for i, stats in enumerate(healthy_stream(steps, seed=0), start=1)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": steps, "log_history": history}))
    return folder


def _run(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one process running ``argv`` (output discarded)."""
    before = os.times()
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7, help="runs of each command and of the baseline")
    parser.add_argument("--quick", action="store_true", help="2 pairs per command")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    pairs = 2 if args.quick else args.pairs
    rlguard = [sys.executable, "-m", "rlguard"]
    baseline = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory() as tmp:
        run = str(_write_trl_run(Path(tmp) / "run", 200))
        commands = {
            "rlguard --version": [*rlguard, "--version"],
            "rlguard detectors": [*rlguard, "detectors"],
            "rlguard doctor RUN": [*rlguard, "doctor", run],
            "rlguard watch --once RUN": [*rlguard, "watch", "--once", run],
            "rlguard losses": [*rlguard, "losses"],
        }
        _run(baseline)  # warm the file cache
        if args.markdown:
            print("| command | wall s | CPU s | `python -c pass` wall s | wall difference s |")
            print("|---|---|---|---|---|")
        else:
            print(f"{'command':<32} {'wall s':>8} {'cpu s':>8} {'python -c pass wall s':>22} {'difference s':>13}")
        for name, command in commands.items():
            _run(command)
            timed = [(_run(command), _run(baseline)) for _ in range(pairs)]
            wall = statistics.median(a[0] for a, _ in timed)
            cpu = statistics.median(a[1] for a, _ in timed)
            base = statistics.median(b[0] for _, b in timed)
            diff = statistics.median(a[0] - b[0] for a, b in timed)
            if args.markdown:
                print(f"| `{name}` | {wall:.3f} | {cpu:.3f} | {base:.3f} | {diff:.3f} |")
            else:
                print(f"{name:<32} {wall:>8.3f} {cpu:>8.3f} {base:>22.3f} {diff:>13.3f}")
    print(f"\nmedians of {pairs} alternated pairs; `python -c pass` is {' '.join(baseline)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
