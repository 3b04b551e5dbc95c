"""HTML pages: the doctor's self-contained report (PNGs embedded as base64) and ``rlguard report``'s run page."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape

from rlguard.doctor.diagnose import Diagnosis
from rlguard.doctor.plots import plot_png, plots_missing
from rlguard.guards import Event

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 960px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; width: 100%; margin: 1em 0; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
.critical { color: #b00; font-weight: bold; } .warn { color: #a60; font-weight: bold; }
img { max-width: 100%; } code { background: #f4f4f4; padding: 0 3px; }
"""


def page(title: str, body: Sequence[str]) -> str:
    """A complete HTML document."""
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_STYLE}</style></head>\n<body>\n<h1>{escape(title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def img_base64(png: bytes, alt: str) -> str:
    """An ``<img>`` with the PNG embedded."""
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _cls(severity: str) -> str:
    """The CSS class of a severity: only the two known names, never text from a file."""
    return severity if severity in ("warn", "critical") else ""


def events_table(events: Sequence[Event]) -> str:
    """Events as an HTML table (step, detector, severity, message); every field escaped."""
    if not events:
        return "<p>No events.</p>"
    rows = "".join(
        f'<tr><td>{escape(str(e.step))}</td><td>{escape(e.detector)}</td><td class="{_cls(e.severity)}">'
        f"{escape(e.severity)}</td><td>{escape(e.message)}</td></tr>"
        for e in events
    )
    return f"<table><tr><th>step</th><th>detector</th><th>severity</th><th>message</th></tr>{rows}</table>"


def doctor_html(diagnosis: Diagnosis) -> str:
    """The ``doctor --html`` page: summary, findings and one plot per finding, all in one file."""
    d = diagnosis
    body = [
        f"<p><code>{escape(str(d.log.path))}</code>: format <b>{escape(d.log.format)}</b>, {len(d.steps)} steps "
        f"({d.steps[0]} to {d.steps[-1]}), {len(d.findings)} finding(s).</p>",
        "<p>" + "<br>".join(escape(line) for line in d.read.lines()) + "</p>",
        "<p>Metrics read: "
        + ", ".join(f"<code>{escape(k)}</code> &rarr; {escape(v)}" for k, v in d.keys.mapped.items())
        + "</p>",
        "<p>Unrecognised keys: "
        + (", ".join(f"<code>{escape(k)}</code>" for k in d.keys.unrecognised) or "none")
        + "</p>",
    ]
    if d.keys.auto_mapped:
        auto = "".join(
            f"<li><code>{escape(k)}</code> &rarr; {escape(v)}: {escape(d.keys.evidence.get(k, ''))}</li>"
            for k, v in d.keys.auto_mapped.items()
        )
        body.append(f"<p>Mapped automatically (exactly one canonical stat matches):</p><ul>{auto}</ul>")
    if d.keys.refused:
        refused = "".join(f"<li><code>{escape(k)}</code>: {escape(why)}</li>" for k, why in d.keys.refused.items())
        body.append(f"<p>Not mapped:</p><ul>{refused}</ul>")
    if d.read.partial and not d.critical:
        body.append(
            "<p><b>Partial read</b> (exit code 3): part of the log could not be read. This is not a clean bill of "
            "health.</p>"
        )
    if not d.judged:
        body.append(
            "<p><b>Could not judge</b> (exit code 3): no detector but <code>nonfinite</code> had enough steps of its "
            "stats. This is not a clean bill of health.</p>"
        )
    elif not d.findings:
        checked = len(d.coverage) - len(d.unchecked)
        body.append(f"<p>No finding from the {checked} detectors that could check this log.</p>")
    if d.keys.suggestions:
        maps = " ".join(f"--map {k}={c}" for k, c in d.keys.suggestions.items())
        body.append(f"<p>These keys look like canonical stats; to read them: <code>{escape(maps)}</code></p>")
    if d.unchecked:
        rows = "".join(f"<tr><td>{escape(n)}</td><td>{escape(why)}</td></tr>" for n, why in d.unchecked.items())
        body.append(f"<h2>Could not check</h2><table><tr><th>detector</th><th>why</th></tr>{rows}</table>")
    if d.live_events or d.live_warnings:
        body.append(f"<h2>The live guard's events</h2><p><code>{escape(str(d.live_events_path))}</code></p>")
        body += [f"<p>{escape(w)}</p>" for w in d.live_warnings]
        body.append(events_table(d.live_events))
    missing = plots_missing() if d.findings else None
    if missing is not None:
        body.append(f"<p>{escape(missing)}</p>")
    for f in d.findings:
        body.append(
            f'<h2><span class="{_cls(f.severity)}">{escape(f.severity)}</span> {escape(f.detector)} from step '
            f"{escape(str(f.step))}</h2>"
            f"<p>{escape(f.message)}</p>"
        )
        names = [n for n in d.detector_metrics.get(f.detector, ()) if n in d.series]
        if names and missing is None:
            evs = [e for e in d.events if e.detector == f.detector]
            png = plot_png(d.steps, {n: d.series[n] for n in names}, evs, title=f"{f.detector} ({f.severity})")
            body.append(img_base64(png, f"{f.detector}: {', '.join(names)}"))
        elif missing is None:
            body.append("<p>(no stat of this detector in the log to plot)</p>")
    return page(f"rlguard doctor: {d.log.path.name}", body)
