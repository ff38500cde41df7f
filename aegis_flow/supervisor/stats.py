"""Numbers the supervisor carries in its heartbeats: step rate, heartbeat lag, GPU type.

The master exports them per worker (``master/metrics.py``); the supervisor itself stays free of
prometheus-client. Standard library only. Side effects: :func:`gpu_type` reads
``/proc/driver/nvidia/gpus/*/information`` (a few small files, once at start); the rest is pure.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from aegis_flow.settings import env_value

GPU_TYPE_ENV = "AEGIS_GPU_TYPE"


class StepRate:
    """Training steps per second over a sliding window of (time, step) samples."""

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()

    def observe(self, now: float, step: int) -> None:
        if self._samples and step < self._samples[-1][1]:
            self._samples.clear()  # a restarted run counts from its checkpoint again
        if self._samples and now <= self._samples[-1][0]:
            self._samples.pop()  # a batch read at one moment: keep its last step only
        self._samples.append((now, step))
        while self._samples and now - self._samples[0][0] > self.window:
            self._samples.popleft()

    @property
    def last(self) -> int | None:
        return self._samples[-1][1] if self._samples else None

    def rate(self, now: float) -> float | None:
        """Steps per second; 0.0 once no step came for a whole window; None before two."""
        if not self._samples:
            return None
        if now - self._samples[-1][0] > self.window:
            return 0.0
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        if t1 - t0 <= 0:
            return None
        return round((s1 - s0) / (t1 - t0), 3)

    def reset(self) -> None:
        self._samples.clear()


def gpu_type(environ: Mapping[str, str] = os.environ,
             root: str = "/proc/driver/nvidia/gpus") -> str:
    """``$AEGIS_GPU_TYPE``, else the NVIDIA driver's model name of the first GPU, else "cpu"."""
    override = env_value(GPU_TYPE_ENV, "", environ=environ).strip()
    if override:
        return override[:60]
    try:
        infos = sorted(Path(root).glob("*/information"))
    except OSError:
        infos = []
    for info in infos:
        try:
            for line in info.read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model" and value.strip():
                    return value.strip()[:60]
        except OSError:
            continue
    return "cpu"


class BeatClock:
    """How late each heartbeat fires against its schedule (a starved supervisor shows here)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._due: float | None = None
        self.lag = 0.0

    def beat(self, now: float) -> None:
        """Call when a heartbeat goes out; the next one is due one interval later."""
        self.lag = max(0.0, now - self._due) if self._due is not None else 0.0
        self._due = now + self.interval
