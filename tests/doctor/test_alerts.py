"""Alerts from a log: ``rlguard watch --alerts`` and ``rlguard doctor --alerts`` against a real HTTP server on
127.0.0.1 (``tests/helpers/webhook.py``): one alert for a collapsing log, with the bearer token of ``headers_env``
sent and never printed; each finding and event sent once; a spec that could send nothing refused at the start."""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import diagnose
from rlguard.doctor.alerts import log_alerts, parse_alert_spec
from rlguard.guards import Event
from rlguard.guards.alerts import AlertConfig
from tests.helpers.docs_pages import code_blocks, section
from tests.helpers.doctor_logs import verl_line
from tests.helpers.synthetic import failing_stream, healthy_stream
from tests.helpers.webhook import Recorder, recording_webhook

URL_ENV, AUTH_ENV = "RLGUARD_TEST_WATCH_WEBHOOK", "RLGUARD_TEST_WATCH_AUTH"
TOKEN = "Bearer s3cr3t-t0ken"
SPEC = json.dumps(
    {"webhook_env": URL_ENV, "headers_env": {"Authorization": AUTH_ENV}, "format": "slack", "min_interval_s": 0}
)


def _collapsing_log(folder: Path) -> Path:
    """A verl file-logger JSONL whose policy entropy collapses from step 45 of 90 (a critical finding)."""
    stream = failing_stream("entropy_collapse", steps=90, onset=45, seed=0)
    (folder / "metrics.jsonl").write_text("".join(verl_line(i, s) for i, s in enumerate(stream, 1)))
    return folder


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    with recording_webhook() as srv:
        monkeypatch.setenv(URL_ENV, srv.url)
        monkeypatch.setenv(AUTH_ENV, TOKEN)
        yield srv


def test_watch_alerts_deliver_one_alert_for_a_collapsing_log(tmp_path: Path, server: Recorder) -> None:
    run = _collapsing_log(tmp_path)
    out = CliRunner().invoke(app, ["watch", str(run), "--interval", "0.05", "--idle", "0.3", "--alerts", SPEC])
    assert out.exit_code == 1, out.output  # the doctor's verdict, whatever the alerts do
    assert len(server.bodies) == 1, server.bodies  # judged several times, sent once
    text = server.bodies[0]["text"]
    assert text.startswith(f"*rlguard: {run}, step 90: ") and "[critical] entropy_collapse from step" in text
    assert server.paths == ["/hooks/T000/B000"] and server.headers[0]["Authorization"] == TOKEN
    assert "alerts: 1 alert(s) in 1 request(s) to http://127.0.0.1" in out.output
    assert TOKEN not in out.output and "T000" not in out.output  # neither secret is printed


def test_doctor_alerts_send_the_job_s_guard_events(tmp_path: Path, server: Recorder) -> None:
    """A run folder whose events.jsonl holds a rollback and a halt: both reach the webhook (outcomes), in json."""
    stream = healthy_stream(60, seed=1)
    (tmp_path / "metrics.jsonl").write_text("".join(verl_line(i, s) for i, s in enumerate(stream, 1)))
    events = [
        Event(50, "action:rollback", "critical", 1.0, "kl_ref_blowup: rolled back to step 45"),
        Event(60, "action:halt", "critical", 1.0, "kl_ref_blowup critical for 25 steps"),
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in events))
    spec = json.dumps({"webhook_env": URL_ENV, "run_name": "exp-7"})
    out = CliRunner().invoke(app, ["doctor", str(tmp_path), "--alerts", spec])
    assert out.exit_code == 1, out.output  # a halt recorded by the guard
    (body,) = server.bodies
    (alert,) = body["alerts"]
    assert alert["title"] == "rlguard: exp-7, step 60: the guard halted the run" and alert["outcome"] == "halt"
    assert [(e["step"], e["detector"]) for e in alert["events"]] == [(50, "action:rollback"), (60, "action:halt")]
    assert "Authorization" not in server.headers[0]  # no headers_env: none sent


def test_each_finding_is_sent_once_and_again_when_it_turns_critical(tmp_path: Path, server: Recorder) -> None:
    run = _collapsing_log(tmp_path)
    d = diagnose(run)
    critical = next(f for f in d.findings if f.severity == "critical")
    alerts = log_alerts(AlertConfig(webhook_env=URL_ENV, min_severity="warn", min_interval_s=0), str(run))
    first = alerts.observe(d)
    assert first is not None and critical.detector in first[0]
    assert first[2]["outcome"] == "finding" and first[2]["findings"] == [f.to_dict() for f in d.findings]
    assert first[2]["step"] == d.steps[-1] == 90 and first[2]["severity"] == "critical"
    assert alerts.observe(d) is None  # nothing new
    warned = dataclasses.replace(d, findings=[dataclasses.replace(critical, severity="warn")])
    fresh = log_alerts(alerts.config, str(run))
    assert fresh.observe(warned) is not None and fresh.observe(warned) is None  # a warning, once
    again = fresh.observe(d)  # the same detector, now critical: sent again
    assert again is not None and f"[critical] {critical.detector}" in again[0]
    assert alerts.close().startswith("alerts: 1 alert(s)") and fresh.close().startswith("alerts: ")


