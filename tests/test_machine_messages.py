"""The message layer of DESIGN.md §2 ("Messages"): seq bumps, Persist, dedup, stale/future,
the Pending exception, un-deduplicated Acks, state-based re-send, malformed and late events."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from machine_helpers import (
    apply,
    assert_ignored,
    bootchecking,
    broadcasts,
    finish_all,
    inc,
    pending,
    persist_count,
    restarting,
    running,
    sends,
    troubleshooting,
)

from aegis_flow.master.machine import (
    Ack,
    CheckpointDone,
    ConnectTimeout,
    Error,
    Event,
    ExitCode,
    FaultClass,
    Finish,
    Hang,
    HangWithQuit,
    Ignored,
    Lost,
    MalformedEvent,
    Order,
    Outcome,
    Persist,
    Phase,
    Send,
    Status,
    Stop,
    step,
)

Scenario = Callable[[], tuple[Status, Event]]


def _succeeded() -> Status:
    status, _ = finish_all(running())
    assert status.phase is Phase.SUCCEED
    return status


def _failed_t11() -> Status:
    status = running(3, 0)
    status, _ = step(status, Error(0, status.seq))
    assert status.phase is Phase.FAILED
    return status


def _stopped() -> Status:
    status, _ = step(running(), Stop("operator"))
    return status


def _independent() -> Status:
    status, _ = step(pending(), ConnectTimeout())
    return status


def _all_acked_but_last() -> Status:
    return apply(pending(), Ack(0, inc(0)), Ack(1, inc(1)))[0]


def _bootcheck_all_but_last() -> Status:
    status = bootchecking()
    return apply(status, Finish(0, status.seq, True), Finish(1, status.seq, True))[0]


def _run_all_but_last() -> Status:
    status = running()
    return apply(status, Finish(0, status.seq, True), Finish(1, status.seq, True))[0]


def _troubleshoot_all_but_last() -> Status:
    status = troubleshooting(rank=0)
    return apply(status, Finish(0, status.seq, True), Finish(1, status.seq, True))[0]


def _s(make: Callable[[], Status], event: Callable[[Status], Event]) -> Scenario:
    def scenario() -> tuple[Status, Event]:
        status = make()
        return status, event(status)

    return scenario


# Every transition that broadcasts an order.
BROADCASTING: dict[str, Scenario] = {
    "T1": _s(_all_acked_but_last, lambda s: Ack(2, inc(2))),
    "T2": _s(_bootcheck_all_but_last, lambda s: Finish(2, s.seq, True)),
    "T3": _s(bootchecking, lambda s: Finish(0, s.seq, False, FaultClass.HARDWARE)),
    "T4-quit": _s(_run_all_but_last, lambda s: Finish(2, s.seq, True)),
    "T5": _s(running, lambda s: Error(0, s.seq)),
    "T6-lost": _s(running, lambda s: Lost(0)),
    "T6-new-pod": _s(running, lambda s: Ack(0, inc(0, 1))),
    "T7": _s(bootchecking, lambda s: Lost(1)),
    "T8": _s(restarting, lambda s: Ack(1, inc(1, 1))),
    "T9": _s(_troubleshoot_all_but_last, lambda s: Finish(2, s.seq, True)),
    "T10": _s(troubleshooting, lambda s: Finish(1, s.seq, False, FaultClass.HARDWARE)),
    "T10c": _s(troubleshooting, lambda s: Finish(1, s.seq, False, FaultClass.CONTAINER)),
    "T11-quit": _s(lambda: running(3, 0), lambda s: Error(1, s.seq)),
    "T12-quit": _s(troubleshooting, lambda s: Stop("operator")),
    "T14": _s(running, lambda s: HangWithQuit(1, s.seq)),
    "T15-run-independent": _s(pending, lambda s: ConnectTimeout()),
}


@pytest.mark.parametrize("scenario", list(BROADCASTING.values()), ids=list(BROADCASTING))
def test_every_broadcast_bumps_seq(scenario: Scenario) -> None:
    before, event = scenario()
    after, effects = step(before, event)
    (broadcast,) = broadcasts(effects)
    assert after.seq == before.seq + 1
    assert broadcast.seq == after.seq
    assert isinstance(effects[0], Persist) and persist_count(effects) == 1


# Transitions that change the status without a broadcast: seq unchanged, Persist first.
QUIET_CHANGES: dict[str, Scenario] = {
    "first-ack": _s(pending, lambda s: Ack(0, inc(0))),
    "T7p": _s(lambda: step(pending(), Ack(0, inc(0)))[0], lambda s: Lost(0)),
    "finish-one": _s(bootchecking, lambda s: Finish(0, s.seq, True)),
    "T7-in-restarting": _s(restarting, lambda s: Lost(2)),
    "T13": _s(running, lambda s: Hang(0, s.seq)),
    "checkpoint": _s(running, lambda s: CheckpointDone(100)),
    "heartbeat-catches-up": _s(running, lambda s: Ack(0, inc(0), seq=s.seq)),
}


@pytest.mark.parametrize("scenario", list(QUIET_CHANGES.values()), ids=list(QUIET_CHANGES))
def test_persist_first_when_the_status_changes_without_broadcast(scenario: Scenario) -> None:
    before, event = scenario()
    after, effects = step(before, event)
    assert after != before
    assert isinstance(effects[0], Persist) and persist_count(effects) == 1
    assert broadcasts(effects) == []
    assert after.seq == before.seq


def test_no_persist_when_the_status_does_not_change() -> None:
    status = running()
    status, _ = step(status, Ack(0, inc(0), seq=status.seq), now=5.0)
    again, effects = step(status, Ack(0, inc(0), seq=status.seq), now=5.0)
    assert again is status
    assert persist_count(effects) == 0
    # A re-send that changes nothing persists nothing either.
    lagging = running()
    lagging, _ = step(lagging, Ack(1, inc(1), seq=lagging.seq - 1), now=1.0)
    again, effects = step(lagging, Ack(1, inc(1), seq=lagging.seq - 1), now=1.0)
    assert again is lagging
    assert effects == [Send(1, Order.RUN, lagging.seq)]


# ------------------------------------------------------------------ duplicates, stale, future

DUPLICATE_FINISH: dict[str, Callable[[], Status]] = {
    "bootchecking": bootchecking,
    "runcommand": running,
    "troubleshooting": lambda: troubleshooting(rank=0),
}


@pytest.mark.parametrize("make", list(DUPLICATE_FINISH.values()), ids=list(DUPLICATE_FINISH))
def test_duplicate_finish_is_ignored(make: Callable[[], Status]) -> None:
    status = make()
    status, _ = step(status, Finish(1, status.seq, ok=True))
    assert_ignored(status, step(status, Finish(1, status.seq, ok=True)), Ignored.DUPLICATE)
    # Same (worker, seq, type) whatever the payload.
    assert_ignored(status, step(status, Finish(1, status.seq, ok=False)), Ignored.DUPLICATE)


def test_duplicate_error_at_the_same_seq_is_ignored() -> None:
    """A processed Error moves seq on, so its repeat reaches the machine as stale (next test);
    a status restored with the Error recorded at the current seq must still ignore it."""
    status = running()
    pod = dataclasses.replace(status.worker(1), error_seq=status.seq)
    status = dataclasses.replace(status, workers=(status.worker(0), pod, status.worker(2)))
    assert_ignored(status, step(status, Error(1, status.seq)), Ignored.DUPLICATE)


def test_repeated_error_after_processing_is_ignored() -> None:
    status = running()
    seq = status.seq
    status, _ = step(status, Error(1, seq))
    assert status.phase is Phase.TROUBLESHOOTING
    assert_ignored(status, step(status, Error(1, seq)), Ignored.STALE)


SEQ_EVENTS: dict[str, Callable[[int], Event]] = {
    "finish": lambda seq: Finish(0, seq, True),
    "finish-not-ok": lambda seq: Finish(0, seq, False, FaultClass.HARDWARE),
    "error": lambda seq: Error(0, seq),
    "hang": lambda seq: Hang(0, seq),
    "hang-with-quit": lambda seq: HangWithQuit(0, seq),
}


@pytest.mark.parametrize("make_event", list(SEQ_EVENTS.values()), ids=list(SEQ_EVENTS))
@pytest.mark.parametrize("make", [bootchecking, running, troubleshooting],
                         ids=["bootchecking", "runcommand", "troubleshooting"])
def test_stale_seq_is_ignored(
    make: Callable[[], Status], make_event: Callable[[int], Event]
) -> None:
    status = make()
    for seq in (0, status.seq - 1):
        assert_ignored(status, step(status, make_event(seq)), Ignored.STALE)


@pytest.mark.parametrize("make_event", list(SEQ_EVENTS.values()), ids=list(SEQ_EVENTS))
@pytest.mark.parametrize("make", [pending, bootchecking, running, troubleshooting],
                         ids=["pending", "bootchecking", "runcommand", "troubleshooting"])
def test_future_seq_is_ignored(
    make: Callable[[], Status], make_event: Callable[[int], Event]
) -> None:
    status = make()
    for seq in (status.seq + 1, status.seq + 1000):
        assert_ignored(status, step(status, make_event(seq)), Ignored.FUTURE)


@pytest.mark.parametrize("make", [bootchecking, running, troubleshooting, restarting],
                         ids=["bootchecking", "runcommand", "troubleshooting", "restarting"])
def test_ack_from_the_future_is_ignored_outside_pending(make: Callable[[], Status]) -> None:
    status = make()
    assert_ignored(status, step(status, Ack(0, inc(0), seq=status.seq + 1)), Ignored.FUTURE)


@pytest.mark.parametrize("seq", [0, 1, 7, 10_000], ids=lambda n: f"seq={n}")
def test_pending_exception_acks_accepted_whatever_their_seq(seq: int) -> None:
    status = pending()
    for rank in range(3):
        status, effects = step(status, Ack(rank, inc(rank), seq=seq))
        assert all(getattr(e, "ignored", None) is None for e in effects)
        assert all(p.seq <= status.seq for p in status.workers)
    assert status.phase is Phase.BOOTCHECKING
    assert status.seq == 1


# ------------------------------------------------------------------ state-based re-send

RESEND: dict[str, tuple[Callable[[], Status], Order, Outcome | None]] = {
    "bootchecking": (bootchecking, Order.BOOTCHECK, None),
    "runcommand": (running, Order.RUN, None),
    "troubleshooting": (lambda: troubleshooting(rank=1), Order.TROUBLESHOOT, None),
    "restarting": (lambda: restarting(rank=1), Order.HOLD, None),
    "succeed": (_succeeded, Order.QUIT, Outcome.SUCCESS),
    "failed-T11": (_failed_t11, Order.QUIT, Outcome.FAILED),
    "failed-T12": (_stopped, Order.QUIT, Outcome.STOPPED),
    "independent": (_independent, Order.RUN_INDEPENDENT, None),
}


@pytest.mark.parametrize(("make", "order", "outcome"), list(RESEND.values()), ids=list(RESEND))
def test_lagging_heartbeat_gets_the_current_order(
    make: Callable[[], Status], order: Order, outcome: Outcome | None
) -> None:
    status = make()
    assert status.seq >= 1
    _, effects = step(status, Ack(0, inc(0), seq=status.seq - 1))
    assert sends(effects) == [Send(0, order, status.seq, outcome)]
    if status.phase.terminal:  # a lagging worker learns the end; nothing else changes
        assert step(status, Ack(0, inc(0), seq=status.seq - 1))[0] is status


@pytest.mark.parametrize(("make", "order", "outcome"), list(RESEND.values()), ids=list(RESEND))
def test_up_to_date_heartbeat_gets_nothing(
    make: Callable[[], Status], order: Order, outcome: Outcome | None
) -> None:
    status = make()
    status, _ = step(status, Ack(0, inc(0), seq=status.seq))
    _, effects = step(status, Ack(0, inc(0), seq=status.seq))
    assert sends(effects) == []


def test_acks_are_never_deduplicated() -> None:
    status = running()
    ack = Ack(2, inc(2), seq=status.seq - 1)
    for _ in range(3):
        status, effects = step(status, ack)
        assert sends(effects) == [Send(2, Order.RUN, status.seq)]
        assert all(getattr(e, "ignored", None) is None for e in effects)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (FaultClass.HARDWARE, ExitCode.NODE_FAULT),
        (FaultClass.CONTAINER, ExitCode.CONTAINER_RESTART),
    ],
    ids=["T10-node-fault", "T10c-container-restart"],
)
def test_worker_told_to_exit_is_resent_the_exit(fault: FaultClass, code: ExitCode) -> None:
    status = troubleshooting(rank=0)
    old_seq = status.seq
    status, _ = step(status, Finish(2, old_seq, ok=False, fault=fault))
    for _ in range(2):  # the old pod is still there: re-sent every time, never "back"
        status, effects = step(status, Ack(2, inc(2), seq=old_seq))
        assert sends(effects) == [Send(2, Order.EXIT, status.seq, exit_code=code)]
        assert status.phase is Phase.RESTARTING and status.worker(2).restarting


def test_t3_worker_told_to_exit_is_resent_the_exit() -> None:
    status = bootchecking()
    old_seq = status.seq
    status, _ = step(status, Finish(0, old_seq, ok=False, fault=FaultClass.HARDWARE))
    _, effects = step(status, Ack(0, inc(0), seq=old_seq))
    assert sends(effects) == [Send(0, Order.EXIT, status.seq, exit_code=ExitCode.NODE_FAULT)]


def test_lost_exit_order_is_resent_even_when_the_hold_arrived() -> None:
    status = bootchecking()
    status, _ = step(status, Finish(0, status.seq, ok=False, fault=FaultClass.HARDWARE))
    # The hold broadcast arrived (the heartbeat shows the current seq); the ExitWorker did not.
    _, effects = step(status, Ack(0, inc(0), seq=status.seq))
    assert sends(effects) == [Send(0, Order.EXIT, status.seq, exit_code=ExitCode.NODE_FAULT)]


def test_new_incarnation_heartbeat_with_older_seq_is_resent() -> None:
    status = troubleshooting(rank=0)
    status, _ = step(status, Lost(2))  # T7: Restarting, hold at a new seq
    status, _ = step(status, Ack(1, inc(1), seq=status.seq))  # rank 1's pod heard the hold
    status, _ = step(status, Lost(1))  # T7 in Restarting: no new seq
    status, _ = step(status, Ack(1, inc(1, 1), seq=0))  # rank 1's new pod, knows no seq
    assert status.phase is Phase.RESTARTING  # rank 2 is still away
    _, effects = step(status, Ack(1, inc(1, 1), seq=0))
    assert sends(effects) == [Send(1, Order.HOLD, status.seq)]


# ------------------------------------------------------------------ malformed events

MALFORMED: dict[str, Event] = {
    "ack-rank-3": Ack(3, "x"),
    "ack-rank-negative": Ack(-1, "x"),
    "ack-empty-incarnation": Ack(0, ""),
    "ack-negative-seq": Ack(0, "x", seq=-1),
    "finish-rank-3": Finish(3, 0, True),
    "finish-negative-seq": Finish(0, -1, True),
    "error-rank-99": Error(99, 0),
    "error-negative-seq": Error(0, -5),
    "lost-rank-3": Lost(3),
    "lost-rank-negative": Lost(-1),
    "hang-rank-3": Hang(3, 0),
    "hang-negative-seq": Hang(0, -1),
    "hang-with-quit-rank-negative": HangWithQuit(-2, 0),
    "hang-with-quit-negative-seq": HangWithQuit(0, -1),
    "checkpoint-negative-step": CheckpointDone(-1),
}


@pytest.mark.parametrize("event", list(MALFORMED.values()), ids=list(MALFORMED))
@pytest.mark.parametrize("make", [pending, bootchecking, running, restarting, _succeeded],
                         ids=["pending", "bootchecking", "runcommand", "restarting", "succeed"])
def test_malformed_event_raises(make: Callable[[], Status], event: Event) -> None:
    status = make()
    snapshot = dataclasses.replace(status)
    with pytest.raises(MalformedEvent):
        step(status, event)
    assert status == snapshot
    assert issubclass(MalformedEvent, ValueError)


# ------------------------------------------------------------------ late events


def _restarting_with_exit() -> Status:
    status = bootchecking()
    status, _ = step(status, Finish(0, status.seq, ok=False, fault=FaultClass.HARDWARE))
    return status


def _run_one_finished() -> Status:
    status = running()
    return step(status, Finish(0, status.seq, True))[0]


LATE: dict[str, Scenario] = {
    "finish-in-pending": _s(pending, lambda s: Finish(0, 0, True)),
    "error-in-pending": _s(pending, lambda s: Error(0, 0)),
    "hang-in-pending": _s(pending, lambda s: Hang(0, 0)),
    "error-in-bootchecking": _s(bootchecking, lambda s: Error(0, s.seq)),
    "hang-in-bootchecking": _s(bootchecking, lambda s: Hang(0, s.seq)),
    "hang-with-quit-in-bootchecking": _s(bootchecking, lambda s: HangWithQuit(0, s.seq)),
    "error-in-troubleshooting": _s(troubleshooting, lambda s: Error(1, s.seq)),
    "hang-with-quit-in-troubleshooting": _s(troubleshooting, lambda s: HangWithQuit(1, s.seq)),
    "finish-in-restarting": _s(restarting, lambda s: Finish(0, s.seq, True)),
    "error-in-restarting": _s(restarting, lambda s: Error(0, s.seq)),
    "hang-in-restarting": _s(restarting, lambda s: Hang(0, s.seq)),
    "finish-from-restarting-worker": _s(restarting, lambda s: Finish(1, s.seq, True)),
    "lost-of-restarting-worker": _s(restarting, lambda s: Lost(1)),
    "lost-of-worker-told-to-exit": _s(_restarting_with_exit, lambda s: Lost(0)),
    "finish-not-ok-while-running": _s(running, lambda s: Finish(0, s.seq, False)),
    "error-after-finish": _s(_run_one_finished, lambda s: Error(0, s.seq)),
    "lost-after-finish": _s(_run_one_finished, lambda s: Lost(0)),
    "hang-after-finish": _s(_run_one_finished, lambda s: Hang(0, s.seq)),
    "hang-with-quit-after-finish": _s(_run_one_finished, lambda s: HangWithQuit(0, s.seq)),
    "finish-again-after-finish": _s(_run_one_finished, lambda s: Finish(0, s.seq, True)),
    "connect-timeout-after-start": _s(running, lambda s: ConnectTimeout()),
}


@pytest.mark.parametrize("scenario", list(LATE.values()), ids=list(LATE))
def test_late_event_is_ignored_with_a_log(scenario: Scenario) -> None:
    status, event = scenario()
    assert_ignored(status, step(status, event))


TERMINAL: dict[str, Callable[[], Status]] = {
    "succeed": _succeeded,
    "failed-T11": _failed_t11,
    "failed-T12": _stopped,
    "independent": _independent,
}
AFTER_THE_END: dict[str, Callable[[Status], Event]] = {
    "finish": lambda s: Finish(0, s.seq, True),
    "finish-old-seq": lambda s: Finish(0, s.seq - 1, True),
    "error": lambda s: Error(1, s.seq),
    "hang": lambda s: Hang(1, s.seq),
    "hang-with-quit": lambda s: HangWithQuit(1, s.seq),
    "lost": lambda s: Lost(2),
    "stop": lambda s: Stop("again"),
    "connect-timeout": lambda s: ConnectTimeout(),
    "checkpoint": lambda s: CheckpointDone(7),
}


@pytest.mark.parametrize("make_event", list(AFTER_THE_END.values()), ids=list(AFTER_THE_END))
@pytest.mark.parametrize("make", list(TERMINAL.values()), ids=list(TERMINAL))
def test_anything_after_the_end_is_ignored(
    make: Callable[[], Status], make_event: Callable[[Status], Event]
) -> None:
    status = make()
    assert_ignored(status, step(status, make_event(status)), Ignored.LATE)


@pytest.mark.parametrize("make", list(TERMINAL.values()), ids=list(TERMINAL))
def test_heartbeats_after_the_end_change_nothing(make: Callable[[], Status]) -> None:
    """Acks are heartbeats, never ignored: after the end they only re-send the final order."""
    status = make()
    for ack in (Ack(0, inc(0), seq=status.seq), Ack(0, inc(0, 5), seq=0), Ack(1, inc(1))):
        after, effects = step(status, ack, now=99.0)
        assert after is status
        assert persist_count(effects) == 0
        assert broadcasts(effects) == []
