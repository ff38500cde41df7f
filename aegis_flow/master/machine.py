"""The master's phase state machine: ``step(status, event, now=...) -> (status, effects)``.

PURE. No I/O, no clock, no asyncio, no logging: time is an argument and every side effect is
returned as data (``Broadcast``, ``Send``, ``ExitWorker``, ``Quarantine``, ``Persist``, ``Log``)
for the runtime (``master/runtime.py``) to carry out. The model checker in ``aegis_flow/verify``
explores this very function.

The contract is the transition table T1–T15 of DESIGN.md §2; each branch below names its row.
Counting rule: a counted failure does ``retries[w] += 1``; T11 is checked first (retries[w] >
maxRetry → Failed with recoverCount = maxRetry+1); otherwise recoverCount = max(retries).

The recovery policy (``policy.py``, docs/recovery.md) adds rows: T5s/T14s (a peer symptom stops
every rank but charges nobody yet), B2 (evidence charges the failed rank), B3 (a passing round
charges the first reporter of a symptom), T16 (the same exception at the same step twice in a
row on one rank fails the job, not counted); a troubleshoot Finish is judged with the rank's
failure history (``policy.verdict``), and a returning new container has its failure answered.

Message layer: every broadcast bumps ``seq``. A worker message carries the seq it answers.
Finish/Error are *duplicates* when that (worker, seq, type) was already processed and *stale*
when their seq is older than the current one; both are ignored with a Log effect. Acks double as
heartbeats: never deduplicated, accepted in Pending whatever their seq (the Pending exception),
and an Ack showing an older seq makes the master re-send that worker its current order (the
state-based re-send that makes a lost order harmless).
"""

from __future__ import annotations

from dataclasses import dataclass

from aegis_flow.master import policy
from aegis_flow.master.model import (
    LIVE_PHASES,
    SEQ_EVENTS,
    TERMINAL_PHASES,
    WORKER_EVENTS,
    Ack,
    AskCheckpoint,
    Broadcast,
    CheckpointDone,
    ConnectTimeout,
    ControlPlaneBack,
    Effect,
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
    MalformedEvent,
    Mark,
    Order,
    Outcome,
    Persist,
    Phase,
    PodInfo,
    Quarantine,
    Rearm,
    Resume,
    Send,
    Slow,
    Status,
    Stop,
    counts,
    evolve,
    initial_status,
    with_pod,
)
from aegis_flow.vocab import CauseClass, passes

# --------------------------------------------------------------------------- helpers


def current_order(status: Status) -> tuple[Order | None, Outcome | None]:
    """The order of the current phase (what a lagging worker is re-sent)."""
    phase = status.phase
    if phase is Phase.PENDING:
        return None, None
    if phase is Phase.SUCCEED:
        return Order.QUIT, Outcome.SUCCESS
    if phase is Phase.FAILED:
        return Order.QUIT, Outcome.STOPPED if status.stop_reason else Outcome.FAILED
    return _PHASE_ORDER[phase], None


_PHASE_ORDER = {
    Phase.BOOTCHECKING: Order.BOOTCHECK,
    Phase.RUNCOMMAND: Order.RUN,
    Phase.RESTARTING: Order.HOLD,
    Phase.TROUBLESHOOTING: Order.TROUBLESHOOT,
    Phase.INDEPENDENT: Order.RUN_INDEPENDENT,
}

Result = tuple[Status, list[Effect]]


def _ignore(status: Status, why: Ignored, message: str) -> Result:
    return status, [Log(message, level="debug", ignored=why)]


def retries_text(status: Status) -> str:
    """Every rank's retries for a log line: the tuple up to 16 ranks, a summary beyond (a line
    of a 4,096-rank job must not carry 4,096 numbers; the events keep 30 lines)."""
    retries = status.retries
    if len(retries) <= 16:
        return str(retries)
    charged = sum(1 for r in retries if r)
    return f"max {max(retries)} ({charged} of {len(retries)} ranks charged)"


def _set(status: Status, pod: PodInfo) -> Status:
    if status.workers[pod.rank] is pod:  # unchanged (a bare heartbeat): the same status, so
        return status                    # step compares nothing, O(1) instead of O(N)
    return evolve(status, workers=with_pod(status.workers, pod))


