"""A blind-test rehearsal of the doctor on the 42 shared real logs: the same logs at another logging cadence, and
under changes of units, steps and column order that must not change a verdict.

    python benchmarks/doctor_blind.py cadence                # every 2nd, 3rd, 5th record; 20 % dropped (seed 0)
    python benchmarks/doctor_blind.py invariance             # x10, x0.1 of each log-space stat; step offsets; columns
    python benchmarks/doctor_blind.py live                   # the live replay (guard_replay.py) at each cadence
    python benchmarks/doctor_blind.py cadence --out FILE     # also write the Markdown table there

The logs are read where they are (``benchmarks/doctor_real_logs.py``'s folders and labels); each variant is built
in memory from the rows read and judged with :func:`rlguard.doctor.diagnose_log` as the doctor judges a file (the
``monitor`` preset, the key maps and runs of the labels).

Cadence criteria, in the variant's own records: a healthy run has no critical finding; a collapse is critical
within ``WITHIN`` (15) records of its onset and the reported onset lies within ``ONSET_WITHIN`` (5) records of it,
where the onset is the first kept record at or after the labelled step. A collapse is judged only where the variant
keeps at least ``MIN_AFTER`` (10) records from its onset on: the consequence rule's horizon, the records after a
finding that decide whether it is critical (one nearer the log's end is "unresolved", a warning by design); a
shorter one is shown in brackets and not counted.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doctor_real_logs import (  # the benchmark beside this one (its folder is on sys.path when run as a script)
    ALL_VERDICTS,
    DEFAULT_LOGS,
    DEFAULT_LOGS2,
    ONSET_WITHIN,
    WITHIN,
    Verdict,
    _short,
    log_paths,
)

#: records a collapse's variant must keep from its onset on to be judged: the consequence rule's horizon (a finding
#: is judged by the records after it; one nearer the log's end is "unresolved", a warning by design)
MIN_AFTER = 10
#: the seed of the random drop
SEED = 0

Rows = list[tuple[int, dict[str, float]]]


@dataclass(frozen=True)
class Judged:
    """One variant of one log, judged."""

    steps: list[int]  # the steps judged (those with a canonical stat)
    critical: list[int]  # steps of the critical events
    onset: int | None  # Diagnosis.onset
    findings: tuple[tuple[str, str], ...]  # (detector, severity) of each finding
    found: tuple[tuple[str, str, int], ...] = ()  # (detector, severity, step it reached it) of each finding


def read_rows(path: Path, verdict: Verdict) -> tuple[Any, Rows]:
    """The raw log at ``path`` and its rows as ``(step, {key: value})`` (every key, as the reader gave it)."""
    from rlguard.doctor.readers import read_log

    log = read_log(path, run=verdict.run)
    return log, [(step, dict(raw)) for step, raw in log.rows]


def judge_rows(log: Any, path: Path, rows: Rows, verdict: Verdict) -> Judged:
    """The doctor's judgement of ``rows`` read as ``log`` (its format and path)."""
    from dataclasses import replace

    from rlguard.doctor.columns import Columns
    from rlguard.doctor.diagnose import diagnose_log

    table = Columns()
    for step, raw in rows:
        table.append(step, raw)
    d = diagnose_log(replace(log, rows=table), path, None, dict(verdict.key_map) or None)
    critical = sorted({e.step for e in d.events if e.severity == "critical" and not e.detector.startswith("action:")})
    return Judged(
        list(d.steps),
        critical,
        d.onset,
        tuple((f.detector, f.severity) for f in d.findings),
        tuple((f.detector, f.severity, f.severity_step) for f in d.findings),
    )


def every(k: int) -> Callable[[Rows], Rows]:
    """Keep every ``k``-th record, the first kept."""
    return lambda rows: rows[::k]


def drop(share: float, seed: int = SEED) -> Callable[[Rows], Rows]:
    """Drop ``share`` of the records at random (``seed``), keeping the order."""

    def apply(rows: Rows) -> Rows:
        rng = random.Random(seed)
        gone = set(rng.sample(range(len(rows)), round(share * len(rows))))
        return [r for i, r in enumerate(rows) if i not in gone]

    return apply


CADENCES: dict[str, Callable[[Rows], Rows]] = {
    "every record": every(1),
    "every 2nd": every(2),
    "every 3rd": every(3),
    "every 5th": every(5),
    "20 % dropped": drop(0.2),
}


