"""The interfaces to the cluster that quarantine and ``submit`` need, and an in-memory fake.

``NodeApi`` is what ``aegis-flow nodes`` and the quarantine step call; ``ObjectApi`` is what
``submit`` reads to check that a workflow's Secrets and service accounts exist (only the key
names of a Secret, never its values). ``client.KubeNodeApi`` implements both with the
``kubernetes`` package, ``FakeNodeApi`` in memory (for tests and for trying the CLI without a
cluster). The fake has no side effects outside itself.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from aegis_flow.k8s.nodes import NodeInfo, merge_patch


class NodeApiError(Exception):
    """A cluster call failed. ``retryable``: trying again may help (a 5xx, a timeout)."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None
                 ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class NodeNotFound(NodeApiError):
    def __init__(self, name: str) -> None:
        super().__init__(f"node {name!r} not found (kubectl get nodes lists them)", status=404)
        self.name = name


class ObjectNotFound(NodeApiError):
    """A namespaced object (``Secret``, ``ServiceAccount``) is not there."""

    def __init__(self, kind: str, namespace: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} not found in namespace {namespace!r}", status=404)
        self.kind, self.namespace, self.name = kind, namespace, name


class ObjectApi(Protocol):
    def secret_keys(self, namespace: str, name: str) -> frozenset[str]:
        """The key names of the Secret (``ObjectNotFound`` if there is none)."""
        ...

    def get_service_account(self, namespace: str, name: str) -> dict[str, Any]:
        """The ServiceAccount as a dict (``ObjectNotFound`` if there is none)."""
        ...


class NodeApi(Protocol):
    def list_nodes(self, label_selector: str | None = None) -> list[NodeInfo]: ...

    def get_node(self, name: str) -> NodeInfo: ...

    def patch_node(self, name: str, body: dict[str, Any]) -> NodeInfo:
        """Apply a JSON merge patch to the node; return the node as it is afterwards."""
        ...


class FakeNodeApi:
    """Nodes as plain API-shaped dicts; patches applied as JSON merge patches."""

    def __init__(self, nodes: Iterable[dict[str, Any]] = (), *,
                 secrets: Mapping[tuple[str, str], Iterable[str]] | None = None,
                 service_accounts: Iterable[tuple[str, str]] = ()) -> None:
        self.nodes: dict[str, dict[str, Any]] = {n["metadata"]["name"]: copy.deepcopy(n)
                                                 for n in nodes}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        # (namespace, name) -> the Secret's key names; (namespace, name) of each account
        self.secrets = {k: frozenset(v) for k, v in (secrets or {}).items()}
        self.service_accounts = set(service_accounts)
        self.created_secrets: dict[tuple[str, str], dict[str, Any]] = {}

    def secret_keys(self, namespace: str, name: str) -> frozenset[str]:
        if (namespace, name) not in self.secrets:
            raise ObjectNotFound("Secret", namespace, name)
        return self.secrets[(namespace, name)]

    def get_service_account(self, namespace: str, name: str) -> dict[str, Any]:
        if (namespace, name) not in self.service_accounts:
            raise ObjectNotFound("ServiceAccount", namespace, name)
        return {"metadata": {"name": name, "namespace": namespace}}

    def create_secret(self, namespace: str, name: str, string_data: Mapping[str, str],
                      owner: Mapping[str, Any] | None = None) -> bool:
        if (namespace, name) in self.secrets:
            return False
        self.secrets[(namespace, name)] = frozenset(string_data)
        self.created_secrets[(namespace, name)] = {"data": dict(string_data),
                                                   "owner": dict(owner or {})}
        return True

    @staticmethod
    def node(name: str, *, labels: dict[str, str] | None = None,
             taints: list[dict[str, str]] | None = None, ready: bool = True) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": dict(labels or {}), "resourceVersion": "1"},
                "spec": {"taints": list(taints or [])},
                "status": {"conditions": [{"type": "Ready",
                                           "status": "True" if ready else "False"}]}}

    def list_nodes(self, label_selector: str | None = None) -> list[NodeInfo]:
        out = [NodeInfo.from_dict(n) for _, n in sorted(self.nodes.items())]
        if label_selector:  # the forms we use: "key" and "key=value"
            key, _, value = label_selector.partition("=")
            out = [n for n in out if key in n.labels and (not value or n.labels[key] == value)]
        return out

    def get_node(self, name: str) -> NodeInfo:
        if name not in self.nodes:
            raise NodeNotFound(name)
        return NodeInfo.from_dict(self.nodes[name])

    def patch_node(self, name: str, body: dict[str, Any]) -> NodeInfo:
        """A merge patch; one carrying a stale ``metadata.resourceVersion`` is refused with
        409 as the API server refuses it. Every applied patch bumps the version."""
        if name not in self.nodes:
            raise NodeNotFound(name)
        self.patches.append((name, copy.deepcopy(body)))
        meta = self.nodes[name].setdefault("metadata", {})
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != meta.get("resourceVersion", "0"):
            raise NodeApiError(f"patch node {name}: HTTP 409 Conflict", status=409)
        version = str(int(meta.get("resourceVersion", "0")) + 1)
        self.nodes[name] = merge_patch(self.nodes[name], body)
        self.nodes[name]["metadata"]["resourceVersion"] = version
        return NodeInfo.from_dict(self.nodes[name])
