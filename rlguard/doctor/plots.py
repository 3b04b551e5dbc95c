"""Matplotlib plots of canonical stats with guard events marked; matplotlib is imported only when plotting.

Figures are built on matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so
plotting works headless and leaves a user's pyplot state alone.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence

from rlguard.guards import Event

_COLOURS = {"warn": "#e69f00", "critical": "#d55e00"}


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


def _spread(values: Iterable[float]) -> float:
    """max / min of the finite values (0 when any is <= 0): a span this wide reads better on a log scale."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or min(finite) <= 0:
        return 0.0
    return max(finite) / min(finite)
