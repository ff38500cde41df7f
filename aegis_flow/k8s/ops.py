"""Quarantine and release a batch of nodes through a ``NodeApi``.

Side effects: only the ``NodeApi`` calls (the real one patches Nodes). Every node is handled
on its own: one that is missing or refused gets a ``Record`` with ``error`` and the others go
on. Idempotent: a node that is already quarantined (label and taint) is not patched again.
Patches are conditional on the node's resourceVersion; on a conflict (another controller
changed the node in between) the node is read again and the patch rebuilt, up to
``CONFLICT_RETRIES`` times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from aegis_flow.k8s.api import NodeApi, NodeApiError
from aegis_flow.k8s.nodes import (
    LABEL,
    QUARANTINE_TAINT,
    NodeInfo,
    Record,
    quarantine_patch,
    release_patch,
    timestamp,
)

CONFLICT_RETRIES = 5


def _patch(api: NodeApi, name: str, build: Callable[[NodeInfo], dict[str, Any] | None]
           ) -> tuple[NodeInfo, NodeInfo | None]:
    """Read the node, build the patch from it (None: nothing to do), apply it; read and
    rebuild on a 409. Returns (the node as read, the node afterwards or None)."""
    for attempt in range(CONFLICT_RETRIES + 1):
        node = api.get_node(name)
        body = build(node)
        if body is None:
            return node, None
        try:
            return node, api.patch_node(name, body)
        except NodeApiError as exc:
            if exc.status != 409 or attempt == CONFLICT_RETRIES:
                raise
    raise AssertionError("unreachable")


def quarantine(api: NodeApi, names: Iterable[str], *, reason: str, now: float, by: str,
               taint: bool = True) -> list[Record]:
    def build(node: NodeInfo) -> dict[str, Any] | None:
        tainted = any(t.key == LABEL for t in node.taints)
        if node.quarantined and (tainted or not taint):
            return None
        return quarantine_patch(node, reason=reason, now=now, by=by, taint=taint)

    out = []
    for name in names:
        try:
            node, after = _patch(api, name, build)
            if after is None:
                out.append(Record(name, "already-quarantined", node.reason, node.since,
                                  node.by))
                continue
            if not after.quarantined or (taint and QUARANTINE_TAINT not in after.taints):
                raise NodeApiError(f"node {name!r}: the patch did not stick (label or taint "
                                   "missing afterwards)", retryable=True)
            out.append(Record(name, "quarantined", reason, timestamp(now), by))
        except NodeApiError as exc:
            out.append(Record(name, "failed", reason, error=str(exc)))
    return out


def release(api: NodeApi, names: Iterable[str]) -> list[Record]:
    def build(node: NodeInfo) -> dict[str, Any] | None:
        if not node.quarantined and not any(t.key == LABEL for t in node.taints):
            return None
        return release_patch(node)

    out = []
    for name in names:
        try:
            node, after = _patch(api, name, build)
            if after is None:
                out.append(Record(name, "not-quarantined"))
                continue
            if after.quarantined or any(t.key == LABEL for t in after.taints):
                raise NodeApiError(f"node {name!r}: still quarantined after the patch",
                                   retryable=True)
            out.append(Record(name, "released", node.reason, node.since, node.by))
        except NodeApiError as exc:
            out.append(Record(name, "failed", error=str(exc)))
    return out
