"""The remedies for stale samples (issue 38, part 4): ``StalenessRemedy`` tells staleness from the engine's gap by
the gap by age, switches on the existing correction, lowers the pipeline's staleness bound on a critical
consequence and restores it after recovery; the cause table, the ``stable`` preset and ``rlguard detectors`` show
it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor.events_only import events_only
from rlguard.doctor.html import events_table
from rlguard.guards import Controls, Guard, GuardConfig
from rlguard.guards.actuation import CAPABILITIES
from rlguard.guards.decision import Proposal, decision_action
from rlguard.guards.events import Finding, read_events
from rlguard.guards.interventions import CAUSES, StepContext
from rlguard.guards.interventions.staleness_remedy import StalenessRemedy
from tests.helpers.mismatch import NO_ROLLOUT, WITH_ROLLOUT, trouble

PIPELINE = NO_ROLLOUT | {"staleness_bound", "drop_stale"}
AGE0, AGE1, AGE2_3, AGE4 = (
    "mismatch_logp_abs_mean_age0",
    "mismatch_logp_abs_mean_age1",
    "mismatch_logp_abs_mean_age2_3",
    "mismatch_logp_abs_mean_age4plus",
)


def at(
    step: int,
    stats: dict[str, float],
    caps: frozenset[str] | None = PIPELINE,
    findings: dict[str, Finding] | None = None,
) -> StepContext:
    return StepContext(step, stats, findings or {}, {}, {}, 0, None, capabilities=caps)


def step(remedy: StalenessRemedy, ctx: StepContext) -> Proposal:
    """The remedy's proposal, which must be one."""
    proposal = remedy.propose(ctx)
    assert proposal is not None
    return proposal


def feed(
    remedy: StalenessRemedy, gaps: dict[str, float], steps: range, caps: frozenset[str] = PIPELINE
) -> list[Proposal | None]:
    """One bucket per step, cycling through ``gaps`` (as a pipeline whose batches have one age each); the bound 8."""
    names = list(gaps)
    return [
        remedy.propose(at(s, {names[s % len(names)]: gaps[names[s % len(names)]], "staleness_bound": 8.0}, caps))
        for s in steps
    ]


def test_a_gap_that_grows_with_age_is_staleness_and_gets_the_kept_gradient() -> None:
    r = StalenessRemedy()
    out = feed(r, {AGE0: 0.01, AGE1: 0.03, AGE4: 0.2}, range(3))
    assert out[:2] == [None, None]
    last = out[2]
    assert last is not None and last.controls == {"kept_gradient": True}
    assert r.stale() == AGE4 and "stale samples" in last.reason


def test_a_gap_as_large_at_age_0_is_the_engines_not_staleness() -> None:
    """0.3 at every age: the engine's numerics (``mismatch_remedy``'s), nothing here."""
    r = StalenessRemedy()
    assert set(feed(r, {AGE0: 0.3, AGE1: 0.31, AGE4: 0.35}, range(30))) == {None}
    # the excess and the ratio are both needed: +0.05 over 0.01 is 6x but less than 0.08 nats per token
    r = StalenessRemedy()
    assert set(feed(r, {AGE0: 0.01, AGE2_3: 0.06}, range(30))) == {None}
    # without an on-policy reference the engine's share is unknown: no diagnosis
    r = StalenessRemedy()
    assert set(feed(r, {AGE4: 0.5}, range(30))) == {None}


