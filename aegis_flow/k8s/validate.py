"""Structural checks of the Kubernetes objects ``install`` renders (no cluster, no schema).

Argo objects go through Argo's JSON schema and our lint (``templates.cli.check_documents``);
the plain Kubernetes objects get these checks: known apiVersion/kind, valid names, namespaces
where they belong, RBAC rules well formed, bindings that point at rendered roles and service
accounts, workloads whose selectors match their pods, mounts that name volumes, ports in range
and Services that select a rendered workload and target a port it has.

PURE: returns findings as strings.
"""

from __future__ import annotations

import re
from typing import Any

KNOWN = {("v1", "ServiceAccount"), ("v1", "Service"), ("v1", "Secret"),
         ("rbac.authorization.k8s.io/v1", "ClusterRole"),
         ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
         ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
         ("apps/v1", "StatefulSet"), ("apps/v1", "Deployment"),
         ("argoproj.io/v1alpha1", "WorkflowTemplate")}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
TOP_KEYS = {"apiVersion", "kind", "metadata", "spec", "rules", "roleRef", "subjects", "data",
            "stringData", "type"}
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _name(doc: dict[str, Any]) -> str:
    return str((doc.get("metadata") or {}).get("name", ""))


def _where(doc: dict[str, Any]) -> str:
    return f"{doc.get('kind', '?')} {_name(doc) or '?'}"


def _rules(doc: dict[str, Any]) -> list[str]:
    out = []
    rules = doc.get("rules")
    if not isinstance(rules, list) or not rules:
        return [f"{_where(doc)}: rules must be a non-empty list"]
    for i, rule in enumerate(rules):
        for key in ("apiGroups", "resources", "verbs"):
            value = rule.get(key)
            if not isinstance(value, list) or not value or not all(
                    isinstance(v, str) for v in value):
                out.append(f"{_where(doc)}: rules[{i}].{key} must be a list of strings")
        bad = set(rule.get("verbs") or []) - VERBS - {"*"}
        if bad:
            out.append(f"{_where(doc)}: rules[{i}] has unknown verbs {sorted(bad)}")
    return out


