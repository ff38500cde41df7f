"""Slow-rank detection over per-rank bandwidths: pure, standard library only, no side effects.

The master calls :func:`flag_slow` with the ``data["rank_bandwidth_gbps"]`` of every rank's
``allreduce_performance`` result (see :mod:`aegis_flow.steps.collective`); every rank also calls
it over the gathered numbers, so a slow rank's own result says so.

A rank is slow when its bandwidth is below ``fraction`` × the **median of its peers** (every
other rank, the rank itself excluded: a slow rank must not drag down the yardstick it is measured
against, and with two ranks the median of the peers is simply the other rank).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

#: a rank below this fraction of its peers' median bandwidth is slow (DESIGN.md §2)
DEFAULT_SLOW_FRACTION = 0.5


def _check(bandwidths: Mapping[int, float], fraction: float) -> None:
    if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    for rank, value in bandwidths.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0.0):
            raise ValueError(f"bandwidth of rank {rank} must be a finite number >= 0, "
                             f"got {value!r}")


def peer_median(bandwidths: Mapping[int, float], rank: int) -> float | None:
    """The median bandwidth of every rank but ``rank``; None when it has no peers."""
    peers = [float(v) for r, v in bandwidths.items() if r != rank]
    return statistics.median(peers) if peers else None


def flag_slow(bandwidths: Mapping[int, float],
              fraction: float = DEFAULT_SLOW_FRACTION) -> list[int]:
    """The ranks whose bandwidth is below ``fraction`` × the median of their peers, sorted.

    ``bandwidths`` maps rank → bandwidth (any unit, the same for all: GB/s from the
    performance check). A lone rank is never slow (no peers to compare with). Raises ValueError
    for a fraction outside (0, 1] or a bandwidth that is negative, NaN or infinite.
    """
    _check(bandwidths, fraction)
    slow = []
    for rank, value in bandwidths.items():
        median = peer_median(bandwidths, rank)
        if median is not None and float(value) < fraction * median:
            slow.append(rank)
    return sorted(slow)
