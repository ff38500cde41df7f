"""One test per row of DESIGN.md §2's transition table (T1–T15, T7p, the flap guard) and one per
row of its decision table. Each test names its row."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from machine_helpers import (
    apply,
    bootchecking,
    broadcasts,
    exits,
    finish_all,
    has_persist_first,
    inc,
    inner_phases,
    pending,
    quarantines,
    restarting,
    running,
    transitions,
    troubleshooting,
)

from aegis_flow.master.machine import (
    Ack,
    Broadcast,
    CauseClass,
    ConnectTimeout,
    Error,
    Event,
    ExitCode,
    ExitWorker,
    FaultClass,
    Finish,
    Hang,
    HangWithQuit,
    Ignored,
    Log,
    Lost,
    Mark,
    Order,
    Outcome,
    Phase,
    Quarantine,
    Status,
    Stop,
    step,
)

# ------------------------------------------------------------------ T1 / T2 / T4


@pytest.mark.parametrize("workers", [1, 2, 3, 5], ids=lambda n: f"workers={n}")
def test_t1_pending_every_ack_starts_bootcheck(workers: int) -> None:
    """T1: Pending + Ack from every worker → BootChecking, seq+1, broadcast bootcheck."""
    status = pending(workers)
    for rank in range(workers - 1):
        status, effects = step(status, Ack(rank, inc(rank)))
        assert status.phase is Phase.PENDING
        assert broadcasts(effects) == []
    status, effects = step(status, Ack(workers - 1, inc(workers - 1)))
    assert status.phase is Phase.BOOTCHECKING
    assert status.seq == 1
    assert broadcasts(effects) == [Broadcast(Order.BOOTCHECK, 1)]
    assert transitions(effects) == ["T1"]
    assert has_persist_first(effects)
    assert inner_phases(status) == (Phase.BOOTCHECKING,) * workers
    assert all(p.incarnation == inc(p.rank) for p in status.workers)


def test_t2_bootcheck_passed_everywhere_runs_the_command() -> None:
    """T2: BootChecking + Finish(ok) from every worker → RunCommand, seq+1, broadcast run."""
    status = bootchecking()
    status, effects = step(status, Finish(0, status.seq, ok=True))
    assert status.phase is Phase.BOOTCHECKING and status.worker(0).finished
    status, effects = step(status, Finish(1, status.seq, ok=True))
    assert status.phase is Phase.BOOTCHECKING
    assert not status.ran
    status, effects = step(status, Finish(2, status.seq, ok=True))
    assert status.phase is Phase.RUNCOMMAND
    assert status.seq == 2
    assert status.ran
    assert broadcasts(effects) == [Broadcast(Order.RUN, 2)]
    assert transitions(effects) == ["T2"]
    assert inner_phases(status) == (Phase.RUNCOMMAND,) * 3
    assert not any(p.finished for p in status.workers)
    assert status.retries == (0, 0, 0) and status.recover_count == 0


def test_t4_command_finished_everywhere_succeeds() -> None:
    """T4: RunCommand + Finish(ok) from every worker → Succeed, broadcast quit(success)."""
    status = running()
    seq = status.seq
    status, effects = step(status, Finish(0, seq, ok=True))
    assert status.phase is Phase.RUNCOMMAND
    assert status.worker(0).finished and status.worker(0).phase is Phase.SUCCEED
    status, effects = apply(status, Finish(1, seq, ok=True), Finish(2, seq, ok=True))
    assert status.phase is Phase.SUCCEED
    assert status.should_quit
    assert status.seq == seq + 1
    assert broadcasts(effects) == [Broadcast(Order.QUIT, seq + 1, Outcome.SUCCESS)]
    assert transitions(effects) == ["T4"]
    assert inner_phases(status) == (Phase.SUCCEED,) * 3


# ------------------------------------------------------------------ T3 / T10 / T10c


@pytest.mark.parametrize(
    "fault",
    [FaultClass.HARDWARE, FaultClass.CONTAINER, FaultClass.TRANSIENT, None],
    ids=["hardware", "container", "transient", "no-diagnosis"],
)
def test_t3_bootcheck_failed_node_fault(fault: FaultClass | None) -> None:
    """T3: BootChecking + Finish(not ok) from w → Restarting, not counted; w exits node-fault,
    node → errorNodes, w.restarting; seq+1, broadcast hold."""
    status = bootchecking()
    seq = status.seq
    status, effects = step(status, Finish(1, seq, ok=False, fault=fault, detail="gpu lost"))
    assert status.phase is Phase.RESTARTING
    assert status.retries == (0, 0, 0) and status.recover_count == 0
    assert status.seq == seq + 1
    assert status.worker(1).restarting
    assert status.worker(1).exit_code is ExitCode.NODE_FAULT
    assert status.error_nodes == frozenset({"node-1"})
    assert broadcasts(effects) == [Broadcast(Order.HOLD, seq + 1)]
    assert exits(effects) == [ExitWorker(1, ExitCode.NODE_FAULT, seq + 1)]
    assert quarantines(effects) == [Quarantine(1, "node-1")]
    assert transitions(effects) == ["T3"]
    assert has_persist_first(effects)
    # Restarting: workers keep the phase they were in.
    assert inner_phases(status) == (Phase.BOOTCHECKING,) * 3


def test_t10_troubleshoot_hardware_fault_quarantines_the_node() -> None:
    """T10: Troubleshooting + Finish(not ok, hardware) from w → Restarting, not counted;
    ExitWorker(node fault), Quarantine, node in errorNodes."""
    status = troubleshooting(rank=0)
    seq = status.seq
    status, effects = step(status, Finish(2, seq, ok=False, fault=FaultClass.HARDWARE))
    assert status.phase is Phase.RESTARTING
    assert status.retries == (1, 0, 0) and status.recover_count == 1
    assert status.seq == seq + 1
    assert status.worker(2).restarting
    assert "node-2" in status.error_nodes
    assert exits(effects) == [ExitWorker(2, ExitCode.NODE_FAULT, seq + 1)]
    assert quarantines(effects) == [Quarantine(2, "node-2")]
    assert broadcasts(effects) == [Broadcast(Order.HOLD, seq + 1)]
    assert transitions(effects) == ["T10"]


def test_t10c_troubleshoot_container_fault_restarts_the_container() -> None:
    """T10c: Troubleshooting + Finish(not ok, container) → Restarting, not counted;
    ExitWorker(CONTAINER_RESTART), no quarantine."""
    status = troubleshooting(rank=0)
    seq = status.seq
    status, effects = step(status, Finish(2, seq, ok=False, fault=FaultClass.CONTAINER))
    assert status.phase is Phase.RESTARTING
    assert status.retries == (1, 0, 0) and status.recover_count == 1
    assert status.worker(2).restarting
    assert status.worker(2).exit_code is ExitCode.CONTAINER_RESTART
    assert status.error_nodes == frozenset()
    assert quarantines(effects) == []
    assert exits(effects) == [ExitWorker(2, ExitCode.CONTAINER_RESTART, seq + 1)]
    assert broadcasts(effects) == [Broadcast(Order.HOLD, seq + 1)]
    assert transitions(effects) == ["T10c"]


def test_t10_transient_diagnosis_does_not_quarantine() -> None:
    status = troubleshooting(rank=0)
    status, effects = step(status, Finish(1, status.seq, ok=False, fault=FaultClass.TRANSIENT))
    assert quarantines(effects) == []
    assert ExitWorker(1, ExitCode.NODE_FAULT, status.seq) not in effects
    assert status.error_nodes == frozenset()


# ------------------------------------------------------------------ T5 / T6 / T14


def test_t5_command_error_is_counted_and_troubleshoots() -> None:
    """T5: RunCommand + Error(w) → Troubleshooting, counted, seq+1, broadcast troubleshoot."""
    status = running()
    seq = status.seq
    status, effects = step(status, Error(1, seq, cause="exit 1"))
    assert status.phase is Phase.TROUBLESHOOTING
    assert status.retries == (0, 1, 0) and status.recover_count == 1
    assert status.worker(1).last_reason == "exit 1"
    assert status.seq == seq + 1
    assert broadcasts(effects) == [Broadcast(Order.TROUBLESHOOT, seq + 1)]
    assert transitions(effects) == ["T5"]
    assert inner_phases(status) == (Phase.TROUBLESHOOTING,) * 3


@pytest.mark.parametrize(
    "make_event",
    [lambda: Lost(1), lambda: Ack(1, inc(1, 1))],
    ids=["lost", "new-incarnation-ack"],
)
def test_t6_worker_gone_while_running_is_counted(make_event: Callable[[], Event]) -> None:
    """T6: RunCommand + Lost(w) of an unfinished worker, or Ack(w) with a new incarnation →
    Restarting, counted; w.restarting; seq+1, broadcast hold."""
    status = running()
    seq = status.seq
    status, effects = step(status, make_event())
    assert status.phase is Phase.RESTARTING
    assert status.retries == (0, 1, 0) and status.recover_count == 1
    assert status.worker(1).restarting
    assert not status.worker(0).restarting and not status.worker(2).restarting
    assert status.seq == seq + 1
    assert broadcasts(effects) == [Broadcast(Order.HOLD, seq + 1)]
    assert transitions(effects) == ["T6"]
    assert exits(effects) == []


@pytest.mark.parametrize(
    "make_event",
    [lambda: Lost(1), lambda: Ack(1, inc(1, 1))],
    ids=["lost", "new-incarnation-ack"],
)
def test_t6_finished_worker_leaving_is_not_counted(make_event: Callable[[], Event]) -> None:
    """T6 (last clause): a worker that finished may exit; losing it is not a failure."""
    status = running()
    status, _ = step(status, Finish(1, status.seq, ok=True))
    before = status
    status, effects = step(status, make_event())
    assert status.phase is Phase.RUNCOMMAND
    assert status.retries == (0, 0, 0) and status.recover_count == 0
    assert status.seq == before.seq
    assert not status.worker(1).restarting
    assert broadcasts(effects) == []
    # The job can still succeed.
    status, effects = apply(status, Finish(0, status.seq, True), Finish(2, status.seq, True))
    assert status.phase is Phase.SUCCEED


def test_t14_hang_with_quit_is_counted_as_hang() -> None:
    """T14: RunCommand + HangWithQuit(w) → Troubleshooting, counted as T5 (cause hang)."""
    status = running()
    seq = status.seq
    status, effects = step(status, HangWithQuit(2, seq))
    assert status.phase is Phase.TROUBLESHOOTING
    assert status.retries == (0, 0, 1) and status.recover_count == 1
    assert status.worker(2).last_reason == "hang"
    assert broadcasts(effects) == [Broadcast(Order.TROUBLESHOOT, seq + 1)]
    assert transitions(effects) == ["T14"]


def test_t13_hang_marks_only() -> None:
    """T13: RunCommand + Hang(w) → RunCommand; w marked hanging, logged, not counted."""
    status = running()
    before = status
    status, effects = step(status, Hang(0, status.seq))
    assert status.phase is Phase.RUNCOMMAND
    assert status.worker(0).hanging
    assert status.retries == (0, 0, 0) and status.recover_count == 0
    assert status.seq == before.seq
    assert broadcasts(effects) == []
    assert transitions(effects) == ["T13"]
    assert inner_phases(status) == (Phase.RUNCOMMAND,) * 3
    # every worker is told which ranks of this run are marked (SetIsHanging)
    assert [e for e in effects if isinstance(e, Mark)] == [Mark((0,), before.seq)]
    # Marked again: nothing changes, nothing is re-sent.
    again = step(status, Hang(0, status.seq))
    assert again[0] is status and not [e for e in again[1] if isinstance(e, Mark)]
    # a second rank: the mark names both
    status, effects = step(status, Hang(2, status.seq, waiting=True))
    assert [e for e in effects if isinstance(e, Mark)] == [Mark((0, 2), before.seq)]
    # a new round clears the marks
    status, _ = step(status, HangWithQuit(0, status.seq))
    assert not any(p.hanging for p in status.workers)


# ------------------------------------------------------------------ T7, flap guard, T7p, T8

LIVE_RECOVERY: dict[str, Callable[[], Status]] = {
    "bootchecking": lambda: bootchecking(),
    "troubleshooting": lambda: troubleshooting(rank=0),
    "restarting": lambda: restarting(rank=1),
}


@pytest.mark.parametrize("form", ["lost", "new-incarnation-ack"])
@pytest.mark.parametrize("phase_name", list(LIVE_RECOVERY))
def test_t7_replacement_during_recovery_is_not_counted(phase_name: str, form: str) -> None:
    """T7: BootChecking/Restarting/Troubleshooting + Lost(w) or a new-incarnation Ack →
    Restarting, not counted; others keep their inner phase."""
    status = LIVE_RECOVERY[phase_name]()
    before = status
    event: Event = Lost(2) if form == "lost" else Ack(2, inc(2, 1))
    status, effects = step(status, event)
    assert status.phase is Phase.RESTARTING
    assert status.retries == before.retries
    assert status.recover_count == before.recover_count
    assert status.worker(2).restarting
    assert status.worker(2).flaps == before.worker(2).flaps + 1
    assert inner_phases(status) == inner_phases(before)
    assert transitions(effects) == ["T7"]
    assert exits(effects) == []
    if before.phase is Phase.RESTARTING:  # already holding: no new round
        assert status.seq == before.seq
        assert broadcasts(effects) == []
    else:
        assert status.seq == before.seq + 1
        assert broadcasts(effects) == [Broadcast(Order.HOLD, before.seq + 1)]


def _flap(status: Status, rank: int, generation: int) -> Status:
    """rank is lost and comes back as a new pod: T7 then T8."""
    status, effects = step(status, Lost(rank))
    if status.phase.terminal:
        return status
    assert status.phase is Phase.RESTARTING
    status, effects = step(status, Ack(rank, inc(rank, generation)))
    assert "T8" in transitions(effects)
    return status


@pytest.mark.parametrize("flap_limit", [0, 1, 3], ids=lambda n: f"flap_limit={n}")
@pytest.mark.parametrize("phase_name", ["bootchecking", "troubleshooting"])
def test_flap_guard_counts_after_flap_limit_replacements(phase_name: str, flap_limit: int) -> None:
    """T7 flap guard: after flapLimit uncounted replacements of w since the job last entered
    RunCommand, the next replacement of w is counted."""
    make = bootchecking if phase_name == "bootchecking" else troubleshooting
    status = make(3, 5, flap_limit=flap_limit)
    base = status.retries
    for generation in range(1, flap_limit + 1):
        status = _flap(status, 1, generation)
        assert status.retries == base, f"replacement {generation} must not be counted"
    status, effects = step(status, Lost(1))
    assert status.phase is Phase.RESTARTING
    assert status.retries[1] == base[1] + 1
    assert status.recover_count == max(status.retries)
    assert status.worker(1).restarting
    # Every further replacement is counted too, until the job enters RunCommand again.
    status, _ = step(status, Ack(1, inc(1, 99)))
    status, _ = step(status, Lost(1))
    assert status.retries[1] == base[1] + 2


def test_flap_guard_is_per_worker() -> None:
    """The flap guard counts replacements of w, not of the job."""
    status = bootchecking(3, 5, flap_limit=1)
    status = _flap(status, 0, 1)
    status, _ = step(status, Lost(1))  # rank 1's first replacement
    assert status.retries == (0, 0, 0)


def test_flap_guard_resets_when_the_job_enters_runcommand() -> None:
    """Flaps count "since the job last entered RunCommand": T2/T9 reset them."""
    status = bootchecking(3, 5, flap_limit=1)
    status = _flap(status, 1, 1)
    assert status.phase is Phase.BOOTCHECKING
    status, _ = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND  # T2
    status, _ = step(status, Error(0, status.seq))  # T5: (1,0,0)
    status, _ = step(status, Lost(1))  # first replacement since RunCommand: not counted
    assert status.retries == (1, 0, 0)


def test_flap_guard_can_fail_the_job() -> None:
    """A counted replacement obeys T11: with max-retry 0, the first counted one fails the job."""
    status = bootchecking(3, 0, flap_limit=0)
    status, effects = step(status, Lost(0))
    assert status.phase is Phase.FAILED
    assert status.recover_count == 1
    assert broadcasts(effects) == [Broadcast(Order.QUIT, status.seq, Outcome.FAILED)]


def test_t7p_lost_in_pending_forgets_the_ack() -> None:
    """T7p: Pending + Lost(w) → Pending; w's Ack is forgotten, Pending keeps waiting."""
    status = pending()
    status, _ = apply(status, Ack(0, inc(0)), Ack(1, inc(1)))
    status, effects = step(status, Lost(0))
    assert status.phase is Phase.PENDING
    assert status.worker(0).incarnation is None
    assert status.worker(1).incarnation == inc(1)
    assert transitions(effects) == ["T7p"]
    assert status.seq == 0 and broadcasts(effects) == []
    status, effects = step(status, Ack(2, inc(2)))
    assert status.phase is Phase.PENDING, "rank 0 must ack again before T1"
    status, effects = step(status, Ack(0, inc(0, 1)))
    assert status.phase is Phase.BOOTCHECKING
    assert transitions(effects) == ["T1"]


