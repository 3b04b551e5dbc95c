"""``python -m rlguard``: the ``rlguard`` command line."""

from rlguard.cli import main

main()
