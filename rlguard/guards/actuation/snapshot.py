"""Rollback snapshots of a model and its optimizer with a known, bounded cost (:class:`ModelSnapshot`) and what
they cost (:func:`snapshot_cost`); the memory budget checked when training starts is
:func:`rlguard.guards.actuation.budget.check_snapshot_budget`.

- **Each rank keeps what it owns.** Where the weights are replicated over a process group (DDP), the model's
  tensors are split over its ranks by bytes (:func:`owners`, the same on every rank) and each rank keeps its share
  and the optimizer state of its parameters: ``1/W`` of the snapshot per rank, plus at most one tensor of
  imbalance. :meth:`ModelSnapshot.restore`, which every rank calls at the same step (decisions are identical),
  broadcasts each tensor from its owner, one at a time (device memory: one tensor). Without a group a rank keeps
  all of its own tensors (a single process, or FSDP whose parameters are already shards).
- **Built in place.** The copies live in CPU buffers allocated once and overwritten with ``copy_`` at each
  snapshot, so the old snapshot is never held beside the new one. A snapshot being taken is not restorable until
  it is complete.
- **Spill to disk** (``path``): the tensors go to a safetensors file instead, written one tensor at a time to a
  temporary file renamed over the old one (host memory: one tensor at a time; disk: the old file stays whole until
  the new one is), and read back one tensor at a time.
- **A budget**: :func:`~rlguard.guards.actuation.budget.check_snapshot_budget` refuses, when training starts, a
  snapshot that would take more host memory than the budget, with the fixes.

What a snapshot holds: every tensor of ``model.state_dict()`` (parameters and persistent buffers, each tied tensor
once) and of the optimizer's ``state``, and the optimizer's hyper-parameters (``param_groups`` without the
parameters). Restoring copies them back in place, as ``load_state_dict`` would.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import Tensor, nn

from rlguard.guards.actuation.budget import SnapshotCost

__all__ = ["ModelSnapshot", "iter_chunks", "owners", "snapshot_cost", "write_safetensors"]

#: optimizer state tensors per parameter, in the parameter's size, for optimizers whose state does not exist yet
#: (created at their first step): what :func:`snapshot_cost` predicts; others are assumed to keep two (as Adam)
_STATE_COPIES = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "Adadelta": 2, "Adagrad": 1}
_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def model_tensors(model: nn.Module) -> list[Tensor]:
    """The tensors of ``model.state_dict()`` (parameters and persistent buffers), each tied tensor once, in order."""
    seen: set[int] = set()
    out: list[Tensor] = []
    for name, value in model.state_dict(keep_vars=True).items():
        if not isinstance(value, Tensor):
            raise NotImplementedError(f"state_dict entry {name!r} is a {type(value).__name__}, not a tensor")
        if id(value) not in seen:
            seen.add(id(value))
            out.append(value)
    return out


def owners(sizes: Sequence[int], ranks: int) -> list[int]:
    """The rank owning each item of ``sizes`` (bytes): largest first onto the least loaded rank (ties: the lower
    rank, the earlier item), so that no rank holds more than ``sum/ranks`` plus one item; the same on every rank."""
    load = [0] * ranks
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += sizes[i]
    return owner


def comm_device(group: Any) -> torch.device:
    """Where a collective of ``group`` takes its tensors: the current GPU for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _group_size(group: Any) -> tuple[int, int]:
    """``(rank, world size)`` in ``group``; ``(0, 1)`` without one."""
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class ModelSnapshot:
    """The rollback snapshot of ``model`` and ``optimizer`` (module docstring).

    Args:
        model: the trained module.
        optimizer: its optimizer.
        group: the process group over which ``model``'s weights are replicated (DDP): each rank keeps its share.
            None: this rank keeps all of its own tensors.
        path: keep the snapshot in this safetensors file (one per rank) instead of host memory.
    """

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, *, group: Any = None, path: str | None = None
    ) -> None:
        self.model, self.optimizer, self.group, self.path = model, optimizer, group, path
        self.rank, self.ranks = _group_size(group)
        tensors = model_tensors(model)
        self._params = [p for g in optimizer.param_groups for p in g["params"]]
        # units: the model's tensors, then the optimizer's parameters outside the state dict; a parameter's
        # optimizer state goes with its unit
        index = {id(t): i for i, t in enumerate(tensors)}
        self._tensors = list(tensors)
        self._param_unit: list[int] = []
        for p in self._params:
            if id(p) not in index:
                index[id(p)] = len(self._tensors)
                self._tensors.append(p)
            self._param_unit.append(index[id(p)])
        self._owner = owners([_nbytes(t) for t in self._tensors], self.ranks)
        self._buffers: dict[str, Tensor] = {}  # in place, by name: "t<unit>" and "s<param>.<key>"
        self._specs: dict[str, tuple[torch.Size, torch.dtype, torch.device]] = {}  # of the owned tensors
        self._values: dict[int, dict[str, Any]] = {}  # owned parameters' non-tensor state values
        self._keys: dict[int, list[str]] = {}  # owned parameters' state keys
        self._groups: list[dict[str, Any]] = []
        self._complete = False

    def owned(self, unit: int) -> bool:
        """Whether this rank keeps unit ``unit`` (a model tensor, with its parameter's optimizer state)."""
        return self._owner[unit] == self.rank

    # -- taking ------------------------------------------------------------------------------------------------
    def take(self) -> None:
        """Copy the owned tensors into this snapshot (in place), or into its file."""
        self._complete = False
        self._groups = [
            {k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups
        ]
        self._values, self._keys = {}, {}
        named: list[tuple[str, Tensor]] = []
        with torch.no_grad():
            for unit, t in enumerate(self._tensors):
                if self.owned(unit):
                    named.append((f"t{unit}", t.detach()))
            for k, p in enumerate(self._params):
                if not self.owned(self._param_unit[k]):
                    continue
                state = self.optimizer.state.get(p, {})
                self._keys[k] = list(state)
                self._values[k] = {key: copy.deepcopy(v) for key, v in state.items() if not isinstance(v, Tensor)}
                named += [(f"s{k}.{key}", v.detach()) for key, v in state.items() if isinstance(v, Tensor)]
            if self.path is None:
                live = {name for name, _ in named}
                for name in [n for n in self._buffers if n not in live]:
                    del self._buffers[name]  # state a parameter no longer has
                for name, t in named:
                    buf = self._buffers.get(name)
                    if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                        buf = self._buffers[name] = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                    buf.copy_(t)
            else:
                meta = {"keys": self._keys, "values": self._values}
                write_safetensors(self.path, named, {"rlguard": json.dumps(meta, default=repr)})
        self._specs = {name: (t.shape, t.dtype, t.device) for name, t in named}
        self._complete = True

    def has(self) -> bool:
        """Whether a complete snapshot can be restored."""
        return self._complete

    # -- restoring ---------------------------------------------------------------------------------------------
    def restore(self) -> bool:
        """Copy the snapshot back into the model and the optimizer (every rank of ``group`` together); False when
        there is none."""
        if not self._complete:
            return False
        with self._reader() as read, torch.no_grad():
            layout = self._layout()
            for unit, t in enumerate(self._tensors):
                t.copy_(self._fetch(unit, f"t{unit}", t.shape, t.dtype, read))
            for k, p in enumerate(self._params):
                keys, values, shapes = layout[k]
                state = self.optimizer.state[p]
                for key in [key for key in state if key not in keys]:
                    del state[key]
                for key in keys:
                    if key in values:
                        state[key] = copy.deepcopy(values[key])
                        continue
                    shape, dtype, device = shapes[key]
                    value = self._fetch(self._param_unit[k], f"s{k}.{key}", shape, dtype, read)
                    old = state.get(key)
                    if isinstance(old, Tensor) and old.shape == shape and old.dtype == dtype and old.device == device:
                        old.copy_(value)
                    else:
                        state[key] = value.to(device, copy=True)
                if not keys:
                    del self.optimizer.state[p]
        for group, saved in zip(self.optimizer.param_groups, self._groups, strict=True):
            group.update(copy.deepcopy(saved))
        return True

    def _layout(self) -> dict[int, tuple[list[str], dict[str, Any], dict[str, tuple[torch.Size, Any, Any]]]]:
        """Every parameter's state keys, non-tensor values and tensor specs at the snapshot, from its owner."""
        mine = {
            k: (
                keys,
                self._values[k],
                {key: self._specs[f"s{k}.{key}"] for key in keys if f"s{k}.{key}" in self._specs},
            )
            for k, keys in self._keys.items()
        }
        if self.ranks == 1:
            return mine
        gathered: list[Any] = [None] * self.ranks
        dist.all_gather_object(gathered, mine, group=self.group)
        return {k: v for part in gathered for k, v in part.items()}

    def _fetch(self, unit: int, name: str, shape: torch.Size, dtype: torch.dtype, read: Any) -> Tensor:
        """Tensor ``name`` of the snapshot: this rank's own, or broadcast from its owner (collective)."""
        mine = self.owned(unit)
        value = (self._buffers[name] if self.path is None else read(name)) if mine else None
        if self.ranks == 1:
            assert value is not None
            return value
        device = comm_device(self.group)
        buf = value.to(device) if value is not None else torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(buf, src=dist.get_global_rank(self.group, self._owner[unit]), group=self.group)
        return buf

    def _reader(self) -> Any:
        """A context giving ``read(name)`` of the snapshot's file (None in memory)."""
        if self.path is None:
            return contextlib.nullcontext()
        return _FileReader(self.path)

    # -- cost --------------------------------------------------------------------------------------------------
    def cost(self) -> SnapshotCost:
        """What this rank's snapshot costs (:func:`snapshot_cost` for its share)."""
        return snapshot_cost(self.model, self.optimizer, owned=self.owned, units=self, path=self.path)

    def units(self) -> Iterator[tuple[int, Tensor, list[Tensor]]]:
        """``(unit, tensor, parameters of the optimizer it is)``: what :func:`snapshot_cost` counts."""
        by_unit: dict[int, list[Tensor]] = {}
        for k, p in enumerate(self._params):
            by_unit.setdefault(self._param_unit[k], []).append(p)
        for unit, t in enumerate(self._tensors):
            yield unit, t, by_unit.get(unit, [])


class _FileReader:
    """Reads a snapshot's safetensors file one tensor at a time (``safe_open``)."""

    def __init__(self, path: str) -> None:
        self._ctx = safe_open(path, framework="pt", device="cpu")

    def __enter__(self) -> Any:
        return self._ctx.__enter__().get_tensor  # type: ignore[no-untyped-call]

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)  # type: ignore[no-untyped-call]


