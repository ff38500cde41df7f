"""The master's data: phases, per-worker PodInfo, Status, events and effects.

PURE data: frozen dataclasses and enums, no behaviour beyond small accessors. ``machine.py``
holds the transition function over them and re-exports every name here.
"""

from __future__ import annotations

import enum
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from aegis_flow.vocab import LIVE_PHASES as LIVE_PHASES
from aegis_flow.vocab import TERMINAL_PHASES as TERMINAL_PHASES
from aegis_flow.vocab import CauseClass as CauseClass
from aegis_flow.vocab import ExitCode as ExitCode
from aegis_flow.vocab import FaultClass as FaultClass
from aegis_flow.vocab import Order as Order
from aegis_flow.vocab import Outcome as Outcome
from aegis_flow.vocab import Phase as Phase

T = TypeVar("T")
_REPLACERS: dict[tuple[Any, ...], Callable[[Any, dict[str, Any]], Any]] = {}


def replaced(before: tuple[PodInfo, ...], after: tuple[PodInfo, ...]) -> list[int]:
    """The ranks whose pod is not the very same object in ``after`` (the core evolves only
    the pods that change, so these are the ranks a transition touched). A walk in C: at 4,096
    ranks a Python loop over the pods per transition cost more than the transition."""
    return list(itertools.compress(range(len(after)), map(operator.is_not, before, after)))


def evolve(obj: T, **changes: Any) -> T:
    """``dataclasses.replace`` for our frozen slotted records, two to four times faster.

    The model checker calls it millions of times. For each class and each set of changed field
    names it generates (once) a straight-line copy function, as ``dataclasses`` itself generates
    ``__init__``: a bare instance, then every slot written through its member descriptor, with no
    per-field "was it changed?" test and no re-validation. Unknown field names raise TypeError,
    as ``replace`` does.
    """
    cls = type(obj)
    key = (cls, *changes)
    fn = _REPLACERS.get(key)
    if fn is None:
        fn = _REPLACERS[key] = _make_copier(cls, frozenset(changes))
    result: T = fn(obj, changes)
    return result


def _setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The slot's member descriptor setter (bypasses frozen ``__setattr__``), or a fallback."""
    slot = cls.__dict__.get(name)
    if slot is not None and hasattr(slot, "__set__") and type(slot).__name__ == "member_descriptor":
        setter: Callable[[Any, Any], None] = slot.__set__
        return setter
    return lambda obj, value: object.__setattr__(obj, name, value)


