"""Safe automatic mapping (issue 36, part 5): a key is mapped onto a canonical stat by its name only when its values
are evidence for the stat: never from a configuration record or a key under ``args/``, ``config/``, ``hparams/``,
never a constant series, only values in the stat's domain (:data:`rlguard.doctor.domains.DOMAINS`); each mapping is
printed with its evidence, and ``--map KEY=`` refuses one."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import classify_keys, diagnose, parse_key_map, read_log
from rlguard.doctor.domains import DOMAINS
from rlguard.metrics import METRICS

runner = CliRunner()


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _training(steps: int = 60) -> list[dict[str, Any]]:
    """A hand-written loop's own names: a rising reward, an entropy near 1, a policy ratio around 1."""
    return [
        {
            "step": i + 1,
            "reward_avg": 0.2 + 0.6 * i / steps + 0.02 * math.sin(i),
            "entropy_avg": 1.0 + 0.05 * math.cos(i),
            "policy_ratio": 1.0 + 0.01 * math.sin(3 * i),
            "loss": 0.1 * math.cos(i),
        }
        for i in range(steps)
    ]


def test_the_arguments_record_is_not_mapped(tmp_path: Path) -> None:
    """A JSONL whose first record holds the run's arguments (read as ``args/entropy_beta``, ...): before, each
    matched one canonical stat and was mapped (``args/kl_coef -> kl_ref``). Without a step among records with one,
    it is no training step: not read as one (counted), so none of its keys can be mapped; with a step, its keys
    under ``args/`` are refused."""
    args = {"args": {"entropy_beta": 0.01, "kl_coef": 0.04, "lr": 1e-6}}
    for first in (args, {"step": 0, **args}):
        d = diagnose(_write(tmp_path / "run.jsonl", [first, *_training()]))
        assert d.keys.auto_mapped == {
            "entropy_avg": "entropy",
            "policy_ratio": "ratio_mean",
            "reward_avg": "reward_mean",
        }
        assert "kl_ref" not in d.series and "lr" not in d.series
    for key in ("args/entropy_beta", "args/kl_coef", "args/lr"):  # the second: a step, so a row, refused by name
        assert "a run's configuration" in d.keys.refused[key], d.keys.refused


def test_a_configuration_record_without_a_prefix_is_not_mapped(tmp_path: Path) -> None:
    """A first record that holds none of the log's per-step keys is configuration, whatever its keys' names."""
    config = {"step": 0, "entropy_beta": 0.01, "kl_coef": 0.04}
    d = diagnose(_write(tmp_path / "run.jsonl", [config, *_training()]))
    assert "entropy_beta" not in d.keys.auto_mapped and "kl_coef" not in d.keys.auto_mapped
    assert "only in configuration records (step 0)" in d.keys.refused["kl_coef"]
    assert d.keys.auto_mapped["entropy_avg"] == "entropy"


def test_a_constant_series_is_not_mapped(tmp_path: Path) -> None:
    """verl's ``response/aborted_ratio`` is 0 on every step of a run that aborts nothing: it is no ratio, and a
    constant is nothing to judge (before, the live table showed ``ratio_mean 0``)."""
    records = [{**r, "response/aborted_ratio": 0.0} for r in _training()]
    for r in records:
        del r["policy_ratio"]
    d = diagnose(_write(tmp_path / "run.jsonl", records))
    assert "response/aborted_ratio" not in d.keys.auto_mapped
    assert "constant (0 on 60 records)" in d.keys.refused["response/aborted_ratio"]
    assert "ratio_mean" not in d.series


@pytest.mark.parametrize(
    ("key", "values", "why"),
    [
        ("completions / clipped_ratio", [0.0, 0.25, 0.75, 1.0], "never above 1, a fraction"),  # a fraction
        ("aborted_ratio", [0.0, 0.01, 0.02, 0.0], "median"),  # a fraction near 0, not a ratio near 1
        ("entropy_bonus_loss", [-0.01, -0.012, -0.009, -0.011], "outside [0, inf]"),  # -coef x entropy
        ("clip_fraction_pct", [5.0, 12.0, 8.0, 20.0], "outside [0, 1]"),  # percent, not a fraction
    ],
)
def test_values_outside_the_stats_domain_are_not_mapped(
    tmp_path: Path, key: str, values: list[float], why: str
) -> None:
    records = [{**r, key: values[i % len(values)]} for i, r in enumerate(_training())]
    for r in records:
        del r["policy_ratio"]
    log = read_log(_write(tmp_path / "run.jsonl", records))
    report = classify_keys(log.keys, rows=log.rows)
    assert key not in report.auto_mapped and key not in report.suggestions
    assert why in report.refused[key], report.refused


