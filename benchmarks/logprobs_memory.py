"""Peak memory and time of the GRPO loss on per-token log-probs + entropies, forward and backward through the LM
head: TRL's path on full logits (``selective_log_softmax`` + ``entropy_from_logits``), TRL 1.16's fused LM head
kernel (``trl.kernels.ChunkedLogProbFunction``, what ``GRPOTrainer`` 1.16 uses),
``rlguard.core_losses.logprobs_from_hidden`` (chunked, recomputes the logits in backward) and
``rlguard.core_losses.objective_from_hidden`` (the objective fused into the LM-head pass), beside the floor: the
three LM-head matrix products (logits, hidden-state and weight gradients) in vocabulary tiles with nothing else.

    python benchmarks/logprobs_memory.py            # V in {32k, 152k}, T in {1k, 4k}, H = 1024 (many minutes)
    python benchmarks/logprobs_memory.py --quick    # V = 8k, T = 256, H = 64 (seconds; a smoke test)

Each case runs in a fresh subprocess; "extra peak" is the growth of the peak RSS over the RSS after the inputs
(hidden states, LM head, targets, old log-probs, advantages) were allocated. Times are for one forward+backward of
the same GRPO loss (the floor: its three products) on this machine's CPU threads, measured side by side in the
same run. The machine's load average is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

CASE = r"""
import json, resource, sys, time
import torch
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[5]))
path, V, T, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
chunk = int(sys.argv[6]) or None
from rlguard.core_losses import PolicyBatch, RolloutBatch, get_objective, logprobs_from_hidden, objective_from_hidden
grpo = get_objective("grpo")
def loss_of(logps, ent, batch):  # the same GRPO loss on every path
    return grpo(PolicyBatch(logprobs=logps, entropies=ent, advantages=batch.advantages, mask=batch.mask,
                            old_logprobs=batch.old_logprobs))
if path == "trl":
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax
    def compute(hidden, weight, targets, batch):
        logits = hidden @ weight.T
        logps = selective_log_softmax(logits, targets)
        with torch.no_grad():
            ent = entropy_from_logits(logits)
        return loss_of(logps, ent, batch)
elif path == "trl-fused":
    from trl.kernels import ChunkedLogProbFunction
    def compute(hidden, weight, targets, batch):
        logps, ent, *_ = ChunkedLogProbFunction.apply(
            hidden[0], weight, None, targets[0], 1.0, 32768, None, 1.0, ("log_probs", "entropy")
        )
        return loss_of(logps.unsqueeze(0), ent.unsqueeze(0), batch)
elif path == "rlguard":
    def compute(hidden, weight, targets, batch):
        return loss_of(*logprobs_from_hidden(hidden, weight, targets, chunk_size=chunk), batch)
elif path == "rlguard-fused":
    def compute(hidden, weight, targets, batch):
        return objective_from_hidden(grpo, hidden, weight, targets, batch, chunk_size=chunk)
