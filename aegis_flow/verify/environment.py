"""The environment of the model checker: every event a realistic world can feed to ``step``.

PURE. No I/O: ``events(status, message_layer=...)`` looks at a status and returns the events the
workers, the runtime's timers and an operator could produce next, each tagged with its kind so
that the properties know what to expect from ``step`` (a duplicate must be ignored, a stale
message rejected, a peer symptom must charge nobody...) and which events a *cooperating* world
produces (the subgraph FlakyRankRecovers and NoEndlessReplacement walk).

Without the message layer every worker message carries the master's current seq: messages are
never lost, duplicated or delayed (a lost message is just an event that has not happened yet).
With it, the environment also re-delivers old messages: heartbeats that answer any seq from the
worker's last reported one up to the current one (how a worker that missed an order is re-sent
it), duplicates of the last processed Finish/Error, and stale Finish/Error of the previous round.

Failures carry a cause, as the supervisor's log classifier reports it (``CAUSES``): an unknown
one (no code: transient, escalated by repetition), a container cause, a hardware cause, a user
exception with a signature (the same signature twice in a row on one rank is R1/T16; a repeat
follows from the graph, since the same event is offered again), and a peer symptom (B1). Hangs
say whether the process sleeps (``waiting``: a symptom) or not. While a suspect is pending
(``status.blame >= 0``) every other rank that has not reported for the last run order
(``status.run_seq``) may still deliver that report late: the evidence of B2.

Incarnations are "0" and "1": only their equality matters to the machine, so a new incarnation of
a worker is simply the other one, and a worker acking in Pending uses "0". Signatures are the same
string for every rank, so the environment stays symmetric in the ranks.
"""

from __future__ import annotations

import enum
from functools import cache

from aegis_flow.master.machine import (
    Ack,
    CauseClass,
    CheckpointDone,
    ConnectTimeout,
    ControlPlaneBack,
    Error,
    Event,
    ExitCode,
    FaultClass,
    Finish,
    Hang,
    HangWithQuit,
    Lost,
    Phase,
    PodInfo,
    Resume,
    Slow,
    Status,
    Stop,
)


class Kind(enum.Enum):
    """Why the environment produced an event; the properties key on it.

    NORMAL, COOPERATIVE and SYMPTOM are first deliveries: COOPERATIVE is what a world without
    faults does (a check round passes, a worker acks, a replaced worker comes back), SYMPTOM a
    report that only shows a *peer* failed (a peer-symptom cause, a hang of a sleeping process),
    NORMAL everything else (a failure, a loss, an unsolicited new pod, late evidence, the
    connect timeout)."""

    NORMAL = "normal"  # a first delivery of a fault (or the connect timeout)
    COOPERATIVE = "cooperative"  # a first delivery of what a fault-free world does
    SYMPTOM = "symptom"  # a first delivery of a peer symptom (B1): charges nobody
    HEARTBEAT = "heartbeat"  # a same-incarnation Ack answering some seq (message layer)
    DUPLICATE = "duplicate"  # the last processed Finish/Error, delivered again
    STALE = "stale"  # a Finish/Error from the previous round (seq - 1)
    STOP = "stop"  # an operator stops the job (T12)
    OUTAGE = "outage"  # the control plane goes out: every live worker silent at once (T6n)
    RESUME = "resume"  # an operator resumes an interrupted job: every worker restarts (T8r)


#: first deliveries
FIRST = frozenset({Kind.NORMAL, Kind.COOPERATIVE, Kind.SYMPTOM})
#: the edges of a cooperating world (FlakyRankRecovers, NoEndlessReplacement)
COOPERATIVE = frozenset({Kind.COOPERATIVE, Kind.HEARTBEAT})

STOP_REASON = "operator"
FIRST_INCARNATION = "0"


