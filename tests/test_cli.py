"""The `rlguard` command: `losses` and `demo` run for real through typer's runner."""

from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.core_losses import get_objective, list_objectives
from rlguard.tasks import demo_batch

runner = CliRunner()


def test_losses_table_lists_every_objective_with_its_paper() -> None:
    result = runner.invoke(app, ["losses"])
    assert result.exit_code == 0, result.output
    for name in list_objectives():
        assert name in result.output
    assert "arXiv 2507.18071" in result.output and "arXiv 2402.03300" in result.output


def test_losses_json_matches_the_registry_defaults() -> None:
    result = runner.invoke(app, ["losses", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert sorted(rows) == list_objectives()
    assert rows["gspo"]["defaults"]["clip_low"] == 3e-4 and rows["gspo"]["defaults"]["clip_high"] == 4e-4
    assert rows["dapo"]["defaults"]["clip_high"] == 0.28 and rows["dapo"]["aggregation"] == "token-mean"
    assert rows["dr_grpo"]["aggregation"] == "seq-mean-token-sum-norm"


def test_demo_json_reports_each_objectives_loss_on_the_demo_batch() -> None:
    result = runner.invoke(app, ["demo", "--json", "--seed", "3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert sorted(report) == list_objectives()
    batch, _ = demo_batch(3)
    for name, res in report.items():
        expected = float(get_objective(name, beta=0.04)(batch).loss.detach())
        assert math.isclose(res["loss"], expected, rel_tol=1e-6), name
        assert all(math.isfinite(v) for v in res.values())


def test_demo_table_runs() -> None:
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    assert "gspo_token" in result.output and "clip_frac" in result.output


def test_detectors_lists_every_registered_detector_and_intervention() -> None:
    from rlguard.plugins import detector_registry, intervention_registry

    result = runner.invoke(app, ["detectors", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["name"] for r in data["detectors"]] == list(detector_registry())
    assert [r["name"] for r in data["interventions"]] == list(intervention_registry())
    table = runner.invoke(app, ["detectors"])
    assert table.exit_code == 0 and "entropy_collapse" in table.output and "rollback" in table.output
