"""``rlguard report RUN_DIR``: a plot per canonical stat of a run, with the guard's events marked.

The run's log is found as by :func:`rlguard.doctor.readers.find_log` (or is the log file given); events come from
the run's ``events.jsonl`` (``GuardConfig(events_path=...)`` writes it), found as the doctor finds it
(:func:`rlguard.doctor.readers.events_file`), when present. A detector's events are marked on the plots of
the stats it reads; the guard's interventions (``action:*``) on every plot. Without matplotlib (the ``plots``
extra) the page is written without plots, with a table of each stat's range instead, and says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from rlguard.doctor.canonical import CanonicalRows
from rlguard.doctor.diagnose import detector_metrics
from rlguard.doctor.html import events_table, page
from rlguard.doctor.inputs import STDIN, is_stream
from rlguard.doctor.keys import CANONICAL, DOCTOR_ONLY, classify_keys
from rlguard.doctor.plots import plot_png, plots_missing
from rlguard.doctor.readers import LogInputError, events_file, read_log
from rlguard.guards import Event, Guard, GuardConfig
from rlguard.guards.events import EventsFileError, read_events
from rlguard.metrics import REDUCTIONS as STAT_REDUCTIONS  # the metric table itself: no torch

#: plot order: the metric table's (docs/design.md, rlguard.metrics), then the derived and plot-only names
_ORDER: tuple[str, ...] = tuple(
    [k for k in STAT_REDUCTIONS if not k.startswith("_")] + sorted((CANONICAL | DOCTOR_ONLY) - set(STAT_REDUCTIONS))
)


@dataclass(frozen=True)
class ReportResult:
    """What ``rlguard report`` wrote.

    Attributes:
        html: the report page.
        images: canonical name -> its PNG (beside the page).
        marked: canonical name -> steps of the detector events marked on its plot.
        events: the events read from ``events.jsonl`` (empty if there was none).
        log_path: the log read.
        plots_missing: why the page has no plots (matplotlib not installed), or None.
    """

    html: Path
    images: dict[str, Path]
    marked: dict[str, list[int]]
    events: list[Event]
    log_path: Path
    plots_missing: str | None = None


def write_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    step_key: str | None = None,
    row_steps: bool = False,
    run: str | None = None,
) -> ReportResult:
    """Plot the canonical stats of the run in ``run_dir`` (a run folder, a log file, or ``-``, a pipe or a FIFO: a
    log read once and whole, as the doctor reads it) into ``out`` (default the run folder, or the log file's
    folder; a stream has none, so ``out`` is needed)/report.html; ``step_key``, ``row_steps``, ``run``: as
    :func:`~rlguard.doctor.readers.read_log`'s."""
    given = Path(run_dir)
    streamed = is_stream(run_dir)
    if streamed and out is None:  # refused before the stream is read
        source = "standard input" if str(run_dir) == STDIN else f"the pipe {given}"
        raise LogInputError(
            f"{given}: a log read from {source} has no run folder to write report.html into: give the folder with "
            f"--out, e.g. `rlguard report {given} --out report/`"
        )
    if not streamed and not given.exists():
        raise LogInputError(f"no such run folder or log file: {given}")
    log = read_log(given, step_key=step_key, row_steps=row_steps, run=run)
    run_dir = log.path if streamed else given if given.is_dir() else given.parent
    keys = classify_keys(log.keys, rows=log.rows)
    rows = CanonicalRows(log.rows, keys.key_map)  # auto-mapped keys too; steps without a stat left out
    if not keys.judged or not rows:
        raise LogInputError(f"no usable metric in {log.path} ({log.format}): no key maps to a canonical stat")
    events_path = None if log.streamed else events_file(given, log.path)
    try:
        read = read_events(events_path) if events_path is not None else None
    except EventsFileError as err:
        raise LogInputError(str(err)) from None
    events = read.events if read is not None else []
    actions = [e for e in events if e.detector.startswith("action:")]
    reads = detector_metrics(Guard(GuardConfig.preset("monitor")))
    out_dir = Path(out) if out is not None else run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = rows.steps
    images: dict[str, Path] = {}
    marked: dict[str, list[int]] = {}
    present = set(rows.names)
    missing = plots_missing()
    for name in (n for n in _ORDER if n in present and missing is None):
        mine = [e for e in events if name in reads.get(e.detector, ())]
        values = rows.series(name)
        png = plot_png(steps, {name: values}, mine, title=name, actions=actions)
        images[name] = out_dir / f"report_{name}.png"
        images[name].write_bytes(png)
        marked[name] = [e.step for e in mine]
    body = [
        f"<p>Run <code>{escape(str(run_dir))}</code>: log <code>{escape(str(log.path))}</code> "
        f"({escape(log.format)}), {len(steps)} steps ({steps[0]} to {steps[-1]}).</p>",
        "<p>" + "<br>".join(escape(line) for line in log.report.lines()) + "</p>",
        *(f"<p>{escape(w)}</p>" for w in (read.warnings if read is not None else [])),
        "<h2>Guard events</h2>",
        events_table(events) if events_path is not None else "<p>No events.jsonl in the run folder.</p>",
        "<h2>Metrics</h2>",
    ]
    body += [f'<h3>{escape(n)}</h3><img alt="{escape(n)}" src="{escape(p.name)}">' for n, p in images.items()]
    if missing is not None:
        body += [f"<p>{escape(missing)}</p>", _ranges_table([n for n in _ORDER if n in present], rows)]
    if keys.unrecognised:
        body.append(
            "<p>Unrecognised keys: " + ", ".join(f"<code>{escape(k)}</code>" for k in keys.unrecognised) + "</p>"
        )
    html = out_dir / "report.html"
    html.write_text(page(f"rlguard report: {run_dir.name}", body), encoding="utf-8")
    return ReportResult(html, images, marked, events, log.path, missing)


def _ranges_table(names: list[str], rows: Sequence[tuple[int, Mapping[str, float]]]) -> str:
    """Each stat's steps logged, first, last, smallest and largest finite value: the page's account of the run
    where it cannot plot it."""
    out = ["<table><tr><th>stat</th><th>steps</th><th>first</th><th>last</th><th>min</th><th>max</th></tr>"]
    for name in names:
        values = [stats[name] for _, stats in rows if name in stats]
        finite = [v for v in values if math.isfinite(v)]
        cells = [f"{v:.4g}" for v in (finite[0], finite[-1], min(finite), max(finite))] if finite else ["-"] * 4
        out.append(
            f"<tr><td>{escape(name)}</td><td>{len(values)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        )
    return "".join(out) + "</table>"
