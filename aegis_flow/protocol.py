"""Wire protocol between the master and the supervisors: messages, subjects, encode/decode.

PURE and light: standard library plus the pure core (``master.machine``) only, because the
supervisor imports it and must stay injectable into any image (DESIGN.md §3).

The message is the article's ``{AegisName, AegisNamespace, podName, type, phase, data,
timeStamp}`` plus ``seq``, ``incarnation``, ``version`` and ``rank``. ``podName == "master"``
marks a message from the master.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aegis_flow.master import machine as m

VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class MsgType(enum.Enum):
    ACK = "ACK"  # hello and heartbeat (state-based: carries seq, inner phase, last result)
    ORDER = "Order"
    FINISH = "Finish"
    ERROR = "Error"
    HANG = "Hang"
    HANG_WITH_QUIT = "HangWithQuit"
    CHECKPOINT = "Checkpoint"
    STOP = "Stop"  # operator request (aegis-flow stop)
    MARK = "Mark"  # master → every worker: the ranks of this run marked hung (SetIsHanging)
    SAVE = "Save"  # master → every worker: a fault-tolerance checkpoint round is asked for


MAX_STEP = 2**53  # the largest step a JSON number holds exactly (review F8: 10^30 stuck)


class ProtocolError(ValueError):
    """A message that cannot be decoded or does not belong here. Permanent: drop and count."""

    def __init__(self, reason: str, *, foreign: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.foreign = foreign


def check_name(kind: str, value: str) -> str:
    """Job and namespace names are DNS labels (they become NATS subjects and k8s names)."""
    if not _NAME.match(value):
        raise ValueError(
            f"invalid {kind} name {value!r}: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit")
    return value


@dataclass(frozen=True)
class Subjects:
    """NATS subjects of one job; everything lives under ``aegis.<namespace>.<job>.>``."""

    namespace: str
    job: str

    @property
    def prefix(self) -> str:
        return f"aegis.{self.namespace}.{self.job}"

    def master(self, rank: int) -> str:
        """Where rank ``rank`` reports. One subject per rank: a worker's credentials allow
        publishing only to its own, so the subject names the sender (``sender_rank``)."""
        return f"{self.prefix}.master.{rank}"

    @property
    def masters(self) -> str:
        """The master's subscription: every rank's report subject."""
        return f"{self.prefix}.master.*"

    def sender_rank(self, subject: str) -> int:
        """The rank a report subject belongs to (ProtocolError if it names none)."""
        head, _, token = subject.rpartition(".")
        if head != f"{self.prefix}.master" or not token.isdigit() or str(int(token)) != token:
            raise ProtocolError(f"not a report subject of this job: {subject!r}")
        return int(token)

    @property
    def broadcast(self) -> str:
        return f"{self.prefix}.broadcast"

    @property
    def control(self) -> str:
        return f"{self.prefix}.control"

    def worker(self, rank: int) -> str:
        return f"{self.prefix}.worker.{rank}"

    @property
    def kv_bucket(self) -> str:
        return f"aegis_{self.namespace}_{self.job}".replace("-", "_")


@dataclass(frozen=True)
class Message:
    job: str
    namespace: str
    pod_name: str
    type: MsgType
    rank: int = -1
    seq: int = 0
    incarnation: str = ""
    phase: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    timestamp: float = 0.0
    version: int = VERSION

    def encode(self) -> bytes:
        return json.dumps({
            "AegisName": self.job,
            "AegisNamespace": self.namespace,
            "podName": self.pod_name,
            "type": self.type.value,
            "rank": self.rank,
            "seq": self.seq,
            "incarnation": self.incarnation,
            "phase": self.phase,
            "data": self.data,
            "timeStamp": self.timestamp,
            "version": self.version,
        }, separators=(",", ":")).encode()


_FIELDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("AegisName", (str,)), ("AegisNamespace", (str,)), ("podName", (str,)), ("rank", (int,)),
    ("seq", (int,)), ("incarnation", (str,)), ("phase", (str,)), ("data", (dict,)),
    ("timeStamp", (int, float)),
)  # every message's fields and their JSON types: exact (json gives exactly these; a bool,
#    which is an int to isinstance, is not one here)
_JSON = json.JSONDecoder()
_MSG_TYPES = {t.value: t for t in MsgType}


def decode(raw: bytes, *, job: str | None = None, namespace: str | None = None) -> Message:
    """Parse and validate one message; raise ProtocolError saying what is wrong."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(raw)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        obj = _JSON.decode(raw.decode() if isinstance(raw, bytes | bytearray) else raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("not a JSON object")
    version = obj.get("version")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version!r} (expected {VERSION})")
    kind = obj.get("type")
    msg_type = _MSG_TYPES.get(kind) if isinstance(kind, str) else None
    if msg_type is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    for key, types in _FIELDS:
        if type(obj.get(key)) not in types:
            raise ProtocolError(f"field {key!r} missing or of the wrong type")
    if (job is not None and obj["AegisName"] != job) or (
            namespace is not None and obj["AegisNamespace"] != namespace):
        raise ProtocolError(
            f"message for job {obj['AegisNamespace']}/{obj['AegisName']}", foreign=True)
    if obj["seq"] < 0:
        raise ProtocolError(f"negative seq {obj['seq']}")
    return Message(
        job=obj["AegisName"], namespace=obj["AegisNamespace"], pod_name=obj["podName"],
        type=msg_type, rank=obj["rank"], seq=obj["seq"], incarnation=obj["incarnation"],
        phase=obj["phase"], data=obj["data"], timestamp=float(obj["timeStamp"]),
        version=version,
    )


