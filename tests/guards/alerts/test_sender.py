"""Alerts against a real HTTP server on 127.0.0.1: the three payloads, what raises an alert, the rate limit, a server
that hangs, one that refuses, W&B's ``run.alert`` (a stand-in module), rank 0 only, the delivery at exit, and an
unset variable (the configuration paths: ``test_config.py``)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlguard.guards import Decision, Event, Guard, GuardConfig
from rlguard.guards.actuation import Applied
from rlguard.guards.alerts import AlertConfig, AlertPlugin, alert_message
from rlguard.guards.alerts.config import webhook_payload
from tests.helpers.guards import StubActuator
from tests.helpers.webhook import Recorder, recording_webhook

pytestmark = pytest.mark.serial  # bounds on the seconds a send takes (make test runs them alone)
ROOT = Path(__file__).resolve().parents[3]
ENV = "RLGUARD_TEST_WEBHOOK"
NAN = float("nan")


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Recorder]:
    with recording_webhook(delay=getattr(request, "param", 0.0)) as srv:
        yield srv


def _guard(monkeypatch: pytest.MonkeyPatch, url: str | None, **alerts: Any) -> Guard:
    if url is not None:
        monkeypatch.setenv(ENV, url)
    alerts.setdefault("min_interval_s", 0.0)
    alerts.setdefault("wandb", False)
    return Guard(GuardConfig.preset("default", alerts={"webhook_env": ENV, **alerts}))


def _step(guard: Guard, actuator: StubActuator, step: int, **stats: float) -> tuple[Applied, float]:
    """Observe and carry out one step; the seconds guard.apply took (the training thread's cost)."""
    decision = guard.observe(step, {"loss": 0.1, "kl_ref": 0.01, "entropy": 1.0, **stats})
    start = time.perf_counter()
    applied = guard.apply(decision, actuator)
    return applied, time.perf_counter() - start


def _flush(guard: Guard, timeout: float = 10.0) -> AlertPlugin:
    plugin = guard.alerts
    assert plugin is not None
    assert plugin.sender.flush(timeout)
    return plugin


@pytest.mark.parametrize("fmt", ["slack", "discord", "json"])
def test_a_skipped_step_reaches_the_webhook_in_each_format(
    monkeypatch: pytest.MonkeyPatch, server: Recorder, fmt: str
) -> None:
    guard = _guard(monkeypatch, server.url, format=fmt, run_name="exp-7")
    actuator = StubActuator()
    _step(guard, actuator, 1)
    _step(guard, actuator, 2, nonfinite=3.0)  # critical nonfinite -> skip
    _flush(guard)
    assert server.paths == ["/hooks/T000/B000"] and len(server.bodies) == 1
    body = server.bodies[0]
    text = {"slack": body.get("text"), "discord": body.get("content"), "json": body.get("text")}[fmt]
    assert isinstance(text, str)
    assert "rlguard exp-7: step 2, skip" in text and "[critical] nonfinite: 3 non-finite values" in text
    keys = {
        "slack": {"text"},
        "discord": {"content", "allowed_mentions"},
        "json": {"source", "text", "alerts", "dropped"},
    }
    assert set(body) == keys[fmt]
    if fmt == "json":
        (alert,) = body["alerts"]
        assert (alert["step"], alert["outcome"], alert["severity"], alert["run"]) == (2, "skip", "critical", "exp-7")
        assert [e["detector"] for e in alert["events"]] == ["nonfinite", "action:skip_step"]


@pytest.mark.parametrize("fmt", ["slack", "discord"])
def test_text_from_the_run_pages_nobody(fmt: str) -> None:
    """A metric name or an events.jsonl detail holding a mention arrives as text: Slack's control sequences escaped
    (its message-formatting reference: &, < and >), Discord told to parse no mention."""
    hostile = "kl <!channel> <@U123> & @everyone"
    body = webhook_payload(fmt, [(hostile, "critical", {})], 0)  # type: ignore[arg-type]
    if fmt == "slack":
        assert body == {"text": "kl &lt;!channel&gt; &lt;@U123&gt; &amp; @everyone"}
    else:
        assert body == {"content": hostile, "allowed_mentions": {"parse": []}}


def test_the_guard_s_alerts_carry_the_headers_of_headers_env(monkeypatch: pytest.MonkeyPatch, server: Recorder) -> None:
    monkeypatch.setenv("RLGUARD_TEST_AUTH", "Bearer t0ken-of-the-guard")
    guard = _guard(
        monkeypatch, server.url, headers_env={"Authorization": "RLGUARD_TEST_AUTH", "X-Team": "RLGUARD_TEST_AUTH"}
    )
    _step(guard, StubActuator(), 1, nonfinite=3.0)  # critical nonfinite -> skip
    _flush(guard)
    (headers,) = server.headers
    assert headers["Authorization"] == headers["X-Team"] == "Bearer t0ken-of-the-guard"
    assert "t0ken" not in repr(guard.config)  # the config holds the variable's name only


def test_what_raises_an_alert(monkeypatch: pytest.MonkeyPatch, server: Recorder) -> None:
    guard = _guard(monkeypatch, server.url, format="json")
    actuator = StubActuator()
    for step in range(1, 4):
        _step(guard, actuator, step)  # healthy: no event, no alert; snapshot at step 1
    # KL above the absolute bound on 3 steps: the first two are lone (warnings by consequence: no alert), the third
    # sustained (critical by consequence: 3 of 5) -> rollback to the snapshot, the one alert
    outcomes = [_step(guard, actuator, step, kl_ref=5.0)[0].outcome for step in (4, 5, 6)]
    assert outcomes == ["step", "step", "rollback"]
    _flush(guard)
    (body,) = server.bodies
    assert [(a["outcome"], a["step"]) for a in body["alerts"]] == [("rollback", 6)]
    # warnings only reach the webhook with min_severity="warn"; an outcome listed in `outcomes` always does
    event = Event(9, "grad_norm_spike", "warn", 6.0, "grad norm 6x its median")
    decision = Decision(step=9, events=(event,), reason="")
    assert alert_message(decision, Applied("step"), AlertConfig(webhook_env=ENV)) is None
    assert alert_message(decision, Applied("step"), AlertConfig(webhook_env=ENV, min_severity="warn")) is not None
    assert alert_message(decision, Applied("skip"), AlertConfig(webhook_env=ENV, outcomes=("skip",))) is not None
    # an event matching `events` is sent whatever its severity: a remedy switch
    remedy = Event(9, "action:remedy", "warn", 1.0, "mismatch_growth: switch to token-level rollout IS")
    sent = alert_message(Decision(step=9, events=(remedy,)), Applied("step"), AlertConfig(webhook_env=ENV))
    assert sent is not None and sent[1] == "warn" and "switch to token-level rollout IS" in sent[0]


def test_rate_limit_combines_alerts_and_loses_none(monkeypatch: pytest.MonkeyPatch, server: Recorder) -> None:
    guard = _guard(monkeypatch, server.url, format="json", min_interval_s=1.0)
    actuator = StubActuator()
    _step(guard, actuator, 1, nonfinite=1.0)
    _flush(guard)  # the first alert goes at once
    for step in range(2, 5):
        _step(guard, actuator, step, nonfinite=1.0)  # three more skips, back to back, inside the 1 s window
    deadline = time.monotonic() + 10
    while len(server.bodies) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a third request would have come by now if the limit did not hold
    assert [[a["step"] for a in b["alerts"]] for b in server.bodies] == [[1], [2, 3, 4]]
    assert server.times[1] - server.times[0] >= 0.95


@pytest.mark.parametrize("server", [3.0], indirect=True)
def test_a_hanging_server_never_slows_training(
    monkeypatch: pytest.MonkeyPatch, server: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    guard = _guard(monkeypatch, server.url, timeout_s=0.3)
    actuator = StubActuator()
    costs = [_step(guard, actuator, step, nonfinite=1.0)[1] for step in range(1, 4)]
    assert max(costs) < 0.25  # the training thread only queues: no wait for the 3 s server or the 0.3 s timeout
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rlguard.alerts"):
        plugin = _flush(guard)  # the sender gives up after its 0.3 s timeout, per request
    assert time.monotonic() - start < 2.5
    assert plugin.sender.failures >= 1 and "timed out" in caplog.text and "training goes on" in caplog.text


def test_a_refusing_server_is_a_warning(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connections to it are refused
    guard = _guard(monkeypatch, f"http://127.0.0.1:{port}/hook")
    actuator = StubActuator()
    with caplog.at_level(logging.WARNING, logger="rlguard.alerts"):
        _step(guard, actuator, 1, nonfinite=1.0)
        plugin = _flush(guard)
        _step(guard, actuator, 2)  # training goes on
    assert plugin.sender.failures == 1 and "Connection refused" in caplog.text
    assert f"{port}" not in caplog.text  # the URL (a secret) is never logged


def test_wandb_run_alert_when_a_run_is_active(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    run = types.SimpleNamespace(alert=lambda **kw: calls.append(kw))
    fake = types.ModuleType("wandb")
    fake.run = None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    guard = Guard(GuardConfig.preset("default", alerts={"wandb": True, "min_interval_s": 0.0}))
    actuator = StubActuator()
    _step(guard, actuator, 1, nonfinite=1.0)
    _flush(guard)
    assert calls == []  # wandb imported, no run: nothing
    fake.run = run  # type: ignore[attr-defined]
    _step(guard, actuator, 2, nonfinite=1.0)
    _flush(guard)
    (call,) = calls
    assert call["title"] == "rlguard: step 2, skip" and call["level"] == "ERROR"
    assert "nonfinite" in call["text"] and call["wait_duration"] == 0.0


def test_only_rank_0_and_only_its_own_guard_send(monkeypatch: pytest.MonkeyPatch, server: Recorder) -> None:
    guard = _guard(monkeypatch, server.url)
    other = Guard(GuardConfig.preset("default"))  # no alerts: its decisions are not the first guard's
    actuator = StubActuator()
    _step(other, actuator, 1, nonfinite=1.0)
    monkeypatch.setenv("RANK", "1")
    _step(guard, actuator, 1, nonfinite=1.0)
    monkeypatch.setenv("RANK", "0")
    _step(guard, actuator, 2, nonfinite=1.0)
    _flush(guard)
    assert [b["alerts"][0]["step"] for b in server.bodies] == [2]


_EXIT_SCRIPT = """
from rlguard.guards import Guard, GuardConfig
from tests.helpers.guards import StubActuator
from tests.helpers.webhook import Recorder, recording_webhook
guard = Guard(GuardConfig.preset("default", alerts={"webhook_env": "RLGUARD_TEST_WEBHOOK", "min_interval_s": 60}))
actuator = StubActuator()
guard.apply(guard.observe(1, {"loss": 0.1, "nonfinite": 1.0}), actuator)
assert guard.alerts.sender.flush(10)  # delivered; the next request may go in 60 s
guard.apply(guard.observe(2, {"loss": 0.1, "nonfinite": 1.0}), actuator)
"""


def test_alerts_held_by_the_rate_limit_are_sent_at_exit(server: Recorder) -> None:
    env = {**os.environ, ENV: server.url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # step 1 at once; step 2 waited for the 60 s window and was sent as the process ended
    assert [[a["step"] for a in b["alerts"]] for b in server.bodies] == [[1], [2]]


def test_an_unset_variable_warns_and_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="rlguard.alerts"):
        guard = Guard(GuardConfig(alerts=AlertConfig(webhook_env=ENV, wandb=False)))
    assert f"{ENV} (alerts.webhook_env) is not set" in caplog.text
    _step(guard, StubActuator(), 1, nonfinite=1.0)
    _flush(guard)