def _broadcast(
    status: Status, phase: Phase, row: str, message: str, *, keep_restarting_phase: bool = False
) -> Result:
    """Enter ``phase``: bump seq, reset every worker's round and broadcast the phase's order.

    Every new round clears ``finished``, the hang marks and the slow marks (training stops on
    every order but run; a slow mark lasts for the run it was made in, and the runtime marks a
    still-slow rank again after its window); entering Restarting keeps each worker's inner
    phase (DESIGN.md, PhaseConsistency).
    """
    seq = status.seq + 1
    if keep_restarting_phase:
        workers = tuple(p if not (p.finished or p.hanging or p.slow) else
                        evolve(p, finished=False, hanging=False, waiting=False, slow=False)
                        for p in status.workers)
    else:
        workers = tuple(p if p.phase is phase and not (p.finished or p.hanging or p.slow) else
                        evolve(p, phase=phase, finished=False, hanging=False, waiting=False,
                               slow=False)
                        for p in status.workers)
    new = evolve(status, phase=phase, seq=seq, workers=workers)
    # the order's payload is fixed now, from the status alone (policy.order_data)
    new = evolve(new, plan=policy.plan(new, phase), epoch=new.recover_count,
                 run_seq=seq if phase is Phase.RUNCOMMAND else new.run_seq,
                 replaced=(new.replaced or phase is Phase.RESTARTING)
                 and phase is not Phase.RUNCOMMAND)
    order, outcome = current_order(new)
    assert order is not None
    return new, [Log(message, transition=row), Broadcast(order, seq, outcome)]


def _is_stale(status: Status, seq: int) -> bool:
    return seq < status.seq


def _is_duplicate(pod: PodInfo, event: Finish | Error) -> bool:
    if isinstance(event, Finish):
        return event.seq == pod.finish_seq
    return event.seq == pod.error_seq


def _count(status: Status, rank: int, cause: str, row: str) -> Result | Status:
    """Counting rule. Returns the Failed result of T11, or the status with the failure counted."""
    pod = status.workers[rank]
    retries = pod.retries + 1
    status = _set(status, evolve(pod, retries=retries, last_reason=cause))
    if retries > status.max_retry:  # T11 is checked first
        return _fail(status, Outcome.FAILED, f"{row}+T11: rank {rank} failed ({cause}); "
                     f"retries {retries} > max-retry {status.max_retry}", row="T11",
                     failure=f"rank {rank} failed {retries} times, more than max-retry "
                             f"{status.max_retry}; last: {cause}")
    return evolve(status, recover_count=max(p.retries for p in status.workers))


@dataclass(frozen=True, slots=True)
class Charge:
    """A failure charged to one rank (policy B2–B4): what its history records."""

    cause: str  # the human text
    code: str = ""  # the classifier's code ("" unknown)
    klass: CauseClass | None = None
    signature: str = ""
    answered: bool = False  # a new pod already replaced it: no open failure is left (V3)


def _charge(status: Status, rank: int, charge: Charge, row: str) -> Result | Status:
    """Count a failure against ``rank`` and record it in its history (policy.py): its failures
    on this node, its open cause, its signature; it becomes the culprit and the blame is
    settled. R1/T16 first: the same signature as its last charged failure ends the job."""
    pod = status.workers[rank]
    if status.give_up_on_repeat and charge.signature and charge.signature == pod.signature:
        return _fail(status, Outcome.FAILED,
                     f"T16: rank {rank} failed twice in a row with the same error "
                     f"({charge.signature}): a deterministic error, not retried", row="T16",
                     failure=f"rank {rank} failed twice in a row with the same error: "
                             f"{charge.signature}")
    if status.blame >= 0 and status.blame != rank:  # the suspect only saw a symptom
        suspect = status.workers[status.blame]
        status = _set(status, evolve(suspect, cause="", cause_class=None))
        pod = status.workers[rank]
    opened = not charge.answered or charge.klass is CauseClass.HARDWARE
    status = _set(status, evolve(pod, failures=pod.failures + 1,
                                 cause=(charge.code or charge.cause) if opened else "",
                                 cause_class=charge.klass if opened else None,
                                 signature=charge.signature))
    status = evolve(status, culprit=rank, blame=-1)
    return _count(status, rank, charge.cause, row)


def _fail(status: Status, outcome: Outcome, message: str, *, row: str,
          failure: str = "") -> Result:
    """T11 / T12 / T16: Failed, shouldQuit, every inner phase Failed, broadcast quit."""
    seq = status.seq + 1
    workers = tuple(evolve(p, phase=Phase.FAILED, restarting=False) for p in status.workers)
    new = evolve(
        status,
        phase=Phase.FAILED,
        seq=seq,
        workers=workers,
        should_quit=True,
        recover_count=status.max_retry + 1 if row == "T11" else status.recover_count,
        failure=failure or status.failure,
    )
    return new, [Log(message, level="error", transition=row), Broadcast(Order.QUIT, seq, outcome)]


