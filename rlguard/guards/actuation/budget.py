"""What a rollback snapshot costs one rank (:class:`SnapshotCost`) and the memory budget checked when training
starts (:func:`check_snapshot_budget`); no torch, so a guard can be judged and bound without it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SnapshotBudgetError", "SnapshotCost", "available_host_memory", "check_snapshot_budget"]

logger = logging.getLogger("rlguard.snapshot")


class SnapshotBudgetError(ValueError):
    """A rollback snapshot that would take more host memory than its budget; ``str(err)`` gives the fixes."""


@dataclass(frozen=True)
class SnapshotCost:
    """What one rank's rollback snapshot costs.

    Attributes:
        host_bytes: host memory it holds (in a file: the largest tensor, held while it is written or read).
        disk_bytes: bytes of its file (0 in host memory).
        model_bytes: bytes of the whole model's parameters and buffers (every rank's together), for ratios.
        ranks: the ranks that share the snapshot (1: this rank keeps all of its own).
        estimated: the optimizer's state does not exist yet and was predicted from its class.
        where: where it is kept, in words.
    """

    host_bytes: int
    disk_bytes: int
    model_bytes: int
    ranks: int = 1
    estimated: bool = False
    where: str = "host memory"


def available_host_memory() -> int | None:
    """Bytes of memory this host can still give: ``MemAvailable`` of ``/proc/meminfo``, or less where a cgroup
    limit (a container) leaves less; None where neither can be read (not Linux)."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            found.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _local_ranks() -> int:
    """Ranks sharing this host (``LOCAL_WORLD_SIZE``, set by torchrun and accelerate; 1 without)."""
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_snapshot_budget(cost: SnapshotCost, budget: float | None, *, where: str) -> None:
    """Log what one rank's rollback snapshot costs and refuse (:class:`SnapshotBudgetError`) one that takes more
    host memory than ``budget`` (a share of the host's available memory, divided among the host's ranks; None: no
    check). ``where`` names the training loop in the messages."""
    ratio = cost.host_bytes / cost.model_bytes if cost.model_bytes else 0.0
    share = f" (this rank's share of {cost.ranks})" if cost.ranks > 1 else ""
    guess = ", optimizer state predicted from its class" if cost.estimated else ""
    disk = f", {_gib(cost.disk_bytes)} on disk" if cost.disk_bytes else ""
    text = (
        f"a rollback snapshot in {where} takes {_gib(cost.host_bytes)} of host memory on this rank{share}{disk}, "
        f"{ratio:.3g}x the model's {_gib(cost.model_bytes)}{guess}; kept in {cost.where}"
    )
    available = available_host_memory()
    if budget is None or available is None:
        logger.info("rlguard: %s (no budget checked)", text)
        return
    allowed = budget * available / _local_ranks()
    logger.info("rlguard: %s; budget %s", text, _gib(allowed))
    if cost.host_bytes > allowed:
        raise SnapshotBudgetError(
            f"rlguard: {text}, over its budget of {_gib(allowed)} (snapshot_budget={budget} of the {_gib(available)} "
            f"available, shared by {_local_ranks()} rank(s) on this host). Fixes: keep snapshots on disk "
            "(GuardConfig(snapshot_to_disk=True); TRL: --guard '{\"snapshot_to_disk\": true}'); raise "
            "snapshot_budget (up to 1.0) if the host has the memory; train on more data-parallel ranks (each keeps "
            "1/W of the snapshot); or switch rollbacks off (interventions rollback and recovery: null), which "
            "makes the guard skip and halt only. A longer snapshot_interval does not help: one snapshot is kept "
            "whatever the interval."
        )
