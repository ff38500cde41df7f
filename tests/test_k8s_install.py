"""``aegis-flow install``: what it renders, that it validates, and that the structural
checks catch each planted error."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_flow.cli import main
from aegis_flow.jobspec import JobSpec
from aegis_flow.k8s.install import InstallOptions, manifests
from aegis_flow.k8s.validate import check_objects
from aegis_flow.templates.cli import check_documents
from aegis_flow.workflow import render

OPTS = InstallOptions(namespace="ml")
DOCS = manifests(OPTS)


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The first document of this kind (three ServiceAccounts: the node-patching one
    first)."""
    return next(d for d in docs if d["kind"] == kind)


def test_install_renders_rbac_checks_and_nats_that_validate() -> None:
    assert [d["kind"] for d in DOCS] == [
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "ServiceAccount",
        "RoleBinding", "ServiceAccount", "Role", "RoleBinding", "WorkflowTemplate", "Service",
        "StatefulSet"]
    assert check_documents(DOCS) == []  # Argo schema + lint, and the structural checks
    rules = {(tuple(r["resources"]), tuple(r["verbs"])) for r in by_kind(DOCS, "ClusterRole")[
        "rules"]}
    assert rules == {(("nodes",), ("get", "list", "patch")), (("pods",), ("get", "list"))}
    crb = by_kind(DOCS, "ClusterRoleBinding")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "aegis-flow",
                                "namespace": "ml"}]  # only this account may patch nodes (W2)
    assert [s["name"] for s in by_kind(DOCS, "RoleBinding")["subjects"]] == [
        "aegis-flow", "aegis-flow-executor", "aegis-flow-setup"]  # all run Argo's executor
    executor_role = by_kind(DOCS, "Role")  # Argo's executor: nothing else (W2)
    assert executor_role["rules"] == [{"apiGroups": ["argoproj.io"],
                                       "resources": ["workflowtaskresults"],
                                       "verbs": ["create", "patch"]}]
    assert by_kind(DOCS, "WorkflowTemplate")["metadata"]["name"] == "aegis-checks"
    assert [d["kind"] for d in manifests(InstallOptions(nats=False))][-1] == "WorkflowTemplate"


def test_the_installed_nats_opens_no_monitoring_port() -> None:
    """Review: nats-server's monitoring port (8222: /varz, /connz, /subsz) answered anyone in
    the pod network without authentication. The installed server opens the client port only,
    and its readiness is that port accepting connections."""
    nats = by_kind(DOCS, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    assert not any(a in ("-m", "--http_port", "-ms", "--https_port") for a in nats["args"])
    assert nats["ports"] == [{"name": "client", "containerPort": 4222}]
    assert nats["readinessProbe"] == {"tcpSocket": {"port": "client"}, "periodSeconds": 5}
    service = named("Service", "aegis-nats")
    assert [p["port"] for p in service["spec"]["ports"]] == [4222]


def named(kind: str, name: str) -> dict[str, Any]:
    return next(d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name)


def test_the_setup_account_creates_services_and_secrets_only() -> None:
    """A workflow's first steps (its master's Service, its bootstrap token) run as
    aegis-flow-setup: no node rights, no user code."""
    role = named("Role", "aegis-flow-setup")
    assert role["metadata"]["namespace"] == "ml"
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]} == {
        (("services",), ("create", "get", "delete")), (("secrets",), ("create",))}
    binding = named("RoleBinding", "aegis-flow-setup")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "aegis-flow-setup"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "aegis-flow-setup",
                                    "namespace": "ml"}]
    node_bindings = [d for d in DOCS if d["kind"] == "ClusterRoleBinding"]
    assert {s["name"] for d in node_bindings for s in d["subjects"]} == {"aegis-flow"}
    # the executor account (the user's code) gets no rule beyond Argo's executor Role
    executor_roles = {d["roleRef"]["name"] for d in DOCS if d["kind"].endswith("Binding")
                      and any(s["name"] == "aegis-flow-executor" for s in d["subjects"])}
    assert executor_roles == {"aegis-flow-executor"}
    custom = manifests(InstallOptions(namespace="ml", service_account="boss"))
    assert [d["metadata"]["name"] for d in custom if d["kind"] == "Role"] == [
        "boss-executor", "boss-setup"]
    assert check_documents(custom) == []


