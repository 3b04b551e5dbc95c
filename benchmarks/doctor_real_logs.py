"""rlguard doctor against rldoctor 0.2.0 on 42 real training logs from public repositories, in sample and leave
one repository out.

    python benchmarks/doctor_real_logs.py                    # the tables (rldoctor's column if it is installed)
    python benchmarks/doctor_real_logs.py --markdown         # the same rows as Markdown tables
    python benchmarks/doctor_real_logs.py --out benchmarks/doctor_real_logs.md   # write them there
    python benchmarks/doctor_real_logs.py --logs DIR         # default: $RLGUARD_REAL_LOGS or ../shared/doctor_foreign
    python benchmarks/doctor_real_logs.py --logs2 DIR        # default: $RLGUARD_REAL_LOGS2 or ../shared/doctor_foreign2

The logs are read where they are (``../shared/doctor_foreign`` and ``../shared/doctor_foreign2``, sources in their
READMEs); they are not copied into the repository. A folder that is absent is left out. Each run's verdict below
was judged from its source and its numbers (:data:`VERDICTS` for the first folder, :data:`FOREIGN2_VERDICTS` for
the second). Criteria: no critical finding
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


def default_logs(name: str = "doctor_foreign", env: str = "RLGUARD_REAL_LOGS") -> Path:
    """``$env``, else the first ``shared/<name>`` beside the checkout or an ancestor of it (``../shared`` from the
    main checkout, ``../../shared`` from a worktree under ``wt/``)."""
    if given := os.environ.get(env):
        return Path(given)
    for folder in ROOT.parents:
        if (folder / "shared" / name).is_dir():
            return folder / "shared" / name
    return ROOT.parent / "shared" / name


DEFAULT_LOGS = default_logs()
DEFAULT_LOGS2 = default_logs("doctor_foreign2", "RLGUARD_REAL_LOGS2")
#: logged steps after the onset within which a collapse must be critical
WITHIN = 15
#: logged steps from the labelled onset within which the doctor's reported onset must lie (issue 36)
ONSET_WITHIN = 5


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
    # onset 31, not 33: the first step at which the score and the length leave their ranges over steps 1-29
    # (score -0.86 below -0.50..-0.73, the least-squares change point of the score; length 578 below 646-1015).
    # Re-judged, 31 stays: the two-phase (broken-stick) regressions of the length and of the KL penalty over steps
    # 1-35..45 bend at 31-33, and the distillation reward critic/rewards/mean improves through 29 (-16 -> -13). The
    # gradient norm and the policy loss sit 10-30% and ~60% up from 25 (0.72-0.83 -> 0.81-0.99 beside one 1.77;
    # 0.021-0.038 -> 0.033-0.050), a precursor of the update, not yet of the run's outputs, which move from 31
    "opd-qwen3-4b-gjvwlq13.verl.jsonl": Verdict(
        "collapse",
        "length 578 @31 -> 10 tokens, grad norm 0.9 -> 15, KL 0.5 -> 2 from 32, score -0.6 -> -0.9 @31",
        onset=31,
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
    # ch06's own signals date it too: the least-squares change point of its reward is 241-246 (0.59-0.64 -> 0.10-0.21
    # over steps 150-350, 180-280 and 200-300) and of its length 246 over the whole run (486 -> 695 tokens).
    # Re-judged, 246 stays: the two-line (two-phase) fit of the reward breaks at 246 over steps 150-350, 150-300 and
    # the whole run; the log length's change point over 150-350 is 255-256, after it
    "rasbt-ch06-grpo-nokl.csv": Verdict(
        "collapse",
        "the 7_3 run without entropy: reward 0.6 -> 0.1 from 246 (change point), -> 0 from 257, lengths "
        "to the 1024 cap",
        onset=246,
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


_NIPS = "EXPERIMENT_STATUS.md / results/logs/evals of Sunshine535/nips-grpo-dynamics"
#: ../shared/doctor_foreign2, judged from the sources (the repositories' own words where they have any) and the
#: numbers; the evidence per log: /work/notes/labels_foreign2.md (onset: the first logged step of the excursion that
#: did not recover)
FOREIGN2_VERDICTS: dict[str, Verdict] = {
    "nipsgrpo-qwen35-9b-rho0.70-s44.trainer_state.json": Verdict(
        "collapse",
        f"reward 0.85-0.97 -> 0.41 @155 -> 0 from 165, entropy 0.17 -> 6.4, zero-std groups 1.0; {_NIPS}: the "
        "collapsed seed (0.01) of rho 0.7; recovered dip at 110-120 before",
        onset=155,
    ),
    "nipsgrpo-qwen35-9b-rho3.00-s42.trainer_state.json": Verdict(
        "healthy", f"reward 0.09 -> 0.95, entropy 0.07-0.30; {_NIPS}: rho 3.0 'all converged'"
    ),
    "nipsgrpo-qwen25-7b-rho0.30-s42.trainer_state.json": Verdict(
        "collapse",
        "reward 0.95 @15 -> 0.18 @20 -> 0; entropy 0.24 -> 8.2 then 1e-12; length to the 512 cap; GSM8K 0.000",
        onset=20,
    ),
    "nipsgrpo-qwen25-7b-rho0.50-s43.trainer_state.json": Verdict(
        "collapse",
        "reward 0.85-1.0 -> 0.23 @40 -> 0-0.2; length 110 -> 3-5 tokens; grad norm 0.2 -> 47; GSM8K 0.015",
        onset=40,
    ),
    "nipsgrpo-qwen25-7b-rho1.00-s42.trainer_state.json": Verdict(
        "collapse",
        "recovered dip at 40-50; then reward 0.8 @125 -> 0.38 @135 -> 0 from 150, entropy 0.06 -> 5.4, length to "
        "the cap; GSM8K 0.005",
        onset=135,
    ),
    "nipsgrpo-qwen25-7b-rho1.00-s43.trainer_state.json": Verdict(
        "collapse",
        "reward 0.78-1.0 -> 0.53 @25 -> 0 from 30; entropy 0.25 -> 7.0; length to the cap; GSM8K 0.000",
        onset=25,
    ),
    "nipsgrpo-qwen25-7b-adabalance-s42.trainer_state.json": Verdict(
        "collapse",
        "reward 0.8-0.98 -> 0.6 @70 -> 0 from 85; length to the 512 cap; zero-std 1.0, loss 0; entropy flat 0.1; "
        "the authors: 'controller broken' (rho stayed 1.0)",
        onset=70,
    ),
    "nipsgrpo-qwen25-7b-rho3.00-s44.trainer_state.json": Verdict(
        "healthy", "reward 0.85 -> 0.95-1.0 held; entropy 0.16 -> 0.04 without a break; GSM8K 0.865"
    ),
    "unsloth-llama32-3b-advanced-grpo.csv": Verdict(
        "healthy", "Unsloth's Advanced Llama 3.2 notebook: reward -0.8 -> 7.5 of ~9.5; KL 0 -> 0.11 (one spike 2.6)"
    ),
    "unsloth-qwen3-8b-fp8-grpo.csv": Verdict(
        "unclear", "100 steps at the reward floor -7.5 on 83 (all truncated), reward_std 0 on 87, no trend"
    ),
    "unsloth-llama31-8b-grpo-feb2025.csv": Verdict("healthy", "Unsloth's Llama 3.1 notebook: reward 0.08 -> 1.4-2.0"),
    "basile-llama31-8b-grpo.csv": Verdict(
        "healthy", "reward 0 -> 0.88; length 156 -> 88 with one-step dips to 28-50 tokens while the reward holds"
    ),
    "medthink-qwen25-3b-grpo-1000.csv": Verdict(
        "healthy", "reward 0.07 -> 0.56 by 100, held to 1000; five one-step KL spikes (up to 2.45e7) that recover"
    ),
    "mathphi4-qwen25-3b-grpo-1000.csv": Verdict(
        "healthy", "reward 0.06 -> 2.0 held 200-1000; the authors serve the resulting model"
    ),
    "xun3-qwen25-3b-grpo.csv": Verdict("healthy", "reward 0.08 -> 1.3-2.4; length 200 (cap) -> 137-190"),
    "xun3-qwen25-3b-grpo-stalled.csv": Verdict(
        "unclear", "stopped at 227/250; reward ~0 throughout, length at the 200 cap: did not learn, nothing broke"
    ),
    "taubench-gptoss-20b-grpo.csv": Verdict(
        "healthy",
        "low confidence: reward 4.4 -> 5.0, held-out reward 5.06 (100% success, the notebook's evaluation); KL 1-35 "
        "with recovered spikes to 3395",
    ),
    "fintech-stock-grpo.csv": Verdict("unclear", "398 steps, reward 0.12-0.80 without trend, length 920 -> 1200"),
    "colab-qwen3-4b-grpo-partial.csv": Verdict(
        "unclear", "46 steps of the Qwen3 notebook, reward at its floor on 19, no trend"
    ),
    "holazzer-qwen25-3b-grpo-partial.csv": Verdict(
        "healthy", "136 steps (interrupted): reward 0.77 -> 1.7 (format learned), one KL spike 4.84 that recovers"
    ),
}
#: every labelled log, both folders
ALL_VERDICTS: dict[str, Verdict] = {**VERDICTS, **FOREIGN2_VERDICTS}

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
    # ../shared/doctor_foreign2/README.md
    **{name: "Sunshine535/nips-grpo-dynamics" for name in FOREIGN2_VERDICTS if name.startswith("nipsgrpo-")},
    **{name: "unslothai/notebooks" for name in FOREIGN2_VERDICTS if name.startswith("unsloth-")},
    "basile-llama31-8b-grpo.csv": "basilenouvellet/unsloth-grpo-fine-tuning",
    "medthink-qwen25-3b-grpo-1000.csv": "matthewchung74/qwen_2_5_3B_GRPO_medical_thinking",
    "mathphi4-qwen25-3b-grpo-1000.csv": "madhurachanna/math-phi4",
    "xun3-qwen25-3b-grpo.csv": "xun-3/grpo",
    "xun3-qwen25-3b-grpo-stalled.csv": "xun-3/grpo",
    "taubench-gptoss-20b-grpo.csv": "Ray-Cheng-11/Tau-Bench-Model-Training",
    "fintech-stock-grpo.csv": "jzystar/fintech",
    "colab-qwen3-4b-grpo-partial.csv": "AbdullahFageeh/colab",
    "holazzer-qwen25-3b-grpo-partial.csv": "holazzer/nb",
}


def log_paths(logs: Path = DEFAULT_LOGS, logs2: Path = DEFAULT_LOGS2) -> dict[str, Path]:
    """Every labelled log found (:data:`VERDICTS` in ``logs``, :data:`FOREIGN2_VERDICTS` in ``logs2``) -> its path,
    in the tables' order; a folder that is absent gives none."""
    found = {n: logs / n for n in VERDICTS if (logs / n).is_file()}
    return found | {n: logs2 / n for n in FOREIGN2_VERDICTS if (logs2 / n).is_file()}