def _binding(doc: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    out = []
    ref = doc.get("roleRef") or {}
    if ref.get("apiGroup") != "rbac.authorization.k8s.io":
        out.append(f"{_where(doc)}: roleRef.apiGroup must be rbac.authorization.k8s.io")
    if doc["kind"] == "ClusterRoleBinding" and ref.get("kind") != "ClusterRole":
        out.append(f"{_where(doc)}: a ClusterRoleBinding must refer to a ClusterRole")
    if not any(d.get("kind") == ref.get("kind") and _name(d) == ref.get("name") for d in docs):
        out.append(f"{_where(doc)}: roleRef {ref.get('kind')} {ref.get('name')!r} is not "
                   "rendered")
    subjects = doc.get("subjects") or []
    if not subjects:
        out.append(f"{_where(doc)}: no subjects")
    for s in subjects:
        if s.get("kind") != "ServiceAccount":
            continue
        if not s.get("namespace"):
            out.append(f"{_where(doc)}: subject {s.get('name')!r} needs a namespace")
        if not any(d.get("kind") == "ServiceAccount" and _name(d) == s.get("name") and (
                (d.get("metadata") or {}).get("namespace") == s.get("namespace")) for d in docs):
            out.append(f"{_where(doc)}: subject ServiceAccount {s.get('name')!r} in "
                       f"{s.get('namespace')!r} is not rendered")
    return out


def _ports_ok(port: Any) -> bool:
    return isinstance(port, int) and 1 <= port <= 65535


def _workload(doc: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    out = []
    spec = doc.get("spec") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    pod = spec.get("template") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not selector:
        out.append(f"{_where(doc)}: spec.selector.matchLabels is empty")
    elif any(labels.get(k) != v for k, v in selector.items()):
        out.append(f"{_where(doc)}: the selector does not match the pod template's labels")
    pspec = pod.get("spec") or {}
    containers = pspec.get("containers") or []
    if not containers:
        out.append(f"{_where(doc)}: no containers")
    names = [c.get("name") for c in containers]
    if len(set(names)) != len(names):
        out.append(f"{_where(doc)}: container names are not unique")
    volumes = {v.get("name") for v in pspec.get("volumes") or []}
    volumes |= {(t.get("metadata") or {}).get("name") for t in spec.get(
        "volumeClaimTemplates") or []}
    for c in containers:
        if not c.get("image"):
            out.append(f"{_where(doc)}: container {c.get('name')!r} has no image")
        for mnt in c.get("volumeMounts") or []:
            if mnt.get("name") not in volumes:
                out.append(f"{_where(doc)}: container {c.get('name')!r} mounts "
                           f"{mnt.get('name')!r}, which is not a volume")
        for p in c.get("ports") or []:
            if not _ports_ok(p.get("containerPort")):
                out.append(f"{_where(doc)}: container {c.get('name')!r} port "
                           f"{p.get('containerPort')!r} is not 1..65535")
    if doc["kind"] == "StatefulSet" and not any(
            d.get("kind") == "Service" and _name(d) == spec.get("serviceName") for d in docs):
        out.append(f"{_where(doc)}: serviceName {spec.get('serviceName')!r} is not rendered")
    return out


def _service(doc: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    out = []
    spec = doc.get("spec") or {}
    selector = spec.get("selector") or {}
    pods = [((d.get("spec") or {}).get("template") or {}) for d in docs
            if d.get("kind") in ("StatefulSet", "Deployment")]
    matching = [p for p in pods if selector and all(
        ((p.get("metadata") or {}).get("labels") or {}).get(k) == v
        for k, v in selector.items())]
    if not matching:
        out.append(f"{_where(doc)}: its selector matches no rendered workload")
    targets = {q for p in matching for c in (p.get("spec") or {}).get("containers") or []
               for port in c.get("ports") or []
               for q in (port.get("name"), port.get("containerPort"))}
    for port in spec.get("ports") or []:
        if not _ports_ok(port.get("port")):
            out.append(f"{_where(doc)}: port {port.get('port')!r} is not 1..65535")
        target = port.get("targetPort", port.get("port"))
        if matching and target not in targets:
            out.append(f"{_where(doc)}: targetPort {target!r} is not a port of the pods")
    return out


def check_objects(docs: list[dict[str, Any]]) -> list[str]:
    """Findings for the plain Kubernetes objects among ``docs`` (Argo ones are skipped)."""
    out: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for doc in docs:
        kind = doc.get("kind")
        if (doc.get("apiVersion"), kind) not in KNOWN:
            out.append(f"{_where(doc)}: unknown apiVersion/kind {doc.get('apiVersion')}/{kind}")
            continue
        if kind == "WorkflowTemplate":
            continue
        extra = set(doc) - TOP_KEYS
        if extra:
            out.append(f"{_where(doc)}: unknown top-level fields {sorted(extra)}")
        name, ns = _name(doc), (doc.get("metadata") or {}).get("namespace")
        if not _SUBDOMAIN.match(name) or len(name) > 253:
            out.append(f"{_where(doc)}: metadata.name {name!r} is not a valid name")
        if kind in CLUSTER_SCOPED and ns:
            out.append(f"{_where(doc)}: cluster-scoped, must not have a namespace")
        if kind not in CLUSTER_SCOPED and not ns:
            out.append(f"{_where(doc)}: needs metadata.namespace")
        elif ns and (not _SUBDOMAIN.match(str(ns)) or "." in str(ns) or len(str(ns)) > 63):
            out.append(f"{_where(doc)}: namespace {ns!r} is not a valid name")
        key = (str(kind), str(ns), name)
        if key in seen:
            out.append(f"{_where(doc)}: rendered twice")
        seen.add(key)
        if kind in ("ClusterRole", "Role"):
            out += _rules(doc)
        elif kind in ("ClusterRoleBinding", "RoleBinding"):
            out += _binding(doc, docs)
        elif kind in ("StatefulSet", "Deployment"):
            out += _workload(doc, docs)
        elif kind == "Service":
            out += _service(doc, docs)
    return out
