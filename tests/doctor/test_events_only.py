"""``rlguard doctor out/`` on a run folder with the guard's ``events.jsonl`` and no training log: the events are
reported, exit 1 when one is critical (a critical detector event or a halt), 2 otherwise, instead of a bare "no
training log"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor.events_only import events_only
from rlguard.guards import Event
from tests.helpers.doctor_logs import verl_line
from tests.helpers.synthetic import healthy_stream
from tests.helpers.webhook import recording_webhook

BLOWUP = Event(50, "kl_ref_blowup", "critical", 4.9, "kl_ref=4.9 is above the absolute bound 2", 2.0)
HALT = Event(50, "action:halt", "critical", 1.0, "kl_ref_blowup critical for 25 steps")
ROLLBACK = Event(40, "action:rollback", "critical", 1.0, "rolled back to step 35")
WARN = Event(30, "grad_spike", "warn", 8.0, "grad_norm 8x its median")


def _events(folder: Path, *events: Event) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in events))
    return folder


def test_critical_events_without_a_log_are_reported_with_exit_1(tmp_path: Path) -> None:
    run = _events(tmp_path / "out", WARN, BLOWUP, HALT)
    out = CliRunner().invoke(app, ["doctor", str(run)])
    assert out.exit_code == 1, out.output
    said = " ".join(out.output.split())  # as the terminal wraps it, by the path's length
    assert "holds 3 event(s), 2 of them critical, as recorded" in said
    assert "no training log in folder" in said and "kl_ref=4.9 is above" in said
    doc = json.loads(CliRunner().invoke(app, ["doctor", "--json", str(run)]).output)
    assert doc["exit_code"] == 1 and doc["critical_events"] == 2 and len(doc["live_events"]) == 3


def test_events_none_critical_still_say_no_log_with_exit_2(tmp_path: Path) -> None:
    """A rollback is the guard's answer, not a verdict (as Diagnosis.critical counts it): with a warning, exit 2."""
    run = _events(tmp_path / "out", WARN, ROLLBACK)
    out = CliRunner().invoke(app, ["doctor", str(run)])
    said = " ".join(out.output.split())
    assert out.exit_code == 2 and "none critical" in said and "rolled back to step 35" in said


def test_the_reader_s_own_answer_stands_without_events_or_with_a_log(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = CliRunner().invoke(app, ["doctor", str(empty)])
    assert out.exit_code == 2 and "no training log in folder" in out.output and "event(s)" not in out.output
    assert events_only(_events(tmp_path / "blank")) is None  # an events.jsonl with no event
    logged = _events(tmp_path / "logged", BLOWUP)
    (logged / "metrics.jsonl").write_text("".join(verl_line(i, s) for i, s in enumerate(healthy_stream(60, 1), 1)))
    assert events_only(logged) is None  # a log is there: the doctor judges it (and the events with it)


def test_doctor_alerts_send_the_events_of_a_folder_without_a_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _events(tmp_path / "out", WARN, BLOWUP, HALT)
    with recording_webhook() as srv:
        monkeypatch.setenv("RLGUARD_TEST_EVENTS_WEBHOOK", srv.url)
        spec = json.dumps({"webhook_env": "RLGUARD_TEST_EVENTS_WEBHOOK", "min_interval_s": 0})
        out = CliRunner().invoke(app, ["doctor", str(run), "--alerts", spec])
    assert out.exit_code == 1, out.output
    (alert,) = srv.bodies[0]["alerts"]
    assert alert["outcome"] == "halt" and alert["step"] == 50
    assert [e["detector"] for e in alert["events"]] == ["kl_ref_blowup", "action:halt"]  # the warning is not sent
