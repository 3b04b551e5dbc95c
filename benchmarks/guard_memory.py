"""Host memory of the guard's rollback snapshot and of its update measurement (``update_ratio``), per rank, on 2
processes (gloo, CPU): DDP, DeepSpeed ZeRO-2 and ZeRO-3, beside the implementation this replaced.

    python benchmarks/guard_memory.py               # 8M parameters: DDP, ZeRO-2, ZeRO-3 (about a minute)
    python benchmarks/guard_memory.py --quick       # 2M parameters, DDP only (seconds)
    python benchmarks/guard_memory.py --markdown    # the table of benchmarks/guard_memory.md

Starts ``torchrun --nproc_per_node 2`` on this file. Each rank builds the same model (``--params`` fp32
parameters: square ``Linear`` layers of 1024), takes one AdamW step (the optimizer's state exists) and measures
each operation's *peak* extra resident memory: ``/proc/self/status`` ``VmHWM`` minus ``VmRSS`` before it, the
peak reset before each operation by writing ``5`` to ``/proc/self/clear_refs`` (Linux), and what it leaves
allocated (``RssAnon`` after minus before), with glibc's mmap threshold fixed at 64 KiB
(:func:`fixed_mmap_threshold`) and free heap memory trimmed before each operation, so that freed tensors leave the
resident set. Ratios are to the bytes of the model's parameters (``4 N``); each row is the larger of the two ranks.

- ``rlguard snapshot (DDP)``: :class:`rlguard.guards.actuation.snapshot.ModelSnapshot` over the world group, as
  ``TrainerActuator`` builds it under DDP: the first ``take`` allocates the rank's share of the buffers, the
  second overwrites them in place, ``restore`` broadcasts each tensor from its owner.
- ``rlguard snapshot (one rank keeps all)``: the same without a group (one process, or FSDP).
- ``rlguard snapshot on disk``: ``path=`` a safetensors file (what ``GuardConfig(snapshot_to_disk=True)`` does).
- ``before``: the implementation this replaced (``state_dict()`` of model and optimizer copied to the CPU at each
  snapshot; the new copy built while the old one is still held).
- ``rlguard update_ratio (DDP)``: :class:`rlguard.guards.actuation.update_meter.UpdateMeter` over the world group:
``capture``
  (the first allocates the host vector) and ``ratio`` after the weights moved. On this CPU run the parameters'
  device *is* the host, so the extra device memory of ``ratio`` is its whole peak here; on an accelerator the host
  vector is in host memory and the device holds at most one chunk in transit (``CHUNK`` elements).
- ``before update_ratio``: ``cat`` of the float64 weights before and after, and their difference.
- ``ZeRO-2`` / ``ZeRO-3``: ``engine.save_checkpoint`` of one tag (what ``ZeroActuator.snapshot`` does), its
  ``load_checkpoint``, and the bytes of this rank's files; ``ZeroActuator.snapshot_cost``'s prediction beside
  them. DeepSpeed's engine keeps its fp32 partitions and Adam's moments on the host here, so what is measured is
  what saving adds; on an accelerator ``torch.save`` also copies each tensor to the host, one at a time. A restore
  (``load_checkpoint``) reads this rank's optimizer partition file whole into host memory. There is no update
  measurement under DeepSpeed (``ZeroActuator`` does not declare ``update_ratio``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 1024


# ---------------------------------------------------------------- memory
def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmHWM:", "VmRSS:", "RssAnon:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def fixed_mmap_threshold() -> None:
    """Make every allocation over 64 KiB its own mapping, returned to the system when freed (glibc's ``mallopt``):
    glibc's default threshold grows after frees, and freed memory then stays resident and is reused unseen."""
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # M_MMAP_THRESHOLD


def _trim() -> None:
    """Give free heap memory back to the system (glibc's ``malloc_trim``), so that an allocation served from it
    shows in the resident set: memory an earlier computation freed stays resident in the heap otherwise."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_extra(fn: Callable[[], Any]) -> tuple[int, int]:
    """``(peak extra resident bytes while fn runs, allocated bytes it leaves behind)``: the peak from ``VmHWM``
    (the kernel keeps no peak of allocated memory alone), what is left from ``RssAnon``, which file pages the
    kernel drops from the resident set under memory pressure do not move."""
    gc.collect()
    _trim()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS
    before = _status()
    fn()
    gc.collect()
    after = _status()
    return after["VmHWM"] - before["VmRSS"], after["RssAnon"] - before["RssAnon"]


# ---------------------------------------------------------------- one rank
def build(params: int, seed: int = 0) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(seed)
    layers = max(params // (WIDTH * WIDTH + WIDTH), 1)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer


def one_step(model: Any, optimizer: Any, step: Callable[[Any], None] | None = None) -> None:
    import torch

    x = torch.randn(4, WIDTH)
    loss = model(x).pow(2).mean()
    if step is None:
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    else:
        step(loss)


def tensors(model: Any, optimizer: Any) -> list[Any]:
    """The weights and every optimizer state tensor, in order."""
    import torch

    state = [v for p in model.parameters() for v in optimizer.state[p].values() if isinstance(v, torch.Tensor)]
    return [*model.state_dict().values(), *state]


def plain(params: int, out: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from rlguard.guards.actuation.snapshot import ModelSnapshot
    from rlguard.guards.actuation.update_meter import UpdateMeter

    model, optimizer = build(params)
    one_step(model, optimizer)
    n = sum(p.numel() for p in model.parameters())
    out["params"], out["param_bytes"] = n, 4 * n
    group = dist.group.WORLD
    with tempfile.TemporaryDirectory() as tmp:
        for label, kwargs in (
            ("rlguard snapshot (DDP)", {"group": group}),
            ("rlguard snapshot (one rank keeps all)", {}),
            ("rlguard snapshot on disk (DDP)", {"group": group, "path": f"{tmp}/rank{dist.get_rank()}.safetensors"}),
        ):
            snap = ModelSnapshot(model, optimizer, **kwargs)  # type: ignore[arg-type]
            first = peak_extra(snap.take)
            second = peak_extra(snap.take)
            saved = [t.clone() for t in tensors(model, optimizer)]
            one_step(model, optimizer)  # the weights and the moments move on, then the rollback
            restore = peak_extra(snap.restore)
            exact = all(torch.equal(a, b) for a, b in zip(saved, tensors(model, optimizer), strict=True))
            del saved
            out[label] = {
                "first": first[0], "held": first[1], "again": second[0], "restore": restore[0], "exact": exact,
                "predicted": snap.cost().host_bytes,
                "disk": os.path.getsize(kwargs["path"]) if "path" in kwargs else 0,
            }  # fmt: skip
            del snap
            gc.collect()

        holder: dict[str, Any] = {}

        def old_take() -> None:  # the implementation this replaced
            def to_cpu(obj: Any) -> Any:
                if isinstance(obj, torch.Tensor):
                    return obj.detach().to("cpu", copy=True)
                if isinstance(obj, dict):
                    return {k: to_cpu(v) for k, v in obj.items()}
                if isinstance(obj, (list, tuple)):
                    return type(obj)(to_cpu(v) for v in obj)
                return obj

            holder["state"] = {"model": to_cpu(model.state_dict()), "optimizer": to_cpu(optimizer.state_dict())}

        first = peak_extra(old_take)
        second = peak_extra(old_take)
        out["before: state_dict copied to the CPU"] = {"first": first[0], "held": first[1], "again": second[0]}
        holder.clear()
        gc.collect()

    def nudge() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-3)

    meter = UpdateMeter(model, optimizer, group=group)
    capture = peak_extra(meter.capture)
    nudge()
    ratio_value: list[float] = []
    ratio = peak_extra(lambda m=meter: ratio_value.append(m.ratio() or 0.0))
    meter.capture()
    nudge()
    again = peak_extra(meter.ratio)
    out["rlguard update_ratio (DDP)"] = {
        "first": capture[0], "held": capture[1], "ratio": ratio[0], "again": again[0],
        "predicted": meter.host_bytes, "value": ratio_value[0],
    }  # fmt: skip
    del meter
    gc.collect()

    def old_ratio() -> None:
        with torch.no_grad():
            before = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
            nudge()
            after = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
            holder["ratio"] = float(torch.linalg.vector_norm(after - before) / torch.linalg.vector_norm(before))

    old = peak_extra(old_ratio)
    out["before: update_ratio of cat(float64 weights)"] = {"first": old[0], "held": old[1]}


def zero(params: int, stage: int, folder: Path, out: dict[str, Any]) -> None:
    import deepspeed
    import torch.distributed as dist

    from rlguard.adapters.trl.actuators import ZeroActuator

    model, _ = build(params)
    zero_config: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero_config.update({"stage3_param_persistence_threshold": 0, "reduce_bucket_size": 100_000})
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero_config,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    def step(loss: Any) -> None:
        engine.backward(loss)
        engine.step()

    one_step(engine, None, step)
    tag = "rlguard_snapshot"
    first = peak_extra(lambda: engine.save_checkpoint(str(folder), tag=tag, save_latest=False))
    again = peak_extra(lambda: engine.save_checkpoint(str(folder), tag=tag, save_latest=False))
    load = peak_extra(lambda: engine.load_checkpoint(str(folder), tag=tag, load_lr_scheduler_states=False))
    rank = dist.get_rank()
    # this rank's files: its ZeRO partition (zero_pp_rank_<rank>_*), and under ZeRO-1/2 on the first rank the
    # module's weights (mp_rank_00_model_states.pt)
    files = [p for p in (folder / tag).iterdir() if p.name.startswith(f"zero_pp_rank_{rank}_")]
    if rank == 0:
        files += [p for p in (folder / tag).iterdir() if p.name.startswith("mp_rank_00_model")]
    predicted = ZeroActuator.snapshot_cost(SimpleNamespace(engine=engine, folder=folder))  # type: ignore[arg-type]
    out[f"ZeRO-{stage} engine checkpoint"] = {
        "first": first[0], "held": first[1], "again": again[0], "restore": load[0],
        "disk": sum(p.stat().st_size for p in set(files)), "predicted": predicted.host_bytes,
        "predicted_disk": predicted.disk_bytes,
        "files": sorted(p.name for p in set(files)),
    }  # fmt: skip
    dist.barrier()


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    fixed_mmap_threshold()
    if args.zero:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank}
    plain(args.params, out)
    if args.zero:
        for stage in (2, 3):
            zero(args.params, stage, Path(args.out) / f"zero{stage}", out)
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- launcher
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(params: int, quick: bool, folder: Path) -> list[dict[str, Any]]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
        __file__, "--worker", "--params", str(params), "--out", str(folder),
    ]  # fmt: skip
    if quick:
        command.append("--quick")
    else:
        command.append("--zero")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def rows(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured thing, each quantity the larger of the two ranks, in bytes and as a ratio to ``4 N``:
    ``kept`` (held between steps), ``peak`` (while the next snapshot is taken, or while the update is measured:
    what is kept plus that operation's transient), ``restore``, ``predicted`` (host) and ``disk`` bytes."""
    base = ranks[0]["param_bytes"]
    out = []
    for label in ranks[0]:
        if not isinstance(ranks[0][label], dict):
            continue

        def worst(key: str, label: str = label) -> int | None:
            values = [r[label].get(key) for r in ranks]
            return None if values[0] is None else max(values)

        kept = worst("held") or 0
        if "ratio" in ranks[0][label]:  # the update measurement: the vector kept, plus ratio()'s transient
            peak = max(kept + (worst("ratio") or 0), kept + (worst("again") or 0))
        elif "again" in ranks[0][label]:  # a snapshot: the one kept, plus what taking the next one adds
            peak = max(kept + (worst("again") or 0), worst("first") or 0)
        else:  # the old update measurement keeps nothing between steps
            peak = worst("first") or 0
        row: dict[str, Any] = {"what": label, "kept": kept, "peak": peak}
        for key in ("restore", "predicted", "disk", "predicted_disk"):
            if worst(key) is not None:
                row[key] = worst(key)
        row.update({f"{k}_ratio": v / base for k, v in list(row.items()) if isinstance(v, int)})
        out.append(row)
    return out


COLUMNS = (
    ("kept", "kept between steps"),
    ("peak", "peak while taken / measured"),
    ("restore", "restore: transient"),
    ("predicted", "predicted host (snapshot_cost)"),
    ("disk", "disk"),
    ("predicted_disk", "predicted disk"),
)


def markdown(ranks: list[dict[str, Any]]) -> str:
    n = ranks[0]["params"]
    head = "| host memory per rank, x the parameters' bytes (4 N) | " + " | ".join(c for _, c in COLUMNS) + " |"
    lines = [f"N = {n:,} fp32 parameters ({4 * n / 2**20:.1f} MiB), AdamW, 2 processes; the larger rank.", "", head]
    lines.append("|---" * (len(COLUMNS) + 1) + "|")
    for row in rows(ranks):
        cells = [f"{row[f'{k}_ratio']:.3f}" if f"{k}_ratio" in row else "" for k, _ in COLUMNS]
        lines.append(f"| {row['what']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=None, help="parameters of the model (default 8M; --quick 2M)")
    parser.add_argument("--quick", action="store_true", help="2M parameters, DDP only")
    parser.add_argument("--markdown", action="store_true", help="print the Markdown table")
    parser.add_argument("--json", type=Path, default=None, help="write both ranks' measurements here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--zero", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.params is None:
        args.params = (2 if args.quick else 8) * (WIDTH * WIDTH + WIDTH)
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        ranks = launch(args.params, args.quick, Path(tmp))
    if args.json is not None:
        args.json.write_text(json.dumps(ranks, indent=1))
    print(markdown(ranks))


if __name__ == "__main__":
    main()
