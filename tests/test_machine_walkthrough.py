"""DESIGN.md §2, "The 3-worker walkthrough (maxRetry = 2)", reproduced step by step."""

from __future__ import annotations

from machine_helpers import (
    NODES3,
    broadcasts,
    has_persist_first,
    inc,
    inner_phases,
    transitions,
)

from aegis_flow.master.machine import (
    Ack,
    Broadcast,
    Effect,
    Error,
    Finish,
    Lost,
    Order,
    Outcome,
    Phase,
    Status,
    initial_status,
    step,
)


def _check(
    status: Status,
    effects: list[Effect],
    *,
    phase: Phase,
    retries: tuple[int, int, int],
    recover_count: int,
    row: str,
) -> None:
    assert status.phase is phase
    assert status.retries == retries
    assert status.recover_count == recover_count
    assert row in transitions(effects), transitions(effects)
    assert has_persist_first(effects)


def _all_pass(status: Status) -> tuple[Status, list[Effect]]:
    effects: list[Effect] = []
    for rank in range(3):
        assert status.phase is Phase.TROUBLESHOOTING
        status, effects = step(status, Finish(rank, status.seq, ok=True))
    return status, effects


def test_walkthrough_three_workers_max_retry_two() -> None:
    status = initial_status(3, 2, nodes=NODES3)
    assert status.phase is Phase.PENDING and status.seq == 0

    # Start: every worker acks (T1), every bootcheck passes (T2).
    for rank in range(3):
        status, effects = step(status, Ack(rank, inc(rank)))
    assert status.phase is Phase.BOOTCHECKING
    assert broadcasts(effects) == [Broadcast(Order.BOOTCHECK, 1)]
    for rank in range(3):
        status, effects = step(status, Finish(rank, status.seq, ok=True))
    assert status.phase is Phase.RUNCOMMAND
    assert broadcasts(effects) == [Broadcast(Order.RUN, 2)]
    assert status.retries == (0, 0, 0) and status.recover_count == 0

    # 1. worker 0's training process is killed -> T5: (1:0:0), recoverCount 1, Troubleshooting.
    status, effects = step(status, Error(0, status.seq, cause="SIGKILL"))
    _check(status, effects, phase=Phase.TROUBLESHOOTING, retries=(1, 0, 0), recover_count=1,
           row="T5")
    assert broadcasts(effects) == [Broadcast(Order.TROUBLESHOOT, 3)]
    assert inner_phases(status) == (Phase.TROUBLESHOOTING,) * 3

    # 2. worker 1 is lost during troubleshooting -> T7: Restarting, still (1:0:0) ...
    status, effects = step(status, Lost(1))
    _check(status, effects, phase=Phase.RESTARTING, retries=(1, 0, 0), recover_count=1,
           row="T7")
    assert broadcasts(effects) == [Broadcast(Order.HOLD, 4)]
    assert status.worker(1).restarting
    # ... it comes back (a new pod for rank 1) -> T8: Troubleshooting (the command has run).
    status, effects = step(status, Ack(1, inc(1, 1)))
    _check(status, effects, phase=Phase.TROUBLESHOOTING, retries=(1, 0, 0), recover_count=1,
           row="T8")
    assert broadcasts(effects) == [Broadcast(Order.TROUBLESHOOT, 5)]
    assert not any(p.restarting for p in status.workers)

    # 3. every check passes -> T9: RunCommand, (1:1:1), recoverCount 1.
    status, effects = _all_pass(status)
    _check(status, effects, phase=Phase.RUNCOMMAND, retries=(1, 1, 1), recover_count=1,
           row="T9")
    assert broadcasts(effects) == [Broadcast(Order.RUN, 6)]

    # 4. worker 1's command fails -> T5: (1:2:1), recoverCount 2, Troubleshooting.
    status, effects = step(status, Error(1, status.seq))
    _check(status, effects, phase=Phase.TROUBLESHOOTING, retries=(1, 2, 1), recover_count=2,
           row="T5")
    assert broadcasts(effects) == [Broadcast(Order.TROUBLESHOOT, 7)]

    # 5. every check passes -> T9: RunCommand, (2:2:2), recoverCount 2.
    status, effects = _all_pass(status)
    _check(status, effects, phase=Phase.RUNCOMMAND, retries=(2, 2, 2), recover_count=2,
           row="T9")
    assert broadcasts(effects) == [Broadcast(Order.RUN, 8)]

    # 6. worker 2's command fails -> counted: (2:2:3) > 2 -> T11: Failed, recoverCount 3.
    status, effects = step(status, Error(2, status.seq))
    _check(status, effects, phase=Phase.FAILED, retries=(2, 2, 3), recover_count=3, row="T11")
    assert status.should_quit
    assert inner_phases(status) == (Phase.FAILED,) * 3
    assert not any(p.restarting for p in status.workers)
    assert broadcasts(effects) == [Broadcast(Order.QUIT, 9, Outcome.FAILED)]
    assert status.seq == 9


def test_walkthrough_with_worker_two_lost_instead_of_worker_one() -> None:
    """Step 2 says "worker 1 or 2": the outcome is the same with worker 2."""
    status = initial_status(3, 2, nodes=NODES3)
    for rank in range(3):
        status, _ = step(status, Ack(rank, inc(rank)))
    for rank in range(3):
        status, _ = step(status, Finish(rank, status.seq, ok=True))
    status, _ = step(status, Error(0, status.seq))
    status, _ = step(status, Lost(2))
    assert status.phase is Phase.RESTARTING and status.retries == (1, 0, 0)
    status, _ = step(status, Ack(2, inc(2, 1)))
    assert status.phase is Phase.TROUBLESHOOTING and status.retries == (1, 0, 0)
    status, _ = _all_pass(status)
    assert (status.phase, status.retries, status.recover_count) == (
        Phase.RUNCOMMAND, (1, 1, 1), 1)
    status, _ = step(status, Error(1, status.seq))
    assert (status.retries, status.recover_count) == ((1, 2, 1), 2)
    status, _ = _all_pass(status)
    assert (status.retries, status.recover_count) == ((2, 2, 2), 2)
    status, effects = step(status, Error(2, status.seq))
    assert (status.phase, status.retries, status.recover_count) == (
        Phase.FAILED, (2, 2, 3), 3)
    assert status.should_quit
    assert broadcasts(effects) == [Broadcast(Order.QUIT, status.seq, Outcome.FAILED)]
