"""What a Workflow needs in its namespace before its pods can start, and the commands that
create it (B7): the service accounts it names and the Secrets its pods mount or read.

A missing Secret leaves a pod in ContainerCreating (Argo shows the node Pending until the
workflow's deadline); a missing service account keeps the pod from being created at all. So
``submit`` checks them through the Kubernetes API before it POSTs (``missing``), and
``install`` prints the same commands (``auth_secret_commands``, ``bootstrap_secret_command``).

``needs`` and the command builders are PURE; ``missing`` calls an ``ObjectApi`` (GETs only;
of a Secret only the key names are read).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aegis_flow.jobspec import DEFAULT_GRPC_TLS_SECRET
from aegis_flow.k8s.api import NodeApiError, ObjectApi, ObjectNotFound
from aegis_flow.security.cli import MASTER_FILES

# the server config and the master's share of `aegis-flow nats-bootstrap`'s files; the offline
# seeds (security.cli.OFFLINE_FILES) never go into the Secret
AUTH_KEYS = ("nats.conf", *MASTER_FILES)
AUTH_VOLUME = "auth-secret"  # templates.inject.AUTH_SECRET_VOLUME
TOKEN_VOLUME = "bootstrap-token"  # templates.inject.TOKEN_VOLUME
TOKEN_ENV = "AEGIS_BOOTSTRAP_TOKEN"  # the master's --token-env
TLS_VOLUMES = ("grpc-tls", "grpc-tls-client")  # templates.inject.GRPC_*_VOLUME
DEFAULT_AUTH_DIR = "aegis-auth"  # where the commands below keep the operator keys


@dataclass
class Need:
    """One object the workflow needs: ``kind`` ServiceAccount or Secret; ``keys``: the Secret
    keys it must have; ``role``: auth, bootstrap, tls, executor, nodes, setup or other (picks the
    command that creates it); ``by``: the templates that use it."""

    kind: str
    name: str
    role: str = "other"
    keys: set[str] = field(default_factory=set)
    by: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Missing:
    need: Need
    problem: str  # "missing", or "lacks keys ...", or the API error
    fix: tuple[str, ...]  # shell commands that create it


def _containers(t: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("container", "script"):
        if isinstance(t.get(key), dict):
            yield t[key]
    for key in ("initContainers", "sidecars"):
        yield from (c for c in t.get(key) or [] if isinstance(c, dict))


def needs(workflow: dict[str, Any]) -> list[Need]:
    """The service accounts and Secrets a Workflow (or WorkflowTemplate) document uses."""
    spec = workflow.get("spec") or {}
    found: dict[tuple[str, str], Need] = {}

    def add(kind: str, name: str, by: str, role: str = "other", keys: tuple[str, ...] = ()
            ) -> None:
        if not name or "{{" in name:  # a parameter: known only when the workflow runs
            return
        need = found.setdefault((kind, name), Need(kind, name, role))
        if need.role == "other":
            need.role = role
        need.keys.update(keys)
        need.by.add(by)

    wf_sa = spec.get("serviceAccountName") or "default"
    add("ServiceAccount", wf_sa, "(workflow)", "executor")
    add("ServiceAccount", (spec.get("executor") or {}).get("serviceAccountName", ""),
        "(workflow)", "executor")
    volumes = list(spec.get("volumes") or [])
    for t in spec.get("templates") or []:
        name = str(t.get("name", "?"))
        account = str(t.get("serviceAccountName", ""))
        # the master's and quarantine's account, or the first steps' (JobSpec.setup_service_
        # account: <that account>-setup); aegis-flow install makes both
        add("ServiceAccount", account, name, "setup" if account.endswith("-setup") else "nodes")
        add("ServiceAccount", (t.get("executor") or {}).get("serviceAccountName", ""), name,
            "executor")
        for v in [*volumes, *(t.get("volumes") or [])]:
            secret = v.get("secret") or {}
            if not secret or secret.get("optional"):
                continue
            vname = v.get("name", "")
            role = ("auth" if vname == AUTH_VOLUME else "bootstrap" if vname == TOKEN_VOLUME
                    else "tls" if vname in TLS_VOLUMES else "other")
            keys = tuple(i["key"] for i in secret.get("items") or [] if i.get("key"))
            if role == "auth":
                keys += AUTH_KEYS
            if any(vname == m.get("name") for c in _containers(t)
                   for m in c.get("volumeMounts") or []):
                add("Secret", secret.get("secretName", ""), name, role, keys)
        for c in _containers(t):
            for env in c.get("env") or []:
                ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
                if ref and not ref.get("optional"):
                    add("Secret", ref.get("name", ""), name,
                        "bootstrap" if env.get("name") == TOKEN_ENV else "other",
                        (ref["key"],) if ref.get("key") else ())
            for src in c.get("envFrom") or []:
                ref = src.get("secretRef") or {}
                if ref and not ref.get("optional"):
                    add("Secret", ref.get("name", ""), name)
    return sorted(found.values(), key=lambda n: (n.kind != "ServiceAccount", n.name))


# -- the commands that create each object (PURE) --------------------------------------------

def auth_secret_commands(namespace: str, secret: str = "aegis-auth",
                         auth_dir: str = DEFAULT_AUTH_DIR) -> list[str]:
    """``nats-bootstrap`` (idempotent) and ``kubectl create secret`` with exactly the master's
    files; the offline seeds stay in ``auth_dir``."""
    d = shlex.quote(auth_dir.rstrip("/"))
    files = " ".join(f"--from-file={d}/{k}" for k in AUTH_KEYS)
    return [f"aegis-flow nats-bootstrap {d}",
            f"kubectl -n {namespace} create secret generic {secret} {files}"]


def bootstrap_secret_command(namespace: str, secret: str = "aegis-bootstrap") -> str:
    return (f"kubectl -n {namespace} create secret generic {secret} --from-literal=token="
            "\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')\"")


def install_command(namespace: str, *, nodes_account: str = "aegis-flow",
                    executor_account: str = "aegis-flow-executor") -> str:
    flags = "".join([f" --service-account {nodes_account}" if nodes_account != "aegis-flow"
                     else "", f" --executor-service-account {executor_account}"
                     if executor_account != "aegis-flow-executor" else ""])
    return (f"aegis-flow install --namespace {namespace}{flags} -o aegis.yaml && "
            "kubectl apply -f aegis.yaml")


def fix(need: Need, namespace: str, all_needs: list[Need]) -> tuple[str, ...]:
    """The commands that create ``need`` in ``namespace``."""
    if need.kind == "ServiceAccount":
        if need.role not in ("nodes", "executor", "setup"):
            return (f"kubectl -n {namespace} create serviceaccount {need.name}",)
        accounts = {n.role: n.name for n in all_needs if n.kind == "ServiceAccount"}
        nodes = accounts.get("nodes") or accounts.get("setup", "aegis-flow-setup").removesuffix(
            "-setup")
        return (install_command(namespace, nodes_account=nodes,
                                executor_account=accounts.get("executor",
                                                              "aegis-flow-executor")),)
    if need.role == "auth":
        return tuple(auth_secret_commands(namespace, need.name))
    if need.role == "bootstrap":
        return (bootstrap_secret_command(namespace, need.name),)
    keys = sorted(need.keys) or ["KEY"]
    if need.role == "tls":
        made = ((f"aegis-flow install --namespace {namespace} --create-secrets DIR makes "
                 f"{need.name} (a CA and the master's certificate), or:",)
                if need.name == DEFAULT_GRPC_TLS_SECRET else ())
        return (*made, f"kubectl -n {namespace} create secret generic {need.name} "
                + " ".join(f"--from-file={k}=PATH" for k in keys)
                + "   # or a cert-manager Certificate with secretName " + need.name)
    return (f"kubectl -n {namespace} create secret generic {need.name} "
            + " ".join(f"--from-file={k}=PATH" for k in keys),)


# -- the check (API calls) -------------------------------------------------------------------

def missing(api: ObjectApi, namespace: str, wanted: list[Need]) -> list[Missing]:
    """Each needed object that is absent, lacks keys, or cannot be read (an API error other
    than 404 counts as a problem too: nothing is submitted unchecked unless asked)."""
    out = []
    for need in wanted:
        try:
            if need.kind == "ServiceAccount":
                api.get_service_account(namespace, need.name)
                continue
            lacking = sorted(need.keys - api.secret_keys(namespace, need.name))
            if not lacking:
                continue
            problem = f"lacks key(s) {', '.join(lacking)}"
        except ObjectNotFound:
            problem = "missing"
        except NodeApiError as exc:
            problem = f"cannot be checked: {exc}"
        out.append(Missing(need, problem, fix(need, namespace, wanted)))
    return out


def report(namespace: str, found: list[Missing]) -> list[str]:
    """Printable lines: each object, what is wrong, who uses it and the command(s)."""
    lines = []
    for f in found:
        n = f.need
        lines.append(f"{n.kind} {namespace}/{n.name} {f.problem} "
                     f"(used by: {', '.join(sorted(n.by))})")
        lines += [f"    {cmd}" for cmd in f.fix]
    return lines
