"""The demo's ``report.html``: the runs' curves overlaid (PNGs beside the page), guard events marked, the summary
table, and each run's own ``rlguard report`` page (:func:`rlguard.doctor.write_report`)."""

from __future__ import annotations

from html import escape
from pathlib import Path

from rlguard.demo.runs import SUMMARY_STATS, DemoConfig, RunSummary, summary_rows
from rlguard.doctor import write_report
from rlguard.doctor.diagnose import detector_metrics
from rlguard.doctor.html import events_table, page
from rlguard.doctor.plots import plot_runs_png
from rlguard.guards import Event, Guard, GuardConfig

#: what each overlaid plot shows
STAT_TITLES = {
    "reward_mean": "mean reward of the sampled completions (1 = exact sum)",
    "entropy": "mean per-token entropy of the policy",
    "kl_ref": "KL to the warm-started reference model (k3)",
    "clip_frac": "fraction of completion tokens whose term was clipped (0 on each batch's first, on-policy step)",
}


def write_demo_report(out: Path, runs: list[RunSummary], config: DemoConfig, command: str = "") -> Path:
    """Write ``out/report.html`` with ``out/demo_<stat>.png`` for each of :data:`SUMMARY_STATS`, and each run's
    own report (``<run folder>/report.html``); return the page's path."""
    images = []
    for name in SUMMARY_STATS:
        series = {r.label: (r.steps, r.series[name]) for r in runs if name in r.series}
        if not series:
            continue
        marked = {r.label: _marked(r, name) for r in runs}
        png = out / f"demo_{name}.png"
        png.write_bytes(plot_runs_png(series, marked, title=STAT_TITLES.get(name, name), ylabel=name))
        images.append((name, png))
    run_pages = {r.label: write_report(r.folder).html for r in runs}
    body = [
        "<p>Tiny random Llama (about 280K parameters) with a character tokenizer, warm-started for "
        f"{config.warm_start_steps} supervised steps on single-digit sums, then trained with TRL's GRPOTrainer "
        f"(rlguard's GuardedGRPOTrainer) for {config.steps} steps per run: {config.prompts_per_step} prompts "
        f"&times; {config.num_generations} completions per step, learning rate {config.learning_rate:g}, "
        f"beta {config.beta:g}, seed {config.seed}.</p>",
    ]
    if command:
        body.append(f"<p>Command: <code>{escape(command)}</code></p>")
    body += ["<h2>Summary</h2>", _summary_table(runs), "<h2>Curves</h2>"]
    body += [f'<h3>{escape(n)}</h3><img alt="{escape(n)}" src="{p.name}">' for n, p in images]
    body.append("<h2>Guard events</h2>")
    for r in runs:
        body.append(f"<h3>{escape(r.label)}</h3>")
        body.append("<p>No guard.</p>" if r.spec.guard is None else events_table(r.events))
    body.append("<h2>Runs</h2><ul>")
    for r in runs:
        link = run_pages[r.label].relative_to(out)
        body.append(
            f'<li><b>{escape(r.label)}</b>: <a href="{escape(str(link))}">{escape(str(link))}</a> (every logged '
            f"stat); <code>rlguard doctor {escape(str(r.folder))}</code> diagnoses its log.</li>"
        )
    body.append("</ul>")
    html = out / "report.html"
    html.write_text(page("rlguard demo", body), encoding="utf-8")
    return html


def _marked(run: RunSummary, name: str) -> list[Event]:
    """The run's events that belong on the plot of ``name``: its detectors reading ``name`` and every action."""
    if run.spec.guard is None:
        return []
    reads = detector_metrics(Guard(GuardConfig.preset(run.spec.guard)))
    return [e for e in run.events if e.detector.startswith("action:") or name in reads.get(e.detector, ())]


def _summary_table(runs: list[RunSummary]) -> str:
    rows = summary_rows(runs)
    head = "".join(f"<th>{escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{escape(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