def write_safetensors(path: str | Path, tensors: Sequence[tuple[str, Tensor]], metadata: dict[str, str]) -> None:
    """Write ``tensors`` to a safetensors file at ``path``, one tensor at a time (host memory: the largest tensor,
    while a tensor on an accelerator is copied), to a temporary file that is then renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, t in tensors:
        if t.dtype not in _DTYPES:
            raise NotImplementedError(f"snapshot tensor {name!r} has dtype {t.dtype}, which safetensors cannot hold")
        header[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + _nbytes(t)],
        }
        offset += _nbytes(t)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(len(encoded).to_bytes(8, "little") + encoded)
            for _, t in tensors:
                if t.numel():
                    fh.write(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# -- cost -----------------------------------------------------------------------------------------------
def _state_bytes(optimizer: torch.optim.Optimizer, p: Tensor) -> tuple[int, bool]:
    """Bytes of ``p``'s optimizer state; predicted from the optimizer's class while it has none (estimated)."""
    state = optimizer.state.get(p)
    if state:
        return sum(_nbytes(v) for v in state.values() if isinstance(v, Tensor)), False
    name = type(optimizer).__name__
    group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
    copies = _STATE_COPIES.get(name, 2)
    if name == "SGD":
        copies = int(group.get("momentum", 0) != 0)
    elif name == "RMSprop":
        copies = 1 + int(group.get("momentum", 0) != 0) + int(bool(group.get("centered", False)))
    return copies * _nbytes(p), True


def snapshot_cost(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    owned: Any = None,
    units: ModelSnapshot | None = None,
    path: str | None = None,
) -> SnapshotCost:
    """What a snapshot of ``model`` and ``optimizer`` costs this rank: its owned share (``owned(unit)``, all by
    default) of the model's tensors and their optimizer state, in host memory or in the file ``path``."""
    snapshot = units if units is not None else ModelSnapshot(model, optimizer)
    owned = owned or (lambda unit: True)
    total = mine = largest = 0
    estimated = False
    for unit, t, params in snapshot.units():
        size = _nbytes(t)
        total += size
        for p in params:
            state, guessed = _state_bytes(optimizer, p)
            size += state
            estimated |= guessed
        if owned(unit):
            mine += size
            largest = max(largest, _nbytes(t))
    ranks = snapshot.ranks
    if path is None:
        return SnapshotCost(mine, 0, total, ranks, estimated)
    return SnapshotCost(largest, mine, total, ranks, estimated, where=f"the file {path}")


def iter_chunks(t: Tensor, size: int) -> Iterable[Tensor]:
    """Flat views of ``t`` of at most ``size`` elements (``t`` contiguous: views, no copy)."""
    flat = t.detach().reshape(-1)
    for start in range(0, flat.numel(), size):
        yield flat[start : start + size]
