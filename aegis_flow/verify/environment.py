"""The environment of the model checker: every event a realistic world can feed to ``step``.

PURE. No I/O: ``events(status, message_layer=...)`` looks at a status and returns the events the
workers, the runtime's timers and an operator could produce next, each tagged with its kind so
that the transition properties know what to expect from ``step`` (a duplicate must be ignored, a
stale message rejected...).

Without the message layer every worker message carries the master's current seq: messages are
never lost, duplicated or delayed (a lost message is just an event that has not happened yet).
With it, the environment also re-delivers old messages: heartbeats that answer any seq from the
worker's last reported one up to the current one (how a worker that missed an order is re-sent
it), duplicates of the last processed Finish/Error, and stale Finish/Error of the previous round.

Incarnations are "0" and "1": only their equality matters to the machine, so a new incarnation of
a worker is simply the other one, and a worker acking in Pending uses "0".
"""

from __future__ import annotations

import enum
from functools import cache

from aegis_flow.master.machine import (
    Ack,
    ConnectTimeout,
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
    Status,
    Stop,
)


class Kind(enum.Enum):
    """Why the environment produced an event; the transition properties key on it."""

    NORMAL = "normal"  # a first delivery of something that happened
    HEARTBEAT = "heartbeat"  # a same-incarnation Ack answering some seq (message layer)
    DUPLICATE = "duplicate"  # the last processed Finish/Error, delivered again
    STALE = "stale"  # a Finish/Error from the previous round (seq - 1)
    STOP = "stop"  # an operator stops the job (T12)


STOP_REASON = "operator"
FIRST_INCARNATION = "0"

_RECOVERY = (Phase.BOOTCHECKING, Phase.TROUBLESHOOTING)
_STOP = Stop(STOP_REASON)
_TIMEOUT = ConnectTimeout()


# Events are immutable values: each distinct one is built once (a frozen dataclass costs
# microseconds to construct), so equal events are the same object.
@cache
def _ack(w: int, incarnation: str, seq: int) -> Ack:
    return Ack(w, incarnation, seq=seq)


@cache
def _finish(w: int, seq: int, ok: bool, fault: FaultClass | None = None) -> Finish:
    return Finish(w, seq, ok, fault)


@cache
def _error(w: int, seq: int) -> Error:
    return Error(w, seq, "error")


@cache
def _lost(w: int) -> Lost:
    return Lost(w)


@cache
def _hang(w: int, seq: int, quit_: bool) -> Hang | HangWithQuit:
    return HangWithQuit(w, seq) if quit_ else Hang(w, seq)


def other_incarnation(incarnation: str | None) -> str:
    """The incarnation a replacement pod of a worker gets: the other one of "0"/"1"."""
    return "1" if incarnation == FIRST_INCARNATION else FIRST_INCARNATION


def events(status: Status, *, message_layer: bool) -> list[tuple[Kind, Event]]:
    """Every (kind, event) the environment can produce from ``status``, without repeats.

    Terminal phases produce nothing: a finished job stays as it is (no stuttering steps).
    """
    phase = status.phase
    if phase.terminal:
        return []
    out: list[tuple[Kind, Event]] = []
    for pod in status.workers:
        out.extend(_worker_events(status, pod, message_layer))
        if message_layer:
            out.extend(_message_layer_events(status, pod))
    if phase is Phase.PENDING:
        out.append((Kind.NORMAL, _TIMEOUT))
    out.append((Kind.STOP, _STOP))
    # only re-deliveries can repeat a first delivery (a heartbeat equal to a returning Ack)
    return _unique(out) if message_layer else out


def _worker_events(status: Status, pod: PodInfo, message_layer: bool) -> list[tuple[Kind, Event]]:
    """First deliveries of what one worker can do in the current phase (current seq)."""
    phase, seq, w = status.phase, status.seq, pod.rank
    n = Kind.NORMAL
    # A replacement pod has heard no order yet: with the message layer its Ack answers seq 0.
    new_pod = _ack(w, other_incarnation(pod.incarnation), 0 if message_layer else seq)
    if phase is Phase.PENDING:
        if pod.incarnation is None:
            return [(n, _ack(w, FIRST_INCARNATION, seq))]
        return [(n, Lost(w))]
    if pod.restarting:  # only in Restarting: it comes back as a new pod or as the same one
        return [(n, new_pod), (n, _ack(w, pod.incarnation or FIRST_INCARNATION, seq))]
    if phase in _RECOVERY:
        out: list[tuple[Kind, Event]] = []
        if not pod.finished:
            out.append((n, _finish(w, seq, True)))
            out.append((n, _finish(w, seq, False, FaultClass.HARDWARE)))
            if phase is Phase.TROUBLESHOOTING:
                out.append((n, _finish(w, seq, False, FaultClass.CONTAINER)))
        out += [(n, _lost(w)), (n, new_pod)]
        return out
    if phase is Phase.RUNCOMMAND:
        if pod.finished:  # it may exit: neither its loss nor its new pod is a failure (T6)
            return [(n, _lost(w)), (n, new_pod)]
        out = [(n, _finish(w, seq, True)), (n, _error(w, seq))]
        if not pod.hanging:
            out.append((n, _hang(w, seq, False)))
        out += [(n, _hang(w, seq, True)), (n, _lost(w)), (n, new_pod)]
        return out
    # Restarting, a worker that is not being replaced: it can still be lost or replaced.
    return [(n, _lost(w)), (n, new_pod)]


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
    if seq > 0:
        out += [
            (Kind.STALE, _finish(w, seq - 1, True)),
            (Kind.STALE, _finish(w, seq - 1, False, FaultClass.HARDWARE)),
            (Kind.STALE, _error(w, seq - 1)),
        ]
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


__all__ = ["FIRST_INCARNATION", "Kind", "STOP_REASON", "events", "other_incarnation"]