def test_each_mapping_is_printed_with_its_evidence(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", _training())
    result = runner.invoke(app, ["doctor", str(path)])
    assert "mapped automatically" in result.stdout, result.output
    assert "policy_ratio: its words (policy ratio) match ratio_mean alone; 60 records, values" in result.stdout
    doc = json.loads(runner.invoke(app, ["doctor", str(path), "--json"]).stdout)
    assert (
        set(doc["auto_map_evidence"]) == set(doc["auto_mapped_keys"]) == {"entropy_avg", "policy_ratio", "reward_avg"}
    )
    assert "a ratio is >= 0 and its mean is near 1" in doc["auto_map_evidence"]["policy_ratio"]


def test_map_with_no_name_refuses_one_key(tmp_path: Path) -> None:
    """``--map KEY=`` refuses KEY (its automatic mapping or the table's) and leaves the others."""
    path = _write(tmp_path / "run.jsonl", [{**r, "kl": 0.01 + 0.001 * i} for i, r in enumerate(_training())])
    doc = json.loads(
        runner.invoke(app, ["doctor", str(path), "--json", "--map", "policy_ratio=", "--map", "kl="]).stdout
    )
    assert doc["auto_mapped_keys"] == {"entropy_avg": "entropy", "reward_avg": "reward_mean"}
    assert doc["refused_keys"] == {"kl": "refused with --map KEY=", "policy_ratio": "refused with --map KEY="}
    assert "kl" not in doc["mapped_keys"]
    assert parse_key_map(["policy_ratio=", "score=reward_mean"]) == {"policy_ratio": "", "score": "reward_mean"}


def test_without_the_logs_values_nothing_is_mapped_automatically() -> None:
    report = classify_keys(["reward_avg", "loss"])
    assert report.auto_mapped == {} and report.suggestions == {"reward_avg": "reward_mean"}


def test_every_domain_names_a_canonical_stat_and_fits_its_own_typical_values() -> None:
    names = {m.name for m in METRICS}
    assert set(DOMAINS) <= names
    typical = {"entropy": [0.3, 1.2], "ratio_mean": [0.98, 1.03], "ratio_max": [1.5, 8.0], "truncated_frac": [0, 0.4]}
    typical |= {"kl_ref": [-0.001, 0.02, 0.05], "mismatch_prob_corr": [0.97, 0.99], "ratio_min": [0.2, 0.6]}
    for name, values in typical.items():
        assert DOMAINS[name].misfit([float(v) for v in values]) is None, name


@pytest.mark.parametrize("segment", ["args", "config", "hparams"])
def test_keys_under_a_configuration_segment_are_refused(tmp_path: Path, segment: str) -> None:
    """Keys under ``args/``, ``config/`` or ``hparams/`` are the run's configuration, even logged on every step and
    changing (a schedule's coefficient): never mapped onto a stat."""
    records = [{**r, f"{segment}/kl_coef": 0.01 * (1 + i % 3)} for i, r in enumerate(_training())]
    d = diagnose(_write(tmp_path / "run.jsonl", records))
    assert f"{segment}/kl_coef" not in d.keys.auto_mapped and "kl_ref" not in d.series
    assert f"under {segment}/, a run's configuration" in d.keys.refused[f"{segment}/kl_coef"]


def test_verl_aborted_ratio_is_no_importance_ratio(tmp_path: Path) -> None:
    """verl's ``response/aborted_ratio`` (a share of aborted responses, near 0, not constant here) in verl's own file
    format: refused by its values (a fraction, median far from 1), so the live table never shows ``ratio_mean 0``."""
    from tests.helpers.doctor_logs import shaped_stream, write_verl_jsonl

    path = write_verl_jsonl(shaped_stream(40, 0), tmp_path / "run.jsonl")
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for i, line in enumerate(lines):
        line["data"]["response/aborted_ratio"] = [0.0, 0.0, 0.015625, 0.0][i % 4]
    _write(path, lines)
    d = diagnose(path)
    assert "response/aborted_ratio" not in d.keys.mapped and "ratio_mean" not in d.series
    assert "median 0 outside [0.5, 2]" in d.keys.refused["response/aborted_ratio"], d.keys.refused