def test_t7p_lost_before_any_ack_is_ignored() -> None:
    status = pending()
    result = step(status, Lost(1))
    assert result[0] is status
    assert isinstance(result[1][0], Log) and result[1][0].ignored is Ignored.LATE


@pytest.mark.parametrize(
    ("phase_name", "expected", "order"),
    [
        ("bootchecking", Phase.BOOTCHECKING, Order.BOOTCHECK),
        ("troubleshooting", Phase.TROUBLESHOOTING, Order.TROUBLESHOOT),
    ],
    ids=["never-ran-bootcheck", "ran-troubleshoot"],
)
def test_t8_every_restarting_worker_back(phase_name: str, expected: Phase, order: Order) -> None:
    """T8: Restarting + Ack from every restarting worker → BootChecking if the command never
    ran in this job, else Troubleshooting; seq+1, broadcast the order."""
    status = LIVE_RECOVERY[phase_name]()
    status, _ = apply(status, Lost(1), Lost(2))
    assert status.phase is Phase.RESTARTING
    status, effects = step(status, Ack(1, inc(1, 1)))
    assert status.phase is Phase.RESTARTING, "rank 2 is not back yet"
    assert broadcasts(effects) == []
    seq = status.seq
    status, effects = step(status, Ack(2, inc(2, 1)))
    assert status.phase is expected
    assert status.seq == seq + 1
    assert broadcasts(effects) == [Broadcast(order, seq + 1)]
    assert transitions(effects) == ["T8"]
    assert not any(p.restarting for p in status.workers)
    assert inner_phases(status) == (expected,) * 3