# -- keep-alives ---------------------------------------------------------------------------
#
# A heartbeat that says nothing new (the same seq, phase, pod, addresses, child, activity as the
# worker's last full heartbeat) goes out as one short line of numbers instead of a JSON
# message: ``K1 SEQ INCARNATION TIMESTAMP STEP STEP_RATE STEPS FORWARDS LAST_ACTIVE FORWARD_MS
# BEAT_LAG DOING_FOR`` ("-" for a number the worker does not have). The master reads it with
# one split and a few int/float calls, and, when it changes nothing (nearly always), without
# the state machine (``machine.beat_changes_nothing``). A worker sends keep-alives only to a
# master that asks for them (its orders carry ``keepalive``: the seconds between two full
# heartbeats, which carry what a keep-alive leaves out: the resource sample, the node, ...).

KEEPALIVE_PREFIX = b"K1 "
_KEEPALIVE_FIELDS = 12
MAX_INCARNATION = 64  # longer incarnations (or ones with whitespace) always send full beats


@dataclass(frozen=True)
class KeepAlive:
    seq: int
    incarnation: str
    timestamp: float
    step: int | None = None  # the script's own step (progress.step)
    step_rate: float | None = None
    steps: int | None = None  # the pre-warmed interpreter's counts (AutoProgress)
    forwards: int | None = None
    last_active: float | None = None
    forward_ms: float | None = None
    beat_lag: float | None = None
    doing_for: float | None = None

    def encode(self) -> bytes:
        def num(value: float | None) -> str:
            return "-" if value is None else repr(value) if isinstance(value, float) else \
                str(value)
        return ("K1 " + " ".join([str(self.seq), self.incarnation, num(self.timestamp),
                                  *(num(v) for v in (self.step, self.step_rate, self.steps,
                                                     self.forwards, self.last_active,
                                                     self.forward_ms, self.beat_lag,
                                                     self.doing_for))])).encode()


def keepalive_safe(incarnation: str) -> bool:
    """Whether an incarnation can travel in a keep-alive (one token, printable ASCII)."""
    return (0 < len(incarnation) <= MAX_INCARNATION and incarnation.isascii()
            and incarnation.isprintable() and " " not in incarnation)


def _count(token: bytes) -> int | None:
    if token == b"-":
        return None
    if not token.isdigit():
        raise ValueError(token)
    value = int(token)
    if value > MAX_STEP:
        raise ValueError(token)
    return value


def _real(token: bytes) -> float | None:
    if token == b"-":
        return None
    value = float(token)
    if not 0.0 <= value < 1e18:  # NaN, infinities, negative numbers
        raise ValueError(token)
    return value


def decode_keepalive(raw: bytes) -> KeepAlive:
    """Parse one keep-alive; raise ProtocolError saying what is wrong."""
    if len(raw) > 512:
        raise ProtocolError(f"keep-alive of {len(raw)} bytes")
    parts = raw.split(b" ")
    if len(parts) != _KEEPALIVE_FIELDS or parts[0] != b"K1":
        raise ProtocolError(f"a keep-alive has {_KEEPALIVE_FIELDS} fields, got {len(parts)}")
    try:
        seq = _count(parts[1])
        incarnation = parts[2].decode("ascii")
        timestamp = _real(parts[3])
        step, steps, forwards = _count(parts[4]), _count(parts[6]), _count(parts[7])
        rate, active, ms, lag, doing_for = (_real(t) for t in parts[5:6] + parts[8:])
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("a keep-alive field is not a valid number or name") from None
    if seq is None or timestamp is None or not keepalive_safe(incarnation):
        raise ProtocolError("a keep-alive without its seq, incarnation or time")
    return KeepAlive(seq, incarnation, timestamp, step, rate, steps, forwards, active, ms, lag,
                     doing_for)


