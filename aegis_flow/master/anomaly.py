"""Anomalies in the shape of the workers' resource samples, across peers. PURE.

Each heartbeat can carry the worker's ``resources`` dict as
:meth:`aegis_flow.supervisor.resources.Sampler.sample` returns it. The earliest sign of many
faults is that a metric's shape changed — a GPU's utilisation drops to zero, a node's bandwidth
collapses, a process's memory only grows — not an error. These rules turn that into findings
(rank, rule, detail) for the fault log: early evidence, never a kill on their own.

Call :meth:`Anomalies.observe` with every live rank's *latest* ``resources`` dict (the master
keeps the last one per rank) whenever it likes, e.g. once per heartbeat round. A rank absent
from a call, or whose dict lacks the rule's metric, has its episode for that rule ended (its
window starts again). Each rule reports a rank once per episode: it re-arms when the condition
clears. No I/O, no clock: time arrives as ``now`` (seconds, monotonic). Malformed dicts (from
the wire) are ignored, never raised on.

The rules (defaults; each is a field):

``gpu_idle`` — GPU utilisation collapsed on one rank while its peers work. A rank's value is
    the *lowest* ``util`` among its GPUs (one idle GPU of eight counts). Fires when the value
    is below 5 % while the median of the other ranks' values is above 50 %, without a break
    for 30 s (``window``).
``rss_growth`` — a process's memory only grows. Per (rank, pid) of ``procs``: every RSS
    sample over the last 300 s (``window``) is ≥ the one before, RSS grew over that window
    (from the last sample at or before its start) by more than 20 % *and* more than 256 MiB,
    and it grew in each half of the window (a warm-up followed by a flat plateau is not a
    leak; nor is a hung process's flat RSS after one). A decrease ends the episode. Samples
    closer than ``window / 64`` apart are thinned from the history (a decrease among them
    still counts), so the state stays bounded.
``net_low`` — one node's network throughput far below its peers'. A rank's value is
    rx + tx of ``net`` plus rx + tx of ``ib`` (B/s). Fires when it is below 25 % of the median
    of the other ranks' values while that median is above 1 MB/s (1e6 B/s), without a break
    for 60 s (``window``).

Comparisons need at least one other rank with the metric (a single rank has no peers).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aegis_flow.steps.slow import peer_medians

MiB = 1024 * 1024


@dataclass(frozen=True)
class Finding:
    rank: int
    rule: str  # "gpu_idle", "rss_growth", "net_low"
    detail: str


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def gpu_util(sample: Any) -> float | None:
    """The lowest GPU utilisation (%) of a resources dict, or None without one."""
    gpus = sample.get("gpus") if isinstance(sample, Mapping) else None
    if not isinstance(gpus, list):
        return None
    utils = [u for g in gpus if isinstance(g, Mapping)
             and (u := _number(g.get("util"))) is not None]
    return min(utils) if utils else None


def net_rate(sample: Any) -> float | None:
    """A node's network throughput (B/s): rx + tx of ``net`` and of ``ib``, or None."""
    if not isinstance(sample, Mapping):
        return None
    total, seen = 0.0, False
    for key in ("net", "ib"):
        part = sample.get(key)
        if not isinstance(part, Mapping):
            continue
        for direction in ("rx", "tx"):
            value = _number(part.get(direction))
            if value is not None:
                total += value
                seen = True
    return total if seen else None


def proc_rss(sample: Any) -> Iterator[tuple[int, float]]:
    """(pid, RSS bytes) of every process of a resources dict that has both."""
    procs = sample.get("procs") if isinstance(sample, Mapping) else None
    if not isinstance(procs, list):
        return
    for proc in procs:
        if not isinstance(proc, Mapping):
            continue
        pid, rss = proc.get("pid"), _number(proc.get("rss"))
        if isinstance(pid, int) and not isinstance(pid, bool) and rss is not None:
            yield pid, rss


def _fmt_rate(bps: float) -> str:
    return f"{bps / 1e6:.2f} MB/s"