def cadence_cell(verdict: Verdict, steps: Sequence[int], j: Judged) -> tuple[str, bool | None]:
    """The cell of one variant and whether it met its criterion (None: not judged)."""
    if verdict.kind == "healthy":
        ok = not j.critical
        return ("ok" if ok else f"CRITICAL @{j.critical[0]}"), ok
    if verdict.kind != "collapse" or verdict.onset is None:
        return ("critical" if j.critical else "-"), None
    after = [s for s in steps if s >= verdict.onset]
    before = len(steps) - len(after)
    short = len(after) < MIN_AFTER
    if not after:
        return f"n/a ({before} before, 0 after)", None
    onset = after[0]
    hits = [s for s in j.critical if s >= onset]
    delay = sum(onset <= s < hits[0] for s in steps) if hits else None
    off = None
    if j.onset is not None:
        off = sum(onset <= s < j.onset for s in steps) - sum(j.onset <= s < onset for s in steps)
    ok = delay is not None and delay <= WITHIN and off is not None and abs(off) <= ONSET_WITHIN
    text = ("late " if delay is not None and delay > WITHIN else "") + (f"+{delay}" if delay is not None else "MISSED")
    text += f", onset {'-' if off is None else f'{off:+d}'}"
    if not ok and j.critical:
        text += f" (critical at {', '.join(map(str, j.critical[:4]))})"
    text = text if ok else f"**{text}**"
    if short:
        return f"{text} [short: {before} before, {len(after)} after]", None
    return text, ok


def cadence(paths: dict[str, Path]) -> tuple[list[str], list[str]]:
    """The table (one row per log, one column per cadence) and the summary."""
    header = ["log", "label", *CADENCES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    tally: dict[str, list[bool]] = {c: [] for c in CADENCES}
    kinds: dict[str, dict[str, list[bool]]] = {c: {"healthy": [], "collapse": []} for c in CADENCES}
    failures = []
    for name, path in paths.items():
        verdict = ALL_VERDICTS[name]
        log, rows = read_rows(path, verdict)
        cells = [_short(name), verdict.kind + (f" @{verdict.onset}" if verdict.onset is not None else "")]
        for label, thin in CADENCES.items():
            kept = thin(rows)
            j = judge_rows(log, path, kept, verdict)
            text, ok = cadence_cell(verdict, j.steps, j)
            cells.append(text)
            if ok is not None:
                tally[label].append(ok)
                kinds[label][verdict.kind].append(ok)
                if not ok:
                    failures.append(f"{name} ({label}): {text}; findings {j.findings}")
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    summary = []
    for label in CADENCES:
        h, c = kinds[label]["healthy"], kinds[label]["collapse"]
        summary.append(
            f"{label}: healthy without a critical {sum(h)}/{len(h)}; collapses critical within {WITHIN} records "
            f"with the onset within {ONSET_WITHIN} {sum(c)}/{len(c)} (judged)"
        )
    return lines, [*summary, "failures:", *failures]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("cadence", "invariance", "live"))
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="folder of the real logs (doctor_foreign)")
    parser.add_argument("--logs2", type=Path, default=DEFAULT_LOGS2, help="the second folder (doctor_foreign2)")
    parser.add_argument("--only", nargs="*", default=None, help="judge only these logs (file names)")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown table to this file")
    args = parser.parse_args(argv)
    paths = log_paths(args.logs, args.logs2)
    if args.only:
        paths = {n: p for n, p in paths.items() if n in args.only}
    if not paths:
        print(f"doctor_blind: no real logs in {args.logs} or {args.logs2}; nothing to do", file=sys.stderr)
        return 2
    table, summary = {"cadence": cadence, "invariance": invariance, "live": live}[args.what](paths)
    text = "\n".join([*table, "", *summary])
    if args.out is not None:
        args.out.write_text(f"<!-- written by `python benchmarks/doctor_blind.py {args.what}` -->\n\n{text}\n")
    print(text)
    return 0