def test_t8_waits_for_the_new_pod_of_a_worker_told_to_exit() -> None:
    """T8 after T3: the old pod's heartbeat is not the return; the new incarnation is."""
    status = bootchecking()
    status, _ = step(status, Finish(0, status.seq, ok=False, fault=FaultClass.HARDWARE))
    status, _ = step(status, Ack(0, inc(0), seq=status.seq))
    assert status.phase is Phase.RESTARTING and status.worker(0).restarting
    status, effects = step(status, Ack(0, inc(0, 1), node="node-9"))
    assert status.phase is Phase.BOOTCHECKING
    assert transitions(effects) == ["T8"]
    assert status.worker(0).node == "node-9"
    assert status.worker(0).exit_code is None


def test_t9_checks_passed_aligns_retries_to_recover_count() -> None:
    """T9: Troubleshooting + Finish(ok) from every worker → RunCommand; retries of all aligned
    to recoverCount; seq+1, broadcast run."""
    status = running(3, 5)
    status, _ = step(status, Error(2, status.seq))
    status, _ = finish_all(status)
    # a user-class cause: the policy never escalates it, so the checks passing means L1 (T9)
    status, _ = step(status, Error(2, status.seq, code="oom", klass=CauseClass.USER))
    assert status.retries == (1, 1, 2) and status.phase is Phase.TROUBLESHOOTING
    seq = status.seq
    status, effects = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND
    assert status.retries == (2, 2, 2) and status.recover_count == 2
    assert status.seq == seq + 1
    assert broadcasts(effects) == [Broadcast(Order.RUN, seq + 1)]
    assert transitions(effects) == ["T9"]


