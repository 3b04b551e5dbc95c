"""A diagnosis on the terminal: the rich renderables ``rlguard doctor`` prints and ``rlguard watch`` keeps live.

Everything read from a file (paths, key names, messages) goes through :func:`safe_text` before it reaches the
terminal: control characters become visible escapes (``\\x1b``), so a metric name or an event message cannot clear
the screen, move the cursor, overwrite a line (``\\r``) or plant an OSC-8 link; and rich's markup is escaped.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from rlguard.doctor import Diagnosis
    from rlguard.doctor.replay import Replay
    from rlguard.guards import Event

SEVERITY_STYLE = {"critical": "bold red", "warn": "yellow"}

#: C0 controls (newline and tab included: a table cell is one line), DEL, C1 controls (``\x9b`` is CSI on its
#: own), and Unicode's bidirectional overrides and isolates (they reorder what follows them on the line)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(text: object, *, markup: bool = True) -> str:
    """``str(text)`` made safe for the terminal: every control character written as a visible escape (``\\x1b``,
    ``\\r``, ``\\u202e``), then rich's markup escaped (``markup=False`` for plain output such as ``typer.echo``)."""
    shown = _UNSAFE.sub(_visible, str(text))
    return escape(shown) if markup else shown


def summary_line(d: Diagnosis) -> str:
    """``PATH: FORMAT, N steps (FIRST to LAST); stats: ...`` (rich markup)."""
    span = f"{len(d.steps)} steps ({d.steps[0]} to {d.steps[-1]})" if d.steps else "no step"
    return (
        f"[bold]{safe_text(d.log.path)}[/bold]: {d.log.format}, {span}; "
        f"stats: {safe_text(', '.join(sorted(set(d.keys.mapped.values()))))}"
    )


def findings_table(d: Diagnosis) -> Table | None:
    """One row per finding, most severe first; None without findings."""
    if not d.findings:
        return None
    table = Table(title=f"rlguard doctor: {len(d.findings)} finding(s), most severe first")
    for col in ("severity", "detector", "onset step", "evidence and suggested fix"):
        table.add_column(col)
    for f in d.findings:
        onset = str(f.step) if f.severity_step == f.step else f"{f.step} ({f.severity} at {f.severity_step})"
        severity = f"[{SEVERITY_STYLE.get(f.severity, '')}]{safe_text(f.severity)}[/]"
        table.add_row(severity, safe_text(f.detector), onset, safe_text(f.message))
    return table


def incident_lines(d: Diagnosis) -> list[str]:
    """The critical excursions the run recovered from by its reward (``Diagnosis.incidents``), and the run's onset
    after them; empty without incidents."""
    if not d.incidents:
        return []
    lines = [
        f"recovered incident: {i.excursion.detector} from step {i.excursion.onset} (critical at "
        f"{i.excursion.severity_step}): the reward fell from its level {i.level:.4g} at step {i.fell} and was back "
        f"at it from step {i.recovered}"
        for i in d.incidents
    ]
    return [*lines, f"the run's onset, after the reward's last recovery: step {d.onset}"]


def events_table(events: list[Event], title: str) -> Table:
    """The live guard's events: step, severity, detector or action, message."""
    table = Table(title=title)
    for col in ("step", "severity", "detector or action", "message"):
        table.add_column(col)
    for e in events:
        style = SEVERITY_STYLE.get(e.severity, "")
        table.add_row(str(e.step), f"[{style}]{safe_text(e.severity)}[/]", safe_text(e.detector), safe_text(e.message))
    return table


def latest_stats_table(d: Diagnosis) -> Table:
    """Each canonical stat's last finite value and the step it was logged at."""
    table = Table(title="latest stats")
    for col in ("stat", "value", "step"):
        table.add_column(col)
    for name, values in sorted(d.series.items()):
        logged = zip(reversed(d.steps), reversed(values), strict=True)
        last = next(((s, v) for s, v in logged if not math.isnan(v)), None)
        if last is not None:
            table.add_row(safe_text(name), f"{last[1]:.4g}", str(last[0]))
    return table