def test_a_drift_past_the_objectives_own_clip_range_is_staleness() -> None:
    """GSPO's sequence clip (3e-4/4e-4): a drift of 0.02 nats per token puts its stale samples outside it, though it
    is far below the engine's warn level 0.08; GRPO's clip (0.2: 0.182 in log-ratio units) leaves 0.08 in force."""
    from rlguard.core_losses import get_objective

    gspo, grpo = get_objective("gspo").clip_log_width(), get_objective("grpo").clip_log_width()
    assert gspo == pytest.approx(-math.log(1 - 3e-4)) and grpo == pytest.approx(math.log(1.2))
    assert get_objective("cispo").clip_log_width() is None  # its truncated weight zeroes no gradient

    def run(width: float | None) -> tuple[list[Proposal | None], StalenessRemedy]:
        r = StalenessRemedy()
        extra = {} if width is None else {"clip_log_width": width}
        out = [
            r.propose(at(s, {**extra, (AGE0, AGE1)[s % 2]: (0.001, 0.02)[s % 2], "staleness_bound": 2.0}))
            for s in range(4)
        ]
        return out, r

    out, r = run(gspo)
    assert out[1] is not None and out[1].controls == {"kept_gradient": True} and r.stale() == AGE1
    assert r.excess_bound() == pytest.approx(gspo) and "drift that matters: 0.0003" in out[1].reason
    for width in (grpo, None):  # the engine's warn level, 0.08, is the smaller bound
        out, r = run(width)
        assert out == [None] * 4 and r.excess_bound() == 0.08
    # the width read is the last reported, kept in the remedy's state
    out, r = run(gspo)
    restored = StalenessRemedy()
    restored.load_state_dict(r.state_dict())
    assert restored.excess_bound() == pytest.approx(gspo)


def test_the_bound_is_halved_per_failure_and_doubled_back_after_recovery() -> None:
    r = StalenessRemedy()
    feed(r, {AGE0: 0.0, AGE4: 0.2}, range(2))  # diagnosed at step 1, kept gradient on
    stats = {"staleness_bound": 8.0}
    # a critical consequence before trial_steps have passed does not count against the correction
    assert step(r, at(5, stats, findings=trouble())).controls == {"kept_gradient": True}
    p = step(r, at(11, stats, findings=trouble()))
    assert p.controls == {"kept_gradient": True, "max_staleness": 4, "stale_drop_age": 4}
    assert "staleness bound 8 -> 4" in p.reason
    assert step(r, at(21, stats, findings=trouble())).controls["max_staleness"] == 2
    assert step(r, at(31, stats, findings=trouble())).controls["max_staleness"] == 1
    assert step(r, at(41, stats, findings=trouble())).controls["max_staleness"] == 1  # min_bound
    # 20 steps with no critical consequence: doubled back, then again, then as configured (no control)
    assert step(r, at(60, stats)).controls["max_staleness"] == 1
    p = step(r, at(61, stats))
    assert p.controls["max_staleness"] == 2 and "recovered: staleness bound 1 -> 2" in p.reason
    assert step(r, at(81, stats)).controls["max_staleness"] == 4
    p = step(r, at(101, stats))
    # back as configured: the bound's controls proposed as None, which announces the change
    assert p.controls == {"kept_gradient": True, "max_staleness": None, "stale_drop_age": None}
    assert "4 -> 8" in p.reason and Controls.from_dict(p.controls).max_staleness is None
    assert step(r, at(102, stats)).controls == {"kept_gradient": True}  # and then left as configured


def test_restoring_the_bound_is_an_event_as_lowering_it_is(tmp_path: Path) -> None:
    """Only the bounds (no correction, whose control would announce itself): the step that puts the bound back as
    configured writes an ``action:set_clip`` event to events.jsonl, read back by the doctor's reader, and leaves
    the step's controls as configured."""
    remedy = {"remedies": ("lower_bound", "drop_stale"), "escalate_on": ("nonfinite",), "trial_steps": 1,
              "recovery_steps": 3}  # fmt: skip
    off = dict.fromkeys(("clip_controller", "halt", "lr_backoff", "rollback", "skip_no_signal", "skip_step"))
    events_path = tmp_path / "events.jsonl"
    interventions = {**off, "staleness_remedy": remedy}
    guard = Guard(GuardConfig.preset("default", events_path=str(events_path), interventions=interventions))
    decisions = []
    for s in range(1, 13):
        stats = {AGE0: 0.0, AGE4: 0.2, "staleness_bound": 4.0} | ({"nonfinite": 1.0} if s in (4, 5) else {})
        decisions.append(guard.observe(s, stats))
    assert guard.events_log is not None
    guard.events_log.close()
    said = [(e.step, e.detector, e.message) for e in read_events(events_path).events if "staleness" in e.message]
    assert said == [
        (4, "action:set_clip", "stale samples (diagnosed at step 1) with nonfinite: staleness bound 4 -> 2"),
        (5, "action:set_clip", "stale samples (diagnosed at step 1) with nonfinite: staleness bound 2 -> 1"),
        (8, "action:set_clip", "recovered: staleness bound 1 -> 2"),
        (11, "action:set_clip", "recovered: staleness bound 2 -> 4"),
    ], said
    bounds = [d.controls.max_staleness for d in decisions]
    assert bounds == [None] * 3 + [2, 1, 1, 1, 2, 2, 2, None, None], bounds
    assert [decision_action(d) for d in decisions].count("set_clip") == 4
    # the doctor's view of a run folder holding only events.jsonl, and its HTML table, list the restore
    found = events_only(tmp_path)
    assert found is not None and [e.step for e in found.events if "staleness bound" in e.message] == [4, 5, 8, 11]
    assert "recovered: staleness bound 2 -&gt; 4" in events_table(found.events)