# ------------------------------------------------------------------ T11 / T12 / T15


def _over_by_error(s: Status) -> tuple[Status, Event]:
    return s, Error(0, s.seq)


def _over_by_lost(s: Status) -> tuple[Status, Event]:
    return s, Lost(0)


def _over_by_new_pod(s: Status) -> tuple[Status, Event]:
    return s, Ack(0, inc(0, 1))


def _over_by_hang(s: Status) -> tuple[Status, Event]:
    return s, HangWithQuit(0, s.seq)


@pytest.mark.parametrize(
    "last_straw",
    [_over_by_error, _over_by_lost, _over_by_new_pod, _over_by_hang],
    ids=["T5-error", "T6-lost", "T6-new-pod", "T14-hang-with-quit"],
)
@pytest.mark.parametrize("max_retry", [0, 1, 2], ids=lambda n: f"max_retry={n}")
def test_t11_retries_exhausted_fail_the_job(
    max_retry: int, last_straw: Callable[[Status], tuple[Status, Event]]
) -> None:
    """T11: a counted failure makes retries[w] > maxRetry → Failed, recoverCount = maxRetry+1,
    shouldQuit, every inner phase Failed, broadcast quit(failed)."""
    status = running(3, max_retry)
    for _ in range(max_retry):  # rank 0 fails max_retry times and recovers (a user-class
        # cause: the policy never escalates it, so each round of checks passing is L1)
        status, _ = step(status, Error(0, status.seq, code="oom", klass=CauseClass.USER))
        status, _ = finish_all(status)
        assert status.phase is Phase.RUNCOMMAND
    assert status.recover_count == max_retry
    status, event = last_straw(status)
    seq = status.seq
    status, effects = step(status, event)
    assert status.phase is Phase.FAILED
    assert status.recover_count == max_retry + 1
    assert status.retries[0] == max_retry + 1
    assert status.should_quit
    assert inner_phases(status) == (Phase.FAILED,) * 3
    assert not any(p.restarting for p in status.workers)
    assert status.seq == seq + 1
    assert broadcasts(effects) == [Broadcast(Order.QUIT, seq + 1, Outcome.FAILED)]
    assert "T11" in transitions(effects)


