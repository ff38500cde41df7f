"""``aegis-flow install``: the cluster-side manifests, rendered as plain dicts.

- RBAC: the ``aegis-flow`` ServiceAccount (the master and the quarantine step only) with a
  ClusterRole to get, list and patch nodes (quarantine) and get/list pods; the
  ``aegis-flow-setup`` ServiceAccount of a workflow's first steps, with a namespaced Role
  (services create/get/delete: the master's per-workflow Service; secrets create: each
  workflow's bootstrap token); the ``aegis-flow-executor`` ServiceAccount every other pod runs
  as (the user's code: no rights); a Role and binding for Argo's executor, for every account
  (``workflowtaskresults`` create/patch, which Argo ≥ 3.4 needs to report outputs, and
  nothing else).
- The ``aegis-checks`` WorkflowTemplate (reusable check steps, for ``templateRef``).
- Cluster-mode NATS (optional): a one-replica StatefulSet with JetStream on a volume claim
  (the masters' stored status survives a NATS restart) in operator mode, its config read
  from the ``aegis-auth`` Secret (``aegis-flow nats-bootstrap`` writes it), and a Service.
  Jobs then render with ``--nats-url nats://aegis-nats.<namespace>:4222``.
- The Secrets (``--create-secrets``): ``aegis-auth`` (``nats.conf`` and the master's share of
  the operator keys) and ``aegis-bootstrap`` (key ``token``), from key material the caller
  generated (``secrets``); without them the pods that mount them never start.

PURE: returns dicts; ``validate.py`` checks them and the CLI prints them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aegis_flow.jobspec import DEFAULT_AEGIS_IMAGE

RBAC = "rbac.authorization.k8s.io"
NATS_NAME = "aegis-nats"
NATS_PORT = 4222


@dataclass(frozen=True)
class InstallOptions:
    namespace: str = "default"
    service_account: str = "aegis-flow"
    executor_service_account: str = "aegis-flow-executor"
    aegis_image: str = DEFAULT_AEGIS_IMAGE
    nats: bool = True
    nats_image: str = "nats:2.10-alpine"
    nats_storage: str = "1Gi"
    auth_secret: str = "aegis-auth"
    bootstrap_secret: str = "aegis-bootstrap"
    grpc_tls_secret: str = "aegis-grpc-tls"

    @property
    def grpc_server_name(self) -> str:
        """The name in the master's certificate (``JobSpec.tls_server_name``'s default)."""
        return f"aegis-master.{self.namespace}.svc"

    @property
    def nats_url(self) -> str:
        return f"nats://{NATS_NAME}.{self.namespace}:{NATS_PORT}"


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {
        "app.kubernetes.io/managed-by": "aegis-flow", "app.kubernetes.io/part-of": "aegis-flow"}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def rbac(o: InstallOptions) -> list[dict[str, Any]]:
    cluster_role = f"{o.service_account}-nodes"
    setup = f"{o.service_account}-setup"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": _meta(o.service_account, o.namespace)},
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": _meta(cluster_role),
         "rules": [{"apiGroups": [""], "resources": ["nodes"],
                    "verbs": ["get", "list", "patch"]},
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding",
         "metadata": _meta(f"{cluster_role}-{o.namespace}"),
         "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": cluster_role},
         "subjects": [{"kind": "ServiceAccount", "name": o.service_account,
                       "namespace": o.namespace}]},
        {"apiVersion": f"{RBAC}/v1", "kind": "Role",
         "metadata": _meta(f"{o.service_account}-executor", o.namespace),
         "rules": [{"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"],
                    "verbs": ["create", "patch"]}]},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": _meta(o.executor_service_account, o.namespace)},
        {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
         "metadata": _meta(f"{o.service_account}-executor", o.namespace),
         "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": f"{o.service_account}-executor"},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": o.namespace}
                      for sa in (o.service_account, o.executor_service_account, setup)]},
        # a workflow's first steps: the Service in front of its master, and its own bootstrap
        # token Secret. Their own account: neither node rights nor the user's code.
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(setup, o.namespace)},
        {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": _meta(setup, o.namespace),
         "rules": [{"apiGroups": [""], "resources": ["services"],
                    "verbs": ["create", "get", "delete"]},
                   {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]},
        {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": _meta(setup, o.namespace),
         "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": setup},
         "subjects": [{"kind": "ServiceAccount", "name": setup, "namespace": o.namespace}]},
    ]


def nats(o: InstallOptions) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": NATS_NAME, "app.kubernetes.io/part-of": "aegis-flow"}
    # No monitoring port: nats-server's /varz, /connz and /subsz answer anyone in the pod
    # network without authentication (review: port 8222 was open). Readiness is the client
    # port accepting connections.
    container = {
        "name": "nats", "image": o.nats_image,
        "args": ["--config", "/etc/aegis/auth/nats.conf", "--jetstream",
                 "--store_dir", "/data", "--port", str(NATS_PORT)],
        "ports": [{"name": "client", "containerPort": NATS_PORT}],
        "readinessProbe": {"tcpSocket": {"port": "client"}, "periodSeconds": 5},
        "volumeMounts": [{"name": "auth", "mountPath": "/etc/aegis/auth", "readOnly": True},
                         {"name": "data", "mountPath": "/data"}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
    }
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(NATS_NAME, o.namespace),
         "spec": {"selector": dict(labels), "ports": [
             {"name": "client", "port": NATS_PORT, "targetPort": "client"}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": _meta(NATS_NAME, o.namespace),
         "spec": {"serviceName": NATS_NAME, "replicas": 1,
                  "selector": {"matchLabels": dict(labels)},
                  "template": {"metadata": {"labels": dict(labels)},
                               "spec": {"containers": [container], "volumes": [
                                   {"name": "auth", "secret": {"secretName": o.auth_secret}}]}},
                  "volumeClaimTemplates": [{
                      "metadata": {"name": "data"},
                      "spec": {"accessModes": ["ReadWriteOnce"],
                               "resources": {"requests": {"storage": o.nats_storage}}}}]}},
    ]


def secrets(o: InstallOptions, *, auth_files: Mapping[str, str], token: str,
            tls_files: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The ``aegis-auth`` Secret (``auth_files``: file name -> text, the master's files and
    ``nats.conf``), the ``aegis-bootstrap`` Secret (key ``token``) and, with ``tls_files``,
    the ``aegis-grpc-tls`` Secret (``ca.crt``, ``tls.crt``, ``tls.key``: security/tls.py).
    Opaque, ``data`` base64-encoded as the API server stores it."""
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(o.auth_secret, o.namespace),
         "type": "Opaque", "data": {k: b64(v) for k, v in sorted(auth_files.items())}},
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": _meta(o.bootstrap_secret, o.namespace),
         "type": "Opaque", "data": {"token": b64(token)}},
        *([{"apiVersion": "v1", "kind": "Secret",
            "metadata": _meta(o.grpc_tls_secret, o.namespace), "type": "Opaque",
            "data": {k: b64(v) for k, v in sorted(tls_files.items())}}] if tls_files else []),
    ]


def manifests(o: InstallOptions, *, secret_docs: list[dict[str, Any]] | None = None
              ) -> list[dict[str, Any]]:
    """Everything ``install`` renders, in apply order (the Secrets, when given, first: the
    NATS StatefulSet mounts ``aegis-auth``)."""
    from aegis_flow.workflow import build_checks_template

    checks: dict[str, Any] = build_checks_template(image=o.aegis_image,
                                                   namespace=o.namespace).to_dict()
    return [*(secret_docs or []), *rbac(o), checks, *(nats(o) if o.nats else [])]