def _replace_worker(
    status: Status, rank: int, cause: str, row: str, *, exit_code: ExitCode | None = None,
    new_pod: bool = False,
) -> Result:
    """T3/T7/T10/T10c (uncounted replacement during recovery) with the flap guard.

    With a suspect pending (B2), the replaced rank is the evidence: the run's failure is
    charged to it first."""
    effects: list[Effect] = []
    if status.blame >= 0:
        outcome = _charge(status, rank, Charge(cause, answered=new_pod), f"{row}+B2")
        if isinstance(outcome, tuple):
            return outcome
        status = outcome
        effects.append(Log(f"B2: rank {rank} failed ({cause}); the peer symptom is "
                           f"settled; retries {retries_text(status)}", transition="B2"))
    pod = status.workers[rank]
    counted = pod.flaps >= status.flap_limit
    if exit_code in (ExitCode.NODE_FAULT, ExitCode.SLOW_NODE_EVICTED) and pod.node:
        # a broken node stays broken; a slow one is never scheduled on again
        status = evolve(status, error_nodes=status.error_nodes | {pod.node})
        effects.append(Quarantine(rank, pod.node, "slow" if exit_code is
                                  ExitCode.SLOW_NODE_EVICTED else "hardware"))
    if counted:
        outcome = _count(status, rank, cause, row)
        if isinstance(outcome, tuple):
            failed, more = outcome
            return failed, [*more, *effects]
        status = outcome
        pod = status.workers[rank]
    pod = evolve(
        pod,
        restarting=True,
        flaps=min(pod.flaps + 1, status.flap_limit) if not counted else pod.flaps,
        last_reason=cause,
        exit_code=exit_code,
        hanging=False,
        waiting=False,
        slow=False,
    )
    status = _set(status, pod)
    note = " (counted: flap limit reached)" if counted else ""
    message = f"{row}: rank {rank} is being replaced ({cause}){note}"
    if status.phase is Phase.RESTARTING:  # already holding: no new round
        effects = [Log(message, transition=row), *effects]
    else:
        status, more = _broadcast(status, Phase.RESTARTING, row, message,
                                  keep_restarting_phase=True)
        effects = [more[0], *effects, *more[1:]]
    if exit_code is not None:
        effects.append(ExitWorker(rank, exit_code, status.seq))
    return status, effects


def _counted_failure(status: Status, rank: int, charge: Charge, row: str,
                     phase: Phase) -> Result:
    """T5/T6/T14: counted; stop every training process (the broadcast order does it)."""
    outcome = _charge(status, rank, charge, row)
    if isinstance(outcome, tuple):
        return outcome
    status = outcome
    message = f"{row}: rank {rank} failed ({charge.cause}); retries {retries_text(status)}, " \
              f"recoverCount {status.recover_count}"
    if phase is Phase.RESTARTING:
        pod = evolve(status.workers[rank], restarting=True, exit_code=None)
        status = _set(status, pod)
        return _broadcast(status, phase, row, message, keep_restarting_phase=True)
    return _broadcast(status, phase, row, message)


def _resend(status: Status, pod: PodInfo) -> list[Effect]:
    """State-based re-send: a worker whose heartbeat shows an older seq gets the current order."""
    if pod.seq >= status.seq or status.phase is Phase.PENDING:
        return []
    if pod.restarting and pod.exit_code is not None:
        return [Send(pod.rank, Order.EXIT, status.seq, exit_code=pod.exit_code)]
    order, outcome = current_order(status)
    assert order is not None
    return [Send(pod.rank, order, status.seq, outcome)]


# --------------------------------------------------------------------------- step


def step(status: Status, event: Event, *, now: float = 0.0) -> Result:
    """Apply one event. Never mutates ``status``; raises MalformedEvent for impossible input.

    An ignored event (late, stale, duplicate) returns ``status`` itself and one Log effect that
    says why. When the status changed, the first effect is ``Persist``: the runtime stores the
    new status before it sends any order, so a restarted master never re-uses a seq.
    """
    _validate(status, event)
    new, effects = _dispatch(status, event, now)
    if effects and isinstance(effects[-1], Log) and effects[-1].ignored is not None:
        return status, effects[-1:]
    if new.seq != status.seq:  # a new order: its time is part of it (re-sent byte for byte)
        new = evolve(new, sent_at=now)
    if new is not status and new != status:
        return new, [Persist(), *effects]
    return status, effects