#: the KL bound (critical) is this multiple of the largest 95th percentile of KL over the healthy logs
KL_MARGIN = 4.0


def kl_from_reference(kl: list[float]) -> bool:
    """Whether a log's KL to the reference starts at the reference: its first record below the warning bound of the
    doctor's ``kl_ref_blowup`` (1 nat by default). The KL to the reference is ~0 where the policy is the reference (at
    initialisation, the first update moves it little); a log whose first record is already at a level the detector
    warns about measures against another policy, or was resumed, and says nothing about how far KL grows from the
    reference in a healthy run (``kl``: the log's finite ``kl_ref`` values in step order)."""
    from rlguard.guards import Guard, GuardConfig

    warn = getattr(Guard(GuardConfig.preset("monitor")).detectors["kl_ref_blowup"], "warn_above", None)
    return bool(kl) and (warn is None or kl[0] < warn)


def calibrate_kl(paths: dict[str, Path], names: list[str]) -> float | None:
    """The critical absolute bound on KL to the reference chosen from the healthy logs among ``names``: KL_MARGIN x
    the largest 95th percentile of their ``kl_ref`` (None if none logs it), over the logs whose KL starts at the
    reference (:func:`kl_from_reference`)."""
    import statistics

    from rlguard.doctor.keys import canonical_stats, classify_keys
    from rlguard.doctor.readers import read_log

    peaks = []
    for name in names:
        if ALL_VERDICTS[name].kind != "healthy":
            continue
        log = read_log(paths[name], run=ALL_VERDICTS[name].run)
        key_map = classify_keys(log.keys, rows=log.rows).key_map
        kl = [v for _, raw in log.rows if math.isfinite(v := canonical_stats(raw, key_map).get("kl_ref", math.nan))]
        if len(kl) >= 2 and kl_from_reference(kl):
            peaks.append(statistics.quantiles(sorted(kl), n=20, method="inclusive")[-1])
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
    onset_found: int | None = None  # the onset the doctor reports (Diagnosis.onset)
    onset_offset: int | None = None  # collapses: logged steps from the labelled onset to it (negative: before)
    incidents: tuple[tuple[str, int], ...] = ()  # recovered incidents before it (Diagnosis.incidents): detector, onset


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


