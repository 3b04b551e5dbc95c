"""Delivery of the guard's alerts off the training thread: a bounded queue, one daemon worker, a rate limit, a
total deadline on every request (connect, send and read together); only the standard library (``urllib``).

The training thread only puts a message on the queue (``put_nowait``: it never waits, and a full queue drops the message
and counts it, with a warning). The worker sends at most one request per ``min_interval_s``; messages that arrive in
between are combined into the next request, so nothing is lost to the rate limit. A request that fails or times out is a
logged warning naming the webhook by scheme and host only (its path is a secret, and so are the values of its request
headers, never quoted), with the server's reason phrase escaped (no control character reaches a terminal or a log),
never an exception in training. At interpreter exit the worker is given ``timeout_s`` to send
what is still queued (the alert of a halt is often the last thing a run does); what it could not send then is a last
warning.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import logging
import queue
import socket
import sys
import threading
import time
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlguard.guards.alerts.urls import redacted, scrub

logger = logging.getLogger("rlguard.alerts")

__all__ = ["AlertSender", "post_json"]

#: a message for the worker: (text, severity, JSON record), severity ``warn`` or ``critical``
Message = tuple[str, str, dict[str, Any]]
_STOP = object()


class _Deadline:
    """One request's total deadline: each connection made for it (a redirect makes another) is registered, and at
    the deadline their sockets are shut down, which ends a read or write blocked on them in the sending thread.
    A per-operation socket timeout cannot do this: a server that sends one byte a second never lets it expire."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0 or self.expired:
            raise TimeoutError(self.message())
        return left

    def message(self) -> str:
        return f"timed out: no complete answer within {self.seconds:g} s (connect, send and read together)"

    def register(self, sock: socket.socket | None) -> None:
        with self._lock:
            if sock is not None:
                self._sockets.append(sock)
            if self.expired:
                self._shut()

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _resolve(host: str, port: int, deadline: _Deadline) -> list[tuple[Any, ...]]:
    """``socket.getaddrinfo`` of ``host`` within what is left of ``deadline``: the C resolver takes no timeout (a
    DNS server that does not answer holds it for the resolver's own retries, tens of seconds), so it runs in a
    daemon thread that is left behind when the deadline passes."""
    found: list[tuple[Any, ...]] = []
    failed: list[OSError] = []

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except OSError as err:
            failed.append(err)

    worker = threading.Thread(target=lookup, name="rlguard-alerts-dns", daemon=True)
    worker.start()
    worker.join(deadline.remaining())
    if worker.is_alive():
        raise TimeoutError(deadline.message() + f"; looking up {host} did not finish")
    if failed:
        raise failed[0]
    return found


def _connect(
    address: tuple[str, int], deadline: _Deadline, source_address: tuple[str, int] | None = None
) -> socket.socket:
    """``socket.create_connection`` with the name looked up within ``deadline`` (:func:`_resolve`), each address
    tried in turn within what is left of it."""
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in _resolve(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.remaining())
            if source_address is not None:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as err:
            error = err
            sock.close()
    raise error if error is not None else OSError(f"getaddrinfo returned no address for {host}")


def _bounded(base: type[http.client.HTTPConnection], deadline: _Deadline) -> Any:
    """``base`` (``HTTPConnection`` or ``HTTPSConnection``) connecting within what is left of ``deadline``, the
    name lookup included, and registering its socket with it."""

    class Bounded(base):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            self.timeout = deadline.remaining()
            self._create_connection = lambda address, timeout, source=None: _connect(address, deadline, source)
            super().connect()
            deadline.register(self.sock)

    return Bounded


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_bounded(http.client.HTTPConnection, self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = _bounded(http.client.HTTPSConnection, self.deadline)
        return self.do_open(connection, req, context=self._context)  # type: ignore[attr-defined]


def post_json(url: str, payload: dict[str, Any], timeout: float, headers: Mapping[str, str] | None = None) -> None:
    """POST ``payload`` as JSON to ``url`` (http or https, through the environment's proxies as ``urllib`` does),
    with ``headers`` added (``Authorization: Bearer ...``), raising on a status >= 400, and ``TimeoutError`` when
    connecting, sending and reading the answer together take longer than ``timeout`` s."""
    data = json.dumps(payload).encode("utf-8")
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "rlguard", **(headers or {})},
    )
    deadline = _Deadline(timeout)
    opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline))
    timer = threading.Timer(timeout, deadline.expire)
    timer.daemon = True
    timer.start()
    try:
        with opener.open(request, timeout=timeout) as response:  # the scheme is checked (http/https)
            while response.read(65536):
                deadline.remaining()
    except Exception:
        if deadline.expired or time.monotonic() >= deadline.at:
            raise TimeoutError(deadline.message()) from None
        raise
    finally:
        timer.cancel()