def _dispatch(status: Status, event: Event, now: float) -> Result:
    if isinstance(event, Ack):
        return _on_ack(status, event, now)
    if isinstance(event, Stop):
        if status.phase.terminal:
            return _ignore(status, Ignored.LATE, f"Stop in {status.phase.value}: already over")
        return _fail(evolve(status, stop_reason=event.reason or "stopped"), Outcome.STOPPED,
                     f"T12: stopped ({event.reason})", row="T12")
    if isinstance(event, ConnectTimeout):
        if status.phase is not Phase.PENDING:
            return _ignore(status, Ignored.LATE, f"connect timeout in {status.phase.value}")
        return _broadcast(status, Phase.INDEPENDENT, "T15",
                          "T15: not every worker acked in time; every worker runs independently")
    if isinstance(event, CheckpointDone):
        if status.phase.terminal:
            return _ignore(status, Ignored.LATE, "checkpoint after the end")
        if event.gated:
            return evolve(status, checkpoint_step=event.step), [
                Log(f"last safe checkpoint: step {event.step} (the integrity gate's choice)")]
        return _on_checkpoint(status, event)
    if isinstance(event, Slow):
        return _on_slow(status, event)
    if isinstance(event, Lost):
        return _on_lost(status, event)
    if isinstance(event, Resume):
        if status.phase.terminal or status.phase is Phase.PENDING:
            return _ignore(status, Ignored.LATE, f"resume in {status.phase.value}: nothing to do")
        workers = tuple(evolve(p, restarting=True, exit_code=None) for p in status.workers)
        # the last run's processes are gone: no late evidence will come, no suspect is kept
        return _broadcast(evolve(status, workers=workers, outage=False, blame=-1),
                          Phase.RESTARTING,
                          "T8r", "T8r: resumed: every worker starts again; nothing is counted",
                          keep_restarting_phase=True)
    if isinstance(event, ControlPlaneBack):
        if not status.outage:
            return _ignore(status, Ignored.LATE, "control plane back, but no outage was seen")
        return evolve(status, outage=False), [
            Log("T6b: the control plane is back: nothing was counted; every worker gets a "
                "full lost timeout again", transition="T6b"), Rearm()]
    # Finish / Error / Hang / HangWithQuit carry a seq.
    if status.phase.terminal:
        return _ignore(status, Ignored.LATE, f"{_name(event)} after the job ended")
    if event.seq > status.seq:
        return _ignore(status, Ignored.FUTURE, f"{_name(event)} for seq {event.seq} > {status.seq}")
    if status.blame >= 0 and event.seq == status.run_seq and isinstance(
            event, Error | HangWithQuit):
        return _on_evidence(status, event)
    if _is_stale(status, event.seq):
        return _ignore(status, Ignored.STALE,
                       f"stale {_name(event)} (seq {event.seq} < {status.seq})")
    pod = status.workers[event.rank]
    if isinstance(event, (Finish, Error)) and _is_duplicate(pod, event):
        return _ignore(status, Ignored.DUPLICATE, f"duplicate {_name(event)} seq {event.seq}")
    if pod.restarting:
        return _ignore(status, Ignored.LATE, f"{_name(event)} from restarting rank {pod.rank}")
    pod = evolve(pod, seq=event.seq, updated=now)
    if isinstance(event, Finish):  # stored with what the Finish changes: one copy of the workers
        return _on_finish(status, event, pod)
    status = _set(status, pod)
    if isinstance(event, Error):
        return _on_error(status, event)
    return _on_hang(status, event)


def _name(event: Event) -> str:
    return type(event).__name__ + (f"(rank {event.rank})" if hasattr(event, "rank") else "")


def _validate(status: Status, event: Event) -> None:
    if isinstance(event, WORKER_EVENTS):
        if not isinstance(event.rank, int) or not 0 <= event.rank < len(status.workers):
            last = len(status.workers) - 1
            raise MalformedEvent(
                f"unknown worker rank {event.rank!r}: this job has ranks 0..{last}")
    if isinstance(event, SEQ_EVENTS) and (not isinstance(event.seq, int) or event.seq < 0):
        raise MalformedEvent(f"negative or non-integer sequence number {event.seq!r}")
    if isinstance(event, Ack) and not event.incarnation:
        raise MalformedEvent("an Ack must carry a non-empty incarnation")
    if isinstance(event, Lost) and any(
            not isinstance(r, int) or not 0 <= r < len(status.workers) for r in event.silent):
        raise MalformedEvent(f"unknown rank among the silent ones {sorted(event.silent)!r}")
    if isinstance(event, CheckpointDone) and event.step < 0:
        raise MalformedEvent(f"negative checkpoint step {event.step}")


