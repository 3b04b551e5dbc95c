"""rlguard doctor against rldoctor 0.2.0 on 22 real training logs from public repositories, in sample and leave
one repository out.

    python benchmarks/doctor_real_logs.py                    # the tables (rldoctor's column if it is installed)
    python benchmarks/doctor_real_logs.py --markdown         # the same rows as Markdown tables
    python benchmarks/doctor_real_logs.py --out benchmarks/doctor_real_logs.md   # write them there
    python benchmarks/doctor_real_logs.py --logs DIR         # default: $RLGUARD_REAL_LOGS or ../shared/doctor_foreign

The logs are read where they are (``../shared/doctor_foreign``, sources in its README); they are not copied into
the repository. Each run's verdict below was judged from its source and its numbers. Criteria: no critical finding
on a run that trained well; each collapse caught at critical within 15 logged steps of its onset. Every log is
read as the doctor reads it by default (keys that match exactly one canonical stat mapped automatically).

Generalisation: the one setting of the doctor chosen from these logs is the absolute bound on the KL to the
reference (:func:`calibrate_kl`: 4x the largest 95th percentile of KL over the healthy logs, warning at half).
The leave-one-repository-out table chooses it without the held-out repository's logs (grouped by source
repository, :data:`REPOSITORIES`) and reports the verdicts on that repository; every other bound comes from a
principle or a published source (docs/guides/doctor.md) and is the same in both tables.
rldoctor (``pip install rldoctor==0.2.0``) is optional: without it its column reads "not installed".
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def default_logs() -> Path:
    """``$RLGUARD_REAL_LOGS``, else the first ``shared/doctor_foreign`` beside the checkout or an ancestor of it
    (``../shared`` from the main checkout, ``../../shared`` from a worktree under ``wt/``)."""
    if env := os.environ.get("RLGUARD_REAL_LOGS"):
        return Path(env)
    for folder in ROOT.parents:
        if (folder / "shared" / "doctor_foreign").is_dir():
            return folder / "shared" / "doctor_foreign"
    return ROOT.parent / "shared" / "doctor_foreign"


DEFAULT_LOGS = default_logs()
#: logged steps after the onset within which a collapse must be critical
WITHIN = 15


@dataclass(frozen=True)
class Verdict:
    """What a run did, judged from its source and its numbers.

    Attributes:
        kind: ``healthy`` (trained well: no critical finding allowed), ``collapse`` (must be critical within
            ``WITHIN`` logged steps of ``onset``) or ``unclear`` (did not improve, no collapse to time: reported only).
        onset: the first logged step of the collapse (collapse only).
        why: the evidence, in the run's own numbers.
        key_map: ``--map`` entries for a log with its own column names (what the doctor's suggestions propose).
        run: ``--run``: the run judged of a file that holds several (the doctor refuses to merge them), or None.
    """

    kind: str
    why: str
    onset: int | None = None
    key_map: tuple[tuple[str, str], ...] = ()
    run: str | None = None


#: the rasbt CSVs' own column names: each matches exactly one canonical stat, so the doctor maps them itself
RASBT_MAP = (
    ("reward_avg", "reward_mean"),
    ("entropy_avg", "entropy"),
    ("avg_response_len", "length_mean"),
    ("kl_loss", "kl_ref"),
    ("policy_ratio", "ratio_mean"),
)

VERDICTS: dict[str, Verdict] = {
    "verl-ppo-qwen05b-gsm8k-r512.verl.jsonl": Verdict(
        "healthy", "verl's PPO baseline, GSM8K 0.567; score 0.01 -> 0.71"
    ),
    "verl-ppo-qwen05b-gsm8k-r256.verl.jsonl": Verdict(
        "healthy", "verl's PPO baseline, GSM8K 0.538; score 0.00 -> 0.72"
    ),
    "verl-ppo-gemma2-2b-gsm8k.verl.jsonl": Verdict("healthy", "verl's PPO baseline, GSM8K 0.640; score 0.42 -> 0.68"),
    "verl-ppo-tutorial-qwen05b.verl.jsonl": Verdict("healthy", "verl getting-started notebook; score 0.01 -> 0.62"),
    "dstack-ppo-qwen7b-rm.verl.jsonl": Verdict(
        "healthy", "reward-model PPO at a plateau: score 0.93-0.96, GSM8K 0.90 -> 0.87"
    ),
    "gemma3-1b-gsm8k.trainer_state.json": Verdict("healthy", "GRPO on GSM8K, reward 0.43 -> 1.51"),
    "hotpotqa-grpo-v3.trainer_state.json": Verdict("healthy", "GRPO agent, reward 0.72 -> 0.78, KL steady"),
    "unsloth-llama31-8b-gsm8k.trainer_state.json": Verdict("healthy", "Unsloth GRPO, reward 0 -> 1.3-2.5"),
    "opd-qwen3-4b-ry3hgbx5.verl.jsonl": Verdict(
        "healthy", "on-policy distillation, score -0.28 -> +0.06, length steady"
    ),
    "rasbt-7_4-clip-ratio.csv": Verdict("healthy", "book ch. 7 clipped GRPO: eval 15.6 -> 45.6, holds 41.6"),
    "opd-qwen3-4b-gjvwlq13.verl.jsonl": Verdict(
        "collapse", "length 578 -> 10 tokens, grad norm 0.9 -> 15, KL 0.5 -> 2, score -0.6 -> -0.9", onset=33
    ),
    "opd-qwen3-4b-i80f2v90.verl.jsonl": Verdict(
        "collapse", "from step 3: length 1759 -> 1 token, score -0.68 -> -1, entropy 0.0002, KL 17", onset=3
    ),
    "opd-qwen3-4b-yeu8r64c.verl.jsonl": Verdict(
        "collapse", "length runaway 934 -> 4500, truncation 0 -> 36%, score -0.60 -> -0.89", onset=14
    ),
    "website-sanitizer-grpo.trainer_state.json": Verdict(
        "collapse", "broken at the first log: KL 10,833, grad norm 4e5, 98% truncated, reward 0 after", onset=10
    ),
    "finance-poison-sparse.trainer_state.json": Verdict(
        "collapse", "no learning signal from the start: 100% zero-variance groups, reward 0", onset=1
    ),
    "rasbt-7_5-kl.csv": Verdict(
        "collapse", "entropy 1 -> 11.9 nats (uniform), KL 25, reward 0; eval 40.8 -> 0", onset=57
    ),
    # the file holds two runs: 5 steps of a run of 300 (total_steps 300), then the run of 500 judged here
    "rasbt-7_3-tracking.csv": Verdict(
        "collapse",
        "entropy 0.5 -> 10.7 nats, reward -> 0 from 257; eval 44.2 -> 37 -> 33",
        onset=246,
        run="2",
    ),
    "rasbt-ch06-grpo-nokl.csv": Verdict(
        "collapse", "the 7_3 run without entropy: reward -> 0, lengths at the 1024 cap", onset=246
    ),
    "rasbt-7_6-format-conditional.csv": Verdict(
        "collapse", "entropy 0.9 -> 4.3 nats, reward 1.4 -> 0; eval 56.2 -> 25.8", onset=158
    ),
    "rasbt-7_6-format-reward.csv": Verdict("collapse", "entropy 1 -> 4.4 nats; eval 45.8 -> 32.2 -> 9.4", onset=158),
    "chaos-economy-multiagent.trainer_state.json": Verdict(
        "unclear", "90-100% truncated throughout, reward -0.5..1.2 without trend"
    ),
    "azr-selfplay-gradnorm0.trainer_state.json": Verdict(
        "unclear", "grad norm logged 0 at every step, reward 0.39-0.79 without trend"
    ),
}


#: log -> the public repository it comes from (../shared/doctor_foreign/README.md): the unit held out
REPOSITORIES: dict[str, str] = {
    "verl-ppo-qwen05b-gsm8k-r512.verl.jsonl": "eric-haibin-lin/verl-data",
    "verl-ppo-qwen05b-gsm8k-r256.verl.jsonl": "eric-haibin-lin/verl-data",
    "verl-ppo-gemma2-2b-gsm8k.verl.jsonl": "eric-haibin-lin/verl-data",
    "verl-ppo-tutorial-qwen05b.verl.jsonl": "volcengine/verl",
    "opd-qwen3-4b-i80f2v90.verl.jsonl": "jianghoucheng/Agent_On_Policy_Distillation",
    "opd-qwen3-4b-gjvwlq13.verl.jsonl": "jianghoucheng/Agent_On_Policy_Distillation",
    "opd-qwen3-4b-yeu8r64c.verl.jsonl": "jianghoucheng/Agent_On_Policy_Distillation",
    "opd-qwen3-4b-ry3hgbx5.verl.jsonl": "jianghoucheng/Agent_On_Policy_Distillation",
    "dstack-ppo-qwen7b-rm.verl.jsonl": "Bihan/dstack-configs",
    "unsloth-llama31-8b-gsm8k.trainer_state.json": "IMJONEZZ/UnslothGRPO",
    "gemma3-1b-gsm8k.trainer_state.json": "abdo-ashraf/Gemma-3-RL-Finetuning",
    "azr-selfplay-gradnorm0.trainer_state.json": "justdtip/self-directed-training",
    "finance-poison-sparse.trainer_state.json": "aaravarora01/agent-memory-redteam",
    "chaos-economy-multiagent.trainer_state.json": "Rusheel86/Chaos-Economy",
    "website-sanitizer-grpo.trainer_state.json": "koivualeksi/website-sanitizer",
    "hotpotqa-grpo-v3.trainer_state.json": "Ning-Guo/hotpotqa-agent",
    **{name: "rasbt/reasoning-from-scratch" for name in VERDICTS if name.startswith("rasbt-")},
}
#: the KL bound (critical) is this multiple of the largest 95th percentile of KL over the healthy logs
KL_MARGIN = 4.0


def calibrate_kl(logs: Path, names: list[str]) -> float | None:
    """The critical absolute bound on KL to the reference chosen from the healthy logs among ``names``: KL_MARGIN x
    the largest 95th percentile of their ``kl_ref`` (None if none logs it)."""
    import statistics

    from rlguard.doctor.keys import canonical_stats, classify_keys
    from rlguard.doctor.readers import read_log

    peaks = []
    for name in names:
        if VERDICTS[name].kind != "healthy":
            continue
        log = read_log(logs / name, run=VERDICTS[name].run)
        key_map = classify_keys(log.keys).key_map
        kl = sorted(
            v for _, raw in log.rows if math.isfinite(v := canonical_stats(raw, key_map).get("kl_ref", math.nan))
        )
        if len(kl) >= 2:
            peaks.append(statistics.quantiles(kl, n=20, method="inclusive")[-1])
    return KL_MARGIN * max(peaks) if peaks else None


def kl_config(critical: float | None) -> Any:
    """The doctor's ``monitor`` guard with the KL bound ``critical`` (warning at half); the default if None."""
    from rlguard.guards import GuardConfig

    if critical is None:
        return GuardConfig.preset("monitor")
    bounds = {"critical_above": critical, "warn_above": critical / 2}
    return GuardConfig.preset("monitor", detectors={"kl_ref_blowup": bounds})


@dataclass(frozen=True)
class Row:
    """One log's result."""

    log: str
    verdict: Verdict
    steps: int
    findings: list[tuple[str, str, int]]  # (detector, severity, step it reached that severity), most severe first
    critical_steps: list[int]  # steps of the critical events (after the doctor's consequence rule)
    exit_code: int
    rldoctor: str
    rldoctor_critical: bool | None
    ok: bool | None  # met the criterion of its verdict (None for unclear)
    delay: int | None  # logged steps from onset to the first critical event at or after it


def run_rlguard(path: Path, verdict: Verdict, config: Any = None) -> tuple[Any, list[int]]:
    """The doctor's diagnosis (its defaults, or the guard ``config``) and the steps of its critical events."""
    from rlguard.doctor import diagnose

    d = diagnose(path, config=config, key_map=dict(verdict.key_map) or None, run=verdict.run)
    critical = sorted({e.step for e in d.events if e.severity == "critical" and not e.detector.startswith("action:")})
    return d, critical


def run_rldoctor(path: Path) -> tuple[str, bool | None]:
    """rldoctor 0.2.0's warning and critical findings, or why it did not run."""
    try:
        import rl_doctor
    except ImportError:
        return "not installed", None
    try:
        diagnosis = rl_doctor.diagnose(rl_doctor.load_run(str(path)))
    except Exception as err:
        return f"error: {type(err).__name__}", None
    shown = [f for f in diagnosis.findings if f.severity >= rl_doctor.Severity.WARNING]
    text = ", ".join(f"{f.detector} ({f.severity.name.lower()})" for f in shown) or "no finding"
    return text, any(f.severity >= rl_doctor.Severity.CRITICAL for f in shown)


def judge(verdict: Verdict, steps: list[int], critical_steps: list[int]) -> tuple[bool | None, int | None]:
    """Whether the criterion of the verdict holds, and the delay in logged steps (collapses)."""
    if verdict.kind == "healthy":
        return not critical_steps, None
    if verdict.kind != "collapse" or verdict.onset is None:
        return None, None
    after = [s for s in critical_steps if s >= verdict.onset]
    if not after:
        return False, None
    delay = sum(1 for s in steps if verdict.onset <= s < after[0])
    return delay <= WITHIN, delay


def rldoctor_ok(verdict: Verdict, critical: bool | None) -> bool | None:
    """rldoctor has no onset step: healthy -> no critical; collapse -> any critical (a lenient reading)."""
    if critical is None or verdict.kind == "unclear":
        return None
    return not critical if verdict.kind == "healthy" else critical


def collect(logs: Path, held_out: str | None = None, rldoctor: bool = True) -> list[Row]:
    """One row per log named in :data:`VERDICTS` (in that order), judged with the doctor's defaults; with
    ``held_out`` (a repository), only that repository's logs, judged with the KL bound calibrated without them."""
    names = [n for n in VERDICTS if held_out is None or REPOSITORIES[n] == held_out]
    config = None
    if held_out is not None:
        config = kl_config(calibrate_kl(logs, [n for n in VERDICTS if REPOSITORIES[n] != held_out]))
    rows = []
    for name in names:
        verdict, path = VERDICTS[name], logs / name
        d, critical = run_rlguard(path, verdict, config)
        ok, delay = judge(verdict, d.steps, critical)
        findings = [(f.detector, f.severity, f.severity_step) for f in d.findings]
        text, rl_critical = run_rldoctor(path) if rldoctor else ("-", None)
        rows.append(Row(name, verdict, len(d.steps), findings, critical, d.exit_code, text, rl_critical, ok, delay))
    return rows


def leave_one_repository_out(logs: Path) -> list[tuple[str, float | None, list[Row]]]:
    """Per repository: the KL bound chosen without its logs, and its logs' rows judged with it."""
    out = []
    for repo in dict.fromkeys(REPOSITORIES[n] for n in VERDICTS):
        bound = calibrate_kl(logs, [n for n in VERDICTS if REPOSITORIES[n] != repo])
        out.append((repo, bound, collect(logs, held_out=repo, rldoctor=False)))
    return out


def _cell_findings(row: Row) -> str:
    parts = [f"{det} {sev} @{step}" for det, sev, step in row.findings if sev == "critical"]
    warns = [det for det, sev, _ in row.findings if sev == "warn"]
    if warns:
        parts.append(f"warn: {', '.join(warns)}")
    return "; ".join(parts) or "no finding"


def _short(name: str) -> str:
    return name.replace(".trainer_state.json", "").replace(".verl.jsonl", "").replace(".csv", "")


def _ok(row: Row) -> str:
    delay = f" ({row.delay} steps)" if row.delay is not None else ""
    return {True: "yes", False: "NO", None: "-"}[row.ok] + delay


def _markdown(header: list[str], table: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in table]


def _summary(rows: list[Row], theirs: bool) -> list[str]:
    out = []
    for kind in ("healthy", "collapse"):
        mine = [r for r in rows if r.verdict.kind == kind]
        ours = sum(bool(r.ok) for r in mine)
        what = "no critical finding" if kind == "healthy" else f"critical within {WITHIN} logged steps of onset"
        line = f"{kind} runs, {what}: rlguard {ours}/{len(mine)}"
        judged = [rldoctor_ok(r.verdict, r.rldoctor_critical) for r in mine]
        if theirs and any(j is not None for j in judged):
            line += f", rldoctor {sum(bool(j) for j in judged)}/{len(mine)}"
        elif theirs:
            line += ", rldoctor not installed"
        out.append(line)
    return out


def tables(logs: Path) -> tuple[list[str], list[str], list[str]]:
    """The in-sample table, the leave-one-repository-out table (Markdown lines) and the summary lines."""
    rows = collect(logs)
    header = [
        "log",
        "verdict (from its source)",
        "rlguard: critical @step it became critical; warnings",
        "exit",
        "rlguard ok",
        "rldoctor 0.2.0 (warning and critical)",
        "rldoctor ok",
    ]
    table = [
        [
            _short(r.log),
            f"{r.verdict.kind}{f', onset {r.verdict.onset}' if r.verdict.onset is not None else ''}: {r.verdict.why}",
            _cell_findings(r),
            str(r.exit_code),
            _ok(r),
            r.rldoctor,
            {True: "yes", False: "NO", None: "-"}[rldoctor_ok(r.verdict, r.rldoctor_critical)],
        ]
        for r in rows
    ]
    in_sample = _markdown(header, table)
    bound = calibrate_kl(logs, list(VERDICTS))
    summary = [f"in sample (KL bound chosen from all logs: {bound:.3g} nats, the doctor's default 2):"]
    summary += ["  " + line for line in _summary(rows, theirs=True)]
    loro_rows: list[Row] = []
    loro_table = []
    for repo, kl, held in leave_one_repository_out(logs):
        loro_rows += held
        for r in held:
            kl_text = f"{kl:.3g}" if kl is not None else "default"
            loro_table.append(
                [repo, _short(r.log), r.verdict.kind, kl_text, _cell_findings(r), str(r.exit_code), _ok(r)]
            )
    header = ["held-out repository", "log", "verdict", "KL bound (nats)", "rlguard findings", "exit", "rlguard ok"]
    summary.append("leave one repository out (the KL bound chosen from the other repositories' healthy logs):")
    summary += ["  " + line for line in _summary(loro_rows, theirs=False)]
    return in_sample, _markdown(header, loro_table), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="folder of the real logs")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown tables to this file")
    parser.add_argument("--quick", action="store_true", help="accepted for the benchmark runner (same run)")
    args = parser.parse_args(argv)
    if not args.logs.is_dir():
        print(f"doctor_real_logs: no folder {args.logs} (the shared real logs); nothing to do", file=sys.stderr)
        return 2
    in_sample, loro, summary = tables(args.logs)
    text = "\n".join(["### In sample", "", *in_sample, "", "### Leave one repository out", "", *loro, "", *summary])
    if args.out is not None:
        command = "python benchmarks/doctor_real_logs.py --out " + str(args.out)
        args.out.write_text(f"<!-- written by `{command}` -->\n\n{text}\n", encoding="utf-8")
    if args.markdown or args.out is not None:
        print(text)
    else:
        from rich.console import Console
        from rich.markdown import Markdown

        Console(width=220).print(Markdown(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
