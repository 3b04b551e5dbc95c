"""The alert sender against servers that misbehave, on 127.0.0.1: one that answers a byte at a time (a total
deadline per request, then a warning), one that refuses; webhook URLs that are malformed (a clear error at
construction) or hold a secret (never in a warning)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.alerts import AlertConfig, AlertSender
from rlguard.guards.alerts.sender import post_json
from rlguard.guards.alerts.urls import redacted, scrub

pytestmark = pytest.mark.serial  # bounds on the seconds a send takes (make test runs them alone)
ENV = "RLGUARD_TEST_WEBHOOK_DEADLINE"
SECRET = "T0000/B0000/XXXXsecretXXXX"


class Dripper:
    """A TCP server on 127.0.0.1 that reads a request, then sends a valid HTTP answer one byte every ``pause``
    seconds (at most ``limit`` bytes, so that the test ends whatever the client does)."""

    def __init__(self, pause: float = 0.1, limit: int = 400) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.pause, self.limit = pause, limit
        self.requests = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/services/{SECRET}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.requests += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 300\r\n\r\n" + b"x" * 300
        with conn:
            conn.settimeout(1.0)
            try:
                conn.recv(65536)
                for byte in answer[: self.limit]:
                    if self.stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(self.pause)
            except OSError:
                return  # the client gave up: what the deadline is for


@pytest.fixture
def dripper() -> Iterator[Dripper]:
    server = Dripper()
    yield server
    server.stop.set()
    server.thread.join(2)
    server.sock.close()


def _in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[BaseException], list[float]]:
    """Run ``fn(*args)`` on a daemon thread (so that a sender that hangs fails the test instead of holding it)."""
    errors: list[BaseException] = []
    took: list[float] = []

    def run() -> None:
        start = time.monotonic()
        try:
            fn(*args)
        except BaseException as err:
            errors.append(err)
        took.append(time.monotonic() - start)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors, took


def test_a_server_sending_a_byte_at_a_time_meets_the_total_deadline(dripper: Dripper) -> None:
    thread, errors, took = _in_thread(post_json, dripper.url, {"text": "x"}, 0.5)
    thread.join(5.0)  # the answer would take 34 s at 0.1 s a byte; every single read comes within 0.1 s
    assert not thread.is_alive(), "post_json ignored its 0.5 s deadline"
    assert len(errors) == 1 and isinstance(errors[0], TimeoutError), errors
    assert "0.5 s" in str(errors[0]) and took[0] < 2.0


def test_the_sender_gives_up_with_a_warning_and_keeps_sending(
    dripper: Dripper, caplog: pytest.LogCaptureFixture
) -> None:
    sender = AlertSender(
        url=dripper.url,
        make_payload=lambda batch, dropped: {"text": "x", "n": len(batch), "dropped": dropped},
        wandb=False,
        min_interval_s=0.0,
        timeout_s=0.3,
        queue_size=2,
    )
    with caplog.at_level(logging.WARNING, logger="rlguard.alerts"):
        for i in range(16):  # 16 alerts while the first request is held: the queue of 2 drops some
            sender.send((f"alert {i}", "critical", {"title": str(i)}))
        assert sender.flush(8.0), "the sender never came back from the dripping server"
    sender.close()
    assert sender.failures >= 1 and "timed out" in caplog.text and "training goes on" in caplog.text
    assert sender.dropped >= 1 and "dropped" in caplog.text  # drops are said, not only counted in the next message
    assert SECRET not in caplog.text and "/services" not in caplog.text
    assert "http://127.0.0.1" in caplog.text  # the webhook named by scheme and host


def test_an_error_that_echoes_the_url_is_scrubbed_in_the_warning(caplog: pytest.LogCaptureFixture) -> None:
    """``http.client`` puts the path of a URL it refuses in its message; the warning must not."""

    def post(url: str, payload: dict[str, Any], timeout: float) -> None:
        raise ValueError(f"URL can't contain control characters. {url.split('1', 1)[1]!r}; full: {url}")

    url = f"https://hooks.slack.com/services/{SECRET}?token=abc123"
    sender = AlertSender(
        url=url, make_payload=lambda b, d: {}, wandb=False, min_interval_s=0, timeout_s=1, queue_size=4, post=post
    )
    with caplog.at_level(logging.WARNING, logger="rlguard.alerts"):
        sender.send(("x", "critical", {}))
        assert sender.flush(5.0)
    sender.close()
    assert "did not take 1 alert(s)" in caplog.text
    assert SECRET not in caplog.text and "abc123" not in caplog.text and "/services" not in caplog.text
    assert "https://hooks.slack.com" in caplog.text


def test_a_server_s_reason_phrase_reaches_the_warning_with_its_control_characters_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A webhook server writes the reason phrase of its status line: a screen clear or an OSC-8 link in it must not
    reach the terminal (or the training log) that shows the warning."""
    server = socket.create_server(("127.0.0.1", 0))
    hostile = b"Bad\x1b[2J\x1b]8;;http://evil.example/\x07here"

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 500 " + hostile + b"\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/services/{SECRET}"
    sender = AlertSender(
        url=url, make_payload=lambda b, d: {}, wandb=False, min_interval_s=0, timeout_s=5, queue_size=4
    )
    with caplog.at_level(logging.WARNING, logger="rlguard.alerts"):
        sender.send(("x", "critical", {}))
        assert sender.flush(8.0)
    sender.close()
    thread.join(5)
    server.close()
    assert "HTTPError: Bad\\x1b[2J\\x1b]8;;http://evil.example/\\x07here" in caplog.text, caplog.text
    assert "\x1b" not in caplog.text and "\x07" not in caplog.text