def _on_ack(status: Status, ev: Ack, now: float) -> Result:
    pod = status.workers[ev.rank]
    if ev.seq > status.seq and status.phase is not Phase.PENDING:
        return _ignore(status, Ignored.FUTURE,
                       f"Ack(rank {ev.rank}) for seq {ev.seq} > {status.seq}")
    new_incarnation = pod.incarnation is not None and ev.incarnation != pod.incarnation
    # a new pod knows nothing of its predecessor's seq: track what *it* has seen
    seq = min(ev.seq if new_incarnation else max(pod.seq, ev.seq), status.seq)
    node, pod_ip = ev.node or pod.node, ev.pod_ip or pod.pod_ip
    if seq != pod.seq or node != pod.node or pod_ip != pod.pod_ip or new_incarnation \
            or pod.incarnation is None:  # a bare heartbeat changes nothing: nothing to persist
        pod = evolve(pod, seq=seq, node=node, pod_ip=pod_ip, updated=now)
    phase = status.phase

    if phase is Phase.PENDING:  # Pending exception: any seq
        first = pod.incarnation is None
        if pod.incarnation != ev.incarnation:
            pod = evolve(pod, incarnation=ev.incarnation)
        status = _set(status, pod)
        if counts(status.workers)[0] == len(status.workers):
            return _broadcast(status, Phase.BOOTCHECKING, "T1", "T1: every worker acked")
        acked = Log(f"rank {ev.rank} acked", level="debug")
        return status, ([acked] if first or new_incarnation else [])

    if phase.terminal:  # nothing changes any more; a lagging worker still learns the end
        return status, _resend(status, pod)

    if pod.restarting:
        back = new_incarnation or pod.exit_code is None
        if not back:  # the old pod is still there: re-send its exit, whatever seq it shows
            status = _set(status, pod)
            assert pod.exit_code is not None
            return status, [Send(pod.rank, Order.EXIT, status.seq, exit_code=pod.exit_code)]
        return _return_worker(status, evolve(pod, incarnation=ev.incarnation),
                              new_incarnation=new_incarnation)

    if new_incarnation:
        if phase is Phase.RUNCOMMAND:
            if pod.finished:  # a worker that finished may go; its new pod changes nothing
                status = _set(status, evolve(pod, incarnation=ev.incarnation))
                return status, [Log(f"rank {ev.rank} restarted after finishing")]
            status = _set(status, evolve(pod, incarnation=ev.incarnation))
            return _counted_failure(status, ev.rank, Charge("restarted", answered=True), "T6",
                                    Phase.RESTARTING)
        status = _set(status, evolve(pod, incarnation=ev.incarnation))
        return _replace_worker(status, ev.rank, "restarted", "T7", new_pod=True)

    status = _set(status, pod)
    return status, _resend(status, pod)


def beat_changes_nothing(status: Status, rank: int, incarnation: str, seq: int) -> bool:
    """Whether a heartbeat of ``rank`` (its worker ``incarnation``, at ``seq``, from where the
    status already has it) leaves the status as it is and asks for nothing: ``step`` with
    ``Ack(rank, incarnation, seq, node=pod.node, pod_ip=pod.pod_ip)`` would return ``status``
    itself and no effect. The runtime skips ``step`` for a keep-alive when this holds (nearly
    every heartbeat of a job that is training); the model checker proves the claim on every
    reachable state (``verify.properties.keepalive_changes_nothing``). ``rank`` must be valid.

    It holds for the worker the status knows (same incarnation), already at the current seq,
    not being replaced, in any phase but Pending (where an ack may complete the round)."""
    pod = status.workers[rank]
    return (seq == status.seq == pod.seq and incarnation == pod.incarnation
            and not pod.restarting and status.phase is not Phase.PENDING)


def _return_worker(status: Status, pod: PodInfo, *, new_incarnation: bool) -> Result:
    """A restarting worker is back; T8 when every restarting worker is. A new container
    answers its open failure, a new node clears its history (policy V3)."""
    if new_incarnation:
        pod = policy.answered(pod, new_node=pod.exit_code in (ExitCode.NODE_FAULT,
                                                               ExitCode.SLOW_NODE_EVICTED))
    pod = evolve(pod, restarting=False, exit_code=None)
    status = _set(status, pod)
    if any(p.restarting for p in status.workers):
        return status, [Log(f"rank {pod.rank} is back"), *_resend(status, pod)]
    if status.ran:
        return _broadcast(status, Phase.TROUBLESHOOTING, "T8",
                          "T8: every restarting worker is back; troubleshoot")
    return _broadcast(status, Phase.BOOTCHECKING, "T8",
                      "T8: every restarting worker is back; bootcheck")


def _live(status: Status) -> list[int]:
    """The ranks whose heartbeats the master expects now: acked, not being replaced, and not
    finished-and-gone from a run."""
    return [p.rank for p in status.workers if p.incarnation is not None and not p.restarting
            and not (status.phase is Phase.RUNCOMMAND and p.finished)]


def _outage(status: Status, ev: Lost) -> bool:
    """T6n: the silence is the control plane's, not the workers' — the master itself cannot
    reach NATS, or every live worker (two or more) fell silent at the same instant. A silence
    that has outlasted the outage bound while the master reaches NATS is the workers' own."""
    if ev.outlasted and ev.nats_ok:
        return False
    if not ev.nats_ok:
        return True
    live = _live(status)
    return len(live) >= 2 and set(live) <= (ev.silent | {ev.rank})


