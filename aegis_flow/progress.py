"""The optional progress API for training scripts: ``aegis_flow.progress.step(n)``.

Side effects: under aegis-flow (``$AEGIS_PROGRESS_SOCKET`` set) :func:`step` sends the step
number as one Unix datagram to that socket — non-blocking, errors swallowed, at most one send per
``MIN_INTERVAL`` (10 a second); the socket is created on first use (again after a fork). Without
the variable it is a no-op costing one environment lookup. Standard library only.

The supervisor's hang watchdog prefers these reports over output activity once it has seen one,
so a script that logs rarely is not taken for hung::

    import aegis_flow.progress
    for i, batch in enumerate(loader):
        ...
        aegis_flow.progress.step(i)
"""

from __future__ import annotations

import os
import socket
import time

SOCKET_ENV = "AEGIS_PROGRESS_SOCKET"
MIN_INTERVAL = 0.1  # seconds between two sends

_sock: socket.socket | None = None
_sock_pid = 0
_last_path = ""
_last_sent = float("-inf")


def step(n: int) -> None:
    """Report that training reached step ``n``. Never raises, never blocks."""
    global _sock, _sock_pid, _last_path, _last_sent
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return
    now = time.monotonic()
    if now - _last_sent < MIN_INTERVAL and path == _last_path:
        return
    try:
        pid = os.getpid()
        if _sock is None or _sock_pid != pid:
            _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            _sock.setblocking(False)
            _sock_pid = pid
        _sock.sendto(b"%d" % int(n), path)
    except (OSError, ValueError, TypeError):
        pass  # the supervisor is gone or busy: training must never notice
    _last_path, _last_sent = path, now
