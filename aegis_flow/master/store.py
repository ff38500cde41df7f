"""Status persistence: a JSON codec (pure) and stores behind one Protocol.

The status is stored as one small **job record** (key ``status``: the job-level fields, the
events, the stats) plus one **worker record** per rank (its ``PodInfo`` and its last output
lines), kept in blocks of ``BLOCK`` ranks (key ``w.<block>``). A save writes the job record
with compare-and-set (the commit point, and the fence against a second master); the worker
records that changed are written after it (``save_records``, by the runtime's one background
writer). The job record carries the records not yet known to be written (``delta``), so a
master killed between the two writes loses nothing: a reader takes a rank's record from the
delta first. Bytes written per transition therefore grow with the ranks that transition
changed, not with the job. A delta too big for one NATS message goes to compressed part keys
(``split_job``).

``assemble`` turns the records back into the one document every reader knows (``decode_doc``);
a stored document of the old, single-key format is read as it is.

``KVStore`` keeps the records in a NATS JetStream key-value bucket (side effects: network I/O).
``MemoryStore`` is the in-memory fake for unit tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Protocol

from aegis_flow.master import machine as m

STATUS_KEY = "status"
FORMAT = 2  # the job record + worker records layout (1: one document with every rank)


# where a job record's delta starts (always its last field); inside a JSON string the quotes
# would be escaped, so these bytes can only be the delta key itself
DELTA_MARK = b', "delta": {'


#: ranks per worker key in the KV store: a round that changes every rank of a 4,096-rank job
#: is 64 puts, not 4,096 (each put is a request to JetStream); one rank's change rewrites its
#: block, ~30 KiB: still the same bytes whatever the size of the job
BLOCK = 64


def worker_key(rank: int) -> str:
    """The KV key holding rank ``rank``'s record (its block of ``BLOCK`` ranks)."""
    return f"w.{rank // BLOCK}"


def encode_block(records: Mapping[int, bytes]) -> bytes:
    """One worker key's value: rank → record, for the ranks of one block."""
    return b"{" + b", ".join(b'"%d": %s' % (r, raw) for r, raw in sorted(records.items())) + b"}"


def decode_block(raw: bytes | None) -> dict[int, Any]:
    """The records of one worker key (rank → record object); {} when missing or unreadable
    (the ranks it should hold are then named by ``assemble``)."""
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
        return {int(r): rec for r, rec in doc.items()} if isinstance(doc, dict) else {}
    except (ValueError, UnicodeDecodeError, AttributeError):
        return {}


class StoreConflict(RuntimeError):
    """Someone else wrote the status since we read it: another master owns this job."""


def status_to_dict(status: m.Status) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(status):
        value = getattr(status, f.name)
        if f.name == "workers":
            value = [pod_to_dict(pod) for pod in value]
        elif f.name == "error_nodes":
            value = sorted(value)
        elif f.name == "plan":
            value = list(value)
        elif isinstance(value, m.Phase):
            value = value.value
        out[f.name] = value
    return out


def pod_to_dict(pod: m.PodInfo) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(pod):
        value = getattr(pod, f.name)
        if isinstance(value, m.Phase):
            value = value.value
        elif isinstance(value, m.ExitCode):
            value = int(value)
        elif isinstance(value, m.CauseClass):
            value = value.value
        out[f.name] = value
    return out


def status_from_dict(data: dict[str, Any]) -> m.Status:
    """Inverse of status_to_dict; raises ValueError with the reason on a damaged document."""
    try:
        pods = []
        for raw in data["workers"]:
            pod = dict(raw)
            pod["phase"] = m.Phase(pod["phase"])
            code = pod.get("exit_code")
            pod["exit_code"] = m.ExitCode(code) if code is not None else None
            klass = pod.get("cause_class")
            pod["cause_class"] = m.CauseClass(klass) if klass is not None else None
            pods.append(m.PodInfo(**pod))
        rest = {k: v for k, v in data.items()
                if k not in ("workers", "phase", "error_nodes", "plan")}
        return m.Status(phase=m.Phase(data["phase"]), workers=tuple(pods),
                        error_nodes=frozenset(data.get("error_nodes", ())),
                        plan=tuple(str(c) for c in data.get("plan", ())), **rest)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"stored status is damaged: {exc!r}") from None


