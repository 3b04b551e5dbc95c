"""The grid of runs (pi_old convention x stressor x objective x guard x seed) of one task, on worker processes,
its resumable log (``runs.jsonl``), and the order its reports list runs in.

See :mod:`rlguard.bench.collapse` for the design.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from rlguard.bench.collapse import loop
from rlguard.bench.collapse.loop import run_one
from rlguard.bench.collapse.report import ReportLayout
from rlguard.bench.collapse.spec import GUARDS, OLD_LOGPROBS, BaseRunConfig, BaseStressor, RunResult


@dataclass(frozen=True)
class TaskSpec:
    """A task as the command line and the report see it.

    Attributes:
        config_type: the task's run configuration (a :class:`~rlguard.bench.collapse.spec.BaseRunConfig`
            subclass implementing the task's hooks); its ``task`` is the name on the command line.
        description: one line for ``--help``.
        objectives, guards: the default grid's.
        default_out: where results go by default.
        quick_objectives, quick_stressors, quick_overrides: ``--quick`` (1 seed): a smoke test of every layer.
        layout: what the report shows.
    """

    config_type: type[BaseRunConfig]
    description: str
    objectives: tuple[str, ...]
    guards: tuple[str, ...]
    default_out: str
    quick_objectives: tuple[str, ...]
    quick_stressors: tuple[str, ...]
    quick_overrides: dict[str, Any]
    layout: ReportLayout

    @property
    def name(self) -> str:
        """The task's name (``--task``)."""
        return self.config_type.task

    @property
    def stressors(self) -> tuple[str, ...]:
        """The task's stressor names, in report order."""
        return self.config_type.stressor_type().NAMES

    @property
    def grid_stressors(self) -> tuple[str, ...]:
        """The default grid's stressors (``--stressors`` unset): the opt-in ones left out."""
        kind = self.config_type.stressor_type()
        return kind.NAMES if kind.GRID is None else kind.GRID

    def read_row(self, data: dict[str, Any]) -> RunResult:
        """A ``runs.jsonl`` row of this task."""
        return RunResult.from_json(data, self.config_type)


def build_grid(
    spec: TaskSpec,
    *,
    objectives: Iterable[str] | None = None,
    guards: Iterable[str] | None = None,
    stressors: Iterable[str | BaseStressor] | None = None,
    seeds: int = 8,
    seed_offset: int = 0,
    old_logprobs: Iterable[str] = ("engine",),
    **overrides: Any,
) -> list[BaseRunConfig]:
    """Every combination for ``spec``'s task (its default grid where an argument is None; a stressor by name takes
    the task's calibrated strength), seeds ``seed_offset .. seed_offset + seeds - 1``; ``overrides`` set other
    fields of the task's run configuration.

    Seed-major order: a run stopped part-way has every cell at the same number of seeds (give ``--resume``).
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1; got {seeds}.")
    if seed_offset < 0:
        raise ValueError(f"seed_offset must be >= 0; got {seed_offset}.")
    make_stressor = spec.config_type.stressor_type()
    cells = [
        (c, s if isinstance(s, BaseStressor) else make_stressor(s), o, g)
        for c in old_logprobs
        for s in (spec.grid_stressors if stressors is None else stressors)
        for o in (spec.objectives if objectives is None else objectives)
        for g in (spec.guards if guards is None else guards)
    ]
    return [
        spec.config_type(objective=o, guard=g, stressor=s, seed=seed, old_logprobs=c, **overrides)  # type: ignore[arg-type]
        for seed in range(seed_offset, seed_offset + seeds)
        for c, s, o, g in cells
    ]


def _init_worker(warm_cache: str | None) -> None:
    torch.set_num_threads(1)
    loop.WARM_START_CACHE.clear()
    if warm_cache is not None:
        loop.WARM_START_CACHE.append(Path(warm_cache))


def run_grid(
    configs: Sequence[BaseRunConfig],
    *,
    workers: int = 2,
    warm_cache: Path | None = None,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run ``configs`` on ``workers`` processes (one torch thread each; warm starts shared through
    ``warm_cache``); results in the order of ``configs``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1; got {workers}.")
    cache = None if warm_cache is None else str(warm_cache)
    results: dict[int, RunResult] = {}
    if workers == 1:
        _init_worker(cache)
        for i, cfg in enumerate(configs):
            results[i] = run_one(cfg)
            if on_result is not None:
                on_result(results[i])
    else:
        ctx = get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(cache,)) as pool:
            futures = {pool.submit(run_one, cfg): i for i, cfg in enumerate(configs)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if on_result is not None:
                    on_result(results[futures[fut]])
    return [results[i] for i in range(len(configs))]


# -- the log --------------------------------------------------------------------------------------------------------
def read_log(path: Path, config_type: type[BaseRunConfig]) -> list[RunResult]:
    """The runs recorded in a ``runs.jsonl`` of ``config_type``'s task (none if the file does not exist)."""
    if not path.is_file():
        return []
    results = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            results.append(RunResult.from_json(json.loads(line), config_type))
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(
                f"{path}:{n} is not a run of the {config_type.task!r} task ({type(err).__name__}: {err}); give the "
                "task that wrote it (--task) or another --out."
            ) from err
    return results


def log_line(result: RunResult) -> str:
    """One ``runs.jsonl`` line."""
    return json.dumps(result.to_json()) + "\n"


def canonical_order(results: Iterable[RunResult], objectives: Sequence[str]) -> list[RunResult]:
    """``results`` in the grid's order whatever order they were recorded in: by seed, pi_old convention, the task's
    stressor order, ``objectives`` (others after them, by name) and guard; so a report does not depend on the
    history of the invocations that filled the log."""

    def rank(r: RunResult) -> tuple[Any, ...]:
        c = r.config
        names = c.stressor.NAMES
        o = objectives.index(c.objective) if c.objective in objectives else len(objectives)
        return (
            c.seed,
            OLD_LOGPROBS.index(c.old_logprobs),
            names.index(c.stressor.name),
            o,
            c.objective,
            GUARDS.index(c.guard),
        )

    return sorted(results, key=rank)
