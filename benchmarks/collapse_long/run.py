"""The long-completion task of the collapse benchmark: ``benchmarks/collapse/run.py --task long`` (see there)."""

import sys

from rlguard.bench.collapse_long.cli import main

if __name__ == "__main__":
    sys.exit(main())
