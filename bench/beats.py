"""What a worker's heartbeat carries while it trains, for the scale benchmarks (PURE).

``scale.py`` (simulated workers over a real nats-server) and ``master_beat.py`` (the master
in-process) send the same numbers: a worker of 8 GPUs, busy and healthy, its numbers moving a
little from beat to beat, as ``supervisor/agent.py`` (``_beat_data``) and
``supervisor/resources.py`` (``Sampler.sample``) produce them.
"""

from __future__ import annotations

import time
from typing import Any

GPUS = 8  # per worker (one rank per GPU under --nproc-per-node 8)


def resources(rank: int, beat: int) -> dict[str, Any]:
    """A resource sample: 8 training processes, the node's network and InfiniBand, 8 GPUs
    (about 900 bytes of JSON)."""
    k = beat % 10
    return {"procs": [{"pid": 1000 + GPUS * rank + i, "cpu": 98.0 + k + i / 10,
                       "rss": 6_400_000_000 + 4096 * i} for i in range(GPUS)],
            "net": {"rx": 120_000_000 + k, "tx": 118_000_000 + k},
            "ib": {"rx": 21_000_000_000 + k, "tx": 20_900_000_000 + k},
            "gpus": [{"i": i, "util": 96 + (k + i) % 4, "mem": 71_000_000_000 + i,
                      "temp": 62 + i % 3, "ecc": 0} for i in range(GPUS)]}


def numbers(rank: int, beat: int) -> dict[str, Any]:
    """The heartbeat fields that move while training: the step, its rate, the pre-warmed
    interpreter's counts and forward time, the beat's lag, and the resource sample."""
    return {"beat_lag": round(0.001 * (beat % 7), 4),
            "step_rate": round(2.0 + 0.01 * (beat % 5), 3), "step": beat,
            "progress": {"steps": beat, "forwards": beat, "last_active": round(time.time(), 3),
                         "forward_ms": round(180.0 + beat % 9, 3)},
            "resources": resources(rank, beat)}
