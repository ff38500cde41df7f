"""Node quarantine, decided purely: the node as data and the patch bodies that change it.

A quarantined node carries the label ``aegis.io/quarantined=true`` (workers' required node
affinity keeps them off it), the taint ``aegis.io/quarantined=true:NoSchedule`` (nothing else
lands there either) and annotations with the reason, the time and who did it. Release removes
all three and nothing else.

PURE: no I/O; time is an argument. The bodies are JSON merge patches (RFC 7386): a ``null``
deletes a label or annotation, and ``spec.taints`` is replaced whole, so the body carries
the node's other taints unchanged.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

LABEL = "aegis.io/quarantined"
TAINT_EFFECT = "NoSchedule"
REASON = "aegis.io/quarantine-reason"
AT = "aegis.io/quarantined-at"
BY = "aegis.io/quarantined-by"
ANNOTATIONS = (REASON, AT, BY)


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str | None = None
    time_added: str | None = field(default=None, compare=False)  # NoExecute taints carry it

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value is not None:
            out["value"] = self.value
        if self.time_added is not None:
            out["timeAdded"] = self.time_added
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Taint:
        value, added = d.get("value"), d.get("timeAdded")
        if added is not None:  # the client gives datetimes back as isoformat: "+00:00" -> "Z"
            added = str(added).replace("+00:00", "Z")
        return cls(str(d["key"]), str(d.get("effect", "")),
                   None if value is None else str(value),
                   None if added is None else str(added))


@dataclass(frozen=True)
class NodeInfo:
    """What quarantine needs to know about a node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    resource_version: str = ""  # what a patch is conditional on (empty: unconditional)

    @property
    def quarantined(self) -> bool:
        return LABEL in self.labels

    @property
    def reason(self) -> str:
        return self.annotations.get(REASON, "")

    @property
    def since(self) -> str:
        return self.annotations.get(AT, "")

    @property
    def by(self) -> str:
        return self.annotations.get(BY, "")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeInfo:
        """From a Node as the API returns it (camelCase JSON)."""
        meta = d.get("metadata") or {}
        spec = d.get("spec") or {}
        conds = (d.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        return cls(str(meta.get("name", "")), dict(meta.get("labels") or {}),
                   dict(meta.get("annotations") or {}),
                   tuple(Taint.from_dict(t) for t in spec.get("taints") or ()), ready,
                   str(meta.get("resourceVersion") or ""))


QUARANTINE_TAINT = Taint(LABEL, TAINT_EFFECT, "true")


def timestamp(now: float) -> str:
    """RFC 3339 UTC, seconds: ``2026-11-30T04:05:06Z``."""
    return dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _other_taints(node: NodeInfo) -> list[dict[str, str]]:
    return [t.to_dict() for t in node.taints if t.key != LABEL]


def _guarded(node: NodeInfo, meta: dict[str, Any]) -> dict[str, Any]:
    """The patch's metadata, made conditional on the node as it was read: ``spec.taints`` is
    replaced whole, so a taint another controller added since (the node lifecycle
    controller's ``unreachable:NoExecute`` on a failing node) must make the API refuse the
    patch (409 Conflict), not vanish; the caller reads the node again and retries."""
    if node.resource_version:
        meta["resourceVersion"] = node.resource_version
    return meta


def quarantine_patch(node: NodeInfo, *, reason: str, now: float, by: str,
                     taint: bool = True) -> dict[str, Any]:
    """Label, annotate and (unless ``taint=False``) taint ``node``; every other taint kept as
    it is (``timeAdded`` included), the patch conditional on the node's resourceVersion."""
    body: dict[str, Any] = {"metadata": _guarded(node, {
        "labels": {LABEL: "true"},
        "annotations": {REASON: reason, AT: timestamp(now), BY: by}})}
    if taint:
        body["spec"] = {"taints": [*_other_taints(node), QUARANTINE_TAINT.to_dict()]}
    return body


def release_patch(node: NodeInfo) -> dict[str, Any]:
    """Remove our label, annotations and taint; keep every other taint (conditional, as
    :func:`quarantine_patch`)."""
    return {"metadata": _guarded(node, {"labels": {LABEL: None},
                                        "annotations": dict.fromkeys(ANNOTATIONS)}),
            "spec": {"taints": _other_taints(node)}}


@dataclass(frozen=True)
class Record:
    """One quarantine or release, as recorded in the job's status (a step output)."""

    node: str
    action: str  # "quarantined" | "released" | "already-quarantined" | "not-quarantined"
    reason: str = ""
    at: str = ""
    by: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in self.__dict__.items() if v}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the fake applies; pure)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out
