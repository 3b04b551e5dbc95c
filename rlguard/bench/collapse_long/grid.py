"""The grid: every objective x guard x stressor x seed, on worker processes, resumable from ``runs.jsonl``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from rlguard.bench.collapse_long import train
from rlguard.bench.collapse_long.stressors import Stressor
from rlguard.bench.collapse_long.train import RunConfig, RunResult, result_from_json, result_to_json, run_one


def build_grid(
    objectives: Iterable[str],
    guards: Iterable[str],
    stressors: Iterable[Stressor],
    seeds: int,
    *,
    seed_offset: int = 0,
    **overrides: Any,
) -> list[RunConfig]:
    """Every combination, seeds ``seed_offset .. seed_offset + seeds - 1``; ``overrides`` set other
    :class:`RunConfig` fields. Seed-major order: a grid stopped part-way has every cell at about the same number
    of seeds (``--resume`` finishes it)."""
    if seeds < 1 or seed_offset < 0:
        raise ValueError(f"seeds must be >= 1 and seed_offset >= 0; got seeds={seeds}, seed_offset={seed_offset}.")
    objectives, guards, stressors = list(objectives), list(guards), list(stressors)
    return [
        RunConfig(objective=o, guard=g, stressor=s, seed=seed, **overrides)  # type: ignore[arg-type]
        for seed in range(seed_offset, seed_offset + seeds)
        for s in stressors
        for o in objectives
        for g in guards
    ]


def _init_worker(warm_cache: str | None) -> None:
    torch.set_num_threads(1)
    train.WARM_START_CACHE.clear()
    if warm_cache is not None:
        train.WARM_START_CACHE.append(Path(warm_cache))


def run_grid(
    configs: Sequence[RunConfig],
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


def config_key(config: RunConfig) -> str:
    """A run's identity in ``runs.jsonl`` (every field of its configuration)."""
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def read_log(path: Path) -> list[RunResult]:
    """The runs recorded in a ``runs.jsonl`` (none if it does not exist)."""
    if not path.is_file():
        return []
    return [result_from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def log_line(result: RunResult) -> str:
    """One ``runs.jsonl`` line."""
    return json.dumps(result_to_json(result)) + "\n"