def check_sender(msg: Message, sender: int | None) -> None:
    """A report must come on its own rank's subject (``sender``: the rank the subject names;
    None for the control subject). A worker can publish only to its own subject, so a payload
    claiming another rank is forged; an operator Stop travels only on the control subject."""
    if sender is None:
        return
    if msg.rank != sender:
        raise ProtocolError(f"{msg.type.value} claiming rank {msg.rank} on rank {sender}'s "
                            "subject")
    if msg.type is MsgType.STOP:
        raise ProtocolError(f"a Stop came on rank {sender}'s subject (only the control "
                            "subject carries operator requests)")


def to_event(msg: Message) -> m.Event:
    """A worker or operator message as a state-machine event (ProtocolError if it is none).
    An operator's Hang/HangWithQuit (``aegis-flow hang``) comes on the control subject; the
    runtime gives it the current run's seq."""
    t = msg.type
    if t is MsgType.ACK:
        if not msg.incarnation:
            raise ProtocolError("ACK without incarnation")
        return m.Ack(msg.rank, msg.incarnation, msg.seq, node=str(msg.data.get("node", "")),
                     pod_ip=str(msg.data.get("pod_ip", "")))
    if t is MsgType.FINISH:
        fault = msg.data.get("fault")
        try:
            fault_class = m.FaultClass(fault) if fault else None
        except ValueError:
            raise ProtocolError(f"unknown fault class {fault!r}") from None
        shared = msg.data.get("shared")
        return m.Finish(msg.rank, msg.seq, bool(msg.data.get("ok", False)), fault_class,
                        str(msg.data.get("detail", ""))[:2000],
                        shared=shared[:300] if isinstance(shared, str) else "")
    if t is MsgType.ERROR:
        code = msg.data.get("cause_code")
        code = code if isinstance(code, str) and code != "unknown" else ""
        klass_name = msg.data.get("cause_class")
        try:
            klass = m.CauseClass(klass_name) if code and klass_name else None
        except ValueError:
            raise ProtocolError(f"unknown cause class {klass_name!r}") from None
        signature = msg.data.get("signature")
        return m.Error(msg.rank, msg.seq, str(msg.data.get("cause", "error"))[:200],
                       code=code[:64], klass=klass,
                       signature=signature[:300] if isinstance(signature, str) else "")
    if t is MsgType.HANG:
        return m.Hang(msg.rank, msg.seq, waiting=msg.data.get("waiting") is True)
    if t is MsgType.HANG_WITH_QUIT:
        return m.HangWithQuit(msg.rank, msg.seq, waiting=msg.data.get("waiting") is True)
    if t is MsgType.CHECKPOINT:
        step = msg.data.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
            shown = repr(step) if len(repr(step)) <= 40 else repr(step)[:40] + "…"
            raise ProtocolError(f"checkpoint without a valid step: {shown}")
        return m.CheckpointDone(step, gated=isinstance(msg.data.get("gate"), list))
    if t is MsgType.STOP:
        return m.Stop(str(msg.data.get("reason", "stopped by an operator"))[:200])
    raise ProtocolError(f"a {t.value} message is not an event for the master")


def order_message(subjects: Subjects, effect: m.Broadcast | m.Send | m.ExitWorker, *,
                  now: float, extra: dict[str, Any] | None = None) -> Message:
    """The wire form of an order effect."""
    data: dict[str, Any] = dict(extra or {})
    if isinstance(effect, m.ExitWorker):
        data.update(order=m.Order.EXIT.value, exit_code=int(effect.code))
        rank = effect.rank
    else:
        data["order"] = effect.order.value
        if effect.outcome is not None:
            data["outcome"] = effect.outcome.value
        # a re-send of the phase's order is the broadcast itself (same bytes, OrdersAreStable);
        # only an exit names its worker
        rank = -1
        if isinstance(effect, m.Send) and effect.exit_code is not None:
            data["exit_code"] = int(effect.exit_code)
            rank = effect.rank
    return Message(job=subjects.job, namespace=subjects.namespace, pod_name="master",
                   type=MsgType.ORDER, rank=rank, seq=effect.seq, data=data, timestamp=now)