LIVE: dict[str, Callable[[], Status]] = {
    "pending": lambda: pending(),
    "pending-partly-acked": lambda: step(pending(), Ack(0, inc(0)))[0],
    "bootchecking": lambda: bootchecking(),
    "runcommand": lambda: running(),
    "restarting": lambda: restarting(rank=1),
    "troubleshooting": lambda: troubleshooting(rank=0),
}


@pytest.mark.parametrize("phase_name", list(LIVE))
def test_t12_stop_from_every_live_phase(phase_name: str) -> None:
    """T12: any live phase + Stop(reason) → Failed; shouldQuit; reason recorded; every inner
    phase Failed; broadcast quit(stopped)."""
    before = LIVE[phase_name]()
    status, effects = step(before, Stop("operator said so"))
    assert status.phase is Phase.FAILED
    assert status.should_quit
    assert status.stop_reason == "operator said so"
    assert inner_phases(status) == (Phase.FAILED,) * 3
    assert not any(p.restarting for p in status.workers)
    assert status.retries == before.retries
    assert status.recover_count == before.recover_count
    assert status.seq == before.seq + 1
    assert broadcasts(effects) == [Broadcast(Order.QUIT, before.seq + 1, Outcome.STOPPED)]
    assert transitions(effects) == ["T12"]
    assert has_persist_first(effects)