class Cause(enum.Enum):
    """The causes a failed process reports (``Error``'s cause, code, class, signature)."""

    UNKNOWN = ("error", "", None, "")  # no rule matched: transient, escalated by repetition
    USER = ("error", "", None, "E@1")  # a Python exception at step 1: R1 when repeated
    CONTAINER = ("cuda_error", "cuda_error", CauseClass.CONTAINER, "")  # D7: L2
    HARDWARE = ("ecc_error", "ecc_error", CauseClass.HARDWARE, "")  # D6: L3
    SYMPTOM = ("connection_reset", "connection_reset", CauseClass.TRANSIENT, "")  # B1

    @property
    def symptom(self) -> bool:
        return self is Cause.SYMPTOM


CAUSES: tuple[Cause, ...] = tuple(Cause)
#: the cause codes this environment sends as peer symptoms (vocab.PEER_SYMPTOM_CAUSES has them;
#: the properties read this list, not the policy's ``is_symptom``, so a broken policy is seen)
SYMPTOM_CODES = frozenset({Cause.SYMPTOM.value[1]})

_RECOVERY = (Phase.BOOTCHECKING, Phase.TROUBLESHOOTING)
_STOP = Stop(STOP_REASON)
_TIMEOUT = ConnectTimeout()
_CHECKPOINT = CheckpointDone(1)  # a checkpoint completes (its step is not in the spec)


# Events are immutable values: each distinct one is built once (a frozen dataclass costs
# microseconds to construct), so equal events are the same object.
@cache
def _ack(w: int, incarnation: str, seq: int) -> Ack:
    return Ack(w, incarnation, seq=seq)


@cache
def _finish(w: int, seq: int, ok: bool, fault: FaultClass | None = None) -> Finish:
    return Finish(w, seq, ok, fault)


#: what a full shared filesystem makes every rank's io check say (T3j)
SHARED_FAULT = "io tmpfs tmpfs /shared ENOSPC"


@cache
def _finish_shared(w: int, seq: int) -> Finish:
    return Finish(w, seq, False, FaultClass.HARDWARE, "io: ENOSPC", shared=SHARED_FAULT)


@cache
def _error(w: int, seq: int, cause: Cause = Cause.UNKNOWN) -> Error:
    text, code, klass, signature = cause.value
    return Error(w, seq, text, code=code, klass=klass, signature=signature)


@cache
def _lost(w: int) -> Lost:
    return Lost(w)


@cache
def _silent_all(w: int, live: frozenset[int], nats_ok: bool) -> Lost:
    """The first of the Lost events of a control-plane outage: every live rank silent now."""
    return Lost(w, silent=live, nats_ok=nats_ok)


@cache
def _outlasted(w: int, live: frozenset[int]) -> Lost:
    """A silence that outlasted the outage bound while the master reaches NATS."""
    return Lost(w, silent=live, nats_ok=True, outlasted=True)


_BACK = ControlPlaneBack()
_RESUME = Resume()


def _outage_events(status: Status) -> list[tuple[Kind, Event]]:
    """T6n/T6b. Out of an outage: the control plane comes back (what a cooperating world
    does), or the silence outlasts the bound (every silent worker is lost), or Stop. Into one:
    the master cannot reach NATS, or (two or more live workers) every one falls silent."""
    live = frozenset(live_ranks(status))
    if status.outage:
        return [(Kind.COOPERATIVE, _BACK), *((Kind.NORMAL, _outlasted(w, live))
                                             for w in sorted(live)), (Kind.STOP, _STOP)]
    if status.phase is Phase.PENDING or not live:
        return []
    first = min(live)
    out: list[tuple[Kind, Event]] = [(Kind.OUTAGE, _silent_all(first, live, False))]
    if len(live) >= 2:
        out.append((Kind.OUTAGE, _silent_all(first, live, True)))
    return out


def live_ranks(status: Status) -> list[int]:
    """The ranks whose heartbeats the master expects (as the runtime judges silence)."""
    return [p.rank for p in status.workers if p.incarnation is not None and not p.restarting
            and not (status.phase is Phase.RUNCOMMAND and p.finished)]