def collect(paths: dict[str, Path], held_out: str | None = None, rldoctor: bool = True) -> list[Row]:
    """One row per log of ``paths`` (:func:`log_paths`, in that order), judged with the doctor's defaults; with
    ``held_out`` (a repository), only that repository's logs, judged with the KL bound calibrated without them."""
    names = [n for n in paths if held_out is None or REPOSITORIES[n] == held_out]
    config = None
    if held_out is not None:
        config = kl_config(calibrate_kl(paths, [n for n in paths if REPOSITORIES[n] != held_out]))
    rows = []
    for name in names:
        verdict, path = ALL_VERDICTS[name], paths[name]
        d, critical = run_rlguard(path, verdict, config)
        ok, delay = judge(verdict, d.steps, critical)
        findings = [(f.detector, f.severity, f.severity_step) for f in d.findings]
        text, rl_critical = run_rldoctor(path) if rldoctor else ("-", None)
        found = d.onset
        offset = None
        if found is not None and verdict.kind == "collapse" and verdict.onset is not None:
            onset = verdict.onset
            offset = sum(onset <= s < found for s in d.steps) - sum(found <= s < onset for s in d.steps)
        rows.append(
            Row(
                name,
                verdict,
                len(d.steps),
                findings,
                critical,
                d.exit_code,
                text,
                rl_critical,
                ok,
                delay,
                found,
                offset,
                tuple((i.excursion.detector, i.excursion.onset) for i in d.incidents),
            )
        )
    return rows


