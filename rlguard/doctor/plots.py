"""Matplotlib plots of canonical stats with guard events marked; matplotlib is imported only when plotting.

Figures are built on matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so
plotting works headless and leaves a user's pyplot state alone.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence

from rlguard._extras import EXTRA_OF
from rlguard.guards import Event

__all__ = ["plot_png", "plot_runs_png", "plots_missing"]

_COLOURS = {"warn": "#e69f00", "critical": "#d55e00"}
#: one colour per run of an overlaid plot (Okabe-Ito, distinguishable with colour-blindness)
_RUN_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#f0e442", "#000000")


def plots_missing() -> str | None:
    """Why no plot can be drawn here, in one line naming the extra that brings matplotlib; None when it can."""
    try:
        import matplotlib  # noqa: F401  (the plots' one dependency, not in the core install)
    except ModuleNotFoundError as err:
        module = (err.name or "matplotlib").partition(".")[0]
        extra = EXTRA_OF.get(module, "plots")
        return f'no plots: {module} is not installed (it comes with the {extra} extra: pip install "rlguard[{extra}]")'
    return None


def plot_png(
    steps: Sequence[int],
    series: dict[str, Sequence[float]],
    events: Sequence[Event] = (),
    title: str = "",
    actions: Sequence[Event] = (),
) -> bytes:
    """One PNG: each of ``series`` against ``steps`` (one panel per stat, shared x axis); ``events`` as coloured
    vertical lines at their steps, ``actions`` (the guard's interventions) as grey dashed lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = max(len(series), 1)
    fig = Figure(figsize=(8, 1.0 + 1.9 * n), dpi=90)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, values) in zip(axes, series.items(), strict=False):
        finite = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
        marker = "." if len(finite) < 60 else None
        ax.plot([s for s, _ in finite], [v for _, v in finite], color="#0072b2", lw=1.2, marker=marker)
        for s in (s for s, v in zip(steps, values, strict=True) if math.isinf(v)):
            ax.axvline(s, color=_COLOURS["critical"], lw=2, alpha=0.5)  # Inf cannot be drawn as a point
        if _spread(v for _, v in finite) > 50:
            ax.set_yscale("log")
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes:
        for e in events:
            ax.axvline(e.step, color=_COLOURS.get(e.severity, "black"), lw=1.5, alpha=0.8)
        for a in actions:
            ax.axvline(a.step, color="grey", lw=0.8, ls="--", alpha=0.6)
    if events:
        labels = {f"{e.detector} ({e.severity})": e.severity for e in events}
        for label, sev in labels.items():
            axes[0].plot([], [], color=_COLOURS.get(sev, "black"), label=label)
        axes[0].legend(fontsize=7, loc="best")
    axes[-1].set_xlabel("step")
    if title:
        axes[0].set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.12, right=0.97, top=1 - 0.5 / fig.get_figheight(), bottom=0.55 / fig.get_figheight())
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def plot_runs_png(
    runs: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    events: Mapping[str, Sequence[Event]] | None = None,
    title: str = "",
    ylabel: str = "",
) -> bytes:
    """One PNG with one panel: each run's ``(steps, values)`` in its own colour, NaN gaps skipped; each run's
    ``events`` as vertical lines in the run's colour, solid for a detector's finding and dashed for the guard's
    interventions (``action:*``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    events = events or {}
    fig = Figure(figsize=(8, 3.4), dpi=90)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i, (label, (steps, values)) in enumerate(runs.items()):
        colour = _RUN_COLOURS[i % len(_RUN_COLOURS)]
        finite = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
        marker = "." if len(finite) < 60 else None
        ax.plot([s for s, _ in finite], [v for _, v in finite], color=colour, lw=1.4, marker=marker, label=label)
        kinds: set[str] = set()
        for e in events.get(label, ()):
            kind = "intervention" if e.detector.startswith("action:") else "finding"
            ax.axvline(e.step, color=colour, lw=1.0, ls="--" if kind == "intervention" else "-", alpha=0.45)
            kinds.add(kind)
        for kind in sorted(kinds):
            ax.plot(
                [],
                [],
                color=colour,
                lw=1.0,
                ls="--" if kind == "intervention" else "-",
                alpha=0.6,
                label=f"{label}: guard {kind}s",
            )
    if _spread(v for _, values in runs.values() for v in values) > 50:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _spread(values: Iterable[float]) -> float:
    """max / min of the finite values (0 when any is <= 0): a span this wide reads better on a log scale."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or min(finite) <= 0:
        return 0.0
    return max(finite) / min(finite)
