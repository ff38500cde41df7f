"""``peer_medians``: every rank's median of the others in O(N log N), the very numbers of
``peer_median`` rank by rank (the O(N²) walk the master ran on every tick at 4,096 ranks)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aegis_flow.master.anomaly import PeerLow, gpu_util
from aegis_flow.master.slowness import SlowDetector
from aegis_flow.steps.slow import flag_slow, peer_median, peer_medians

values = st.dictionaries(st.integers(0, 5000), st.floats(0, 1e6, allow_nan=False)
                         | st.sampled_from([0.0, 1.0, 2.0, 2.0, 3.5]), max_size=40)


@given(values)
def test_peer_medians_equal_peer_median_rank_by_rank(v: dict[int, float]) -> None:
    brute = {r: peer_median(v, r) for r in v}
    assert peer_medians(v) == {r: m for r, m in brute.items() if m is not None}


def test_a_lone_rank_and_none_have_no_peers() -> None:
    assert peer_medians({}) == {} and peer_medians({3: 1.0}) == {}
    assert peer_medians({0: 1.0, 1: 5.0}) == {0: 5.0, 1: 1.0}


def test_the_users_of_it_still_flag_the_one_slow_rank() -> None:
    v = {r: 10.0 for r in range(50)} | {7: 1.0}
    assert flag_slow(v, 0.5) == [7]
    det, found = SlowDetector(window=0.0).observe(0.0, {r: 100.0 for r in range(50)} | {9: 400.0})
    assert [r for r, _ in found] == [9] and det.flagged == {9}
    rule = PeerLow("gpu_idle", gpu_util, window=0.0, peers_above=50.0, below=5.0)
    samples = {r: {"gpus": [{"util": 90}]} for r in range(20)} | {4: {"gpus": [{"util": 0}]}}
    _, findings = rule.observe(0.0, samples)
    assert [f.rank for f in findings] == [4]
