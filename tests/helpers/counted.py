"""A list that counts the reads of its items by position, for tests that bound the work a kept (incremental)
computation does per judgement."""

from __future__ import annotations

from typing import Any, SupportsIndex


class Counted(list[Any]):
    """A list that counts the reads of its items by position in the class attribute ``reads`` (shared by every
    instance; set it to 0 before the reads to count): an index reads one, a slice or an iteration as many as it
    covers."""

    reads = 0

    def __getitem__(self, k: SupportsIndex | slice) -> Any:  # type: ignore[override]
        Counted.reads += 1 if isinstance(k, SupportsIndex) else len(range(len(self))[k])
        return super().__getitem__(k)

    def __iter__(self) -> Any:
        Counted.reads += len(self)
        return super().__iter__()
