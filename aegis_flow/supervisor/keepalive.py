"""When a worker's heartbeat goes out as a keep-alive (``protocol.KeepAlive``), and its bytes.

A heartbeat that says nothing new — the same seq, phase, pod, addresses, child, activity, hang
mark and saver state as the worker's last full heartbeat, which went out less than the
master's ``keepalive`` seconds ago — is sent as one short line of its moving numbers (step,
rate, the pre-warmed interpreter's counts, the beat's lag). Everything else is a full
heartbeat, and so is every heartbeat until the master's orders ask for keep-alives (an older
master never gets one). The resource sample travels in full heartbeats only.

PURE state and logic: the supervisor calls :meth:`KeepAlives.compact` with each heartbeat
and the time; no I/O. Standard library only (the worker side stays light).
"""

from __future__ import annotations

import json
from typing import Any

from aegis_flow import protocol as p

#: heartbeat fields that move from beat to beat; a change in any other field sends it in full
MOVING = frozenset({"beat_lag", "step_rate", "step", "progress", "doing_for", "resources"})
#: the bounds on the master's full-heartbeat interval a worker accepts
EVERY_MIN, EVERY_MAX = 1.0, 60.0


def _int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= p.MAX_STEP
    return value if ok else None


def _real(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0.0 <= value < 1e18 else None


class KeepAlives:
    """One worker's keep-alive state: the master's interval and the last full heartbeat."""

    def __init__(self) -> None:
        self.every: float | None = None  # None: the master did not ask for keep-alives
        self._marker: tuple[int, str, str] | None = None  # what the last full beat said
        self._at = 0.0  # ... and when it went out
        self.sent = 0  # keep-alives sent (for tests and the log)

    def asked(self, every: object) -> None:
        """An order's ``keepalive`` field: the seconds between two full heartbeats."""
        if isinstance(every, int | float) and not isinstance(every, bool) and \
                EVERY_MIN <= every <= EVERY_MAX:
            self.every = float(every)

    def compact(self, msg: p.Message, now: float) -> bytes | None:
        """``msg`` (a heartbeat about to go out at monotonic ``now``) as a keep-alive, or None
        when it must go in full (it is then the last full one)."""
        data = msg.data
        still = {k: v for k, v in data.items() if k not in MOVING}
        marker = (msg.seq, msg.phase, json.dumps(still, sort_keys=True, default=str))
        if (self.every is None or marker != self._marker or now - self._at >= self.every
                or not p.keepalive_safe(msg.incarnation)):
            self._marker, self._at = marker, now
            return None
        progress = data.get("progress")
        progress = progress if isinstance(progress, dict) else {}
        self.sent += 1
        return p.KeepAlive(
            msg.seq, msg.incarnation, round(msg.timestamp, 3), step=_int(data.get("step")),
            step_rate=_real(data.get("step_rate")), steps=_int(progress.get("steps")),
            forwards=_int(progress.get("forwards")),
            last_active=_real(progress.get("last_active")),
            forward_ms=_real(progress.get("forward_ms")), beat_lag=_real(data.get("beat_lag")),
            doing_for=_real(data.get("doing_for"))).encode()
