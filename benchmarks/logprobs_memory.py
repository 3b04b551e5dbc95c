"""Peak memory and time of per-token log-probs + entropies, forward and backward: TRL's path on full logits
(``selective_log_softmax`` + ``entropy_from_logits``) against ``rlguard.core_losses.logprobs_from_hidden``.

    python benchmarks/logprobs_memory.py            # V in {32k, 152k}, T in {1k, 4k}, H = 1024 (minutes)
    python benchmarks/logprobs_memory.py --quick    # V = 32k, T = 256, H = 256

Each case runs in a fresh subprocess; "extra peak" is the growth of the peak RSS over the RSS after the inputs
(hidden states, LM head) were allocated. Times are for one forward+backward on this machine's CPU threads,
measured side by side in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from rich.console import Console
from rich.table import Table

CASE = r"""
import json, resource, sys, time
import torch
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[5]))
path, V, T, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hidden = torch.randn(1, T, H, requires_grad=True)
weight = (0.02 * torch.randn(V, H)).requires_grad_()
targets = torch.randint(0, V, (1, T))
from trl.trainer.utils import entropy_from_logits, selective_log_softmax
from rlguard.core_losses import logprobs_from_hidden
def rss():  # current resident set in bytes
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()
base = rss()
t0 = time.perf_counter()
if path == "trl":
    logits = hidden @ weight.T
    logps = selective_log_softmax(logits, targets)
    with torch.no_grad():
        ent = entropy_from_logits(logits)
else:
    logps, ent = logprobs_from_hidden(hidden, weight, targets)
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
    args = parser.parse_args()
    cases = [(32768, 256, 256)] if args.quick else [(v, t, 1024) for v in (32768, 151936) for t in (1024, 4096)]
    table = Table(title="log-probs + entropies, forward+backward, one sequence")
    for col in (
        "V",
        "T",
        "H",
        "TRL extra peak GB",
        "rlguard extra peak GB",
        "memory ratio",
        "TRL s",
        "rlguard s",
        "time ratio",
        "same result",
    ):
        table.add_column(col, justify="right")
    for v, t, h in cases:
        trl, ours = run("trl", v, t, h, args.threads), run("rlguard", v, t, h, args.threads)
        same = abs(trl["check"] - ours["check"]) <= 1e-3 * max(1.0, abs(trl["check"]))
        table.add_row(
            str(v),
            str(t),
            str(h),
            f"{trl['extra_peak_gb']:.3f}",
            f"{ours['extra_peak_gb']:.3f}",
            f"{ours['extra_peak_gb'] / max(trl['extra_peak_gb'], 1e-9):.2f}",
            f"{trl['seconds']:.2f}",
            f"{ours['seconds']:.2f}",
            f"{ours['seconds'] / max(trl['seconds'], 1e-9):.2f}",
            "yes" if same else "NO",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