def diagnosis_renderables(d: Diagnosis, *, final: bool = True) -> list[RenderableType]:
    """What ``rlguard doctor`` prints: the summary line, unrecognised keys, findings, what it could not check, the
    live guard's events and the verdict (not when the read is not ``final``: the watch's last good read of a log
    that then could not be read)."""
    out: list[RenderableType] = [summary_line(d)]
    for line in d.read.lines():
        out.append(f"[bold yellow]{safe_text(line)}[/bold yellow]" if line.startswith("damaged") else safe_text(line))
    if d.keys.auto_mapped:
        auto = ", ".join(f"{k} -> {c}" for k, c in d.keys.auto_mapped.items())
        out.append(
            f"mapped automatically (exactly one canonical stat matches; --no-auto-map to refuse all, --map KEY= "
            f"one): {safe_text(auto)}"
        )
        out.extend(f"  {safe_text(k)}: {safe_text(why)}" for k, why in d.keys.evidence.items())
    if d.keys.refused:
        out.append(safe_text("not mapped: " + "; ".join(f"{k}: {why}" for k, why in d.keys.refused.items())))
    if d.keys.unrecognised:
        out.append(f"unrecognised keys: {safe_text(', '.join(d.keys.unrecognised))}")
    if d.keys.suggestions:
        maps = " ".join(f"--map {k}={c}" for k, c in d.keys.suggestions.items())
        out.append(f"[yellow]these look like canonical stats[/yellow]; to read them, rerun with: {safe_text(maps)}")
    findings = findings_table(d)
    if findings is not None:
        out.append(findings)
    out.extend(safe_text(line) for line in incident_lines(d))
    unchecked = d.unchecked
    if unchecked:
        table = Table(title=f"could not check ({len(unchecked)} of {len(d.coverage)} detectors)")
        table.add_column("detector")
        table.add_column("why")
        for name, why in unchecked.items():
            table.add_row(safe_text(name), safe_text(why))
        out.append(table)
    if d.live_events:
        out.append(events_table(d.live_events, f"the live guard's events ({safe_text(str(d.live_events_path))})"))
    out.extend(f"[yellow]warning[/yellow]: {safe_text(w)}" for w in d.live_warnings)
    last = verdict(d) if final else None
    if last is not None:
        out.append(last)
    return out


def verdict(d: Diagnosis) -> str | None:
    """The last line where the tables above do not say it: could not judge, or no finding."""
    if d.read.partial and not d.critical:
        return (
            "[bold yellow]partial read[/bold yellow]: part of the log could not be read (above); this is not a clean "
            "bill of health (exit code 3)."
        )
    if not d.judged and d.critical:
        return (
            "[bold red]critical[/bold red] (exit code 1), although no detector but nonfinite had enough steps of "
            "the log's stats to judge them."
        )
    if not d.judged:
        return (
            "[bold yellow]could not judge[/bold yellow]: no detector but nonfinite had enough steps of its stats; "
            "this is not a clean bill of health (exit code 3)."
        )
    if not d.findings and not d.live_events and not d.critical:
        unchecked = d.unchecked
        checked = len(d.coverage) - len(unchecked)
        return f"[green]no finding[/green] from the {checked} detectors that could check this log" + (
            f"; {len(unchecked)} could not (above)." if unchecked else "."
        )
    return None


def replay_renderables(r: Replay) -> list[RenderableType]:
    """What ``rlguard doctor --live PRESET`` prints: what was replayed, the decisions step by step, the verdict."""
    counts = ", ".join(f"{o}s {r.count(o)}" for o in ("skip", "rollback", "halt"))
    out: list[RenderableType] = [
        f"{safe_text(str(r.read.log.path))} ({r.read.log.format}): {r.replayed} of {len(r.read.rows)} records replayed "
        f"through the live guard of preset {safe_text(r.preset)}: {counts}"
    ]
    if r.read.keys.auto_mapped:
        auto = ", ".join(f"{k} -> {c}" for k, c in r.read.keys.auto_mapped.items())
        out.append(f"mapped automatically (--no-auto-map, or --map KEY= to refuse): {safe_text(auto)}")
    if r.decisions:
        table = Table(title="decisions (outcomes other than step, and changes of controls)")
        for col in ("step", "outcome", "controls", "reason"):
            table.add_column(col)
        for d in r.decisions:
            controls = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.controls.items())
            outcome = d.outcome + (f" to {d.rollback_to}" if d.rollback_to is not None else "")
            table.add_row(str(d.step), outcome, safe_text(controls or "neutral"), safe_text(d.reason))
        out.append(table)
    verdicts = {
        1: "[bold red]the guard would have rolled back or halted this run[/bold red]",
        3: "[yellow]could not judge: no detector but nonfinite got past its warm-up, or part of the log is unread"
        "[/yellow]",
    }
    out.append(verdicts.get(r.exit_code, "the guard would have let the run go on (skips and control changes only)"))
    return out
