"""The size of an optimizer update, ``update_ratio = ||theta_after - theta_before|| / ||theta_before||`` (what the trust
region reads, :mod:`rlguard.guards.interventions.trust_region`), measured with bounded device memory
(:class:`UpdateMeter`).

Before the step, the meter copies the parameters the optimizer can change (those in its ``param_groups``: no other
parameter moves in ``optimizer.step()``) into one flat float64 vector in host memory, allocated once and
overwritten in place, a chunk of :data:`CHUNK` elements at a time, and takes its norm; the norm of the other
parameters is summed on their device, chunk by chunk. After the step it subtracts the new values from the vector,
chunk by chunk, and takes the norm again. Each element is the exact float64 difference of the two values, and the
norms are those of one flat float64 vector, as ``vector_norm(cat(after) - cat(before))`` and
``vector_norm(cat(before))`` of the concatenated float64 weights: for a model whose parameters are all trained, in
one process on the CPU, the ratio is the same float, bit for bit (the collapse benchmark's committed runs depend on
it); otherwise it agrees to float64 rounding.

Cost: host memory, 8 bytes per trained parameter (this rank's share, below), kept between steps, and one chunk in
transit (``CHUNK`` elements, 8 MiB in float64); device memory, nothing extra for the trained parameters (a blocking copy
to the host converts to float64 on the host) and, for the norm of the others, one float64 chunk no larger than the
model's largest tensor: whatever the model's size, the device never holds more than its largest parameter tensor extra;
time, two passes over the host copy per step (one copy of the parameters to the host before the step and one after).
``benchmarks/guard_memory.md`` has the measured figures. Where the weights are replicated over a process group (DDP),
each rank measures the parameters it owns (:func:`rlguard.guards.actuation.snapshot.owners`) and one ``all_gather`` of
two float64 norms per rank combines them, so the host copy per rank is ``1/W`` of the trained parameters and every rank
gets the same ratio.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlguard.guards.actuation.snapshot import comm_device, iter_chunks, owners

__all__ = ["CHUNK", "UpdateMeter"]

#: elements of a parameter moved between its device and the host at a time
CHUNK = 1 << 20


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class UpdateMeter:
    """Measures ``update_ratio`` of each optimizer step (module docstring).

    Args:
        model: the trained module (``model.parameters()``: the norm's parameters).
        optimizer: its optimizer (its parameters are the ones copied).
        group: the process group over which the weights are replicated (DDP), or None.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, group: Any = None) -> None:
        self.group = group
        rank, ranks = (0, 1) if group is None else (dist.get_rank(group), dist.get_world_size(group))
        params = list(model.parameters())  # each tied parameter once
        trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
        owner = owners([_nbytes(p) for p in params], ranks)
        mine = [p for p, o in zip(params, owner, strict=True) if o == rank]
        self._moved = [p for p in mine if id(p) in trained]  # in the host vector
        self._fixed = [p for p in mine if id(p) not in trained]  # their norm only
        # the norm of a fixed parameter is taken on its device in float64 chunks no larger than the model's largest
        # tensor (and at most CHUNK elements): the device never holds more than that tensor's bytes extra
        self._fixed_chunk = max(min(CHUNK, max((_nbytes(p) for p in params), default=8) // 8), 1)
        self._flat: Tensor | None = None
        self._before: tuple[float, float] | None = None  # norms of the vector and of the fixed parameters

    @property
    def host_bytes(self) -> int:
        """Host memory of the before-copy on this rank: 8 bytes per trained parameter it measures."""
        return 8 * sum(p.numel() for p in self._moved)

    def _slices(self) -> list[tuple[Tensor, Tensor]]:
        """``(slice of the host vector, the parameter's chunk)`` for every chunk of the trained parameters."""
        assert self._flat is not None
        out, offset = [], 0
        for p in self._moved:
            for chunk in iter_chunks(p, CHUNK):
                out.append((self._flat[offset : offset + chunk.numel()], chunk))
                offset += chunk.numel()
        return out

    def capture(self) -> None:
        """Before the optimizer step: copy the parameters it can change and take the norms of the weights."""
        with torch.no_grad():
            if self._flat is None:
                self._flat = torch.empty(sum(p.numel() for p in self._moved), dtype=torch.float64)
            for host, chunk in self._slices():
                host.copy_(chunk)  # to float64, exactly
            squares = [
                torch.dot(c, c) for p in self._fixed for c in (x.double() for x in iter_chunks(p, self._fixed_chunk))
            ]
            fixed = math.sqrt(math.fsum(float(s) for s in squares))
            self._before = (float(torch.linalg.vector_norm(self._flat)), fixed)

    def ratio(self) -> float | None:
        """After the optimizer step: ``||theta_after - theta_before|| / ||theta_before||`` (the same on every rank
        of the group); None when nothing was captured since the last call."""
        if self._before is None:
            return None
        with torch.no_grad():
            for host, chunk in self._slices():
                host.sub_(chunk.to("cpu"))  # theta_before - theta_after, in float64
            diff = float(torch.linalg.vector_norm(self._flat))
        norms = [diff, *self._before]
        self._before = None
        if self.group is not None:
            mine = torch.tensor(norms, dtype=torch.float64, device=comm_device(self.group))
            every = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
            dist.all_gather(every, mine, group=self.group)
            rows = [t.tolist() for t in every]
        else:
            rows = [norms]
        # hypot of one value is that value exactly: in one process with every parameter trained, the quotient is
        # vector_norm(after - before) / vector_norm(before)
        diff_norm = _hypot([r[0] for r in rows])
        before_norm = _hypot([x for r in rows for x in r[1:]])
        return diff_norm / max(before_norm, 1e-30)


def _hypot(values: list[float]) -> float:
    return math.hypot(*[v for v in values if v != 0.0])