@dataclass(frozen=True)
class PeerLow:
    """One rank's value low against its peers' median for ``window`` seconds without a break:
    low is below ``below`` (absolute) if set, else below ``fraction`` × the median; only while
    the median is above ``peers_above``."""

    rule: str
    metric: Callable[[Any], float | None]
    window: float
    peers_above: float
    below: float | None = None
    fraction: float | None = None
    describe: Callable[[float], str] = str
    since: Mapping[int, float] = field(default_factory=dict)  # rank → when it turned low
    flagged: frozenset[int] = frozenset()  # reported in the current episode
    values: Mapping[int, float | None] = field(default_factory=dict)  # the last call's metric

    def __post_init__(self) -> None:
        if (self.below is None) == (self.fraction is None) or self.window < 0:
            raise ValueError(f"{self.rule}: need exactly one of below/fraction and window >= 0")

    def observe(self, now: float, samples: Mapping[int, Any],
                fresh: Collection[int] | None = None) -> tuple[PeerLow, list[Finding]]:
        """``fresh``: the ranks whose sample is new since the last call (None: all); the
        others' metric is the one read then (reading it is most of the cost at 4,096 ranks)."""
        last = self.values
        read = {rank: (self.metric(s) if fresh is None or rank in fresh or rank not in last
                       else last[rank]) for rank, s in samples.items()}
        values = {rank: v for rank, v in read.items() if v is not None}
        since: dict[int, float] = {}
        flagged: set[int] = set()
        found: list[Finding] = []
        medians = peer_medians(values)
        for rank, value in sorted(values.items()):
            median = medians.get(rank)
            if median is None:
                continue
            limit = self.below if self.below is not None else (self.fraction or 0) * median
            if median <= self.peers_above or value >= limit:
                continue  # healthy (or nothing to compare with): the episode ends, re-armed
            start = since[rank] = self.since.get(rank, now)
            if now - start < self.window:
                continue
            if rank not in self.flagged:
                found.append(Finding(rank, self.rule, (
                    f"{self.describe(value)} vs its peers' median {self.describe(median)} "
                    f"for {now - start:.0f} s")))
            flagged.add(rank)
        return replace(self, since=since, flagged=frozenset(flagged), values=read), found


@dataclass(frozen=True)
class _Run:
    points: tuple[tuple[float, float], ...]  # (time, RSS) of the current non-decreasing run
    last: float  # the latest RSS seen (thinned samples included)