def live(paths: dict[str, Path]) -> tuple[list[str], list[str]]:
    """The live replay of each cadence under ``default`` and ``stable`` (``benchmarks/guard_replay.py``'s criteria,
    in the variant's records): healthy runs rolled back or halted; collapses first acted on within ``WITHIN``
    records of the onset, judged where the variant keeps ``MIN_AFTER`` records from it on."""
    from dataclasses import replace

    from guard_replay import PRESETS, replay

    header = ["records kept", *(f"{p}: healthy rolled back or halted" for p in PRESETS)]
    header += [f"{p}: collapses acted on within {WITHIN} records (judged)" for p in PRESETS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    misses: list[str] = []
    for label, thin in CADENCES.items():
        acted = {p: [0, 0] for p in PRESETS}
        on_time = {p: [0, 0] for p in PRESETS}
        for name, path in paths.items():
            verdict = ALL_VERDICTS[name]
            log, rows = read_rows(path, verdict)
            kept = thin(rows)
            variant = replace(log, rows=kept)
            onset = verdict.onset if verdict.kind == "collapse" else None
            if onset is not None and sum(s >= onset for s, _ in kept) < MIN_AFTER:
                continue
            for p in PRESETS:
                r = replay(path, verdict, p, log=variant)
                if verdict.kind == "healthy":
                    acted[p][1] += 1
                    if r.rollbacks or r.halts:
                        acted[p][0] += 1
                        misses.append(f"{label}, {p}: {_short(name)} healthy: {r.rollbacks} rollbacks, {r.halts} halts")
                elif verdict.kind == "collapse":
                    on_time[p][1] += 1
                    if r.delay is not None and 0 <= r.delay <= WITHIN:
                        on_time[p][0] += 1
                    else:
                        delay = "no action" if r.delay is None else f"{r.delay:+d}"
                        misses.append(f"{label}, {p}: {_short(name)} collapse @{verdict.onset}: first action {delay}")
        cells = [label, *(f"{a}/{n}" for a, n in acted.values()), *(f"{a}/{n}" for a, n in on_time.values())]
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines, ["not met:", *misses]


def _mapped(log: Any, verdict: Verdict) -> dict[str, str]:
    """The log's raw key -> canonical stat, as the doctor maps it."""
    from rlguard.doctor.keys import classify_keys

    return dict(classify_keys(log.keys, dict(verdict.key_map) or None, rows=log.rows).key_map)


def scale(stat: str, c: float) -> Callable[[Rows, dict[str, str]], Rows]:
    """Every raw key mapped to ``stat`` multiplied by ``c`` (a change of units)."""

    def apply(rows: Rows, mapped: dict[str, str]) -> Rows:
        keys = {k for k, name in mapped.items() if name == stat}
        return [(step, {k: v * c if k in keys else v for k, v in raw.items()}) for step, raw in rows]

    return apply


def offset(first: int | None, by: int = 0) -> Callable[[Rows, dict[str, str]], Rows]:
    """Steps moved by ``by``, or so that the first is ``first``."""

    def apply(rows: Rows, mapped: dict[str, str]) -> Rows:
        shift = by if first is None else first - rows[0][0]
        return [(step + shift, raw) for step, raw in rows]

    return apply


def columns(order: str) -> Callable[[Rows, dict[str, str]], Rows]:
    """Each row's keys in reversed or shuffled (seed 0) order."""

    def apply(rows: Rows, mapped: dict[str, str]) -> Rows:
        keys = list(dict.fromkeys(k for _, raw in rows for k in raw))
        if order == "reversed":
            keys.reverse()
        else:
            random.Random(SEED).shuffle(keys)
        return [(step, {k: raw[k] for k in keys if k in raw}) for step, raw in rows]

    return apply


#: perturbation -> (how, the stat it needs in the log or None, whether the verdict must not change by principle)
PERTURBATIONS: dict[str, tuple[Callable[[Rows, dict[str, str]], Rows], str | None, bool]] = {
    "grad_norm x0.1": (scale("grad_norm", 0.1), "grad_norm", True),
    "grad_norm x10": (scale("grad_norm", 10.0), "grad_norm", True),
    "entropy x0.1": (scale("entropy", 0.1), "entropy", False),
    "entropy x10": (scale("entropy", 10.0), "entropy", False),
    "kl_ref x0.1": (scale("kl_ref", 0.1), "kl_ref", False),
    "kl_ref x10": (scale("kl_ref", 10.0), "kl_ref", False),
    "length x10": (scale("length_mean", 10.0), "length_mean", False),
    "steps +1000": (offset(None, 1000), None, True),
    "steps from 0": (offset(0), None, True),
    "steps from 1": (offset(1), None, True),
    "columns reversed": (columns("reversed"), None, True),
    "columns shuffled": (columns("shuffled"), None, True),
}


def signature(j: Judged, first: int) -> tuple[Any, ...]:
    """What must not change, with steps counted from the log's first: findings, critical steps, onset."""
    return (
        tuple(sorted((d, sev, at - first) for d, sev, at in j.found)),
        tuple(s - first for s in j.critical),
        None if j.onset is None else j.onset - first,
    )


def invariance(paths: dict[str, Path]) -> tuple[list[str], list[str]]:
    """One row per log, one column per perturbation: "=" where the verdict did not change, else what changed."""
    header = ["log", *PERTURBATIONS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    changed: dict[str, list[str]] = {p: [] for p in PERTURBATIONS}
    applied = dict.fromkeys(PERTURBATIONS, 0)
    for name, path in paths.items():
        verdict = ALL_VERDICTS[name]
        log, rows = read_rows(path, verdict)
        mapped = _mapped(log, verdict)
        base = judge_rows(log, path, rows, verdict)
        want = signature(base, base.steps[0])
        cells = [_short(name)]
        for label, (how, stat, _) in PERTURBATIONS.items():
            if stat is not None and stat not in mapped.values():
                cells.append("")
                continue
            applied[label] += 1
            j = judge_rows(log, path, how(rows, mapped), verdict)
            got = signature(j, j.steps[0])
            if got == want:
                cells.append("=")
                continue
            lost = sorted(set(want[0]) - set(got[0]))
            new = sorted(set(got[0]) - set(want[0]))
            text = f"-{lost} +{new}; onset {want[2]} -> {got[2]}"
            cells.append("**changed**")
            changed[label].append(f"{name}: {text}")
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    summary = []
    for label, (_, _, must) in PERTURBATIONS.items():
        kind = "must not change (principle)" if must else "may change (an absolute bound in the stat's units)"
        summary.append(f"{label}: {len(changed[label])}/{applied[label]} verdicts changed; {kind}")
        summary += [f"  {c}" for c in changed[label]]
    return lines, summary


if __name__ == "__main__":
    sys.exit(main())