@cache
def _hang(w: int, seq: int, quit_: bool, waiting: bool = False) -> Hang | HangWithQuit:
    return HangWithQuit(w, seq, waiting) if quit_ else Hang(w, seq, waiting)


@cache
def _hang_behind(w: int, seq: int, behind: int, workers: int) -> HangWithQuit:
    """A waiting rank's HangWithQuit whose progress counts show rank ``behind`` one forward
    behind every other rank (B5: ``behind`` stopped first)."""
    activity = tuple((r, 0, 0 if r == behind else 1) for r in range(workers))
    return HangWithQuit(w, seq, True, activity)


@cache
def _slow(w: int) -> Slow:
    return Slow(w)


def other_incarnation(incarnation: str | None) -> str:
    """The incarnation a replacement pod of a worker gets: the other one of "0"/"1"."""
    return "1" if incarnation == FIRST_INCARNATION else FIRST_INCARNATION


def events(status: Status, *, message_layer: bool,
           resume: bool = True) -> list[tuple[Kind, Event]]:
    """Every (kind, event) the environment can produce from ``status``, without repeats.

    Terminal phases produce nothing: a finished job stays as it is (no stuttering steps).
    """
    phase = status.phase
    if phase.terminal:
        return []
    if status.outage:  # the runtime hears no worker until it says the control plane is back
        return _outage_events(status)
    out: list[tuple[Kind, Event]] = _outage_events(status)
    for pod in status.workers:
        out.extend(_worker_events(status, pod, message_layer))
        if status.blame >= 0 and pod.rank != status.blame:
            out.extend(_late_evidence(status, pod))
        if message_layer:
            out.extend(_message_layer_events(status, pod))
    if phase is Phase.RUNCOMMAND and any(p.slow for p in status.workers):
        out.append((Kind.NORMAL, _CHECKPOINT))  # the safe point a slow rank waits for (T13e)
    if phase is Phase.PENDING:
        out.append((Kind.NORMAL, _TIMEOUT))
    elif resume:
        out.append((Kind.RESUME, _RESUME))
    out.append((Kind.STOP, _STOP))
    # only re-deliveries can repeat a first delivery (a heartbeat equal to a returning Ack...)
    return _unique(out) if message_layer else out


def _worker_events(status: Status, pod: PodInfo, message_layer: bool) -> list[tuple[Kind, Event]]:
    """First deliveries of what one worker can do in the current phase (current seq)."""
    phase, seq, w = status.phase, status.seq, pod.rank
    n, c = Kind.NORMAL, Kind.COOPERATIVE
    # A replacement pod has heard no order yet: with the message layer its Ack answers seq 0.
    new_pod = _ack(w, other_incarnation(pod.incarnation), 0 if message_layer else seq)
    if phase is Phase.PENDING:
        if pod.incarnation is None:
            return [(c, _ack(w, FIRST_INCARNATION, seq))]
        return [(n, _lost(w))]
    if pod.restarting:  # only in Restarting: it comes back as a new pod or as the same one
        return [(c, new_pod), (c, _ack(w, pod.incarnation or FIRST_INCARNATION, seq))]
    if phase in _RECOVERY:
        out: list[tuple[Kind, Event]] = []
        if not pod.finished:
            out.append((c, _finish(w, seq, True)))
            out.append((n, _finish(w, seq, False, FaultClass.HARDWARE)))
            out.append((n, _finish_shared(w, seq)))
            if phase is Phase.TROUBLESHOOTING:
                out.append((n, _finish(w, seq, False, FaultClass.CONTAINER)))
        out += [(n, _lost(w)), (n, new_pod)]
        return out
    if phase is Phase.RUNCOMMAND:
        if pod.finished:  # it may exit: neither its loss nor its new pod is a failure (T6)
            return [(n, _lost(w)), (n, new_pod)]
        out = [(c, _finish(w, seq, True))]
        out += [(Kind.SYMPTOM if cause.symptom else n, _error(w, seq, cause)) for cause in CAUSES]
        for waiting in (False, True):  # T13 marks (idempotent: not offered again)
            if not (pod.hanging and pod.waiting == waiting):
                out.append((Kind.SYMPTOM if waiting else n, _hang(w, seq, False, waiting)))
        out += [(n, _hang(w, seq, True, False)), (Kind.SYMPTOM, _hang(w, seq, True, True)),
                (n, _lost(w)), (n, new_pod)]
        out += [(Kind.SYMPTOM, _hang_behind(w, seq, r, len(status.workers)))
                for r in range(len(status.workers)) if r != w]
        if not pod.slow:  # T13s: marked once
            out.append((n, _slow(w)))
        return out
    # Restarting, a worker that is not being replaced: it can still be lost or replaced.
    return [(n, _lost(w)), (n, new_pod)]


