"""The demo's settings and results: which runs, how long, and what each run reached (no framework import)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlguard.core_losses import list_objectives
from rlguard.guards import PRESETS, Event

#: faults a run can inject (``OBJECTIVE@FAULT``), each the same in a guarded and an unguarded run
FAULTS: dict[str, str] = {
    "lr_spike": "the learning rate x1000 for one optimizer step (DemoConfig.fault_step)",
}
#: the default runs: a healthy pair (GRPO; GSPO under the default guard) and a stressed pair (an LR spike, without
#: and with the strict guard)
DEFAULT_RUNS = "grpo,gspo+guard,grpo@lr_spike,grpo+strict@lr_spike"
#: the progress task of the supervised warm start
WARM_START = "warm start"
#: progress hook: (task: WARM_START or a run's label, steps done, total steps, the step's stats) -> None
ProgressHook = Callable[[str, int, int, dict[str, float]], None]
#: the stats of the summary and the overlaid plots, in that order
SUMMARY_STATS = ("reward_mean", "entropy", "kl_ref", "clip_frac")


@dataclass(frozen=True)
class RunSpec:
    """One run of the demo: an objective, a guard preset or ``None``, and a fault (:data:`FAULTS`) or ``None``."""

    objective: str
    guard: str | None = None
    fault: str | None = None

    @property
    def label(self) -> str:
        """``objective[+preset][@fault]``, as written in ``--objectives``."""
        guard = "" if self.guard is None else f"+{self.guard}"
        fault = "" if self.fault is None else f"@{self.fault}"
        return f"{self.objective}{guard}{fault}"

    @property
    def folder(self) -> str:
        """The run's folder name: ``objective[-guard-preset][-fault]``."""
        guard = "" if self.guard is None else f"-guard-{self.guard}"
        fault = "" if self.fault is None else f"-{self.fault.replace('_', '-')}"
        return f"{self.objective}{guard}{fault}"


