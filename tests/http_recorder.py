"""A real local HTTP server that records every request and answers from a route table, for
testing real API clients (kubernetes, Hera's WorkflowsService) without a cluster; and a
``black_hole``: a server that accepts connections and never answers."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Answer = tuple[int, Any]
Route = Callable[[Request], Answer]


class Recorder:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.routes: dict[tuple[str, str], Route] = {}
        self.url = ""

    def on(self, method: str, path: str, route: Route | Answer) -> None:
        self.routes[(method, path)] = route if callable(route) else (lambda _r, a=route: a)


@contextmanager
def recording_server() -> Iterator[Recorder]:
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            parts = urlsplit(self.path)
            req = Request(self.command, parts.path, parts.query,
                          {k.lower(): v for k, v in self.headers.items()},
                          self.rfile.read(length) if length else b"")
            rec.requests.append(req)
            route = rec.routes.get((req.method, req.path))
            status, payload = route(req) if route else (404, {
                "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@dataclass
class BlackHole:
    url: str
    accepted: threading.Event  # set at the first connection it took


@contextmanager
def black_hole() -> Iterator[BlackHole]:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers (an API
    server that hangs); closed with everything it accepted on leaving."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()
    hole = BlackHole(f"http://127.0.0.1:{srv.getsockname()[1]}", threading.Event())

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = srv.accept()
                held.append(conn)
                hole.accepted.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield hole
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        srv.close()
