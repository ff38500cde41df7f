"""The anomaly rules over per-rank resource samples: each fires once per episode, re-arms,
stays quiet for healthy peers and short blips, and its thresholds matter."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from aegis_flow.master.anomaly import Anomalies, Finding, MiB, PeerLow, RssGrowth, gpu_util

Sample = dict[str, Any]


def gpus(*utils: float) -> Sample:
    return {"gpus": [{"i": i, "util": u, "mem": 10**9} for i, u in enumerate(utils)]}


def net(bps: float, ib: float | None = None) -> Sample:
    out: Sample = {"net": {"rx": bps / 2, "tx": bps / 2}}
    if ib is not None:
        out["ib"] = {"rx": ib / 2, "tx": ib / 2}
    return out


def procs(*pid_rss: tuple[int, float]) -> Sample:
    return {"procs": [{"pid": p, "cpu": 90.0, "rss": r} for p, r in pid_rss]}


def run(timeline: list[tuple[float, Mapping[int, Sample]]],
        detector: Anomalies | None = None) -> list[tuple[float, Finding]]:
    det = detector or Anomalies()
    found: list[tuple[float, Finding]] = []
    for now, samples in timeline:
        det, new = det.observe(now, samples)
        found += [(now, f) for f in new]
    return found


def every(step: float, until: float, make: Callable[[float], Mapping[int, Sample]],
          start: float = 0.0) -> list[tuple[float, Mapping[int, Sample]]]:
    out, t = [], start
    while t <= until + 1e-9:
        out.append((t, make(t)))
        t += step
    return out


# -- gpu_idle ----------------------------------------------------------------------------------


def test_gpu_idle_fires_once_after_the_window() -> None:
    found = run(every(1.0, 100.0, lambda t: {0: gpus(95, 97), 1: gpus(96, 0 if t >= 10 else 95),
                                              2: gpus(94, 93)}))
    assert [(t, f.rank, f.rule) for t, f in found] == [(40.0, 1, "gpu_idle")]
    assert "0 % vs its peers' median 94 %" in found[0][1].detail


def test_gpu_idle_quiet_for_a_blip_and_when_peers_idle_too() -> None:
    blip = every(1.0, 100.0, lambda t: {0: gpus(95), 1: gpus(0 if 10 <= t < 39 else 95),
                                        2: gpus(94)})
    assert run(blip) == []
    all_idle = every(1.0, 100.0, lambda t: {0: gpus(1), 1: gpus(0), 2: gpus(2)})  # eval, I/O
    assert run(all_idle) == []
    healthy = every(1.0, 100.0, lambda t: {r: gpus(60 + r) for r in range(8)})
    assert run(healthy) == []


def test_gpu_idle_rearms_when_it_clears() -> None:
    def make(t: float) -> Mapping[int, Sample]:
        idle = 10 <= t < 60 or 100 <= t
        return {0: gpus(90), 1: gpus(0 if idle else 90), 2: gpus(90)}
    found = run(every(1.0, 200.0, make))
    assert [(t, f.rank) for t, f in found] == [(40.0, 1), (130.0, 1)]


@pytest.mark.parametrize("mine, peers, fires", [
    (4.9, 51.0, True),   # planted just inside both thresholds
    (5.0, 90.0, False),  # 5 % is not below 5 %
    (0.0, 50.0, False),  # peers' median must be above 50 %
])
def test_gpu_idle_thresholds_matter(mine: float, peers: float, fires: bool) -> None:
    found = run(every(5.0, 60.0, lambda t: {0: gpus(peers), 1: gpus(mine), 2: gpus(peers)}))
    assert bool(found) is fires


def test_gpu_idle_one_gpu_of_eight_counts_and_missing_gpus_are_skipped() -> None:
    found = run(every(5.0, 60.0, lambda t: {0: gpus(*[90] * 8), 1: gpus(*[90] * 7, 0),
                                            2: {"procs": []}, 3: gpus(*[92] * 8)}))
    assert [f.rank for _, f in found] == [1]
    assert gpu_util({"gpus": "junk"}) is None and gpu_util({"gpus": [{"util": True}]}) is None


# -- rss_growth --------------------------------------------------------------------------------


def test_rss_growth_fires_once_for_a_leak() -> None:
    # 2 GiB growing 4 MiB a second: +1.2 GiB (60 %) per 300 s; a healthy peer stays flat
    found = run(every(5.0, 900.0, lambda t: {0: procs((100, 2048 * MiB + 4 * MiB * t)),
                                             1: procs((200, 2048 * MiB))}))
    assert [(t, f.rank, f.rule) for t, f in found] == [(300.0, 0, "rss_growth")]
    assert "pid 100" in found[0][1].detail and "+59 %" in found[0][1].detail


def test_rss_growth_quiet_for_warmup_then_plateau_and_for_sawtooth() -> None:
    # loads its data set in the first 60 s (+3 GiB), then flat: growth is old, not in the window
    plateau = every(5.0, 900.0, lambda t: {0: procs((1, (1024 + 50 * min(t, 60)) * MiB))})
    assert run(plateau) == []
    # grows for 250 s then frees (a cache flush), again and again
    saw = every(5.0, 1500.0, lambda t: {0: procs((1, (1024 + 4 * (t % 250)) * MiB))})
    assert run(saw) == []


def test_rss_growth_rearms_after_a_decrease_and_a_new_pid_starts_afresh() -> None:
    def make(t: float) -> Mapping[int, Sample]:
        if t < 400:
            return {0: procs((1, (1024 + 4 * t) * MiB))}
        if t < 405:
            return {0: procs((1, 1024 * MiB))}  # freed: the episode ends
        return {0: procs((1, (1024 + 4 * (t - 405)) * MiB))}
    found = run(every(5.0, 1000.0, make))
    assert [t for t, _ in found] == [300.0, 700.0]  # the new run starts at the decrease (400)
    # the process restarted at 200 s (a new pid) and grows on: pid 2's own window, not pid 1's
    restart = every(5.0, 600.0, lambda t: {0: procs((1 if t < 200 else 2, (1024 + 4 * t) * MiB))})
    assert [(t, f.detail.split(" RSS")[0]) for t, f in run(restart)] == [(500.0, "pid 2")]


@pytest.mark.parametrize("base_mib, per_s_mib, fires", [
    (1024, 1.0, True),     # +300 MiB, 29 %: both thresholds passed
    (2048, 1.0, False),    # +300 MiB but only 15 %
    (100, 0.8, False),     # +240 %, but only 240 MiB
])
def test_rss_growth_thresholds_matter(base_mib: float, per_s_mib: float, fires: bool) -> None:
    found = run(every(5.0, 310.0, lambda t: {0: procs((1, (base_mib + per_s_mib * t) * MiB))}))
    assert bool(found) is fires


def test_rss_growth_state_is_bounded_under_frequent_calls() -> None:
    det = Anomalies()
    for i in range(5000):  # every 0.1 s
        det, _ = det.observe(i / 10, {0: procs((1, 1024 * MiB + i))})
    assert len(det.rss.runs[0][1].points) <= 66


# -- net_low -----------------------------------------------------------------------------------


def test_net_low_fires_once_after_the_window() -> None:
    found = run(every(5.0, 300.0, lambda t: {0: net(50e6), 1: net(48e6, ib=2e9),
                                             2: net(4e6 if t >= 20 else 50e6), 3: net(52e6)}))
    assert [(t, f.rank, f.rule) for t, f in found] == [(80.0, 2, "net_low")]
    assert "4.00 MB/s vs its peers' median 52.00 MB/s" in found[0][1].detail


def test_net_low_quiet_for_idle_peers_and_blips_and_rearms() -> None:
    idle = every(5.0, 300.0, lambda t: {0: net(0.9e6), 1: net(0), 2: net(0.8e6)})
    assert run(idle) == []

    def make(t: float) -> Mapping[int, Sample]:
        low = 10 <= t < 50 or 100 <= t < 170 or 200 <= t
        return {0: net(40e6), 1: net(1e6 if low else 40e6), 2: net(40e6)}
    assert [t for t, _ in run(every(5.0, 300.0, make))] == [160.0, 260.0]


@pytest.mark.parametrize("mine, peers, fires", [
    (2.4e6, 10e6, True),    # 24 % of the median
    (2.5e6, 10e6, False),   # 25 % is not below 25 %
    (0.0, 1e6, False),      # peers must move more than 1 MB/s
])
def test_net_low_thresholds_matter(mine: float, peers: float, fires: bool) -> None:
    found = run(every(5.0, 70.0, lambda t: {0: net(peers), 1: net(mine), 2: net(peers)}))
    assert bool(found) is fires


# -- together ----------------------------------------------------------------------------------


def test_rules_together_absent_ranks_forget_and_junk() -> None:
    det = Anomalies()
    bad: dict[int, Any] = {0: {"gpus": [None, {"util": "x"}], "procs": [{"pid": "x"}, 3]},
                           1: "junk", 2: {}}
    det, found = det.observe(0.0, bad)
    assert found == []
    for t in range(0, 30):
        det, found = det.observe(float(t), {0: gpus(90), 1: gpus(0), 2: gpus(90)})
        assert found == []
    assert det.gpu.since == {1: 0.0}
    det, found = det.observe(30.0, {0: gpus(90), 1: gpus(0), 2: gpus(90)})
    assert [f.rank for f in found] == [1]
    det = det.forget(1)  # replaced: judged afresh
    assert 1 not in det.gpu.since and 1 not in det.gpu.flagged
    det, found = det.observe(31.0, {0: gpus(90), 2: gpus(90)})  # rank 1 absent: state dropped
    assert found == [] and det.gpu.since == {}


def test_rule_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        PeerLow("x", gpu_util, window=1.0, peers_above=0.0)
    with pytest.raises(ValueError):
        RssGrowth(window=0)


# -- fresh samples only (the runtime's once-a-beat look at thousands of ranks) ---------------


def test_only_fresh_samples_are_read_and_the_findings_are_the_same() -> None:
    """The runtime passes which ranks sent a new sample since its last look; the others'
    samples are not read again. Seen every second while samples arrive every 5 s (each a new
    object only when it arrives), the findings are those of looking at every arrival."""
    def sample(rank: int, t: float) -> Sample:
        util = 0.0 if rank == 3 and t >= 100 else 95.0
        rss = 2048 * MiB + (4 * MiB * t if rank == 1 else 0)
        return {**gpus(util), **procs((100 + rank, rss)), **net(5e7 if rank != 2 else 1e6)}

    looked: list[tuple[float, Finding]] = []
    det, latest = Anomalies(), {r: sample(r, 0.0) for r in range(6)}
    fresh: set[int] = set(latest)
    for t in range(0, 601):
        if t % 5 == 0 and t:  # each rank's full heartbeat: a new sample object
            latest = {r: sample(r, float(t)) for r in range(6)}
            fresh = set(latest)
        det, new = det.observe(float(t), latest, fresh)
        fresh = set()
        looked += [(float(t), f) for f in new]
    arrivals = run([(float(t), {r: sample(r, float(t)) for r in range(6)})
                    for t in range(0, 601, 5)])
    assert sorted((t, f.rank, f.rule) for t, f in looked) == sorted(
        (t, f.rank, f.rule) for t, f in arrivals)
    assert {(f.rank, f.rule) for _, f in looked} == {(1, "rss_growth"), (3, "gpu_idle"),
                                                     (2, "net_low")}


def test_a_sample_not_fresh_is_not_read_again() -> None:
    reads: list[int] = []

    def metric(sample: Any) -> float | None:
        reads.append(sample["rank"])
        return float(sample["v"])

    rule = PeerLow("x", metric, window=0.0, peers_above=0.0, fraction=0.5)
    samples = {r: {"rank": r, "v": 10.0} for r in range(4)}
    rule, _ = rule.observe(0.0, samples)
    assert sorted(reads) == [0, 1, 2, 3]
    reads.clear()
    rule, found = rule.observe(1.0, samples | {2: {"rank": 2, "v": 1.0}}, fresh={2})
    assert reads == [2] and [f.rank for f in found] == [2]
    rule, found = rule.observe(2.0, {r: samples[r] for r in (0, 1)}, fresh=set())
    assert reads == [2] and found == [] and set(rule.values) == {0, 1}  # 2 and 3 are gone