def test_redacted_and_scrub() -> None:
    url = "https://user:pw@hooks.slack.com:8443/services/T0/B0/S%20ECRET?token=t0k#frag"
    assert redacted(url) == "https://hooks.slack.com"
    assert redacted("not a url") == "<webhook>"
    message = f"failed {url}; path /services/T0/B0/S ECRET; token=t0k; auth user:pw"
    cleaned = scrub(message, url)
    assert "S ECRET" not in cleaned and "t0k" not in cleaned and "user:pw" not in cleaned and "8443" not in cleaned


MALFORMED = {
    "hooks.slack.com/services/T0/B0/SECRETX": "is 'https://' missing",
    "https:///services/T0/B0/SECRETX": "has no host",
    "ftp://hooks.example.org/SECRETX": "must start with http:// or https://",
    "https://hooks.example.org:notaport/SECRETX": "cannot be parsed",
    "https://[::1/SECRETX": "cannot be parsed",
    "https://hooks.example.org/SECRETX with space": "whitespace or a control character",
}


@pytest.mark.parametrize(("url", "why"), list(MALFORMED.items()))
def test_a_malformed_webhook_url_is_a_clear_error_at_construction(
    monkeypatch: pytest.MonkeyPatch, url: str, why: str
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    config = GuardConfig(alerts=AlertConfig(webhook_env=ENV, wandb=False))  # built where the variable is unset
    monkeypatch.setenv(ENV, url)
    with pytest.raises(ValueError, match=rf"\${ENV} \(alerts.webhook_env\)") as err:
        AlertConfig(webhook_env=ENV, wandb=False)
    assert why in str(err.value) and "SECRETX" not in str(err.value)
    with pytest.raises(ValueError, match=ENV) as err:
        Guard(config)  # where it is set: the guard refuses it when built, not at its first alert
    assert why in str(err.value) and "SECRETX" not in str(err.value)


def test_a_well_formed_url_and_an_unset_variable_still_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "https://hooks.slack.com:443/services/T0/B0/SECRET")
    assert AlertConfig(webhook_env=ENV).webhook_url() == "https://hooks.slack.com:443/services/T0/B0/SECRET"
    monkeypatch.delenv(ENV)
    assert AlertConfig(webhook_env=ENV).webhook_url() is None  # set on rank 0's machine only: a warning later


def test_a_name_lookup_that_hangs_ends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C resolver takes no timeout: a lookup that never answers must still end at the request's deadline."""
    release = threading.Event()
    real = socket.getaddrinfo

    def hanging(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "alerts.invalid":
            release.wait(10.0)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            post_json("http://alerts.invalid/hook", {"text": "x"}, timeout=0.3)
    finally:
        release.set()
    assert time.monotonic() - start < 2.0


def test_a_name_that_resolves_is_connected_within_the_deadline(dripper: Dripper) -> None:
    """``localhost`` goes through the bounded lookup and connects (the dripping server still times out in full)."""
    url = dripper.url.replace("127.0.0.1", "localhost")
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        post_json(url, {"text": "x"}, timeout=0.5)
    assert 0.4 < time.monotonic() - start < 2.0 and dripper.requests == 1