@dataclass(frozen=True)
class RssGrowth:
    """A process's RSS non-decreasing over ``window`` s, grown by > ``fraction`` and
    > ``min_bytes`` over it, and grown in each half of it; per (rank, pid)."""

    window: float = 300.0
    fraction: float = 0.20
    min_bytes: float = 256 * MiB
    runs: Mapping[int, Mapping[int, _Run]] = field(default_factory=dict)  # rank → pid → run
    flagged: frozenset[tuple[int, int]] = frozenset()

    def __post_init__(self) -> None:
        if self.window <= 0 or self.fraction < 0 or self.min_bytes < 0:
            raise ValueError(f"rss_growth: need window > 0, fraction >= 0, min_bytes >= 0, got "
                             f"{self.window}, {self.fraction}, {self.min_bytes}")

    def observe(self, now: float, samples: Mapping[int, Any],
                fresh: Collection[int] | None = None) -> tuple[RssGrowth, list[Finding]]:
        """``fresh``: the ranks whose sample is new since the last call (None: all); the
        others' runs stay as they are (a sample is one measurement, judged when it comes)."""
        runs: dict[int, Mapping[int, _Run]] = {}
        flagged: set[tuple[int, int]] = set()
        found: list[Finding] = []
        if fresh is not None:  # the ranks still present and not fresh keep what they had
            runs = {r: by_pid for r, by_pid in self.runs.items()
                    if r in samples and r not in fresh}
            flagged = {k for k in self.flagged if k[0] in runs}
        for rank, sample in sorted(samples.items()):
            if fresh is not None and rank not in fresh:
                continue
            mine = runs[rank] = self._judge(now, rank, sample, flagged, found)
            if not mine:
                del runs[rank]
        return replace(self, runs=runs, flagged=frozenset(flagged)), found

    def _judge(self, now: float, rank: int, sample: Any, flagged: set[tuple[int, int]],
               found: list[Finding]) -> dict[int, _Run]:
        """One rank's new sample: its processes' runs after it (findings and flags added)."""
        step = self.window / 64
        before = self.runs.get(rank, {})
        mine: dict[int, _Run] = {}
        for pid, rss in proc_rss(sample):
            key = (rank, pid)
            run = before.get(pid)
            if run is None or rss < run.last:  # a new process, or memory went down
                points: tuple[tuple[float, float], ...] = ((now, rss),)
            elif now - run.points[-1][0] >= step:
                points = (*run.points, (now, rss))
            else:
                points = run.points  # thinned: too close to the last point kept
            cut = now - self.window
            if points[0][0] > cut:  # not a whole window of history yet
                mine[pid] = _Run(points, rss)
                continue
            first = 0  # the baseline: the last sample at or before the cut (points are in
            while first + 1 < len(points) and points[first + 1][0] <= cut:  # time order)
                first += 1
            points = points[first:]
            mine[pid] = _Run(points, rss)
            base = points[0][1]
            grown = rss - base
            if grown <= self.min_bytes or grown <= self.fraction * base:
                continue
            mid = [v for t, v in points if t <= now - self.window / 2][-1]
            if not base < mid < rss:
                continue
            if key not in self.flagged:
                found.append(Finding(rank, "rss_growth", (
                    f"pid {pid} RSS only grew for {now - points[0][0]:.0f} s: "
                    f"{base / MiB:.0f} MiB → {rss / MiB:.0f} MiB "
                    f"(+{100 * grown / base if base else 100:.0f} %)")))
            flagged.add(key)
        return mine


def _fmt_pct(value: float) -> str:
    return f"{value:.0f} %"


@dataclass(frozen=True)
class Anomalies:
    """Every rule together: ``observe(now, samples)`` → (the next Anomalies, new findings)."""

    gpu: PeerLow = field(default_factory=lambda: PeerLow(
        "gpu_idle", gpu_util, window=30.0, peers_above=50.0, below=5.0, describe=_fmt_pct))
    rss: RssGrowth = field(default_factory=RssGrowth)
    net: PeerLow = field(default_factory=lambda: PeerLow(
        "net_low", net_rate, window=60.0, peers_above=1e6, fraction=0.25,
        describe=_fmt_rate))

    def observe(self, now: float, samples: Mapping[int, Any],
                fresh: Collection[int] | None = None) -> tuple[Anomalies, list[Finding]]:
        """``samples``: rank → its latest ``resources`` dict. Findings that are new now.
        ``fresh``: the ranks whose sample is new since the last call (None: every rank's):
        the others' samples are not read again."""
        gpu, f1 = self.gpu.observe(now, samples, fresh)
        rss, f2 = self.rss.observe(now, samples, fresh)
        net, f3 = self.net.observe(now, samples, fresh)
        return Anomalies(gpu, rss, net), [*f1, *f2, *f3]

    def forget(self, rank: int) -> Anomalies:
        """Rank ``rank`` was replaced: judge it afresh (its next sample starts every window)."""
        return Anomalies(
            replace(self.gpu, since={r: t for r, t in self.gpu.since.items() if r != rank},
                    flagged=self.gpu.flagged - {rank}),
            replace(self.rss, runs={r: v for r, v in self.rss.runs.items() if r != rank},
                    flagged=frozenset(k for k in self.rss.flagged if k[0] != rank)),
            replace(self.net, since={r: t for r, t in self.net.since.items() if r != rank},
                    flagged=self.net.flagged - {rank}))
