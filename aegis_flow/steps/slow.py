"""Slow-rank detection over per-rank bandwidths: pure, standard library only, no side effects.

The master calls :func:`flag_slow` with the ``data["rank_bandwidth_gbps"]`` of every rank's
``allreduce_performance`` result (see :mod:`aegis_flow.steps.collective`); every rank also calls
it over the gathered numbers, so a slow rank's own result says so.

A rank is slow when its bandwidth is below ``fraction`` × the **median of its peers** (every
other rank, the rank itself excluded: a slow rank must not drag down the yardstick it is measured
against, and with two ranks the median of the peers is simply the other rank).
"""

from __future__ import annotations

import bisect
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


def peer_medians(values: Mapping[int, float]) -> dict[int, float]:
    """Every rank's :func:`peer_median` at once, in O(N log N): the values sorted once, and
    each rank's median of the others read off by position (removing one element shifts the
    ones above it down by one). The same numbers as ``peer_median`` rank by rank, which is
    O(N) per rank and O(N²) for all (at 4,096 ranks the master spent most of its time there).
    A lone rank has no entry."""
    ordered = sorted(float(v) for v in values.values())
    rest = len(ordered) - 1
    if rest < 1:
        return {}
    mid = rest // 2
    out: dict[int, float] = {}
    for rank, value in values.items():
        i = bisect.bisect_left(ordered, float(value))  # one copy of the value is removed

        def at(j: int, i: int = i) -> float:  # the j-th of the others, in order
            return ordered[j] if j < i else ordered[j + 1]

        out[rank] = at(mid) if rest % 2 else (at(mid - 1) + at(mid)) / 2
    return out


def flag_slow(bandwidths: Mapping[int, float],
              fraction: float = DEFAULT_SLOW_FRACTION) -> list[int]:
    """The ranks whose bandwidth is below ``fraction`` × the median of their peers, sorted.

    ``bandwidths`` maps rank → bandwidth (any unit, the same for all: GB/s from the
    performance check). A lone rank is never slow (no peers to compare with). Raises ValueError
    for a fraction outside (0, 1] or a bandwidth that is negative, NaN or infinite.
    """
    _check(bandwidths, fraction)
    medians = peer_medians(bandwidths)
    return sorted(rank for rank, median in medians.items()
                  if float(bandwidths[rank]) < fraction * median)
