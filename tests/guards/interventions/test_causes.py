"""The cause table (``rlguard.guards.interventions.causes``) is the one place that says which intervention answers
which cause: it names registered detectors and interventions, it drives the guard's hand-over, and ``rlguard
detectors`` prints exactly it."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.guards import Guard, GuardConfig
from rlguard.guards.interventions import CAUSES, Cause, handed_over
from rlguard.guards.registry import detector_registry, intervention_registry


def test_every_row_names_registered_detectors_and_interventions() -> None:
    detectors, interventions = detector_registry(), intervention_registry()
    for cause in CAUSES:
        assert cause.answer in interventions, cause
        assert set(cause.detectors) <= set(detectors), cause
        assert set(cause.yields) <= set(interventions), cause
        assert bool(cause.detectors) != bool(cause.evidence), cause  # a detector, or the stat read instead


def test_the_hand_over_follows_the_table_and_what_is_enabled() -> None:
    assert handed_over({"mismatch_remedy", "lr_backoff"}) == {"lr_backoff": frozenset({"mismatch_growth"})}
    assert handed_over({"lr_backoff"}) == {}  # nobody answers the gap: nobody yields
    table = (Cause("x", ("grad_norm_spike",), "skip_step", "skip", yields=("lr_backoff", "skip_step")),)
    # an intervention never yields to itself
    assert handed_over({"skip_step"}, table) == {"lr_backoff": frozenset({"grad_norm_spike"})}


def test_the_guard_hands_over_what_the_table_says() -> None:
    stable = GuardConfig.preset("stable")
    assert Guard(stable).handed_over == handed_over(Guard(stable).interventions)
    assert Guard(stable).handed_over == {"lr_backoff": frozenset({"mismatch_growth"})}
    assert Guard(GuardConfig.preset("default")).handed_over == {}


def test_rlguard_detectors_prints_the_table() -> None:
    result = CliRunner().invoke(app, ["detectors", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["remedies"]
    assert rows == [
        {
            "cause": c.diagnosis,
            "diagnosed_by": c.diagnosed_by,
            "remedies": c.remedies,
            "intervention": c.answer,
            "yields": list(c.yields),
        }
        for c in CAUSES
    ]
    assert rows[0]["diagnosed_by"] == "mismatch_growth" and rows[0]["yields"] == ["lr_backoff"]
    assert any(r["diagnosed_by"] == "update_ratio (no detector)" for r in rows)