@pytest.mark.parametrize("acked", [0, 1, 2], ids=lambda n: f"acked={n}")
def test_t15_connect_timeout_falls_back_to_independent(acked: int) -> None:
    """T15: Pending + ConnectTimeout → Independent; every inner phase Independent; broadcast
    run-independent."""
    status = pending()
    status, _ = apply(status, *(Ack(r, inc(r)) for r in range(acked)))
    status, effects = step(status, ConnectTimeout())
    assert status.phase is Phase.INDEPENDENT
    assert status.seq == 1
    assert inner_phases(status) == (Phase.INDEPENDENT,) * 3
    assert broadcasts(effects) == [Broadcast(Order.RUN_INDEPENDENT, 1)]
    assert transitions(effects) == ["T15"]


@pytest.mark.parametrize("phase_name", [n for n in LIVE if not n.startswith("pending")])
def test_t15_connect_timeout_outside_pending_is_ignored(phase_name: str) -> None:
    status = LIVE[phase_name]()
    result = step(status, ConnectTimeout())
    assert result[0] is status
    assert len(result[1]) == 1 and isinstance(result[1][0], Log)
    assert result[1][0].ignored is Ignored.LATE


# ------------------------------------------------------------------ the decision table


def test_decision_bootcheck_gpu_lost() -> None:
    """Decision table — Bootcheck | GPU lost | worker exits with the node-fault code, node
    recorded in ErrorNodes."""
    status = bootchecking()
    status, effects = step(
        status, Finish(1, status.seq, ok=False, fault=FaultClass.HARDWARE, detail="gpu lost"))
    assert exits(effects) == [ExitWorker(1, ExitCode.NODE_FAULT, status.seq)]
    assert status.error_nodes == frozenset({"node-1"})
    assert status.retries == (0, 0, 0)