def leave_one_repository_out(paths: dict[str, Path]) -> list[tuple[str, float | None, list[Row]]]:
    """Per repository: the KL bound chosen without its logs, and its logs' rows judged with it."""
    out = []
    for repo in dict.fromkeys(REPOSITORIES[n] for n in paths):
        bound = calibrate_kl(paths, [n for n in paths if REPOSITORIES[n] != repo])
        out.append((repo, bound, collect(paths, held_out=repo, rldoctor=False)))
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
    delay = f" ({row.delay} steps" if row.delay is not None else ""
    if row.onset_offset is not None:
        delay += f"; onset reported @{row.onset_found}, {row.onset_offset:+d}" if delay else ""
        delay += "".join(f"; recovered incident {name} @{at}" for name, at in row.incidents) if delay else ""
    return {True: "yes", False: "NO", None: "-"}[row.ok] + delay + (")" if delay else "")


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


def _failures(rows: list[Row]) -> list[str]:
    """The logs that fail their criterion: healthy with a critical finding, collapses missed or late."""
    false_alarms = [
        f"{_short(r.log)} ({', '.join(f'{d} @{s}' for d, sev, s in r.findings if sev == 'critical')})"
        for r in rows
        if r.verdict.kind == "healthy" and not r.ok
    ]
    missed = [
        f"{_short(r.log)} (onset {r.verdict.onset}, "
        + (f"critical {r.delay} logged steps after" if r.delay is not None else "no critical finding at or after it")
        + ")"
        for r in rows
        if r.verdict.kind == "collapse" and not r.ok
    ]
    collapses = [r for r in rows if r.verdict.kind == "collapse"]
    near = [r for r in collapses if r.onset_offset is not None and abs(r.onset_offset) <= ONSET_WITHIN]
    off = [
        f"{_short(r.log)} (@{r.onset_found} for {r.verdict.onset}, {r.onset_offset:+d})"
        for r in collapses
        if r not in near and r.onset_offset is not None
    ]
    return [
        f"healthy with a critical finding: {'; '.join(false_alarms) or 'none'}",
        f"collapses missed or late: {'; '.join(missed) or 'none'}",
        f"collapses whose reported onset (Diagnosis.onset) is within {ONSET_WITHIN} logged steps of "
        f"the labelled one: {len(near)}/{len(collapses)}; off (logged steps): {'; '.join(off) or 'none'}",
    ]


def tables(paths: dict[str, Path]) -> tuple[list[str], list[str], list[str]]:
    """The in-sample table, the leave-one-repository-out table (Markdown lines) and the summary lines."""
    rows = collect(paths)
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
    bound = calibrate_kl(paths, list(paths))
    kl_text = f"{bound:.3g}" if bound is not None else "none"
    summary = [f"{len(paths)} logs; in sample (KL bound chosen from all logs: {kl_text} nats, the doctor's default 2):"]
    summary += ["  " + line for line in _summary(rows, theirs=True)]
    loro_rows: list[Row] = []
    loro_table = []
    for repo, kl, held in leave_one_repository_out(paths):
        loro_rows += held
        for r in held:
            kl_text = f"{kl:.3g}" if kl is not None else "default"
            loro_table.append(
                [repo, _short(r.log), r.verdict.kind, kl_text, _cell_findings(r), str(r.exit_code), _ok(r)]
            )
    header = ["held-out repository", "log", "verdict", "KL bound (nats)", "rlguard findings", "exit", "rlguard ok"]
    summary += ["  " + line for line in _failures(rows)]
    summary.append("leave one repository out (the KL bound chosen from the other repositories' healthy logs):")
    summary += ["  " + line for line in _summary(loro_rows, theirs=False)]
    summary += ["  " + line for line in _failures(loro_rows)]
    return in_sample, _markdown(header, loro_table), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="folder of the real logs (doctor_foreign)")
    parser.add_argument("--logs2", type=Path, default=DEFAULT_LOGS2, help="the second folder (doctor_foreign2)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown tables to this file")
    parser.add_argument("--quick", action="store_true", help="accepted for the benchmark runner (same run)")
    args = parser.parse_args(argv)
    if not args.logs.is_dir():
        print(f"doctor_real_logs: no folder {args.logs} (the shared real logs); nothing to do", file=sys.stderr)
        return 2
    in_sample, loro, summary = tables(log_paths(args.logs, args.logs2))
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
