"""Long-completion collapse benchmark: grpo/dapo/gspo/cispo/sapo x guard x stressors on a 33-token task.

    python benchmarks/collapse_long/run.py --workers 2 --seeds 8          # the grid (also: rlguard bench collapse-long)
    python benchmarks/collapse_long/run.py --quick --out /tmp/cl          # smoke test of every layer, seconds

Writes runs.jsonl, runs.csv, summary.csv, paired.csv, summary.md, plots/ and invocations.jsonl under --out
(default benchmarks/collapse_long/results). Design, calibration and the collapse definition:
rlguard/bench/collapse_long/__init__.py.
"""

from __future__ import annotations

import sys

from rlguard.bench.collapse_long.cli import main

if __name__ == "__main__":
    sys.exit(main())
