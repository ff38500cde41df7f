"""Live progress of ``aegis-flow run``: one short status line on stderr every few seconds.

Side effects: :meth:`ProgressPrinter.poll` reads the master's port file and GETs its
``/progress`` endpoint (localhost, short timeout) at most once a second, and writes a line to
stderr when the phase, the restart count or what a rank says it is doing changed, or every
``every`` seconds. The training output (stdout, rank-prefixed) is never held up: a failed
fetch is skipped silently.
:func:`progress_line` is pure.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from aegis_flow.master.endpoints import PROGRESS_PATH


def progress_line(snap: dict[str, Any], elapsed: float) -> str:
    """``RunCommand · restarts 1/3 · steps/s r0 19.8 r1 19.6 · 42 s`` (pure)."""
    parts = [str(snap.get("phase", "?"))]
    if "recover_count" in snap:  # past max-retry (T11: the failure not restarted) it is full
        most = snap.get("max_retry")
        count = snap["recover_count"]
        shown = min(count, most) if isinstance(count, int) and isinstance(most, int) else count
        parts.append(f"restarts {shown}/{'?' if most is None else most}")
    rates = []
    for w in snap.get("workers") or []:
        rate = w.get("step_rate")
        shown = f"{rate:.1f}" if isinstance(rate, int | float) else "-"
        rates.append(f"r{w.get('rank')} {shown}")
    if rates and any(not r.endswith(" -") for r in rates):
        parts.append("steps/s " + " ".join(rates))
    phases = {w.get("phase") for w in snap.get("workers") or []}
    if len(phases) > 1:
        parts.append("workers " + ",".join(
            f"r{w.get('rank')}:{w.get('phase')}" for w in snap.get("workers") or []))
    busy: dict[str, list[str]] = {}  # what the ranks say they do, e.g. the torch import
    longest: dict[str, float] = {}
    for w in snap.get("workers") or []:
        doing = w.get("doing")
        if isinstance(doing, str) and doing:
            busy.setdefault(doing, []).append(f"r{w.get('rank')}")
            took = w.get("doing_for")
            if isinstance(took, int | float):
                longest[doing] = max(longest.get(doing, 0.0), float(took))
    for doing, ranks in busy.items():
        since = f" ({longest[doing]:.0f} s)" if longest.get(doing, 0) >= 1 else ""
        parts.append(f"{','.join(ranks)} {doing}{since}")
    if snap.get("error_nodes"):
        parts.append(f"quarantined {','.join(snap['error_nodes'])}")
    parts.append(f"{elapsed:.0f} s")
    return " · ".join(parts)


def fetch_progress(port_file: Path, timeout: float = 0.5) -> dict[str, Any] | None:
    try:
        port = int(port_file.read_text().strip())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{PROGRESS_PATH}",
                                    timeout=timeout) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class ProgressPrinter:
    def __init__(self, port_file: Path, *, every: float = 5.0, enabled: bool = True) -> None:
        self.port_file, self.every, self.enabled = port_file, every, enabled
        self.started = time.monotonic()
        self._next_poll = 0.0
        self._last_print = float("-inf")
        self._last_key: tuple[Any, ...] = ()

    def poll(self) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + 1.0
        snap = fetch_progress(self.port_file)
        if snap is None:
            return
        key = (snap.get("phase"), snap.get("recover_count"),
               tuple((w.get("phase"), w.get("doing")) for w in snap.get("workers") or []))
        if key == self._last_key and now - self._last_print < self.every:
            return
        self._last_key, self._last_print = key, now
        sys.stderr.write(f"[aegis-flow] {progress_line(snap, now - self.started)}\n")
        sys.stderr.flush()
