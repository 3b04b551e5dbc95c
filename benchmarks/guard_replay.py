"""The live guard replayed on the 42 shared real training logs: what the ``default`` and ``stable`` presets would have
done to runs that trained well, and how soon they act on runs that collapsed.

    python benchmarks/guard_replay.py                               # the table and the summary
    python benchmarks/guard_replay.py --out benchmarks/guard_replay.md   # also write them there (Markdown)
    python benchmarks/guard_replay.py --logs DIR --logs2 DIR        # default: ../shared/doctor_foreign{,2}

Each log is replayed record by record through ``Guard.observe`` of the preset (``rlguard doctor --live PRESET LOG``,
:func:`rlguard.doctor.replay.replay_live`), read as the doctor reads it; a halt ends the replay. The labels
(healthy, collapse with its onset, unclear) and the reason for each are those of the doctor's benchmark
(``benchmarks/doctor_real_logs.py``: ``VERDICTS`` and ``FOREIGN2_VERDICTS``), one table for both. This measures the
guard as it is: nothing here is tuned.

Criteria (issue 36): no rollback or halt on a healthy run; on a collapse, a first action (skip, rollback or halt)
within 15 logged steps of the labelled onset. An action before the onset counts as the first action, and its delay
is negative (logged steps before the onset), except a skip of a batch without signal (``skip_no_signal``: every
group's rewards equal, so every advantage 0): it is right whatever the run does, so one before the onset is no early
action on the collapse; from the onset on it counts. The skips column gives the skips without signal in brackets.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlguard.doctor.readers import MetricLog
    from rlguard.doctor.replay import LiveDecision

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doctor_real_logs import (  # the benchmark beside this one (its folder is on sys.path when run as a script)
    ALL_VERDICTS,
    DEFAULT_LOGS,
    DEFAULT_LOGS2,
    WITHIN,
    Verdict,
    log_paths,
)

PRESETS = ("default", "stable")


@dataclass(frozen=True)
class Replayed:
    """One log under one preset."""

    skips: int
    no_signal: int  # of ``skips``: batches without signal (``skip_no_signal``)
    rollbacks: int
    halts: int
    first_action: str  # "outcome @step" of the first skip, rollback or halt, or "-"
    delay: int | None  # collapses: logged steps from the onset to the first action (negative: before it)
    stats: tuple[str, ...] = ()  # the canonical stats the log carries (the signals the guard could read)


def replay(path: Path, verdict: Verdict, preset: str, log: MetricLog | None = None) -> Replayed:
    """The replay of ``path`` under ``preset`` and, for a collapse, the delay of its first action (``log``: the
    log at ``path`` already read, or changed: ``benchmarks/doctor_blind.py``)."""
    from rlguard.doctor.replay import replay_live
    from rlguard.guards.interventions.skip_no_signal import NO_SIGNAL

    r = replay_live(path, preset, dict(verdict.key_map) or None, run=verdict.run, log=log)
    onset = verdict.onset if verdict.kind == "collapse" else None

    def no_signal(d: LiveDecision) -> bool:
        return d.outcome == "skip" and d.reason.startswith(NO_SIGNAL)

    # a skip without signal before the onset is no action on the collapse (see the module's docstring)
    acts = [d for d in r.decisions if d.outcome != "step" and not (no_signal(d) and (onset is None or d.step < onset))]
    first = acts[0] if acts else None
    delay = None
    if first is not None and onset is not None:
        steps = [s for s, _ in r.read.rows]
        delay = sum(onset <= s < first.step for s in steps) - sum(first.step <= s < onset for s in steps)
    text = "-" if first is None else f"{first.outcome}{' (no signal)' * no_signal(first)} @{first.step}"
    stats = tuple(sorted({k for _, row in r.read.rows for k in row}))
    quiet = sum(map(no_signal, r.decisions))
    return Replayed(r.count("skip"), quiet, r.count("rollback"), r.count("halt"), text, delay, stats)


def _short(name: str) -> str:
    return name.replace(".trainer_state.json", "").replace(".verl.jsonl", "").replace(".csv", "")


def _label(v: Verdict) -> str:
    return v.kind + (f" @{v.onset}" if v.onset is not None else "")


def run(paths: dict[str, Path]) -> tuple[list[str], list[str]]:
    """The Markdown table and the summary lines."""
    header = [
        "log",
        "label",
        *(f"{p}: skips (without signal) / rollbacks / halts, first action (delay)" for p in PRESETS),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    results: dict[str, dict[str, Replayed]] = {}
    for name, path in paths.items():
        verdict = ALL_VERDICTS[name]
        results[name] = {p: replay(path, verdict, p) for p in PRESETS}
        cells = [_short(name), _label(verdict)]
        for p in PRESETS:
            r = results[name][p]
            delay = f" ({r.delay:+d})" if r.delay is not None else ""
            cells.append(f"{r.skips} ({r.no_signal}) / {r.rollbacks} / {r.halts}, {r.first_action}{delay}")
        lines.append("| " + " | ".join(cells) + " |")
    summary = [f"{len(paths)} logs replayed under {', '.join(PRESETS)}:"]
    healthy = [n for n in paths if ALL_VERDICTS[n].kind == "healthy"]
    collapses = [n for n in paths if ALL_VERDICTS[n].kind == "collapse"]
    for p in PRESETS:
        acted = [n for n in healthy if results[n][p].rollbacks or results[n][p].halts]
        halted = [n for n in healthy if results[n][p].halts]
        quiet = {_short(n): results[n][p].no_signal for n in healthy if results[n][p].no_signal}
        summary.append(
            f"  {p}: healthy runs rolled back or halted: {len(acted)}/{len(healthy)} "
            f"({', '.join(map(_short, acted)) or 'none'}); halted: {len(halted)}; skips without signal on "
            f"{len(quiet)}/{len(healthy)} ({', '.join(f'{n} {k}' for n, k in quiet.items()) or 'none'})"
        )
        delays = {n: results[n][p].delay for n in collapses}
        on_time = [n for n, d in delays.items() if d is not None and 0 <= d <= WITHIN]
        text = ", ".join(f"{_short(n)} {'no action' if d is None else f'{d:+d}'}" for n, d in delays.items())
        summary.append(
            f"  {p}: collapses acted on within {WITHIN} logged steps of onset (skip, rollback or halt): "
            f"{len(on_time)}/{len(collapses)}; delay in logged steps: {text}"
        )
        for n in collapses:
            if n not in on_time:  # the signals the log has, to judge whether the guard could have acted in time
                summary.append(f"    {_short(n)}: not in time; its log carries {', '.join(results[n][p].stats)}")
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="folder of the real logs (doctor_foreign)")
    parser.add_argument("--logs2", type=Path, default=DEFAULT_LOGS2, help="the second folder (doctor_foreign2)")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown table to this file")
    parser.add_argument("--quick", action="store_true", help="accepted for the benchmark runner (same run)")
    args = parser.parse_args(argv)
    paths = log_paths(args.logs, args.logs2)
    if not paths:
        print(f"guard_replay: no real logs in {args.logs} or {args.logs2}; nothing to do", file=sys.stderr)
        return 2
    table, summary = run(paths)
    text = "\n".join([*table, "", *summary])
    if args.out is not None:
        command = "python benchmarks/guard_replay.py --out " + str(args.out)
        args.out.write_text(f"<!-- written by `{command}` -->\n\n{text}\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