def _make_copier(cls: type, changed: frozenset[str]) -> Callable[[Any, dict[str, Any]], Any]:
    names = [f.name for f in fields(cls)]
    unknown = changed - set(names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    setters = {f"set_{k}": _setter(cls, k) for k in names}
    body = "".join(f"    set_{k}(n, c[{k!r}])\n" if k in changed else f"    set_{k}(n, o.{k})\n"
                   for k in names)
    scope: dict[str, Any] = {"new": object.__new__, "C": cls, **setters}
    exec(f"def copy(o, c):\n    n = new(C)\n{body}    return n\n", scope)  # noqa: S102 - our own field names
    copier: Callable[[Any, dict[str, Any]], Any] = scope["copy"]
    return copier


# --------------------------------------------------------------------------- states
# The vocabulary (phases, orders, fault and cause classes, exit codes) lives in
# ``aegis_flow/vocab.py``, written down once for the core, the runtime and the supervisor.

@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the master knows of one worker (by rank). ``incarnation`` is None until it acks."""

    rank: int
    phase: Phase = Phase.PENDING
    finished: bool = False
    retries: int = 0
    restarting: bool = False
    incarnation: str | None = None
    last_reason: str = ""
    node: str = ""
    pod_ip: str = ""
    updated: float = 0.0
    seq: int = 0  # the highest (valid) seq this worker has reported
    finish_seq: int = -1  # seq of the last processed Finish (dedup)
    error_seq: int = -1  # seq of the last processed Error (dedup)
    flaps: int = 0  # uncounted replacements since the job last entered RunCommand
    hanging: bool = False
    waiting: bool = False  # its hang report said the process sleeps (waiting on a peer)
    exit_code: ExitCode | None = None  # an exit it was told to make; re-sent until it returns
    slow: bool = False  # marked slow during training (T13s): evicted right after a checkpoint
    # -- failure history (the policy's input; ``policy.py``) ---------------------------------
    failures: int = 0  # counted failures charged to this rank on its current node (escalation)
    cause: str = ""  # the cause code of its open failure ("" = none, or answered)
    cause_class: CauseClass | None = None  # the log classifier's class of that cause
    signature: str = ""  # exception and step of its last charged failure (repeat detection)
    shared: str = ""  # its failed check of this round hit storage the ranks may share (T3j)


_ACKED = operator.attrgetter("incarnation")
_FINISHED = operator.attrgetter("finished")
_SHARED = operator.attrgetter("shared")


class Workers(tuple[PodInfo, ...]):
    """A status's workers: a tuple in every respect (equality, hash, encoding), that also
    carries ``counts`` — (acked, finished, shared): how many pods have acked, have finished
    this round, hold a shared-storage failure. The core asks these on every Ack and Finish;
    counting 4,096 pods per report made a round's fan-in O(N²) (1.3 s of core time at 4,096
    ranks). ``with_pod`` derives the counts of the new tuple from the old in O(1), so they are
    always what counting would give (``counts`` counts any other tuple)."""

    counts: tuple[int, int, int]
    origin: tuple[int, int]  # (id of the tuple it was made from, the rank replaced): touched()


def touched(before: tuple[PodInfo, ...], after: tuple[PodInfo, ...]) -> list[int]:
    """``replaced(before, after)``, in O(1) when ``after`` is ``before`` with one pod put in by
    ``with_pod`` (a report: the common case). ``before`` must have existed when ``after`` was
    made (the status a step started from), so that no other tuple can have had its id."""
    origin: tuple[int, int] | None = getattr(after, "origin", None)
    if origin is not None and origin[0] == id(before) and len(before) == len(after):
        rank = origin[1]
        return [rank] if before[rank] is not after[rank] else []
    return replaced(before, after)


def counts(workers: tuple[PodInfo, ...]) -> tuple[int, int, int]:
    """(acked, finished, shared) of ``workers``: carried by a ``Workers``, else counted (in C)."""
    carried: tuple[int, int, int] | None = getattr(workers, "counts", None)
    if carried is not None:
        return carried
    return (len(workers) - list(map(_ACKED, workers)).count(None),
            sum(map(_FINISHED, workers)), sum(map(bool, map(_SHARED, workers))))


def with_pod(workers: tuple[PodInfo, ...], pod: PodInfo) -> Workers:
    """``workers`` with ``pod`` in its rank's place, and the counts carried along."""
    old = workers[pod.rank]
    acked, finished, shared = counts(workers)
    items = list(workers)
    items[pod.rank] = pod
    new = Workers(items)
    new.counts = (acked + (pod.incarnation is not None) - (old.incarnation is not None),
                  finished + pod.finished - old.finished,
                  shared + bool(pod.shared) - bool(old.shared))
    new.origin = (id(workers), pod.rank)
    return new


@dataclass(frozen=True, slots=True)
class Status:
    """The master's whole state; persisted after every transition."""

    phase: Phase
    workers: tuple[PodInfo, ...]
    max_retry: int
    flap_limit: int = 3
    recover_count: int = 0
    should_quit: bool = False
    error_nodes: frozenset[str] = frozenset()
    seq: int = 0
    ran: bool = False  # the command has run at least once in this job (T8)
    stop_reason: str = ""
    checkpoint_step: int = -1
    # -- the recovery policy's state (``policy.py``): all of it persisted ---------------------
    blame: int = -1  # a rank reported only a peer symptom: the first such rank, until evidence
    culprit: int = -1  # the rank charged with the failure that started this recovery
    replaced: bool = False  # a worker was replaced since the command last ran
    run_seq: int = -1  # the seq of the last run order (late evidence answers it)
    plan: tuple[str, ...] = ()  # the checks of the current bootcheck/troubleshoot order
    epoch: int = 0  # recoverCount when the current order was made (AEGIS_RESTART_COUNT)
    sent_at: float = 0.0  # when the current order was made: a re-send is byte-for-byte equal
    failure: str = ""  # why the job failed, in one line (T11, T16)
    outage: bool = False  # the control plane is out (T6n): no loss is judged until it is back
    # -- settings of the policy -------------------------------------------------------------
    give_up_on_repeat: bool = True  # the same error at the same step twice in a row: T16
    l2_after: int = 2  # a rank with this many failures on its node: restart its container
    l3_after: int = 3  # ... this many: quarantine its node
    collective_after: int = 2  # ... this many: troubleshoot with the collective checks
    rdzv_addr: str = "127.0.0.1"  # where rank 0 hosts each epoch's rendezvous (RDZV_RANK0:
    #                               rank 0's own pod address, which it reports when it acks)
    rdzv_base: int = 0  # first port of the rendezvous window (0 = ports not assigned)

    @property
    def retries(self) -> tuple[int, ...]:
        return tuple(p.retries for p in self.workers)

    def worker(self, rank: int) -> PodInfo:
        return self.workers[rank]