class AlertSender:
    """A daemon worker that delivers messages to a webhook (``url``, payloads from ``make_payload``) and to the
    active W&B run (``wandb=True``: ``wandb.run.alert`` when the training process has imported wandb and started a
    run; rlguard never imports it). Started on the first message. ``headers`` go with every request (``post`` is
    called as ``post(url, payload, timeout, headers=headers)`` when there are any); their values are secrets, cut
    from every warning."""

    def __init__(
        self,
        *,
        url: str | None,
        headers: Mapping[str, str] | None = None,
        make_payload: Callable[[Sequence[Message], int], dict[str, Any]],
        wandb: bool,
        min_interval_s: float,
        timeout_s: float,
        queue_size: int,
        post: Callable[..., None] = post_json,
    ) -> None:
        self._url = url
        self._headers = dict(headers or {})
        self._make_payload = make_payload
        self._wandb = wandb
        self._min_interval = min_interval_s
        self._timeout = timeout_s
        self._post = post
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._dropped = 0  # messages the full queue refused, reported in the next request
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._flush_now = threading.Event()
        self._pending = 0  # messages queued and not yet delivered (under the lock)
        self._idle = threading.Event()  # set while nothing is pending
        self._idle.set()
        self.sent = 0  # requests made (webhook and W&B count once together)
        self.failures = 0
        self.dropped = 0  # alerts the full queue refused, in all

    def send(self, message: Message) -> None:
        """Queue ``message``; returns at once whatever the endpoint does."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rlguard-alerts", daemon=True)
                self._thread.start()
                _SENDERS.add(self)
            try:
                self._queue.put_nowait(message)
            except queue.Full:
                self._dropped += 1
                if self._dropped == 1:
                    logger.warning("rlguard alerts: the queue is full (endpoint too slow); dropping alerts meanwhile")
                return
            self._pending += 1
            self._idle.clear()

    def flush(self, timeout: float) -> bool:
        """Send what is queued now, ignoring the rate limit; wait up to ``timeout`` s. True if all was sent."""
        if self._thread is None:
            return True
        self._flush_now.set()
        return self._idle.wait(timeout)

    def close(self) -> None:
        """Stop the worker once it has sent what is queued (rate limit included); returns at once."""
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(_STOP)

    def _run(self) -> None:
        next_allowed = 0.0
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch: list[Message] = [item]  # type: ignore[list-item]
            # the rate limit: wait for the window (unless a flush is asked for), gathering what arrives meanwhile
            while not self._flush_now.is_set() and time.monotonic() < next_allowed:
                self._flush_now.wait(min(0.05, max(0.0, next_allowed - time.monotonic())))
            stop = self._drain(batch)
            with self._lock:
                dropped, self._dropped = self._dropped, 0
            if dropped:
                self.dropped += dropped
                logger.warning(
                    "rlguard alerts: %d alert(s) dropped, the queue of %d being full (the endpoint too slow); the next "
                    "message counts them (training goes on)",
                    dropped,
                    self._queue.maxsize,
                )
            self._deliver(batch, dropped)
            next_allowed = time.monotonic() + self._min_interval
            with self._lock:
                self._pending -= len(batch)
                if self._pending == 0:
                    self._flush_now.clear()
                    self._idle.set()
            if stop:
                return

    def _drain(self, batch: list[Message]) -> bool:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            batch.append(item)  # type: ignore[arg-type]

    def _deliver(self, batch: Sequence[Message], dropped: int) -> None:
        self.sent += 1
        if self._url is not None:
            try:
                extra = {"headers": self._headers} if self._headers else {}
                self._post(self._url, self._make_payload(batch, dropped), self._timeout, **extra)
            except Exception as err:  # refused, timed out, an HTTP error status: never an exception in training
                self.failures += 1
                reason = scrub(str(getattr(err, "reason", None) or err), self._url)
                secrets = {part for v in self._headers.values() for part in (v, *v.split()) if len(part) > 1}
                for secret in sorted(secrets, key=len, reverse=True):  # a header's value, and each word of it
                    reason = reason.replace(secret, "...")
                # the server writes the reason phrase: its control characters (a screen clear, an OSC-8 link) shown
                reason = reason.encode("unicode_escape").decode("ascii")
                logger.warning(
                    "rlguard alerts: the webhook (%s) did not take %d alert(s): %s: %s (training goes on)",
                    redacted(self._url),
                    len(batch),
                    type(err).__name__,
                    reason,
                )
        if self._wandb:
            self._wandb_alert(batch)

    def _wandb_alert(self, batch: Sequence[Message]) -> None:
        run = getattr(sys.modules.get("wandb"), "run", None)
        if run is None:
            return
        critical = any(severity == "critical" for _, severity, _ in batch)
        title = batch[0][2].get("title", "rlguard") + (f" (+{len(batch) - 1} more)" if len(batch) > 1 else "")
        try:
            run.alert(
                title=title,
                text="\n\n".join(text for text, _, _ in batch),
                level="ERROR" if critical else "WARN",
                wait_duration=self._min_interval,
            )
        except Exception as err:  # W&B's errors must never reach training
            self.failures += 1
            logger.warning("rlguard alerts: wandb.run.alert failed: %s: %s (training goes on)", type(err).__name__, err)


_SENDERS: weakref.WeakSet[AlertSender] = weakref.WeakSet()
#: seconds each sender gets at interpreter exit to deliver what is queued
EXIT_FLUSH_S = 10.0


@atexit.register
def _flush_at_exit() -> None:
    for sender in list(_SENDERS):
        if not sender.flush(min(EXIT_FLUSH_S, sender._timeout + 1.0)):
            with sender._lock:
                pending = sender._pending
            logger.warning("rlguard alerts: %d alert(s) still unsent at exit, given up", pending)
