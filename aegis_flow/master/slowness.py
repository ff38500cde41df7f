"""Which rank trains slower than its peers, continuously, from what the heartbeats carry. PURE.

Every heartbeat of a training rank carries the mean time of its outermost forwards since its
last report (``forward_ms``, counted by the pre-warmed interpreter with no change to the
script). In synchronous training every rank takes the same wall time per step — the fast ones
wait for the slow one in the collectives — but not the same time *computing*: the forward
pass holds no collective, so a rank on a slow node (a throttled CPU, a hot GPU, a noisy
neighbour) shows a longer forward than its peers. A rank whose forward takes longer than its
peers' median divided by ``fraction`` (0.5: twice as long) for ``window`` seconds in a row is
slow. One slow sample is noise; the window is the sustained part. No I/O, no clock: time
arrives as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from aegis_flow.steps.slow import peer_medians


@dataclass(frozen=True)
class SlowDetector:
    fraction: float = 0.5  # a rank below this share of its peers' median speed is slow
    window: float = 60.0  # ... for this long without a break
    since: Mapping[int, float] = field(default_factory=dict)  # rank → when it turned slow
    flagged: frozenset[int] = frozenset()  # already said: never again until forget()

    def __post_init__(self) -> None:
        if not 0 < self.fraction < 1 or self.window < 0:
            raise ValueError(f"need 0 < fraction < 1 and window >= 0, got fraction="
                             f"{self.fraction}, window={self.window}")

    def observe(self, now: float, forward_ms: Mapping[int, float]
                ) -> tuple[SlowDetector, tuple[tuple[int, str], ...]]:
        """The detector after these samples (each rank's latest mean forward time, ms), and
        the ranks that became slow now, each with a one-line reason."""
        since = dict(self.since)
        found: list[tuple[int, str]] = []
        medians = peer_medians(forward_ms)
        for rank, ms in sorted(forward_ms.items()):
            median = medians.get(rank)
            if median is None or ms <= 0:
                since.pop(rank, None)
                continue
            if median <= 0 or ms * self.fraction <= median:
                since.pop(rank, None)
                continue
            start = since.setdefault(rank, now)
            if now - start >= self.window and rank not in self.flagged:
                found.append((rank, f"forward {ms:.1f} ms vs its peers' median {median:.1f} ms "
                                    f"for {now - start:.0f} s"))
        flagged = self.flagged | {r for r, _ in found}
        return replace(self, since=since, flagged=frozenset(flagged)), tuple(found)

    def forget(self, rank: int) -> SlowDetector:
        """Rank ``rank`` was replaced (a new node): judge it afresh."""
        since = {r: t for r, t in self.since.items() if r != rank}
        return replace(self, since=since, flagged=self.flagged - {rank})