def _late_evidence(status: Status, pod: PodInfo) -> list[tuple[Kind, Event]]:
    """B2: a rank other than the suspect reports the last run's failure late (first delivery:
    it has reported neither an Error nor its success for ``run_seq``): every cause, and hang
    reports."""
    run = status.run_seq
    if run < 0 or pod.error_seq == run or pod.finish_seq == run:
        return []
    w = pod.rank
    out: list[tuple[Kind, Event]] = [
        (Kind.SYMPTOM if cause.symptom else Kind.NORMAL, _error(w, run, cause))
        for cause in CAUSES]
    out += [(Kind.NORMAL, _hang(w, run, True, False)), (Kind.SYMPTOM, _hang(w, run, True, True))]
    return out


def _message_layer_events(status: Status, pod: PodInfo) -> list[tuple[Kind, Event]]:
    """Re-deliveries: heartbeats over older seqs, duplicates and stale results."""
    seq, w = status.seq, pod.rank
    out: list[tuple[Kind, Event]] = []
    if pod.incarnation is not None:
        inc = pod.incarnation
        out += [(Kind.HEARTBEAT, _ack(w, inc, s)) for s in range(pod.seq, seq + 1)]
    if pod.finish_seq == seq:
        ok = pod.finished or pod.exit_code is None
        fault = None if ok else (
            FaultClass.CONTAINER if pod.exit_code is ExitCode.CONTAINER_RESTART
            else FaultClass.HARDWARE)
        out.append((Kind.DUPLICATE, _finish(w, seq, ok, fault)))
    if pod.error_seq == seq:
        out.append((Kind.DUPLICATE, _error(w, seq)))
    # the suspect's own peer-symptom report of the last run, again (B2 path: a duplicate)
    run = status.run_seq
    if status.blame == w and 0 <= run < seq and pod.error_seq == run:
        out.append((Kind.DUPLICATE, _error(w, run, Cause.SYMPTOM)))
    if seq > 0:
        out += [
            (Kind.STALE, _finish(w, seq - 1, True)),
            (Kind.STALE, _finish(w, seq - 1, False, FaultClass.HARDWARE)),
        ]
        # an Error answering the last run while a suspect is pending is evidence, not stale
        if not (status.blame >= 0 and seq - 1 == run):
            out.append((Kind.STALE, _error(w, seq - 1)))
    return out


def _unique(pairs: list[tuple[Kind, Event]]) -> list[tuple[Kind, Event]]:
    """Drop repeated events, keeping the first kind (a heartbeat equal to a normal Ack...).

    Equal events are the same object here (see ``_ack`` & co.), so identity is enough."""
    seen: set[int] = set()
    out: list[tuple[Kind, Event]] = []
    for kind, event in pairs:
        if id(event) not in seen:
            seen.add(id(event))
            out.append((kind, event))
    return out


__all__ = ["CAUSES", "COOPERATIVE", "FIRST", "FIRST_INCARNATION", "SYMPTOM_CODES", "Cause",
           "live_ranks",
           "Kind", "STOP_REASON", "events", "other_incarnation"]