def test_only_a_control_whose_neutral_is_none_can_be_put_back_as_configured() -> None:
    assert Controls.combine([{"max_staleness": 2}, {"max_staleness": None}], {}).max_staleness == 2
    assert Controls.combine([{"max_staleness": None}], {"max_staleness": 3}).max_staleness == 3  # as scheduled
    with pytest.raises(ValueError, match=r"\['lr_scale'\] are None.*propose its neutral value"):
        Proposal("step", "x", {"lr_scale": None})


def test_an_actuator_without_the_capabilities_gets_no_bound_and_trainer_pi_old_waits_for_trouble() -> None:
    r = StalenessRemedy()
    feed(r, {AGE0: 0.0, AGE4: 0.2}, range(2), caps=NO_ROLLOUT)
    assert "max_staleness" not in step(r, at(20, {"staleness_bound": 8.0}, NO_ROLLOUT, trouble())).controls
    # pi_old recomputed (rollout_correction): TIS only on the first critical consequence, as mismatch_remedy does
    r = StalenessRemedy()
    assert feed(r, {AGE0: 0.0, AGE4: 0.2}, range(2), caps=WITH_ROLLOUT | {"staleness_bound"})[1] is None
    p = step(r, at(3, {}, WITH_ROLLOUT | {"staleness_bound"}, trouble()))
    assert p.controls == {"rollout_is_cap": 2.0}
    # only lower_bound allowed: the drop control is never proposed
    r = StalenessRemedy(remedies=("kept_gradient", "lower_bound"))
    feed(r, {AGE0: 0.0, AGE4: 0.2}, range(2))
    assert step(r, at(20, {"staleness_bound": 8.0}, findings=trouble())).controls == {
        "kept_gradient": True,
        "max_staleness": 4,
    }


def test_state_survives_a_checkpoint() -> None:
    r = StalenessRemedy()
    feed(r, {AGE0: 0.0, AGE4: 0.2}, range(2))
    step(r, at(20, {"staleness_bound": 8.0}, findings=trouble()))
    restored = StalenessRemedy()
    restored.load_state_dict(json.loads(json.dumps(r.state_dict())))
    assert restored.controls() == r.controls() == {"kept_gradient": True, "max_staleness": 4, "stale_drop_age": 4}
    assert math.isclose(restored.gap_by_age()[AGE4], 0.2)


def test_stable_runs_it_and_the_cause_table_and_the_cli_show_it() -> None:
    assert "staleness_remedy" in Guard(GuardConfig.preset("stable")).interventions
    assert "staleness_remedy" not in Guard(GuardConfig.preset("default")).interventions
    cause = next(c for c in CAUSES if c.answer == "staleness_remedy")
    assert "staleness bound" in cause.remedies and cause.detectors == ()
    assert {"staleness_bound", "drop_stale"} <= CAPABILITIES
    caps = Controls.capabilities()
    assert (caps["max_staleness"], caps["stale_drop_age"]) == ("staleness_bound", "drop_stale")
    out = CliRunner().invoke(app, ["detectors", "--json"])
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)
    assert any(row["intervention"] == "staleness_remedy" for row in shown["remedies"])
    assert any(row["name"] == "staleness_remedy" for row in shown["interventions"])