def test_install_prints_the_commands_that_create_the_secrets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--namespace", "ml", "-o", str(tmp_path / "a.yaml")]) == 0
    err = capsys.readouterr().err
    assert "aegis-flow nats-bootstrap aegis-auth" in err
    assert ("kubectl -n ml create secret generic aegis-auth --from-file=aegis-auth/nats.conf "
            "--from-file=aegis-auth/public.json") in err
    assert "kubectl -n ml create secret generic aegis-bootstrap --from-literal=token=" in err
    assert "Secret" not in {d["kind"] for d in yaml.safe_load_all(
        (tmp_path / "a.yaml").read_text())}


def test_install_create_secrets_renders_both_secrets_from_fresh_keys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import base64

    from aegis_flow.k8s.api import FakeNodeApi
    from aegis_flow.k8s.preflight import AUTH_KEYS, missing, needs
    from aegis_flow.security.operator import load

    out, keys = tmp_path / "aegis.yaml", tmp_path / "auth"
    assert main(["install", "--namespace", "ml", "--create-secrets", str(keys),
                 "-o", str(out)]) == 0
    assert "mode 0600" in capsys.readouterr().err
    assert out.stat().st_mode & 0o777 == 0o600  # it holds keys
    docs = list(yaml.safe_load_all(out.read_text()))
    assert main(["lint", str(out)]) == 0
    auth = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "aegis-auth")
    boot = next(d for d in docs if d["kind"] == "Secret"
                and d["metadata"]["name"] == "aegis-bootstrap")
    assert set(auth["data"]) == set(AUTH_KEYS)  # the master's files, no offline seed
    assert not {"operator.seed", "account.seed", "system.seed"} & set(auth["data"])
    token = base64.b64decode(boot["data"]["token"]).decode().strip()
    assert len(token) >= 32
    public = json.loads(base64.b64decode(auth["data"]["public.json"]))
    assert public["operator"] == load(keys).keys.operator
    # a second install keeps the keys and the token (jobs already running keep working)
    assert main(["install", "--namespace", "ml", "--create-secrets", str(keys),
                 "-o", str(out)]) == 0
    again = list(yaml.safe_load_all(out.read_text()))
    assert next(d for d in again if d["metadata"]["name"] == "aegis-bootstrap") == boot
    # the credential exchange's TLS Secret: the CA and the master's certificate for the name
    # workers check (its CA key stays in the directory), kept by a second install too
    from cryptography import x509

    tls = next(d for d in docs if d["metadata"]["name"] == "aegis-grpc-tls")
    assert set(tls["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    assert tls == next(d for d in again if d["metadata"]["name"] == "aegis-grpc-tls")
    ca = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["aegis-master.ml.svc"]
    assert (keys / "grpc-tls" / "grpc-ca.key").stat().st_mode & 0o777 == 0o600
    # and what it renders satisfies submit's check of a rendered workflow
    cluster = FakeNodeApi(secrets={("ml", d["metadata"]["name"]): d["data"] for d in docs
                                   if d["kind"] == "Secret"},
                          service_accounts=[("ml", d["metadata"]["name"]) for d in docs
                                            if d["kind"] == "ServiceAccount"])
    wf = render(JobSpec(image="IMG", command=("python", "t.py"), namespace="ml",
                        nats_url=OPTS.nats_url))
    assert missing(cluster, "ml", needs(wf)) == []


def test_jobs_in_cluster_mode_reach_the_installed_nats() -> None:
    svc = by_kind(DOCS, "Service")
    assert OPTS.nats_url == (f"nats://{svc['metadata']['name']}.{svc['metadata']['namespace']}"
                             f":{svc['spec']['ports'][0]['port']}")
    wf = render(JobSpec(image="IMG", command=("python", "t.py"), namespace="ml",
                        nats_url=OPTS.nats_url))
    assert check_documents([wf, *DOCS]) == []
    master = {t["name"]: t for t in wf["spec"]["templates"]}["master"]
    assert "sidecars" not in master  # no embedded server when NATS is installed


def test_install_cli_writes_what_lint_accepts(tmp_path: Path) -> None:
    out = tmp_path / "aegis.yaml"
    assert main(["install", "--namespace", "ml", "-o", str(out)]) == 0
    assert list(yaml.safe_load_all(out.read_text())) == DOCS
    assert main(["lint", str(out)]) == 0
    assert main(["install", "--namespace", "Not_Valid"]) == 1


Mutation = Callable[[list[dict[str, Any]]], None]


def _kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return by_kind(docs, kind)


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _kind(docs, "StatefulSet")["spec"]["template"]["spec"]
    return spec


PLANTED: dict[str, tuple[Mutation, str]] = {
    "unknown kind": (lambda d: _kind(d, "Role").update(kind="Rolle"), "unknown apiVersion"),
    "bad name": (lambda d: _kind(d, "ServiceAccount")["metadata"].update(name="Aegis_SA"),
                 "is not a valid name"),
    "no namespace": (lambda d: _kind(d, "Role")["metadata"].pop("namespace"),
                     "needs metadata.namespace"),
    "cluster role with namespace": (
        lambda d: _kind(d, "ClusterRole")["metadata"].update(namespace="ml"),
        "cluster-scoped"),
    "unknown top-level field": (lambda d: _kind(d, "Role").update(rulez=[]),
                                "unknown top-level fields"),
    "unknown verb": (lambda d: _kind(d, "ClusterRole")["rules"][0]["verbs"].append("patchh"),
                     "unknown verbs"),
    "rule without resources": (lambda d: _kind(d, "Role")["rules"][0].pop("resources"),
                               "resources must be a list"),
    "role not rendered": (lambda d: _kind(d, "RoleBinding")["roleRef"].update(name="x"),
                          "is not rendered"),
    "cluster binding to a role": (
        lambda d: _kind(d, "ClusterRoleBinding")["roleRef"].update(kind="Role"),
        "must refer to a ClusterRole"),
    "wrong api group": (lambda d: _kind(d, "RoleBinding")["roleRef"].update(apiGroup="rbac"),
                        "roleRef.apiGroup"),
    "subject not rendered": (
        lambda d: _kind(d, "ClusterRoleBinding")["subjects"][0].update(name="other"),
        "is not rendered"),
    "subject without namespace": (
        lambda d: _kind(d, "RoleBinding")["subjects"][0].pop("namespace"), "needs a namespace"),
    "no subjects": (lambda d: _kind(d, "RoleBinding").update(subjects=[]), "no subjects"),
    "selector mismatch": (
        lambda d: _kind(d, "StatefulSet")["spec"]["selector"]["matchLabels"].update(x="y"),
        "does not match the pod template"),
    "mount of no volume": (
        lambda d: _pod(d)["containers"][0]["volumeMounts"].append(
            {"name": "ghost", "mountPath": "/g"}), "which is not a volume"),
    "port out of range": (
        lambda d: _pod(d)["containers"][0]["ports"][0].update(containerPort=70000),
        "is not 1..65535"),
    "no image": (lambda d: _pod(d)["containers"][0].pop("image"), "has no image"),
    "duplicate containers": (
        lambda d: _pod(d)["containers"].append(copy.deepcopy(_pod(d)["containers"][0])),
        "not unique"),
    "no containers": (lambda d: _pod(d).update(containers=[]), "no containers"),
    "service name missing": (
        lambda d: _kind(d, "StatefulSet")["spec"].update(serviceName="nope"),
        "serviceName 'nope'"),
    "service selects nothing": (
        lambda d: _kind(d, "Service")["spec"]["selector"].update(x="y"), "matches no rendered"),
    "target port unknown": (
        lambda d: _kind(d, "Service")["spec"]["ports"][0].update(targetPort="clinet"),
        "targetPort 'clinet'"),
    "rendered twice": (lambda d: d.append(copy.deepcopy(_kind(d, "Role"))), "rendered twice"),
    "bad namespace": (lambda d: _kind(d, "ServiceAccount")["metadata"].update(namespace="M_L"),
                      "namespace 'M_L'"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_each_structural_check_catches_its_planted_error(name: str) -> None:
    mutate, expected = PLANTED[name]
    docs = copy.deepcopy(DOCS)
    mutate(docs)
    findings = check_objects(docs)
    assert any(expected in f for f in findings), findings


def test_the_yaml_has_no_anchors() -> None:
    """Regression: shared label dicts made PyYAML write &id001/*id001 aliases."""
    text = yaml.safe_dump_all(DOCS, sort_keys=False)
    assert "&id" not in text and "*id" not in text