def parse_runs(spec: str) -> tuple[RunSpec, ...]:
    """``"grpo,gspo+guard,grpo+strict@lr_spike"`` -> runs. Each comma-separated item is ``OBJECTIVE``, optionally
    followed by ``+PRESET`` (one of :data:`rlguard.guards.PRESETS`; ``guard`` means ``default``) and ``@FAULT``
    (one of :data:`FAULTS`). Bad items raise ``ValueError``."""
    runs = []
    for item in (s.strip() for s in spec.split(",")):
        head, _, fault = item.partition("@")
        objective, _, preset = head.partition("+")
        if objective not in list_objectives():
            raise ValueError(
                f"objectives: unknown objective {objective!r} in {spec!r}; use a comma-separated list of "
                f"{list_objectives()}, each optionally followed by +guard or +PRESET ({', '.join(PRESETS)}) "
                f"and @FAULT ({', '.join(FAULTS)})."
            )
        guard = None if not preset else "default" if preset == "guard" else preset
        if guard is not None and guard not in PRESETS:
            raise ValueError(
                f"objectives: unknown guard preset {preset!r} in {item!r}; use +guard (the default preset) or one of "
                f"{', '.join('+' + p for p in PRESETS)}."
            )
        if fault and fault not in FAULTS:
            raise ValueError(f"objectives: unknown fault {fault!r} in {item!r}; faults: {', '.join(FAULTS)}.")
        runs.append(RunSpec(objective, guard, fault or None))
    folders = [r.folder for r in runs]
    if len(set(folders)) != len(folders):
        raise ValueError(f"objectives: {spec!r} names the same run twice; name each objective+guard@fault once.")
    return tuple(runs)


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo; the defaults take a few minutes on two CPU cores, :meth:`quick` well under one.

    Attributes:
        steps: optimizer steps of each run.
        seed: seed of the model, the warm start, the prompts and TRL's sampling.
        runs: the runs, in order (:func:`parse_runs`).
        warm_start_steps: supervised steps before RL (:func:`rlguard.tasks.hf.warm_start`).
        prompts_per_step: prompts per optimizer step; each gets ``num_generations`` completions.
        num_generations: completions per prompt (GRPO's group size).
        num_iterations: optimizer passes over each generated batch (TRL's mu).
        steps_per_generation: optimizer steps per generated batch; the steps after a batch's first are off-policy,
            so the importance ratios and clip fractions are not trivially 1 and 0.
        learning_rate: AdamW learning rate (constant).
        beta: KL coefficient to the warm-started reference model.
        fault_step: the optimizer step of a run's fault (``@lr_spike``); default: a third of the way in (at
            least step 2, so that the guard has judged healthy steps and holds a snapshot).
        lr_spike: the factor of the ``lr_spike`` fault.
    """

    steps: int = 60
    seed: int = 0
    runs: tuple[RunSpec, ...] = field(default_factory=lambda: parse_runs(DEFAULT_RUNS))
    warm_start_steps: int = 100
    prompts_per_step: int = 16
    num_generations: int = 8
    num_iterations: int = 1
    steps_per_generation: int = 2
    learning_rate: float = 5e-4
    beta: float = 0.04
    fault_step: int | None = None
    lr_spike: float = 1000.0

    def __post_init__(self) -> None:
        if self.steps < 2:
            raise ValueError(f"steps must be >= 2 (a start and an end to compare); got {self.steps}.")
        if not self.runs:
            raise ValueError("runs must name at least one run (see parse_runs).")
        unknown = [r.objective for r in self.runs if r.objective not in list_objectives()]
        if unknown:
            raise ValueError(f"runs: objectives {unknown} are not registered; `rlguard losses` lists them.")
        if self.fault_step is not None and not 2 <= self.fault_step <= self.steps:
            raise ValueError(f"fault_step must be in [2, steps={self.steps}]; got {self.fault_step}.")

    @property
    def fault_at(self) -> int:
        """The optimizer step of a run's fault (:attr:`fault_step`, or a third of the way in, at least 2)."""
        return self.fault_step if self.fault_step is not None else max(2, self.steps // 3)

    @classmethod
    def quick(cls, **changes: Any) -> DemoConfig:
        """A short demo for tests and smoke checks: fewer steps and a shorter warm start."""
        return cls(**{"steps": 6, "warm_start_steps": 40, "prompts_per_step": 8, **changes})


@dataclass
class RunSummary:
    """One finished run.

    Attributes:
        spec: the run.
        folder: its TRL ``output_dir``.
        steps: the logged optimizer steps.
        series: canonical stat -> its value at each of ``steps`` (NaN where not logged).
        events: the guard's events (empty without a guard).
        accuracy_before, accuracy_after: share of the 100 sums answered exactly, greedy decoding.
        seconds: wall time of the run.
    """

    spec: RunSpec
    folder: Path
    steps: list[int]
    series: dict[str, list[float]]
    events: list[Event]
    accuracy_before: float
    accuracy_after: float
    seconds: float

    @property
    def label(self) -> str:
        """The run's label (:attr:`RunSpec.label`)."""
        return self.spec.label

    def window_mean(self, name: str, *, end: bool) -> float:
        """Mean of ``name`` over the first (``end=False``) or last fifth of the steps (at least 2 steps)."""
        values = self.series.get(name, [])
        k = max(2, len(values) // 5)
        part = [v for v in (values[-k:] if end else values[:k]) if math.isfinite(v)]
        return sum(part) / len(part) if part else math.nan

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (``NaN`` as ``None``)."""
        stats = {
            n: {"start": self.window_mean(n, end=False), "end": self.window_mean(n, end=True)} for n in SUMMARY_STATS
        }
        return {
            "run": self.label,
            "objective": self.spec.objective,
            "guard": self.spec.guard,
            "folder": str(self.folder),
            "steps": len(self.steps),
            **{name: {k: _json_float(v) for k, v in se.items()} for name, se in stats.items()},
            "accuracy": {"before": self.accuracy_before, "after": self.accuracy_after},
            "guard_events": [e.to_dict() for e in self.events],
            "seconds": round(self.seconds, 1),
        }


@dataclass
class DemoResult:
    """What the demo did and wrote.

    Attributes:
        out: the output folder.
        config: the settings used.
        runs: one summary per run, in order.
        report: ``out/report.html``.
        warm_start_seconds: wall time of the supervised warm start.
        seconds: wall time of the whole demo.
    """

    out: Path
    config: DemoConfig
    runs: list[RunSummary]
    report: Path
    warm_start_seconds: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary of the demo."""
        return {
            "out": str(self.out),
            "report": str(self.report),
            "steps": self.config.steps,
            "seed": self.config.seed,
            "warm_start_seconds": round(self.warm_start_seconds, 1),
            "seconds": round(self.seconds, 1),
            "runs": [r.to_dict() for r in self.runs],
        }


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None


def summary_rows(runs: Sequence[RunSummary]) -> list[dict[str, str]]:
    """The summary table's cells, one dict per run (shared by the terminal table and the HTML page)."""
    rows = []
    for r in runs:
        cells = {"run": r.label}  # the steps per run are in the title
        for name in SUMMARY_STATS:
            cells[name] = f"{_fmt(r.window_mean(name, end=False))} -> {_fmt(r.window_mean(name, end=True))}"
        cells["exact answers"] = f"{r.accuracy_before:.0%} -> {r.accuracy_after:.0%}"
        cells["guard events"] = "no guard" if r.spec.guard is None else _events_text(r.events)
        cells["time"] = f"{r.seconds:.0f} s"
        rows.append(cells)
    return rows


def _events_text(events: Sequence[Event]) -> str:
    if not events:
        return "none"
    counts: dict[str, int] = {}
    for e in events:
        counts[e.detector] = counts.get(e.detector, 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def _fmt(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.3g}"


__all__ = [
    "DEFAULT_RUNS",
    "FAULTS",
    "SUMMARY_STATS",
    "WARM_START",
    "DemoConfig",
    "DemoResult",
    "ProgressHook",
    "RunSpec",
    "RunSummary",
    "parse_runs",
    "summary_rows",
]