def _on_lost(status: Status, ev: Lost) -> Result:
    pod = status.workers[ev.rank]
    phase = status.phase
    if phase is not Phase.PENDING and not phase.terminal:
        if _outage(status, ev):
            if status.outage:
                return _ignore(status, Ignored.OUTAGE,
                               f"rank {ev.rank} silent during a control-plane outage")
            why = ("the master cannot reach NATS" if not ev.nats_ok
                   else "every worker fell silent at the same instant")
            return evolve(status, outage=True), [Log(
                f"T6n: control-plane outage ({why}): nothing is counted or restarted; "
                "training goes on", level="warning", transition="T6n")]
        if status.outage:  # outlasted: the workers are gone, whatever the control plane did
            status = evolve(status, outage=False)
    if phase is Phase.PENDING:  # T7p
        if pod.incarnation is None:
            return _ignore(status, Ignored.LATE, f"rank {ev.rank} lost before it acked")
        return _set(status, evolve(pod, incarnation=None)), [
            Log(f"T7p: rank {ev.rank} lost before start; waiting for it again",
                transition="T7p")]
    if phase.terminal:
        return _ignore(status, Ignored.LATE, f"rank {ev.rank} lost after the job ended")
    if pod.restarting:
        return _ignore(status, Ignored.LATE, f"rank {ev.rank} lost while already restarting")
    if phase is Phase.RUNCOMMAND:
        if pod.finished:
            return _ignore(status, Ignored.LATE, f"rank {ev.rank} finished and left")
        return _counted_failure(status, ev.rank, Charge("lost", "lost"), "T6",
                                Phase.RESTARTING)
    return _replace_worker(status, ev.rank, "lost", "T7")


def _on_finish(status: Status, ev: Finish, pod: PodInfo) -> Result:
    """``pod``: the reporting rank's pod with the report's seq and time, not yet in ``status``."""
    phase = status.phase
    pod = evolve(pod, finish_seq=ev.seq, shared="")
    if phase not in (Phase.BOOTCHECKING, Phase.TROUBLESHOOTING, Phase.RUNCOMMAND):
        return _ignore(status, Ignored.LATE, f"Finish(rank {ev.rank}) in {phase.value}")
    if pod.finished:
        return _ignore(status, Ignored.LATE, f"Finish(rank {ev.rank}): already finished")
    # the checks' own verdict (not ok without a class: the node failed them) ...
    fault = ev.fault if ev.fault is not None or ev.ok else FaultClass.HARDWARE
    if phase is Phase.TROUBLESHOOTING:  # ... judged with the rank's history (policy V1-V2)
        fault = policy.verdict(status, pod, fault)
    if not passes(fault, troubleshooting=phase is Phase.TROUBLESHOOTING):
        if phase is Phase.RUNCOMMAND:
            return _ignore(status, Ignored.LATE,
                           "Finish(not ok) while running: failures are Errors")
        status = _set(status, pod)
        if ev.shared and not ev.ok:  # T3j: judged when every rank has answered
            return _hold_shared(status, ev)
        detail = ev.detail or (fault.value if fault else "check failed")
        if ev.ok and pod.cause:
            detail = f"{pod.cause} ({fault.value if fault else ''}, failure "\
                     f"{pod.failures} on this node)"
        if phase is Phase.TROUBLESHOOTING and fault is FaultClass.CONTAINER:
            return _replace_worker(status, ev.rank, detail, "T10c",
                                   exit_code=ExitCode.CONTAINER_RESTART)
        row = "T3" if phase is Phase.BOOTCHECKING else "T10"
        return _replace_worker(status, ev.rank, detail, row, exit_code=ExitCode.NODE_FAULT)
    inner = Phase.SUCCEED if phase is Phase.RUNCOMMAND else phase
    reason = ev.detail if not ev.ok else pod.last_reason
    status = _set(status, evolve(pod, finished=True, phase=inner, last_reason=reason))
    held = _held(status)
    if held:  # a rank passed: the storage failure is not every rank's, it is a node's
        return _release(status, held[0])
    if counts(status.workers)[1] < len(status.workers):
        return status, [Log(f"rank {ev.rank} finished {phase.value}", level="debug")]
    if phase is Phase.RUNCOMMAND:  # T4
        seq = status.seq + 1
        workers = tuple(evolve(p, phase=Phase.SUCCEED) for p in status.workers)
        new = evolve(status, phase=Phase.SUCCEED, seq=seq, workers=workers, should_quit=True)
        return new, [Log("T4: every worker finished; job succeeded", transition="T4"),
                     Broadcast(Order.QUIT, seq, Outcome.SUCCESS)]
    effects: list[Effect] = []
    if phase is Phase.TROUBLESHOOTING:
        if status.blame >= 0:  # B3: only symptoms were seen; the first reporter is charged
            suspect = status.workers[status.blame]
            outcome = _charge(status, suspect.rank, Charge(suspect.last_reason or suspect.cause,
                                                           suspect.cause, suspect.cause_class),
                              "B3")
            if isinstance(outcome, tuple):
                return outcome
            status = outcome
            effects.append(Log(f"B3: no evidence beyond the peer symptom: rank {suspect.rank} "
                               f"is charged; retries {retries_text(status)}", transition="B3"))
        # T9: retries aligned to recoverCount; the open failures are answered (L1)
        rc = status.recover_count
        workers = tuple(p if p.retries == rc and not p.cause else
                        evolve(p, retries=rc, cause="", cause_class=None)
                        for p in status.workers)
        status = evolve(status, workers=workers, culprit=-1)
        row = "T9"
    else:
        row = "T2"
    workers = tuple(p if p.flaps == 0 else evolve(p, flaps=0) for p in status.workers)
    status = evolve(status, workers=workers, ran=True)
    new, more = _broadcast(status, Phase.RUNCOMMAND, row, f"{row}: every check passed; run")
    return new, [*effects, *more]