def initial_status(
    workers: int,
    max_retry: int,
    *,
    flap_limit: int = 3,
    nodes: tuple[str, ...] | None = None,
    **settings: Any,
) -> Status:
    """The status of a job that has just been created (phase Pending). ``settings``: the
    policy's settings (``give_up_on_repeat``, ``l2_after``, ``l3_after``, ``collective_after``,
    ``rdzv_addr``, ``rdzv_base``)."""
    unknown = set(settings) - SETTINGS
    if unknown:
        raise TypeError(f"unknown settings {sorted(unknown)}")
    if not 1 <= settings.get("l2_after", 2) <= settings.get("l3_after", 3):
        raise ValueError("escalation thresholds must satisfy 1 <= l2_after <= l3_after, got "
                         f"l2_after={settings.get('l2_after', 2)}, "
                         f"l3_after={settings.get('l3_after', 3)}")
    if settings.get("collective_after", 2) < 1:
        raise ValueError("collective_after must be 1 or more")
    base = settings.get("rdzv_base", 0)
    if base and not 1024 <= base <= 65535 - RDZV_SPAN:
        raise ValueError(f"rendezvous port base {base} must lie in 1024..{65535 - RDZV_SPAN}")
    if workers < 1:
        raise ValueError(f"the number of workers ({workers}) must be at least 1")
    if max_retry < 0:
        raise ValueError(f"max-retry ({max_retry}) must be 0 or more")
    if flap_limit < 0:
        raise ValueError(f"flap-limit ({flap_limit}) must be 0 or more")
    if nodes is not None and len(nodes) != workers:
        raise ValueError(f"{len(nodes)} node names given for {workers} workers")
    pods = tuple(
        PodInfo(rank=r, node=nodes[r] if nodes else "") for r in range(workers)
    )
    return Status(phase=Phase.PENDING, workers=pods, max_retry=max_retry, flap_limit=flap_limit,
                  **settings)


SETTINGS = frozenset({"give_up_on_repeat", "l2_after", "l3_after", "collective_after",
                      "rdzv_addr", "rdzv_base"})
RDZV_SPAN = 64  # each order with a rendezvous uses port rdzv_base + seq % RDZV_SPAN
#: ``rdzv_addr`` meaning "the address rank 0's pod reported" (pods: each has its own loopback)
RDZV_RANK0 = "rank0"


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Ack:
    """Worker is up and subscribed; sent once at start and then as its heartbeat."""

    rank: int
    incarnation: str
    seq: int = 0
    node: str = ""
    pod_ip: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    """Worker completed the work of order ``seq``: check results (ok = passed) or exit 0."""

    rank: int
    seq: int
    ok: bool
    fault: FaultClass | None = None  # the diagnosis when not ok
    detail: str = ""
    # a failed check of storage the ranks may share: "io <filesystem> <errno>" (T3j)
    shared: str = ""


@dataclass(frozen=True, slots=True)
class Error:
    """The command failed while running (non-zero exit or signal).

    ``code``/``klass``: the log classifier's cause code and class ("" / None: unknown);
    ``signature``: the exception and step it died at ("" when none: a signal, no traceback) —
    two equal signatures in a row on one rank are a deterministic user error (T16)."""

    rank: int
    seq: int
    cause: str = "error"
    code: str = ""
    klass: CauseClass | None = None
    signature: str = ""


@dataclass(frozen=True, slots=True)
class Slow:
    """Rank ``rank`` trains slower than its peers for a sustained window (the runtime's
    ``slowness.SlowDetector`` over the forward times heartbeats carry): mark it (T13s); it is
    evicted right after the next checkpoint completes (T13e), never before."""

    rank: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Lost:
    """Worker's heartbeats stopped (produced by the runtime's timer).

    What the runtime observed at that instant, for the core to tell a control-plane outage
    from lost workers (T6n): ``silent``, every rank silent past the lost timeout now (empty:
    only ``rank``); ``nats_ok``, the master's own round trip to NATS succeeded just now;
    ``outlasted``, this silence has lasted longer than the outage bound."""

    rank: int
    silent: frozenset[int] = frozenset()
    nats_ok: bool = True
    outlasted: bool = False


