"""Status persistence: a JSON codec (pure) and stores behind one Protocol.

``KVStore`` keeps the status in a NATS JetStream key-value bucket with compare-and-set (side
effects: network I/O). ``MemoryStore`` is the in-memory fake for unit tests.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Protocol

from aegis_flow.master import machine as m

STATUS_KEY = "status"


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


class Store(Protocol):
    async def load(self) -> tuple[bytes | None, int]: ...

    async def save(self, raw: bytes, revision: int) -> int:
        """Write if the stored revision is still ``revision`` (0: must not exist yet)."""
        ...


class MemoryStore:
    def __init__(self) -> None:
        self.raw: bytes | None = None
        self.revision = 0

    async def load(self) -> tuple[bytes | None, int]:
        return self.raw, self.revision

    async def save(self, raw: bytes, revision: int) -> int:
        if revision != self.revision:
            raise StoreConflict(f"revision {revision} != stored {self.revision}")
        self.raw, self.revision = raw, self.revision + 1
        return self.revision


class KVStore:
    """JetStream KV with compare-and-set (``create`` for the first write, ``update`` after)."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, nc: Any, bucket: str, *, create: bool = True) -> KVStore:
        js = nc.jetstream(timeout=2.0)  # a save retries (runtime._save): fail fast
        try:
            kv = await js.key_value(bucket)
        except Exception:  # noqa: BLE001 - nats raises BucketNotFoundError / NotFoundError
            if not create:
                raise
            kv = await js.create_key_value(bucket=bucket, history=1)
        return cls(kv)

    async def load(self) -> tuple[bytes | None, int]:
        try:
            entry = await self.kv.get(STATUS_KEY)
        except Exception:  # noqa: BLE001 - KeyNotFoundError
            return None, 0
        return entry.value, int(entry.revision)

    async def save(self, raw: bytes, revision: int) -> int:
        from nats.js import errors as js_errors

        try:
            if revision == 0:
                return int(await self.kv.create(STATUS_KEY, raw))
            return int(await self.kv.update(STATUS_KEY, raw, last=revision))
        except (js_errors.KeyWrongLastSequenceError, js_errors.BadRequestError,
                js_errors.APIError) as exc:
            raise StoreConflict(f"status changed under us (expected revision {revision}): "
                                f"{exc}") from None
