"""``python -m rlguard.cli``."""

from rlguard.cli import main

main()
