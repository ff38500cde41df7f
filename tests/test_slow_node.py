"""Slow ranks during training, marked and evicted at the checkpoint boundary (issue 18).

Pure and unit tier: ``master/slowness.py`` (which rank is slow, from forward times, over a
sustained window) and the core's rows T13s (mark, nothing else) and T13e (evict right after a
checkpoint, never before; the node quarantined as slow). The real-process proof is
``tests/test_slow_node_e2e.py``; the model checker's EvictionOnlyAtCheckpoint covers every
reachable state.
"""

from __future__ import annotations

import pytest
from machine_helpers import running, transitions

from aegis_flow.master.machine import (
    Ack,
    AskCheckpoint,
    CheckpointDone,
    ExitCode,
    ExitWorker,
    Finish,
    Phase,
    Quarantine,
    Slow,
    step,
)
from aegis_flow.master.slowness import SlowDetector


def test_a_rank_twice_as_slow_for_the_whole_window_is_named_once() -> None:
    d = SlowDetector(0.5, window=10)
    found: list[tuple[int, str]] = []
    for t in range(0, 30):
        d, new = d.observe(float(t), {0: 10.0, 1: 25.0, 2: 11.0})
        found += new
        if t < 10:
            assert new == ()
    assert [r for r, _ in found] == [1]  # at t = 10, and never again
    assert "forward 25.0 ms vs its peers' median 10.5 ms" in found[0][1]


def test_a_break_in_the_slowness_starts_the_window_again() -> None:
    d = SlowDetector(0.5, window=10)
    for t in range(0, 9):
        d, new = d.observe(float(t), {0: 10.0, 1: 30.0})
    d, new = d.observe(9.0, {0: 10.0, 1: 12.0})  # one fast sample: the window restarts
    for t in range(10, 19):
        d, new = d.observe(float(t), {0: 10.0, 1: 30.0})
        assert new == ()
    d, new = d.observe(20.0, {0: 10.0, 1: 30.0})
    assert [r for r, _ in new] == [1]


@pytest.mark.parametrize("samples", [
    {0: 10.0}, {0: 10.0, 1: 19.0}, {0: 0.0, 1: 50.0}, {0: 10.0, 1: -1.0}, {}])
def test_nothing_slow(samples: dict[int, float]) -> None:
    d = SlowDetector(0.5, window=0)
    assert d.observe(5.0, samples)[1] == ()


def test_a_replaced_rank_is_judged_afresh_and_bad_settings_are_refused() -> None:
    d = SlowDetector(0.5, window=0)
    d, new = d.observe(1.0, {0: 10.0, 1: 30.0})
    assert [r for r, _ in new] == [1]
    assert d.observe(2.0, {0: 10.0, 1: 30.0})[1] == ()
    d = d.forget(1)
    assert [r for r, _ in d.observe(3.0, {0: 10.0, 1: 30.0})[1]] == [1]
    for bad in ((0.0, 1.0), (1.0, 1.0), (0.5, -1.0)):
        with pytest.raises(ValueError):
            SlowDetector(*bad)


def test_t13s_marks_only_and_t13e_evicts_right_after_the_next_checkpoint() -> None:
    status = running(3, 2)
    seq = status.seq
    status, effects = step(status, Slow(1, "forward 25 ms vs 10 ms"))
    assert transitions(effects) == ["T13s"]
    assert status.phase is Phase.RUNCOMMAND and status.worker(1).slow and status.seq == seq
    assert not any(isinstance(e, ExitWorker | Quarantine) for e in effects)
    # a fault-tolerance checkpoint round is asked for: the eviction need not wait a period
    assert [e for e in effects if isinstance(e, AskCheckpoint)] == [
        AskCheckpoint(seq, f"fault-{seq}-1", "rank 1 is slow")]
    again, effects = step(status, Slow(1))
    assert again is status and not effects[1:]  # marked once, asked once
    status, effects = step(status, CheckpointDone(40))
    assert status.checkpoint_step == 40 and status.phase is Phase.RESTARTING
    assert ExitWorker(1, ExitCode.SLOW_NODE_EVICTED, status.seq) in effects
    assert Quarantine(1, status.worker(1).node, "slow") in effects
    assert status.worker(1).node in status.error_nodes
    assert status.retries == (0, 0, 0) and not status.worker(1).slow  # not a failure
    # the rank comes back on a new node: a clean history, the job goes on (T8)
    status, _ = step(status, Ack(1, "new-pod", 0, node="n1-1"))
    assert status.phase is Phase.TROUBLESHOOTING and not status.worker(1).restarting


def test_no_eviction_without_a_checkpoint_or_outside_training() -> None:
    status = running(2, 2)
    status, _ = step(status, Slow(0))
    for r in (0, 1):
        status, _ = step(status, Finish(r, status.seq, ok=True))
    assert status.phase is Phase.SUCCEED
    status = running(2, 2)
    status, _ = step(status, Finish(1, status.seq, ok=True))
    status, effects = step(status, Slow(1))  # finished: too late to mark
    assert not status.worker(1).slow and transitions(effects) == []
