"""The master's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz`` and ``/progress``.

Side effects: binds a TCP port (0 picks a free one) and serves from daemon threads, so a
scrape never waits on (or delays) the asyncio loop that handles worker reports. The paths and
the default port are in ``endpoints.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from aegis_flow.master.endpoints import HEALTH_PATH, METRICS_PATH, PROGRESS_PATH, READINESS_PATH


class MetricsServer:
    """Serve the endpoints until :meth:`stop`; ``port`` is the one actually bound."""

    def __init__(self, *, render: Callable[[], bytes], ready: Callable[[], bool],
                 progress: Callable[[], dict[str, Any]], addr: str = "0.0.0.0",
                 port: int = 0) -> None:
        handler = _handler(render, ready, progress)
        try:
            self._server = ThreadingHTTPServer((addr, port), handler)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}; "
                          "pick another --metrics-port (0 = any free port)") from None
        self._server.daemon_threads = True
        self.addr = addr
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="aegis-metrics", daemon=True)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr
        return f"http://{host}:{self.port}"

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(render: Callable[[], bytes], ready: Callable[[], bool],
             progress: Callable[[], dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "aegis-flow"

        def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
            path = self.path.split("?", 1)[0]
            try:
                if path == METRICS_PATH:
                    self._send(200, render(), CONTENT_TYPE_LATEST)
                elif path == HEALTH_PATH:
                    self._send(200, b"ok\n")
                elif path == READINESS_PATH:
                    ok = ready()
                    self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
                elif path == PROGRESS_PATH:
                    self._send(200, json.dumps(progress()).encode(), "application/json")
                else:
                    self._send(404, f"not found; try {METRICS_PATH}, {HEALTH_PATH}, "
                               f"{READINESS_PATH}, {PROGRESS_PATH}\n".encode())
            except Exception as exc:  # noqa: BLE001 - a scrape must never kill the master
                self._send(500, f"error: {exc}\n".encode())

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # scrapes every few seconds would drown the job's output

    return Handler
