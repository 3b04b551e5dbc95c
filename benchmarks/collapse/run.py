"""Collapse benchmark: collapse rate per objective x guard x stressor, with and without the guard, for one task.

    python benchmarks/collapse/run.py --task short              # 3 objectives x 3 guards x 5 stressors x 8 seeds
    python benchmarks/collapse/run.py --task long --resume      # 5 objectives x off/default x 5 stressors x 8 seeds
    python benchmarks/collapse/run.py --task long --quick --out /tmp/cl   # smoke test of every layer, seconds

Writes runs.jsonl, runs.csv, summary.csv, summary.md, plots/ and invocations.jsonl (and, for the long task,
paired.csv) under --out (default benchmarks/collapse/results or benchmarks/collapse_long/results). How to run it:
benchmarks/collapse/README.md; design and definitions: rlguard/bench/collapse/__init__.py.
"""

from __future__ import annotations

import sys

from rlguard.bench.collapse import main

if __name__ == "__main__":
    sys.exit(main())
