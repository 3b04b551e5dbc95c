"""A webhook on 127.0.0.1 for the alerts' tests: a real HTTP server in a thread that records each POST's JSON body,
path and headers (``recording_webhook``)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Recorder", "recording_webhook"]


class Recorder(ThreadingHTTPServer):
    """An HTTP server on a free port of 127.0.0.1 that records each POST's JSON body, path and headers; ``delay``
    seconds before it answers (a server that hangs); ``status`` is its answer's status."""

    daemon_threads = True

    def __init__(self, delay: float = 0.0, status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.delay = delay
        self.status = status
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.times: list[float] = []  # time.monotonic() of each request's arrival

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks/T000/B000"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.times.append(time.monotonic())
        time.sleep(self.server.delay)
        self.server.bodies.append(body)
        self.server.paths.append(self.path)
        self.server.headers.append(dict(self.headers.items()))
        try:
            self.send_response(self.server.status)
            self.end_headers()
            self.wfile.write(b"ok")
        except BrokenPipeError:
            pass  # the client gave up waiting (the hanging-server test)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def recording_webhook(delay: float = 0.0, status: int = 200) -> Iterator[Recorder]:
    """A :class:`Recorder` serving in a daemon thread while the block runs."""
    srv = Recorder(delay=delay, status=status)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