def test_a_spec_that_could_send_nothing_is_refused_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _collapsing_log(tmp_path)
    runner = CliRunner()
    monkeypatch.delenv(URL_ENV, raising=False)
    unset = runner.invoke(app, ["watch", "--once", str(run), "--alerts", json.dumps({"webhook_env": URL_ENV})])
    assert unset.exit_code == 2 and f"{URL_ENV} (webhook_env) is not set" in unset.output
    nowhere = runner.invoke(app, ["doctor", str(run), "--alerts", "{}"])
    assert nowhere.exit_code == 2 and "set webhook_env" in nowhere.output
    for bad, says in [("[1]", "expected a JSON object"), ("{oops", "not valid JSON"), ("nofile", "no such file")]:
        with pytest.raises(ValueError, match=says):
            parse_alert_spec(bad)
    (tmp_path / "alerts.json").write_text(json.dumps({"webhook_env": URL_ENV, "format": "discord"}))
    assert parse_alert_spec(str(tmp_path / "alerts.json")) == AlertConfig(webhook_env=URL_ENV, format="discord")


def test_a_header_s_variable_unset_or_a_secret_in_its_place_is_refused_unseen(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(URL_ENV, "http://127.0.0.1:9/hook")
    monkeypatch.delenv(AUTH_ENV, raising=False)
    with pytest.raises(ValueError, match=f"{AUTH_ENV} \\(the value of header Authorization\\) is not set"):
        AlertConfig(webhook_env=URL_ENV, headers_env={"Authorization": AUTH_ENV})
    with pytest.raises(ValueError, match="NAME of an environment variable") as pasted:
        AlertConfig(webhook_env=URL_ENV, headers_env={"Authorization": TOKEN})
    assert "s3cr3t" not in str(pasted.value)
    monkeypatch.setenv(AUTH_ENV, "Bearer s3cr3t\r\nX-Evil: 1")
    with pytest.raises(ValueError, match="line break") as injected:
        AlertConfig(webhook_env=URL_ENV, headers_env={"Authorization": AUTH_ENV})
    assert "s3cr3t" not in str(injected.value)
    with pytest.raises(ValueError, match="not an HTTP header name"):
        AlertConfig(webhook_env=URL_ENV, headers_env={"Bad Name": AUTH_ENV})


def test_a_refused_request_warns_without_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A 401 from the endpoint: one warning by scheme and host; the token, even echoed in the error, never shown."""
    with recording_webhook(status=401) as srv:
        monkeypatch.setenv(URL_ENV, srv.url)
        monkeypatch.setenv(AUTH_ENV, TOKEN)
        config = AlertConfig(webhook_env=URL_ENV, headers_env={"Authorization": AUTH_ENV}, min_interval_s=0)

        def echoing_post(url: str, payload: object, timeout: float, headers: dict[str, str]) -> None:
            raise PermissionError(f"refused {headers['Authorization']} at {url}")

        alerts = log_alerts(config, "run", post=echoing_post)
        with caplog.at_level(logging.WARNING, logger="rlguard.alerts"):
            alerts.observe(diagnose(_collapsing_log(tmp_path)))
            line = alerts.close()
        direct = log_alerts(config, "run")
        direct.observe(diagnose(tmp_path))
        with caplog.at_level(logging.WARNING, logger="rlguard.alerts"):
            direct_line = direct.close()
    assert "1 failed" in line and "1 failed" in direct_line and "HTTPError" in caplog.text
    assert srv.headers[0]["Authorization"] == TOKEN  # it was sent, and refused
    assert "s3cr3t" not in caplog.text and "T000" not in caplog.text and "http://127.0.0.1" in caplog.text


@pytest.mark.parametrize("heading", ["## From the watch: any job you can read", "## Request headers: a bearer token"])
def test_the_alerts_guide_s_commands_page_as_written(
    heading: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/guides/alerts.md's shell blocks, run: each ``export`` set (the page's URL and token are placeholders:
    the test server's own stand in), the watch run on a collapsing log (with ``--idle`` so that it ends)."""
    (shell,) = code_blocks(section("guides/alerts.md", heading), "bash")
    run = _collapsing_log(tmp_path)
    with recording_webhook() as srv:
        for line in shell.splitlines():
            words = shlex.split(line)
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                monkeypatch.setenv(name, srv.url if value.startswith("https://") else TOKEN)
                continue
            assert words[:3] == ["rlguard", "watch", "out/"], line
            out = CliRunner().invoke(app, ["watch", str(run), *words[3:], "--interval", "0.05", "--idle", "0.3"])
            assert out.exit_code == 1, out.output
    assert len(srv.bodies) == 1 and "entropy_collapse" in json.dumps(srv.bodies[0])
    spec = json.loads(words[words.index("--alerts") + 1])
    for header, env in spec.get("headers_env", {}).items():
        assert srv.headers[0][header] == TOKEN, env
    assert ("Authorization" in srv.headers[0]) is ("headers_env" in spec)
