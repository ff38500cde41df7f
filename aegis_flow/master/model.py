"""The master's data: phases, per-worker PodInfo, Status, events and effects.

PURE data: frozen dataclasses and enums, no behaviour beyond small accessors. ``machine.py``
holds the transition function over them and re-exports every name here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

T = TypeVar("T")
_REPLACERS: dict[tuple[Any, ...], Callable[[Any, dict[str, Any]], Any]] = {}


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


class Phase(enum.Enum):
    """Global phase of the job, also used as each worker's inner phase."""

    PENDING = "Pending"
    BOOTCHECKING = "BootChecking"
    RUNCOMMAND = "RunCommand"
    RESTARTING = "Restarting"
    TROUBLESHOOTING = "Troubleshooting"
    SUCCEED = "Succeed"
    FAILED = "Failed"
    INDEPENDENT = "Independent"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_PHASES


TERMINAL_PHASES = frozenset({Phase.SUCCEED, Phase.FAILED, Phase.INDEPENDENT})
LIVE_PHASES = frozenset(set(Phase) - TERMINAL_PHASES)


class Order(enum.Enum):
    """What the master tells workers to do. Each phase has exactly one current order."""

    BOOTCHECK = "bootcheck"
    RUN = "run"
    TROUBLESHOOT = "troubleshoot"
    HOLD = "hold"  # stop training (if any) and wait
    QUIT = "quit"
    RUN_INDEPENDENT = "run-independent"
    EXIT = "exit"  # leave with an exit code (node fault / container restart); per worker only


class FaultClass(enum.Enum):
    """Diagnosis of a failed check (DESIGN.md §2, decision table)."""

    TRANSIENT = "transient"  # L1: restart the process in place
    CONTAINER = "container"  # L2: restart the container
    HARDWARE = "hardware"  # L3: quarantine the node, reschedule
    SLOW = "slow"  # mark only; evict at the next checkpoint


class ExitCode(enum.IntEnum):
    """Worker exit codes: the contract between supervisor and workflow (range 70–79)."""

    NODE_FAULT = 70  # retry this pod elsewhere
    CONTAINER_RESTART = 71  # retry here
    SLOW_NODE_EVICTED = 72
    JOB_FAILED = 73  # retries exhausted: never retried
    STOPPED = 74  # stopped by an operator


class Outcome(enum.Enum):
    SUCCESS = "success"
    FAILED = "failed"
    STOPPED = "stopped"


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
    exit_code: ExitCode | None = None  # an exit it was told to make; re-sent until it returns


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
) -> Status:
    """The status of a job that has just been created (phase Pending)."""
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
    return Status(phase=Phase.PENDING, workers=pods, max_retry=max_retry, flap_limit=flap_limit)


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


@dataclass(frozen=True, slots=True)
class Error:
    """The command failed while running (non-zero exit or signal)."""

    rank: int
    seq: int
    cause: str = "error"


@dataclass(frozen=True, slots=True)
class Lost:
    """Worker's heartbeats stopped (produced by the runtime's timer)."""

    rank: int


@dataclass(frozen=True, slots=True)
class Hang:
    rank: int
    seq: int


@dataclass(frozen=True, slots=True)
class HangWithQuit:
    rank: int
    seq: int


@dataclass(frozen=True, slots=True)
class CheckpointDone:
    step: int


@dataclass(frozen=True, slots=True)
class ConnectTimeout:
    """Pending: not every worker acked within the connect timeout (runtime timer) → T15."""


@dataclass(frozen=True, slots=True)
class Stop:
    """An operator stopped the job, or a restarting worker missed its deadline → T12."""

    reason: str = "stopped"


Event = (
    Ack | Finish | Error | Lost | Hang | HangWithQuit | CheckpointDone | ConnectTimeout | Stop
)
WORKER_EVENTS = (Ack, Finish, Error, Lost, Hang, HangWithQuit)
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


@dataclass(frozen=True, slots=True)
class Persist:
    """Store the new status (after every transition)."""


class Ignored(enum.Enum):
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


Effect = Broadcast | Send | ExitWorker | Quarantine | Persist | Log


class MalformedEvent(ValueError):
    """An event that no correct worker or runtime can produce (unknown rank, negative seq).

    Permanent: retrying the same event cannot help; the runtime drops and counts it.
    """
