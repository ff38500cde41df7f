"""Quarantine and release a batch of nodes through a ``NodeApi``.

Side effects: only the ``NodeApi`` calls (the real one patches Nodes). Every node is handled
on its own: one that is missing or refused gets a ``Record`` with ``error`` and the others go
on. Idempotent: a node that is already quarantined (label and taint) is not patched again.
"""

from __future__ import annotations

from collections.abc import Iterable

from aegis_flow.k8s.api import NodeApi, NodeApiError
from aegis_flow.k8s.nodes import (
    LABEL,
    QUARANTINE_TAINT,
    Record,
    quarantine_patch,
    release_patch,
    timestamp,
)


def quarantine(api: NodeApi, names: Iterable[str], *, reason: str, now: float, by: str,
               taint: bool = True) -> list[Record]:
    out = []
    for name in names:
        try:
            node = api.get_node(name)
            tainted = any(t.key == LABEL for t in node.taints)
            if node.quarantined and (tainted or not taint):
                out.append(Record(name, "already-quarantined", node.reason, node.since,
                                  node.by))
                continue
            after = api.patch_node(name, quarantine_patch(node, reason=reason, now=now, by=by,
                                                          taint=taint))
            if not after.quarantined or (taint and QUARANTINE_TAINT not in after.taints):
                raise NodeApiError(f"node {name!r}: the patch did not stick (label or taint "
                                   "missing afterwards)", retryable=True)
            out.append(Record(name, "quarantined", reason, timestamp(now), by))
        except NodeApiError as exc:
            out.append(Record(name, "failed", reason, error=str(exc)))
    return out


def release(api: NodeApi, names: Iterable[str]) -> list[Record]:
    out = []
    for name in names:
        try:
            node = api.get_node(name)
            if not node.quarantined and not any(t.key == LABEL for t in node.taints):
                out.append(Record(name, "not-quarantined"))
                continue
            after = api.patch_node(name, release_patch(node))
            if after.quarantined or any(t.key == LABEL for t in after.taints):
                raise NodeApiError(f"node {name!r}: still quarantined after the patch",
                                   retryable=True)
            out.append(Record(name, "released", node.reason, node.since, node.by))
        except NodeApiError as exc:
            out.append(Record(name, "failed", error=str(exc)))
    return out
