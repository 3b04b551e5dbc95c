"""Changes to a log that must not change the doctor's verdict: units of a stat judged only in log space, where the
steps start, the order of the columns (``benchmarks/doctor_blind.py invariance`` runs the same on the real logs).

A verdict here is each finding's detector, severity and step (counted from the log's first step), the critical
steps and the reported onset. Stats with an absolute bound in their own units (KL and entropy in nats, lengths in
tokens, fractions) are not scale-free, and a rescale may change their verdict by design; the gradient norm's
detectors judge ratios and robust z-scores of its logarithm only (their floor, 1e-8, aside), so a change of its
units (a norm before or after a loss scale, a sum instead of a mean over parameters) changes no verdict.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlguard.doctor import Diagnosis
from rlguard.doctor.columns import Columns
from rlguard.doctor.diagnose import diagnose_log
from rlguard.doctor.readers import MetricLog
from tests.helpers.synthetic import failing_stream, healthy_stream

STEPS, ONSET = 200, 110
Rows = list[tuple[int, dict[str, float]]]


def _rows(mode: str | None, seed: int) -> Rows:
    stream = healthy_stream(STEPS, seed) if mode is None else failing_stream(mode, STEPS, ONSET, seed)
    return [(i + 1, dict(stats)) for i, stats in enumerate(stream)]


def _judge(rows: Rows, folder: Path) -> Diagnosis:
    table = Columns()
    for step, stats in rows:
        table.append(step, stats)
    path = folder / "run.jsonl"  # never written: the doctor looks beside it for an events file, and finds none
    return diagnose_log(MetricLog("jsonl", path, table), path)


def _verdict(d: Diagnosis) -> tuple[Any, ...]:
    first = d.steps[0]
    critical = sorted({e.step - first for e in d.events if e.severity == "critical"})
    found = sorted((f.detector, f.severity, f.severity_step - first) for f in d.findings)
    return found, critical, None if d.onset is None else d.onset - first


def _scaled(stat: str, c: float) -> Callable[[Rows], Rows]:
    return lambda rows: [(s, {k: v * c if k == stat else v for k, v in r.items()}) for s, r in rows]


def _shifted(first: int) -> Callable[[Rows], Rows]:
    return lambda rows: [(s - rows[0][0] + first, r) for s, r in rows]


def _reordered(seed: int | None) -> Callable[[Rows], Rows]:
    def apply(rows: Rows) -> Rows:
        keys = list(rows[0][1])
        keys.reverse() if seed is None else random.Random(seed).shuffle(keys)
        return [(s, {k: r[k] for k in keys if k in r}) for s, r in rows]

    return apply


CHANGES: dict[str, Callable[[Rows], Rows]] = {
    "grad_norm x0.1": _scaled("grad_norm", 0.1),
    "grad_norm x10": _scaled("grad_norm", 10.0),
    "steps from 0": _shifted(0),
    "steps from 1001": _shifted(1001),
    "columns reversed": _reordered(None),
    "columns shuffled": _reordered(3),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("mode", [None, "grad_spike", "grad_explosion", "entropy_collapse", "kl_ref_blowup"])
def test_the_verdict_does_not_depend_on_units_steps_or_column_order(
    tmp_path: Path, mode: str | None, change: str
) -> None:
    rows = _rows(mode, seed=1)
    before = _judge(rows, tmp_path)
    if mode is not None:  # the verdict compared is one that found the failure
        assert before.findings, mode
    assert _verdict(_judge(CHANGES[change](rows), tmp_path)) == _verdict(before)


def test_an_absolute_bound_is_not_scale_free(tmp_path: Path) -> None:
    """The control of the test above: KL to the reference has a bound in nats (2, critical), so the same healthy
    run with its KL logged 100x larger (a sum over 100 tokens instead of a mean) is judged differently."""
    rows = _rows(None, seed=1)
    assert _verdict(_judge(_scaled("kl_ref", 100.0)(rows), tmp_path)) != _verdict(_judge(rows, tmp_path))


def _blind() -> Any:
    """``benchmarks/doctor_blind.py`` (its perturbations and the real logs' labels), imported from its folder."""
    import importlib
    import sys

    folder = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("doctor_blind")


BLIND = _blind()
REAL = BLIND.log_paths()
#: a verl log with a gradient norm (a collapse), a TRL trainer_state (a collapse), a CSV (healthy)
REAL_LOGS = (
    "opd-qwen3-4b-gjvwlq13.verl.jsonl",
    "nipsgrpo-qwen25-7b-rho0.30-s42.trainer_state.json",
    "verl-ppo-gemma2-2b-gsm8k.verl.jsonl",
)


@pytest.mark.parametrize("name", REAL_LOGS)
def test_a_real_log_s_verdict_does_not_depend_on_units_steps_or_column_order(name: str) -> None:
    """The principled invariances on real logs read in place (skipped where ``../shared`` is absent); all 42:
    ``python benchmarks/doctor_blind.py invariance``."""
    if name not in REAL:
        pytest.skip(f"real log {name} not found (../shared/doctor_foreign or doctor_foreign2)")
    verdict, path = BLIND.ALL_VERDICTS[name], REAL[name]
    log, rows = BLIND.read_rows(path, verdict)
    mapped = BLIND._mapped(log, verdict)
    base = BLIND.judge_rows(log, path, rows, verdict)
    assert base.critical or verdict.kind == "healthy", name
    for label, (how, stat, must) in BLIND.PERTURBATIONS.items():
        if not must or (stat is not None and stat not in mapped.values()):
            continue
        got = BLIND.judge_rows(log, path, how(rows, mapped), verdict)
        assert BLIND.signature(got, got.steps[0]) == BLIND.signature(base, base.steps[0]), (name, label)