def test_decision_bootcheck_user_command_wrong() -> None:
    """Decision table — Bootcheck | user command wrong | checks cannot see it; result shown as
    is: bootcheck passes, the command's failure is then an ordinary counted Error."""
    status, _ = finish_all(bootchecking())
    assert status.phase is Phase.RUNCOMMAND
    status, _ = step(status, Error(0, status.seq, cause="exit 2: no such file"))
    assert status.phase is Phase.TROUBLESHOOTING
    assert status.worker(0).last_reason == "exit 2: no such file"


def test_decision_runcommand_gpu_lost() -> None:
    """Decision table — RunCommand | GPU lost | report failure, wait for troubleshooting:
    Error → Troubleshooting (T5)."""
    status = running()
    status, effects = step(status, Error(0, status.seq, cause="CUDA error: device lost"))
    assert status.phase is Phase.TROUBLESHOOTING
    assert status.retries == (1, 0, 0)
    assert broadcasts(effects) == [Broadcast(Order.TROUBLESHOOT, status.seq)]


def test_decision_runcommand_pod_force_deleted() -> None:
    """Decision table — RunCommand | pod force-deleted | count a retry, restart and rerun:
    Lost (T6, counted) → Restarting → new pod (T8) → checks pass (T9) → RunCommand."""
    status = running()
    status, _ = step(status, Lost(2))
    assert status.phase is Phase.RESTARTING and status.retries == (0, 0, 1)
    status, _ = step(status, Ack(2, inc(2, 1)))
    assert status.phase is Phase.TROUBLESHOOTING
    status, effects = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND
    assert status.retries == (1, 1, 1) and status.recover_count == 1
    assert broadcasts(effects) == [Broadcast(Order.RUN, status.seq)]


def test_decision_troubleshooting_gpu_lost() -> None:
    """Decision table — Troubleshooting | GPU lost | node-fault exit, node recorded."""
    status = troubleshooting(rank=0)
    status, effects = step(status, Finish(0, status.seq, ok=False, fault=FaultClass.HARDWARE))
    assert exits(effects) == [ExitWorker(0, ExitCode.NODE_FAULT, status.seq)]
    assert quarantines(effects) == [Quarantine(0, "node-0")]
    assert "node-0" in status.error_nodes
    assert status.phase is Phase.RESTARTING


def test_decision_troubleshooting_wrong_command_node_fine() -> None:
    """Decision table — Troubleshooting | wrong command, node fine | go on running the command:
    every check passes → RunCommand (T9)."""
    status = troubleshooting(rank=1)
    status, effects = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND
    assert broadcasts(effects) == [Broadcast(Order.RUN, status.seq)]
    assert status.error_nodes == frozenset()


def test_decision_troubleshooting_network_cut() -> None:
    """Decision table — Troubleshooting | network cut | runs on but cannot report: Lost → T7
    Restarting, not counted; when it reports again it is back (T8)."""
    status = troubleshooting(rank=0)
    status, _ = step(status, Lost(1))
    assert status.phase is Phase.RESTARTING and status.retries == (1, 0, 0)
    status, effects = step(status, Ack(1, inc(1), seq=status.seq - 1))  # same pod, reconnected
    assert status.phase is Phase.TROUBLESHOOTING
    assert status.retries == (1, 0, 0)


def test_decision_before_bootcheck_any_worker_cut_off() -> None:
    """Decision table — before bootcheck | any worker cut off | every worker falls back to a
    plain training job: ConnectTimeout → T15 Independent, broadcast run-independent."""
    status = pending()
    status, _ = apply(status, Ack(0, inc(0)), Ack(2, inc(2)))
    status, effects = step(status, ConnectTimeout())
    assert status.phase is Phase.INDEPENDENT
    assert broadcasts(effects) == [Broadcast(Order.RUN_INDEPENDENT, status.seq)]