def encode_doc(status: m.Status, **extra: Any) -> bytes:
    return json.dumps({"status": status_to_dict(status), **extra}, sort_keys=True).encode()


def decode_doc(raw: bytes) -> tuple[m.Status, dict[str, Any]]:
    """The status and the whole document; ValueError naming the damage if it is unreadable."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"stored status is damaged: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), dict):
        raise ValueError("stored status is damaged: no status object in the document")
    return status_from_dict(doc["status"]), doc


def encode_worker(pod: m.PodInfo, tail: list[str] | None = None) -> bytes:
    """One rank's record: its PodInfo and its last output lines (display only)."""
    return json.dumps({"pod": pod_to_dict(pod), "tail": tail or []}, sort_keys=True).encode()


def encode_job(status: m.Status, delta: Mapping[int, bytes], **extra: Any) -> bytes:
    """The job record: every field of ``status`` but the workers (their count instead), the
    ``extra`` fields, and the worker records this save writes (``delta``, rank → record)."""
    st = status_to_dict(dataclasses.replace(status, workers=()))
    st["workers"] = len(status.workers)
    head = json.dumps({"format": FORMAT, "status": st, **extra}, sort_keys=True).encode()
    body = b", ".join(b'"%d": %s' % (rank, raw) for rank, raw in sorted(delta.items()))
    return head[:-1] + DELTA_MARK + body + b"}}"



