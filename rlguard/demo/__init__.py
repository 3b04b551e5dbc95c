"""``rlguard demo``: real TRL GRPO runs of a tiny model on the embedded addition task, compared in one report.

>>> from rlguard.demo import DemoConfig, parse_runs, run_demo
>>> result = run_demo(DemoConfig(runs=parse_runs("grpo,grpo+strict@lr_spike")), "demo-out")  # doctest: +SKIP
>>> [(r.label, r.window_mean("reward_mean", end=False), r.window_mean("reward_mean", end=True)) for r in result.runs]

What it does, on CPU with no download:

1. builds the tiny random Llama of :mod:`rlguard.tasks.hf` and warm-starts it with a few seconds of supervised
   training on correct sums (:func:`~rlguard.tasks.hf.warm_start`): a random model almost never writes a right sum,
   so RL would have nothing to reinforce. The model is saved in ``OUT/model``; every run starts from it, and it is
   the runs' KL reference;
2. trains one copy per run with ``GuardedGRPOTrainer``, a real ``trl.GRPOTrainer`` whose loss is the run's rlguard
   objective (its paper's clip range and aggregation), with the run's guard preset if it names one and the run's
   fault if it names one (:func:`parse_runs`). The default runs (:data:`DEFAULT_RUNS`) are a healthy pair (GRPO;
   GSPO under the ``default`` guard) and a stressed pair: the same x1000 learning rate at one step, without and
   with the ``strict`` guard, so that the report shows a collapse and the guard's rescue side by side. Each run's
   TRL ``output_dir`` is ``OUT/<run folder>``, holding ``trainer_state.json`` and, with a guard, the guard's
   ``events.jsonl``, so that ``rlguard report`` and ``rlguard doctor`` read it;
3. writes ``OUT/report.html``: the runs' reward, entropy, KL and clip-fraction curves overlaid (PNGs beside the
   page) with the guard's events marked, the summary table, and each run's own ``rlguard report`` page.

Only :func:`run_demo` imports TRL (the ``trl`` extra: ``pip install 'rlguard[trl]'``).
"""

from __future__ import annotations

import time
from pathlib import Path

from rlguard.demo.runs import (
    DEFAULT_RUNS,
    FAULTS,
    SUMMARY_STATS,
    WARM_START,
    DemoConfig,
    DemoResult,
    ProgressHook,
    RunSpec,
    RunSummary,
    parse_runs,
    summary_rows,
)


def run_demo(
    config: DemoConfig, out: str | Path, on_progress: ProgressHook | None = None, command: str = ""
) -> DemoResult:
    """Warm-start the tiny model, train one copy per run of ``config.runs`` and write ``out/report.html``.

    ``on_progress(task, done, total, stats)`` is called after every warm-start step (task :data:`WARM_START`,
    stats ``{"loss": ...}``) and every logged training step (task: the run's label, stats: the step's canonical
    stats). ``command`` is shown in the report.
    """
    try:
        from rlguard.demo.train import demo_environment, train_run, warm_started_model
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(f"rlguard demo needs TRL: pip install 'rlguard[trl]' ({err}).") from err
    from rlguard.demo.report import write_demo_report

    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with demo_environment():
        model_dir, warm_seconds = warm_started_model(out / "model", config, on_progress)
        runs = [train_run(model_dir, out / spec.folder, spec, config, on_progress) for spec in config.runs]
    report = write_demo_report(out, runs, config, command)
    return DemoResult(out, config, runs, report, warm_seconds, time.perf_counter() - start)


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
    "run_demo",
    "summary_rows",
]
