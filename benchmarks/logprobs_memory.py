"""Peak memory and time of per-token log-probs + entropies, forward and backward: TRL's path on full logits
(``selective_log_softmax`` + ``entropy_from_logits``) and TRL 1.16's fused LM head kernel
(``trl.kernels.ChunkedLogProbFunction``, what ``GRPOTrainer`` 1.16 uses) against
``rlguard.core_losses.logprobs_from_hidden``.

    python benchmarks/logprobs_memory.py            # V in {32k, 152k}, T in {1k, 4k}, H = 1024 (minutes)
    python benchmarks/logprobs_memory.py --quick    # V = 8k, T = 256, H = 64 (seconds; a smoke test)

Each case runs in a fresh subprocess; "extra peak" is the growth of the peak RSS over the RSS after the inputs
(hidden states, LM head) were allocated. Times are for one forward+backward on this machine's CPU threads,
measured side by side in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

CASE = r"""
import json, resource, sys, time
import torch
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[5]))
path, V, T, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if path == "trl":
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax
    def compute(hidden, weight, targets):
        logits = hidden @ weight.T
        logps = selective_log_softmax(logits, targets)
        with torch.no_grad():
            ent = entropy_from_logits(logits)
        return logps, ent
elif path == "trl-fused":
    from trl.kernels import ChunkedLogProbFunction
    def compute(hidden, weight, targets):
        logps, ent, *_ = ChunkedLogProbFunction.apply(
            hidden[0], weight, None, targets[0], 1.0, 32768, None, 1.0, ("log_probs", "entropy")
        )
        return logps, ent
else:
    from rlguard.core_losses import logprobs_from_hidden
    compute = logprobs_from_hidden
def run(t, v, h):
    hidden = torch.randn(1, t, h, requires_grad=True)
    weight = (0.02 * torch.randn(v, h)).requires_grad_()
    targets = torch.randint(0, v, (1, t))
    return hidden, weight, targets
# warm-up on tiny inputs: one-time costs (lazy imports, first-call set-up) are not part of the measure
for _ in range(2):
    h, w, y = run(8, 64, 16)
    lp, ent = compute(h, w, y)
    lp.sum().backward()
hidden, weight, targets = run(T, V, H)
def rss():  # current resident set in bytes
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()
base = rss()
t0 = time.perf_counter()
logps, ent = compute(hidden, weight, targets)
logps.sum().backward()
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
check = float(logps.detach().sum()) + float(ent.sum())
print(json.dumps({"extra_peak_gb": (peak - base) / 2**30, "seconds": seconds, "check": check}))
"""


def run(path: str, v: int, t: int, h: int, threads: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", CASE, path, str(v), str(t), str(h), str(threads)],
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
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    cases = [(8192, 256, 64)] if args.quick else [(v, t, 1024) for v in args.vocab for t in args.tokens]
    table = Table(
        title="log-probs + entropies, forward+backward, one sequence: extra peak RSS (GB) and seconds; "
        "ratios are rlguard / TRL full logits and rlguard / TRL fused head"
    )
    for col in (
        "V",
        "T",
        "H",
        "TRL full GB",
        "TRL fused GB",
        "rlguard GB",
        "mem ratio full",
        "mem ratio fused",
        "TRL full s",
        "TRL fused s",
        "rlguard s",
        "time ratio full",
        "time ratio fused",
        "same result",
    ):
        table.add_column(col, justify="right")
    rows = []
    for v, t, h in cases:
        full, fused, ours = (run(path, v, t, h, args.threads) for path in ("trl", "trl-fused", "rlguard"))
        same = all(abs(x["check"] - ours["check"]) <= 1e-3 * max(1.0, abs(x["check"])) for x in (full, fused))
        row = {
            "V": v,
            "T": t,
            "H": h,
            "trl_full_gb": full["extra_peak_gb"],
            "trl_fused_gb": fused["extra_peak_gb"],
            "rlguard_gb": ours["extra_peak_gb"],
            "mem_ratio_full": ours["extra_peak_gb"] / max(full["extra_peak_gb"], 1e-9),
            "mem_ratio_fused": ours["extra_peak_gb"] / max(fused["extra_peak_gb"], 1e-9),
            "trl_full_s": full["seconds"],
            "trl_fused_s": fused["seconds"],
            "rlguard_s": ours["seconds"],
            "time_ratio_full": ours["seconds"] / max(full["seconds"], 1e-9),
            "time_ratio_fused": ours["seconds"] / max(fused["seconds"], 1e-9),
            "same_result": same,
        }
        rows.append(row)
        table.add_row(
            *(str(row[k]) for k in ("V", "T", "H")),
            *(f"{row[k]:.3f}" for k in ("trl_full_gb", "trl_fused_gb", "rlguard_gb")),
            *(f"{row[k]:.2f}" for k in ("mem_ratio_full", "mem_ratio_fused", "trl_full_s", "trl_fused_s")),
            *(f"{row[k]:.2f}" for k in ("rlguard_s", "time_ratio_full", "time_ratio_fused")),
            "yes" if same else "NO",
        )
    Console(width=200).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