@dataclass(frozen=True, slots=True)
class Hang:
    """No progress for the mark threshold (T13). ``waiting``: as for ``HangWithQuit``."""

    rank: int
    seq: int
    waiting: bool = False


@dataclass(frozen=True, slots=True)
class HangWithQuit:
    """No progress for the quit threshold. ``waiting``: the process sleeps (blocked, e.g. in a
    collective waiting for a peer) rather than running or stopped: a peer symptom.
    ``activity``: evidence the runtime attaches, each rank's (rank, optimizer steps, forwards)
    as its last heartbeat counted them in the current run (``policy.stopped_first`` reads it:
    the rank behind its peers stopped first)."""

    rank: int
    seq: int
    waiting: bool = False
    activity: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ControlPlaneBack:
    """A worker was heard from again while the control plane was out (runtime, T6b)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """An operator resumed an interrupted job (``aegis-flow run --resume``): every worker was
    started again, a new process; none of it is a failure (T8r)."""


@dataclass(frozen=True, slots=True)
class CheckpointDone:
    """A checkpoint of ``step`` is complete. ``gated``: the integrity gate's choice before a
    resume (a newer one was damaged and moved aside): the job's last safe step is this one."""

    step: int
    gated: bool = False


@dataclass(frozen=True, slots=True)
class ConnectTimeout:
    """Pending: not every worker acked within the connect timeout (runtime timer) → T15."""


@dataclass(frozen=True, slots=True)
class Stop:
    """An operator stopped the job, or a restarting worker missed its deadline → T12."""

    reason: str = "stopped"


Event = (
    Ack | Finish | Error | Lost | Hang | HangWithQuit | CheckpointDone | ConnectTimeout | Stop
    | ControlPlaneBack | Resume | Slow
)
WORKER_EVENTS = (Ack, Finish, Error, Lost, Hang, HangWithQuit, Slow)
SEQ_EVENTS = (Ack, Finish, Error, Hang, HangWithQuit)

# --------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Broadcast:
    order: Order
    seq: int
    outcome: Outcome | None = None


@dataclass(frozen=True, slots=True)
class Send:
    """One worker gets ``order`` (a re-send of the current order)."""

    rank: int
    order: Order
    seq: int
    outcome: Outcome | None = None
    exit_code: ExitCode | None = None


@dataclass(frozen=True, slots=True)
class ExitWorker:
    """Tell one worker to leave with ``code`` (node fault → reschedule; container restart)."""

    rank: int
    code: ExitCode
    seq: int


@dataclass(frozen=True, slots=True)
class Quarantine:
    rank: int
    node: str
    reason: str = "hardware"  # or "slow" (T13e)


@dataclass(frozen=True, slots=True)
class Mark:
    """Tell every worker which ranks of run ``seq`` are marked hung (the article's
    SetIsHanging): each keeps its process, notes the mark and names the frame it is in."""

    hanging: tuple[int, ...]
    seq: int


@dataclass(frozen=True, slots=True)
class AskCheckpoint:
    """Ask every worker for a fault-tolerance checkpoint round now (the article's saver run
    with a ``fault``-prefixed run id): a rank marked slow waits for the next checkpoint, and a
    script or saver that honours the request makes that checkpoint come at once."""

    seq: int
    run_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Persist:
    """Store the new status (after every transition)."""


@dataclass(frozen=True, slots=True)
class Rearm:
    """Restart every worker's silence clock: after an outage each gets a full lost timeout."""


class Ignored(enum.Enum):
    OUTAGE = "outage"  # a loss while the control plane is out (T6n)
    DUPLICATE = "duplicate"
    STALE = "stale"
    FUTURE = "future"  # a seq the master never sent
    LATE = "late"  # legitimate event in a phase where it means nothing


@dataclass(frozen=True, slots=True)
class Log:
    message: str
    level: str = "info"
    ignored: Ignored | None = None
    transition: str = ""  # the table row, e.g. "T5"


Effect = (Broadcast | Send | ExitWorker | Quarantine | Persist | Log | Rearm | Mark
          | AskCheckpoint)


class MalformedEvent(ValueError):
    """An event that no correct worker or runtime can produce (unknown rank, negative seq).

    Permanent: retrying the same event cannot help; the runtime drops and counts it.
    """