def _held(status: Status) -> list[int]:
    """The ranks whose failed storage check of this round waits for the others' (T3j)."""
    if not counts(status.workers)[2]:  # none holds one: no walk (asked on every Finish)
        return []
    return [p.rank for p in status.workers if p.shared and p.finish_seq == status.seq]


def _hold_shared(status: Status, ev: Finish) -> Result:
    """T3j. A rank failed a check of storage the ranks may share (a full or read-only shared
    filesystem). Judge it when every rank has answered: if every rank failed it the same way,
    the storage is the job's, not a node's — the job fails with that error in one line and no
    node is quarantined; if any rank passed, or failed otherwise, it is a node fault (T3/T10)."""
    pod = evolve(status.workers[ev.rank], shared=ev.shared, last_reason=ev.detail)
    status = _set(status, pod)
    if counts(status.workers)[1]:  # a rank passed
        return _release(status, ev.rank)
    held = _held(status)
    if len(held) < len(status.workers):
        return status, [Log(f"rank {ev.rank} failed a check of storage the ranks may share "
                            f"({ev.shared}); judged when every rank has answered")]
    keys = {p.shared for p in status.workers}
    if len(keys) > 1:
        return _release(status, held[0])
    detail = ev.detail or ev.shared
    failure = (f"every rank failed the same storage check ({ev.shared}): {detail} — the job's "
               "storage, not a node: nothing was quarantined")
    return _fail(status, Outcome.FAILED, f"T3j: {failure}", row="T3j", failure=failure)


def _release(status: Status, rank: int) -> Result:
    """The storage failure of ``rank`` is its node's after all: the usual replacement."""
    workers = tuple(evolve(p, shared="") if p.shared else p for p in status.workers)
    status = evolve(status, workers=workers)
    row = "T3" if status.phase is Phase.BOOTCHECKING else "T10"
    detail = status.workers[rank].last_reason or "storage check failed"
    return _replace_worker(status, rank, detail, row, exit_code=ExitCode.NODE_FAULT)


def _charge_of(ev: Error) -> Charge:
    return Charge(ev.cause or "error", ev.code, ev.klass, ev.signature)


def _on_error(status: Status, ev: Error) -> Result:
    pod = evolve(status.workers[ev.rank], error_seq=ev.seq)
    if status.phase is not Phase.RUNCOMMAND:
        return _ignore(status, Ignored.LATE, f"Error(rank {ev.rank}) in {status.phase.value}")
    if pod.finished:
        return _ignore(status, Ignored.LATE, f"Error(rank {ev.rank}) after it finished")
    if policy.is_symptom(ev.code) and _has_live_peer(status, ev.rank):  # B1: nobody yet
        status = _set(status, evolve(pod, cause=ev.code, cause_class=ev.klass,
                                     last_reason=ev.cause))
        return _suspect(status, ev.rank, ev.cause, "T5s")
    status = _set(status, pod)
    return _counted_failure(status, ev.rank, _charge_of(ev), "T5", Phase.TROUBLESHOOTING)


def _has_live_peer(status: Status, rank: int) -> bool:
    """A symptom needs a peer that could have caused it: another rank still running."""
    running = len(status.workers) - counts(status.workers)[1]
    return running - (not status.workers[rank].finished) > 0


def _suspect(status: Status, rank: int, cause: str, row: str) -> Result:
    """B1: stop every rank and troubleshoot with the collectives; blame waits for evidence."""
    status = evolve(status, blame=rank)
    return _broadcast(status, Phase.TROUBLESHOOTING, row,
                      f"{row}: rank {rank} reports a peer symptom ({cause}); every rank stops; "
                      "the failed rank is named by evidence")


def _on_evidence(status: Status, ev: Error | HangWithQuit) -> Result:
    """B2: a late report of the last run while a suspect is pending."""
    pod = status.workers[ev.rank]
    if isinstance(ev, Error) and ev.seq == pod.error_seq:
        return _ignore(status, Ignored.DUPLICATE, f"duplicate {_name(ev)} seq {ev.seq}")
    symptom = ev.waiting if isinstance(ev, HangWithQuit) else policy.is_symptom(ev.code)
    if symptom or pod.restarting:
        return _ignore(status, Ignored.STALE, f"{_name(ev)} of the last run: no evidence")
    if isinstance(ev, Error):
        status = _set(status, evolve(pod, error_seq=ev.seq))
        charge = _charge_of(ev)
    else:
        charge = Charge("hang", policy.HANG_CAUSE)
    outcome = _charge(status, ev.rank, charge, "B2")
    if isinstance(outcome, tuple):
        return outcome
    return outcome, [Log(f"B2: rank {ev.rank} failed ({charge.cause}); the peer symptom is "
                         f"settled; retries {outcome.retries}, recoverCount "
                         f"{outcome.recover_count}", transition="B2")]