def job_layout(raw: bytes) -> tuple[int, frozenset[int]] | None:
    """(ranks, ranks in the delta) of a job record; None for a document of the old format
    (every rank inside it). ValueError naming the damage if it is unreadable."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"stored status is damaged: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    st, delta = doc.get("status"), doc.get("delta")
    if not isinstance(st, dict) or not isinstance(delta, dict):
        raise ValueError("stored status is damaged: a job record without status or delta")
    n = st.get("workers")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"stored status is damaged: worker count {n!r}")
    try:
        return n, frozenset(int(r) for r in delta)
    except ValueError:
        raise ValueError("stored status is damaged: a delta rank that is not a number") from None


def split_job(raw: bytes, token: str, limit: int) -> tuple[bytes, dict[str, bytes]]:
    """A job record too big for one NATS message (a round that changed thousands of ranks):
    its delta, compressed, moves to part keys ``d.<token>.<i>`` of at most ``limit`` bytes,
    written before the job record that names them (pure)."""
    at = raw.find(DELTA_MARK)  # encode_job puts the delta last: cut it out, no JSON parse
    if at < 0 or not raw.endswith(b"}}"):
        raise ValueError("not a job record of encode_job")
    packed = zlib.compress(raw[at + len(DELTA_MARK) - 1:-1], 1)
    parts = {f"d.{token}.{i}": packed[i * limit:(i + 1) * limit]
             for i in range((len(packed) + limit - 1) // limit)}
    names = json.dumps(list(parts)).encode()
    return raw[:at] + b', "delta": {}, "delta_parts": ' + names + b"}", parts


def part_names(raw: bytes) -> list[str]:
    """The part keys a stored job record names (none: its delta is inline)."""
    try:
        names = json.loads(raw).get("delta_parts") or []
    except (ValueError, UnicodeDecodeError, AttributeError):
        return []
    return [str(n) for n in names] if isinstance(names, list) else []


def join_job(raw: bytes, parts: Mapping[str, bytes | None]) -> bytes:
    """The job record with its delta back inline (inverse of ``split_job``); ValueError
    naming the damage when a part is missing or unreadable."""
    doc = json.loads(raw)
    names = doc.pop("delta_parts")
    missing = [n for n in names if parts.get(n) is None]
    if missing:
        raise ValueError(f"stored status is damaged: delta part(s) {missing} missing")
    try:
        doc["delta"] = json.loads(zlib.decompress(b"".join(parts[n] or b"" for n in names)))
    except (zlib.error, ValueError) as exc:
        raise ValueError(f"stored status is damaged: delta parts unreadable ({exc})") from None
    return json.dumps(doc, sort_keys=True).encode()


def assemble(job: bytes, records: Mapping[int, bytes | dict[str, Any] | None]) -> bytes:
    """The one document (``decode_doc``'s) from a job record and the worker records; a rank's
    record in the job's delta wins over its stored key (it is the newer one). An old-format
    document is returned as it is. ValueError naming the damage (a rank with no record)."""
    if job_layout(job) is None:
        return job
    doc = json.loads(job)
    delta = doc.pop("delta")
    doc.pop("format", None)
    pods, tails = [], {}
    for rank in range(doc["status"]["workers"]):
        raw = delta.get(str(rank))
        if raw is None:
            stored = records.get(rank)
            if stored is None:
                raise ValueError(f"stored status is damaged: no record of rank {rank}")
            try:
                raw = stored if isinstance(stored, dict) else json.loads(stored)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ValueError(f"stored status is damaged: rank {rank}'s record is not "
                                 f"JSON ({exc})") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("pod"), dict):
            raise ValueError(f"stored status is damaged: rank {rank}'s record has no pod")
        pods.append(raw["pod"])
        if raw.get("tail"):
            tails[str(rank)] = raw["tail"]
    doc["status"]["workers"] = pods
    doc["tails"] = tails
    return json.dumps(doc, sort_keys=True).encode()


class Store(Protocol):
    async def load(self) -> tuple[bytes | None, int]:
        """The whole document (``assemble``d) and the job record's revision (0: none)."""
        ...

    async def load_job(self) -> tuple[bytes | None, int]:
        """The job record alone, as it was saved, and its revision."""
        ...

    async def save(self, raw: bytes, revision: int,
                   workers: Mapping[int, bytes] | None = None) -> int:
        """Write the job record ``raw`` if the stored revision is still ``revision`` (0: must
        not exist yet), then the worker records ``workers`` (rank → record)."""
        ...

    async def save_records(self, workers: Mapping[int, bytes]) -> None:
        """Write worker records (rank → record) a stored job record already carries."""
        ...


class MemoryStore:
    def __init__(self) -> None:
        self.job: bytes | None = None
        self.records: dict[int, bytes] = {}
        self.revision = 0
        self.written: list[int] = []  # bytes of each save (job record + worker records)

    @property
    def raw(self) -> bytes | None:
        """The whole document, as a reader sees it."""
        return None if self.job is None else assemble(self.job, self.records)

    @raw.setter
    def raw(self, doc: bytes | None) -> None:  # tests plant a document (old format)
        self.job, self.records = doc, {}

    async def load(self) -> tuple[bytes | None, int]:
        return self.raw, self.revision

    async def load_job(self) -> tuple[bytes | None, int]:
        return self.job, self.revision

    async def save(self, raw: bytes, revision: int,
                   workers: Mapping[int, bytes] | None = None) -> int:
        if revision != self.revision:
            raise StoreConflict(f"revision {revision} != stored {self.revision}")
        self.job, self.revision = raw, self.revision + 1
        self.records.update(workers or {})
        self.written.append(len(raw) + sum(len(r) for r in (workers or {}).values()))
        return self.revision

    async def save_records(self, workers: Mapping[int, bytes]) -> None:
        self.records.update(workers)
        self.written.append(sum(len(r) for r in workers.values()))


class KVStore:
    """JetStream KV with compare-and-set (``create`` for the first write, ``update`` after)."""

    def __init__(self, kv: Any, *, max_record: int = 512 * 1024,
                 records_kv: Any = None) -> None:
        self.kv = kv
        # worker records are not on the path of any order: their puts may wait longer
        self.records_kv = records_kv if records_kv is not None else kv
        # below NATS's max payload (1 MiB by default): a bigger job record is split (split_job)
        self.max_record = max_record
        self._parts: list[str] = []  # the part keys of the last split save (removed later)
        self._split: dict[bytes, bytes] = {}  # stored form → the record as it was given
        self._blocks: dict[int, dict[int, bytes]] = {}  # block → rank → record (as written)

    @classmethod
    async def open(cls, nc: Any, bucket: str, *, create: bool = True) -> KVStore:
        js = nc.jetstream(timeout=2.0)  # a save retries (runtime._save): fail fast
        try:
            kv = await js.key_value(bucket)
        except Exception:  # noqa: BLE001 - nats raises BucketNotFoundError / NotFoundError
            if not create:
                raise
            kv = await js.create_key_value(bucket=bucket, history=1)
        return cls(kv, records_kv=await nc.jetstream(timeout=15.0).key_value(bucket))

    async def load_job(self) -> tuple[bytes | None, int]:
        raw, revision = await self._get(STATUS_KEY)
        if raw is None or not part_names(raw):
            return raw, revision
        if raw in self._split:  # our own save: the record as the runtime gave it
            return self._split[raw], revision
        names = part_names(raw)
        got = await asyncio.gather(*(self._get(n) for n in names))
        self._parts = names  # a resumed master removes them once its own save names others
        return join_job(raw, {n: v for n, (v, _) in zip(names, got, strict=True)}), revision

    async def _get(self, key: str) -> tuple[bytes | None, int]:
        try:
            entry = await self.kv.get(key)
        except Exception:  # noqa: BLE001 - KeyNotFoundError
            return None, 0
        return entry.value, int(entry.revision)

    async def load(self) -> tuple[bytes | None, int]:
        job, revision = await self.load_job()
        if job is None:
            return None, 0
        layout = job_layout(job)
        if layout is None:
            return job, revision
        n, in_delta = layout
        keys = sorted({worker_key(r) for r in range(n) if r not in in_delta})
        records: dict[int, Any] = {}
        for at in range(0, len(keys), self.PARALLEL):
            chunk = keys[at:at + self.PARALLEL]
            got = await asyncio.gather(*(self._get(k) for k in chunk))
            for raw, _ in got:
                block = decode_block(raw)
                records.update(block)
                for rank, rec in block.items():  # what a block write keeps of ranks not passed
                    self._blocks.setdefault(rank // BLOCK, {})[rank] = json.dumps(
                        rec, sort_keys=True).encode()
        return assemble(job, records), revision

    PARALLEL = 256  # worker keys read or written at once

    async def save_records(self, workers: Mapping[int, bytes]) -> None:
        """Each block whose ranks changed is written whole: the records given, and for the
        other ranks of the block the last ones written or read."""
        touched = set()
        for rank, rec in workers.items():
            self._blocks.setdefault(rank // BLOCK, {})[rank] = rec
            touched.add(rank // BLOCK)
        items = sorted(touched)
        for at in range(0, len(items), self.PARALLEL):
            await asyncio.gather(*(self.records_kv.put(f"w.{b}", encode_block(self._blocks[b]))
                                   for b in items[at:at + self.PARALLEL]))

    async def save(self, raw: bytes, revision: int,
                   workers: Mapping[int, bytes] | None = None) -> int:
        from nats.js import errors as js_errors

        stored, parts = raw, dict[str, bytes]()
        if len(raw) > self.max_record:  # the parts first: the job record commits them
            stored, parts = split_job(raw, uuid.uuid4().hex[:12], self.max_record)
            for key, value in parts.items():
                await self.kv.put(key, value)
            self._split = {stored: raw}
        try:
            if revision == 0:
                new = int(await self.kv.create(STATUS_KEY, stored))
            else:
                new = int(await self.kv.update(STATUS_KEY, stored, last=revision))
        except (js_errors.KeyWrongLastSequenceError, js_errors.BadRequestError,
                js_errors.APIError) as exc:
            raise StoreConflict(f"status changed under us (expected revision {revision}): "
                                f"{exc}") from None
        # The job record is stored (it holds these records in its delta): a failure from here
        # on raises, and the runtime saves again, these records included.
        await self.save_records(workers or {})
        old, self._parts = self._parts, list(parts)
        for key in old:  # the previous split save's parts: no stored job record names them
            with contextlib.suppress(Exception):
                await self.kv.purge(key)
        return new
