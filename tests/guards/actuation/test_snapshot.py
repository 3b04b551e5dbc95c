"""Rollback snapshots with a known, bounded cost (``rlguard.guards.actuation.snapshot``) and the update measurement's
memory (``rlguard.guards.actuation.update_meter``): restores are exact and repeatable, a snapshot is rebuilt in place,
spills to a safetensors file, costs what ``snapshot_cost`` says, is refused over its budget, and the host memory
measured while they run stays within the stated bounds (``benchmarks/guard_memory.md``)."""

from __future__ import annotations

import gc
import logging
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from rlguard.guards.actuation import SnapshotBudgetError, SnapshotCost, TorchActuator, check_snapshot_budget
from rlguard.guards.actuation.snapshot import ModelSnapshot, owners, snapshot_cost
from rlguard.guards.actuation.update_meter import CHUNK, UpdateMeter

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from guard_memory import fixed_mmap_threshold, peak_extra  # the benchmark's measurement, one copy


def model_and_adamw(width: int = 64, layers: int = 3, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    first = next(model.parameters())
    loss = model(torch.randn(8, first.shape[1], generator=g)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every weight and every optimizer state tensor, copied."""
    out = {f"w.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, p in enumerate(optimizer.param_groups[0]["params"]):
        out.update({f"s{i}.{k}": v.clone() for k, v in optimizer.state[p].items() if isinstance(v, torch.Tensor)})
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("on_disk", [False, True], ids=["host", "disk"])
def test_a_second_rollback_to_one_snapshot_restores_it_again(tmp_path: Path, on_disk: bool) -> None:
    """The restored optimizer state must not alias the snapshot (else the steps after the first rollback change the
    snapshot, and the second rollback restores their moments)."""
    model, optimizer = model_and_adamw()
    train_step(model, optimizer, 0)
    path = str(tmp_path / "rank0.safetensors") if on_disk else None
    actuator = TorchActuator(model, optimizer, snapshot_path=path)
    actuator.snapshot(1)
    saved = state(model, optimizer)
    for seed in (1, 2):
        train_step(model, optimizer, seed)
        assert not same(state(model, optimizer), saved)
        assert actuator.restore()
        assert same(state(model, optimizer), saved), seed  # bit for bit, both times
        train_step(model, optimizer, 10 + seed)  # steps after the rollback, as training goes on
    if on_disk:
        with safe_open(path, framework="pt") as fh:  # a safetensors file the library reads
            assert len(list(fh.keys())) == len(saved)


def test_a_snapshot_is_rebuilt_in_place_and_holds_the_latest_values() -> None:
    model, optimizer = model_and_adamw()
    train_step(model, optimizer, 0)
    snap = ModelSnapshot(model, optimizer)
    snap.take()
    buffers = {k: v.data_ptr() for k, v in snap._buffers.items()}
    train_step(model, optimizer, 1)
    latest = state(model, optimizer)
    snap.take()
    assert {k: v.data_ptr() for k, v in snap._buffers.items()} == buffers  # the same host buffers, overwritten
    train_step(model, optimizer, 2)
    assert snap.restore() and same(state(model, optimizer), latest)


def test_snapshot_cost_is_the_tensors_bytes_and_is_predicted_before_the_first_step() -> None:
    model, optimizer = model_and_adamw(width=32, layers=2)
    n = sum(p.numel() for p in model.parameters())
    before = snapshot_cost(model, optimizer)
    assert before.estimated and before.host_bytes == 12 * n and before.model_bytes == 4 * n  # fp32 + AdamW's 2
    train_step(model, optimizer, 0)
    after = snapshot_cost(model, optimizer)
    steps = sum(
        optimizer.state[p]["step"].numel() * optimizer.state[p]["step"].element_size() for p in model.parameters()
    )
    assert not after.estimated and after.host_bytes == 12 * n + steps
    snap = ModelSnapshot(model, optimizer)
    snap.take()
    assert sum(b.numel() * b.element_size() for b in snap._buffers.values()) == after.host_bytes


def test_owners_split_the_bytes_with_at_most_one_item_over_the_share() -> None:
    sizes = [4096, 64, 4096, 64, 1000, 4096, 64, 7]
    for ranks in (1, 2, 3, 4):
        owner = owners(sizes, ranks)
        loads = [sum(s for s, o in zip(sizes, owner, strict=True) if o == r) for r in range(ranks)]
        assert sum(loads) == sum(sizes) and max(loads) <= sum(sizes) / ranks + max(sizes), (ranks, loads)
        assert owner == owners(sizes, ranks)  # the same on every rank
    model, optimizer = model_and_adamw(width=64, layers=4)
    train_step(model, optimizer, 0)
    whole = snapshot_cost(model, optimizer).host_bytes
    tensors = [t.numel() * t.element_size() for t in model.state_dict().values()]
    owner = owners(tensors, 2)
    shares = [snapshot_cost(model, optimizer, owned=lambda u, r=r: owner[u] == r).host_bytes for r in (0, 1)]
    assert sum(shares) == whole and max(shares) <= whole / 2 + 3 * max(tensors) + 64  # a tensor and its moments


def test_a_snapshot_over_its_budget_is_refused_with_the_fixes(caplog: pytest.LogCaptureFixture) -> None:
    cost = SnapshotCost(host_bytes=2**50, disk_bytes=0, model_bytes=2**48)
    with pytest.raises(SnapshotBudgetError, match=r"takes 1\.05e\+06 GiB .*4x the model.*snapshot_to_disk=True"):
        check_snapshot_budget(cost, 0.5, where="the test loop")
    with caplog.at_level(logging.INFO, logger="rlguard.snapshot"):
        check_snapshot_budget(SnapshotCost(1024, 0, 256), 0.5, where="the test loop")
    assert "4x the model" in caplog.text and "budget" in caplog.text


def test_the_guard_refuses_at_start_up_a_snapshot_over_its_budget() -> None:
    from rlguard.guards import Guard, GuardConfig
    from rlguard.guards.actuation import bind_guard

    model, optimizer = model_and_adamw()
    guard = Guard(GuardConfig(snapshot_budget=1e-12))
    with pytest.raises(SnapshotBudgetError, match="over its budget"):
        bind_guard(guard, TorchActuator(model, optimizer), where="a test loop")
    bind_guard(Guard(GuardConfig(snapshot_budget=1e-12, observe_only=True)), TorchActuator(model, optimizer), where="x")


def test_update_meter_is_the_float64_formula_with_frozen_parameters_in_the_norm() -> None:
    model, _ = model_and_adamw(width=48, layers=3)
    frozen = list(model.parameters())[:2]
    optimizer = torch.optim.SGD([p for p in model.parameters() if all(p is not f for f in frozen)], lr=0.5)
    before = [p.detach().double().numpy().copy() for p in model.parameters()]
    meter = UpdateMeter(model, optimizer)
    meter.capture()
    model(torch.randn(4, 48)).pow(2).mean().backward()
    optimizer.step()
    after = [p.detach().double().numpy() for p in model.parameters()]
    # an independent reference: the formula over every parameter, in float64 with math.fsum
    diff = math.sqrt(math.fsum(float(((a - b) ** 2).sum()) for a, b in zip(after, before, strict=True)))
    base = math.sqrt(math.fsum(float((b**2).sum()) for b in before))
    assert meter.ratio() == pytest.approx(diff / base, rel=1e-12) and diff > 0
    assert meter.host_bytes == 8 * sum(p.numel() for p in optimizer.param_groups[0]["params"])


# -- memory, measured: the bounds the benchmark reports --------------------------------------------------------
needs_proc = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="peak resident memory is read from Linux's /proc"
)
MiB = 2**20
SLACK = 2 * MiB  # the allocator's and the interpreter's own movements


@pytest.fixture
def big() -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    """4 x 1024^2 fp32 weights (16 MiB): the 24 N bytes of the old update measurement are 100 MiB."""
    fixed_mmap_threshold()  # freed tensors leave the resident set (kept for the rest of this process: harmless)
    model, optimizer = model_and_adamw(width=1024, layers=4)
    train_step(model, optimizer, 0)
    gc.collect()
    return model, optimizer, sum(p.numel() for p in model.parameters())


@needs_proc
def test_a_snapshot_holds_its_cost_and_taking_the_next_adds_nothing(big: Any) -> None:
    model, optimizer, _ = big
    snap = ModelSnapshot(model, optimizer)
    cost = snap.cost().host_bytes
    first, kept = peak_extra(snap.take)
    again, _ = peak_extra(snap.take)  # the replaced implementation held both copies: +12 N here
    assert first <= cost + SLACK and kept >= cost - SLACK, (first, kept, cost)
    assert again <= SLACK, again
    restore, _ = peak_extra(snap.restore)  # copied back in place
    assert restore <= SLACK, restore
    del snap


@needs_proc
def test_a_snapshot_on_disk_keeps_at_most_one_tensor_in_host_memory(big: Any, tmp_path: Path) -> None:
    model, optimizer, _ = big
    snap = ModelSnapshot(model, optimizer, path=str(tmp_path / "rank0.safetensors"))
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    for _ in range(2):
        first, kept = peak_extra(snap.take)
        assert first <= largest + SLACK and kept <= SLACK, (first, kept)


@needs_proc
def test_the_update_measurement_holds_one_float64_vector_and_a_chunk(big: Any) -> None:
    model, optimizer, n = big
    meter = UpdateMeter(model, optimizer)
    first, kept = peak_extra(meter.capture)
    assert abs(kept - 8 * n) <= SLACK and first <= 8 * n + SLACK, (first, kept, 8 * n)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3)
    ratio, _ = peak_extra(meter.ratio)  # the replaced implementation: two more float64 copies (+16 N)
    assert ratio <= 8 * CHUNK + SLACK, ratio
    again, _ = peak_extra(meter.capture)  # the vector is reused
    assert again <= SLACK, again