def _on_checkpoint(status: Status, ev: CheckpointDone) -> Result:
    """A checkpoint completed: the job's last safe step; the safe point a slow rank waits for
    (T13e: evicted now, the lowest such rank, its node quarantined as slow)."""
    status = evolve(status, checkpoint_step=max(status.checkpoint_step, ev.step))
    note = Log(f"checkpoint at step {ev.step}")
    slow = [p.rank for p in status.workers if p.slow and not p.finished and not p.restarting]
    if status.phase is not Phase.RUNCOMMAND or not slow:
        return status, [note]
    status, effects = _replace_worker(status, slow[0], "slow", "T13e",
                                      exit_code=ExitCode.SLOW_NODE_EVICTED)
    return status, [note, *effects]


def _on_slow(status: Status, ev: Slow) -> Result:
    """T13s: mark a rank slow in RunCommand; nothing stops, nothing is counted."""
    pod = status.workers[ev.rank]
    if status.phase is not Phase.RUNCOMMAND or pod.finished or pod.restarting:
        return _ignore(status, Ignored.LATE, f"Slow(rank {ev.rank}) in {status.phase.value}")
    if pod.slow:
        return _ignore(status, Ignored.DUPLICATE, f"rank {ev.rank} is already slow")
    return _set(status, evolve(pod, slow=True)), [
        Log(f"T13s: rank {ev.rank} is slow{f' ({ev.detail})' if ev.detail else ''}; it is "
            "evicted right after the next checkpoint", level="warning", transition="T13s"),
        AskCheckpoint(status.seq, f"fault-{status.seq}-{ev.rank}", f"rank {ev.rank} is slow")]


def _on_hang(status: Status, ev: Hang | HangWithQuit) -> Result:
    pod = status.workers[ev.rank]
    if status.phase is not Phase.RUNCOMMAND or pod.finished:
        return _ignore(status, Ignored.LATE, f"{_name(ev)} in {status.phase.value}")
    if isinstance(ev, HangWithQuit):  # T14
        first = policy.stopped_first(ev.activity)
        if (first is not None and 0 <= first < len(status.workers)
                and not status.workers[first].finished
                and not status.workers[first].restarting):
            # B5: the counts name the rank that stopped first (its peers went one step on and
            # wait on it), whichever rank's watchdog fired first
            status, effects = _counted_failure(status, first, Charge("hang", policy.HANG_CAUSE),
                                               "T14", Phase.TROUBLESHOOTING)
            return status, [Log(f"B5: rank {first} stopped first: its progress counts are behind "
                                f"every peer's (the hang was reported by rank {ev.rank})"),
                            *effects]
        if not ev.waiting or not _has_live_peer(status, ev.rank):  # B4: it is the one
            return _counted_failure(status, ev.rank, Charge("hang", policy.HANG_CAUSE), "T14",
                                    Phase.TROUBLESHOOTING)
        busy = [p.rank for p in status.workers if p.hanging and not p.waiting
                and not p.finished]
        if busy:  # B2: a peer marked hung (T13) and not waiting is the one
            return _counted_failure(status, busy[0], Charge("hang", policy.HANG_CAUSE), "T14",
                                    Phase.TROUBLESHOOTING)
        status = _set(status, evolve(pod, cause=policy.HANG_CAUSE, cause_class=None,
                                     last_reason="hang (waiting)"))
        return _suspect(status, ev.rank, "hang while waiting", "T14s")
    if pod.hanging and pod.waiting == ev.waiting:  # T13, idempotent
        return _ignore(status, Ignored.DUPLICATE, f"rank {ev.rank} is already marked hanging")
    status = _set(status, evolve(pod, hanging=True, waiting=ev.waiting))
    return status, [
        Log(f"T13: rank {ev.rank} looks hung{' (waiting)' if ev.waiting else ''}; process kept",
            level="warning", transition="T13"),
        Mark(tuple(p.rank for p in status.workers if p.hanging), status.seq)]


__all__ = [
    "Ack", "AskCheckpoint", "Broadcast", "CauseClass", "Charge", "CheckpointDone", "ConnectTimeout",
    "ControlPlaneBack", "Effect",
    "Error", "Event", "ExitCode", "ExitWorker", "FaultClass", "Finish", "Hang", "HangWithQuit",
    "Slow",
    "Ignored",
    "LIVE_PHASES", "Log", "Lost", "MalformedEvent", "Mark", "Order", "Outcome", "Persist", "Phase",
    "PodInfo", "Quarantine", "Rearm", "Resume", "Send", "Status", "Stop", "TERMINAL_PHASES",
    "beat_changes_nothing", "current_order", "retries_text",
    "evolve", "initial_status", "step",
]
