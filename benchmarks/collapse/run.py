"""Collapse benchmark: collapse rate of grpo/dapo/gspo with and without the guard under five stressors.

    python benchmarks/collapse/run.py                 # full grid: 3 x 2 x 5 cells x 8 seeds, 2 workers
    python benchmarks/collapse/run.py --quick         # smoke test: grpo+gspo x off/default x none/high_lr, 1 seed

Writes runs.csv, summary.csv, summary.md and plots/ under --out (default benchmarks/collapse/results).
Design, stressors and the collapse definition: rlguard/bench/collapse/ (its package docstring).
"""

from __future__ import annotations

import sys

from rlguard.bench.collapse import main

if __name__ == "__main__":
    sys.exit(main())