else:  # the floor: logits, hidden-state and weight gradients in vocabulary tiles, nothing else
    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight):
            ctx.save_for_backward(hidden, weight)
            return hidden.new_zeros(())
        @staticmethod
        def backward(ctx, grad):
            hidden, weight = ctx.saved_tensors
            h = hidden[0]
            tile = max(1, (1 << 25) // h.shape[0])
            gh, gw = torch.zeros_like(h), torch.empty_like(weight)
            for v0 in range(0, weight.shape[0], tile):
                w = weight[v0 : v0 + tile]
                z = h @ w.T  # (T, v)
                gh.addmm_(z, w)
                torch.mm(z.T, h, out=gw[v0 : v0 + tile])
            return gh.unsqueeze(0), gw
    class Out:
        def __init__(self, loss):
            self.loss, self.metrics = loss, {"entropy": loss.detach()}
    def compute(hidden, weight, targets, batch):
        return Out(Floor.apply(hidden, weight))
def run(t, v, h):
    hidden = torch.randn(1, t, h, requires_grad=True)
    weight = (0.02 * torch.randn(v, h)).requires_grad_()
    targets = torch.randint(0, v, (1, t))
    old = torch.full((1, t), -torch.log(torch.tensor(float(v)))) + 0.1 * torch.randn(1, t)
    return hidden, weight, targets, RolloutBatch(advantages=torch.randn(1), mask=torch.ones(1, t), old_logprobs=old)
# warm-up on tiny inputs: one-time costs (lazy imports, first-call set-up) are not part of the measure
for _ in range(2):
    out = compute(*run(8, 64, 16))
    out.loss.backward()
inputs = run(T, V, H)
def rss():  # current resident set in bytes
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()
base = rss()
t0, c0 = time.perf_counter(), time.process_time()
out = compute(*inputs)
out.loss.backward()
seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
check = [float(out.loss.detach()), float(out.metrics["entropy"])]
print(json.dumps({"extra_peak_gb": (peak - base) / 2**30, "seconds": seconds, "cpu_seconds": cpu_seconds,
                  "check": check}))
"""

PATHS = {
    "trl": "TRL full",
    "trl-fused": "TRL fused",
    "rlguard": "rlguard",
    "rlguard-fused": "rlguard fused",
    "floor": "floor",
}
KEYS = {
    "trl": "trl_full",
    "trl-fused": "trl_fused",
    "rlguard": "rlguard",
    "rlguard-fused": "rlguard_fused",
    "floor": "floor",
}


def run(path: str, v: int, t: int, h: int, threads: int, chunk: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CASE, path, str(v), str(t), str(h), str(threads), str(chunk)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{path} V={v} T={t}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small case, for CI")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32768, 151936], help="vocabulary sizes V")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096], help="sequence lengths T")
    parser.add_argument("--chunk-size", type=int, default=0, help="rows per chunk of the rlguard paths (0: default)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    cases = [(8192, 256, 64)] if args.quick else [(v, t, 1024) for v in args.vocab for t in args.tokens]
    table = Table(
        title="GRPO loss on log-probs + entropies, forward+backward through the LM head, one sequence: extra peak "
        "RSS (GB) and wall seconds; ratios to TRL's full logits (cpu: process CPU time, steadier on a loaded machine)"
    )
    for col in (
        "V",
        "T",
        *(f"{name} GB" for name in PATHS.values()),
        *(f"{name} s" for name in PATHS.values()),
        "fused/full mem",
        "fused/full time",
        "fused/full cpu",
        "floor/full time",
        "fused/floor time",
        "same result",
    ):
        table.add_column(col, justify="right")
    rows = []
    for v, t, h in cases:
        res = {path: run(path, v, t, h, args.threads, args.chunk_size) for path in PATHS}
        ours = res["rlguard-fused"]["check"]
        same = all(
            math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-3)
            for path in ("trl", "trl-fused", "rlguard")
            for a, b in zip(res[path]["check"], ours, strict=True)
        )
        row: dict[str, Any] = {"V": v, "T": t, "H": h}
        for path, key in KEYS.items():
            row[f"{key}_gb"], row[f"{key}_s"] = res[path]["extra_peak_gb"], res[path]["seconds"]
            row[f"{key}_cpu_s"] = res[path]["cpu_seconds"]
        full_gb, full_s = max(row["trl_full_gb"], 1e-9), max(row["trl_full_s"], 1e-9)
        row.update(
            mem_ratio_full=row["rlguard_gb"] / full_gb,
            time_ratio_full=row["rlguard_s"] / full_s,
            fused_mem_ratio_full=row["rlguard_fused_gb"] / full_gb,
            fused_time_ratio_full=row["rlguard_fused_s"] / full_s,
            fused_cpu_ratio_full=row["rlguard_fused_cpu_s"] / max(row["trl_full_cpu_s"], 1e-9),
            floor_time_ratio_full=row["floor_s"] / full_s,
            fused_time_ratio_floor=row["rlguard_fused_s"] / max(row["floor_s"], 1e-9),
            same_result=same,
            load_average=os.getloadavg(),
        )
        rows.append(row)
        table.add_row(
            str(v),
            str(t),
            *(f"{row[key + '_gb']:.3f}" for key in KEYS.values()),
            *(f"{row[key + '_s']:.2f}" for key in KEYS.values()),
            *(f"{row[k]:.2f}" for k in ("fused_mem_ratio_full", "fused_time_ratio_full", "fused_cpu_ratio_full")),
            f"{row['floor_time_ratio_full']:.2f}",
            f"{row['fused_time_ratio_floor']:.2f}",
            "yes" if same else "NO",
        )
    Console(width=240).print(table)
    print(f"H = {cases[0][2]}; threads = {args.threads}; load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
