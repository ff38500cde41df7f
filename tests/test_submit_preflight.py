"""``aegis-flow submit`` checks, before it POSTs, that the service accounts and Secrets the
workflow uses exist in its namespace (B7): pure (``needs``), against the in-memory fake, and as
a real ``aegis-flow submit`` process with the real ``kubernetes`` client talking HTTPS to the
rehearsal's API stand-in (``NodesApiServer``) and Hera to a recording Argo Server."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_flow.argo.rehearse.cluster import NodeStore
from aegis_flow.argo.rehearse.kubeapi import Grant, NodesApiServer
from aegis_flow.argo.rehearse.objects import ObjectStore
from aegis_flow.jobspec import JobSpec
from aegis_flow.k8s.api import FakeNodeApi
from aegis_flow.k8s.preflight import (
    AUTH_KEYS,
    AUTH_VOLUME,
    TLS_VOLUMES,
    TOKEN_VOLUME,
    missing,
    needs,
    report,
)
from aegis_flow.security.cli import MASTER_FILES
from aegis_flow.templates import inject
from aegis_flow.workflow import render
from tests.http_recorder import Request, recording_server

NS = "ml"


def workflow(**kw: Any) -> dict[str, Any]:
    return render(JobSpec(image="IMG", command=("python", "t.py"), namespace=NS, **kw))


def wanted(doc: dict[str, Any]) -> dict[tuple[str, str], tuple[str, set[str]]]:
    return {(n.kind, n.name): (n.role, n.keys) for n in needs(doc)}


def test_the_constants_follow_the_templates_and_nats_bootstrap() -> None:
    assert AUTH_VOLUME == inject.AUTH_SECRET_VOLUME and TOKEN_VOLUME == inject.TOKEN_VOLUME
    assert set(TLS_VOLUMES) == {inject.GRPC_TLS_VOLUME, inject.GRPC_CLIENT_VOLUME}
    assert set(AUTH_KEYS) == {"nats.conf", *MASTER_FILES}


def test_a_rendered_workflow_needs_two_accounts_and_the_auth_secret() -> None:
    """Its bootstrap token is its own (made by its first step), so only the auth Secret must
    exist beforehand; with a shared token Secret (--bootstrap-secret) that one too."""
    got = wanted(workflow())
    assert got[("ServiceAccount", "aegis-flow-executor")][0] == "executor"
    assert got[("ServiceAccount", "aegis-flow")][0] == "nodes"
    assert got[("Secret", "aegis-auth")] == ("auth", set(AUTH_KEYS))
    # TLS for the credential exchange by default: the master's certificate and the CA
    assert got[("Secret", "aegis-grpc-tls")] == ("tls", {"tls.crt", "tls.key", "ca.crt"})
    assert {k for k in got if k[0] == "Secret"} == {("Secret", "aegis-auth"),
                                                    ("Secret", "aegis-grpc-tls")}
    plain = wanted(workflow(grpc_plaintext=True))
    assert {k for k in plain if k[0] == "Secret"} == {("Secret", "aegis-auth")}
    shared = wanted(workflow(bootstrap_secret="aegis-bootstrap"))
    assert shared[("Secret", "aegis-bootstrap")] == ("bootstrap", {"token"})


def test_tls_secrets_are_needed_with_their_keys() -> None:
    got = wanted(workflow(grpc_tls_secret="srv", grpc_tls_client_secret="cli"))
    assert got[("Secret", "srv")] == ("tls", {"tls.crt", "tls.key", "ca.crt"})
    assert got[("Secret", "cli")] == ("tls", {"tls.crt", "tls.key"})


def test_the_fake_names_each_missing_object_with_its_command() -> None:
    doc = workflow(bootstrap_secret="job-token")
    found = missing(FakeNodeApi(), NS, needs(doc))
    assert {(f.need.kind, f.need.name, f.problem) for f in found} == {
        ("ServiceAccount", "aegis-flow", "missing"),
        ("ServiceAccount", "aegis-flow-executor", "missing"),
        ("ServiceAccount", "aegis-flow-setup", "missing"),
        ("Secret", "aegis-auth", "missing"), ("Secret", "job-token", "missing"),
        ("Secret", "aegis-grpc-tls", "missing")}
    text = "\n".join(report(NS, found))
    assert "aegis-flow install --namespace ml -o aegis.yaml && kubectl apply -f aegis.yaml" in text
    assert "aegis-flow nats-bootstrap aegis-auth" in text
    assert "kubectl -n ml create secret generic job-token --from-literal=token=" in text
    assert "aegis-flow install --namespace ml --create-secrets DIR makes aegis-grpc-tls" in text
    # all there, one key short
    cluster = FakeNodeApi(secrets={(NS, "aegis-auth"): set(AUTH_KEYS) - {"nats.conf"},
                                   (NS, "job-token"): {"token"},
                                   (NS, "aegis-grpc-tls"): {"tls.crt", "tls.key", "ca.crt"}},
                          service_accounts=[(NS, "aegis-flow"), (NS, "aegis-flow-executor"),
                                            (NS, "aegis-flow-setup")])
    (only,) = missing(cluster, NS, needs(doc))
    assert (only.need.name, only.problem) == ("aegis-auth", "lacks key(s) nats.conf")


# -- the real command against real servers ----------------------------------------------------

@dataclass
class Cluster:
    api: NodesApiServer
    store: ObjectStore
    kubeconfig: Path

    def add_everything(self, *, drop_key: str = "") -> None:
        b64 = base64.b64encode(b"x").decode()
        for sa in ("aegis-flow", "aegis-flow-executor", "aegis-flow-setup"):
            self.api.objects[("serviceaccounts", NS, sa)] = {
                "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": sa, "namespace": NS}}
        for name, keys in (("aegis-auth", AUTH_KEYS), ("aegis-bootstrap", ("token",)),
                           ("aegis-grpc-tls", ("tls.crt", "tls.key", "ca.crt"))):
            if any(s["metadata"]["name"] == name for s in self.store.items("secrets", NS)):
                self.store.delete("secrets", NS, name)
            self.store.create("secrets", NS, {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": NS},
                "data": {k: b64 for k in keys if k != drop_key}})


READ = frozenset({("secrets", "get"), ("serviceaccounts", "get")})


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    tokens = {"reader": Grant("alice", frozenset({"get", "list"}), READ),
              "no-secrets": Grant("bob", frozenset({"get", "list"}),
                                  frozenset({("serviceaccounts", "get")}))}
    store = ObjectStore()
    try:
        with NodesApiServer(NodeStore(), host="127.0.0.1", tokens=tokens,
                            cert_dir=tmp_path / "ca", namespaced=store) as api:
            path = tmp_path / "kubeconfig"
            path.write_text(yaml.safe_dump(api.kubeconfig("reader")))
            yield Cluster(api, store, path)
    finally:
        store.close()


def created(req: Request) -> tuple[int, Any]:
    wf = req.json()["workflow"]
    return 200, {**wf, "metadata": {**wf["metadata"], "name": "aegis-job-abcde", "uid": "u"}}


def submit(tmp_path: Path, argo_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``aegis-flow submit`` as its own process (no ~/.kube/config, no KUBECONFIG)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "ARGO_"))}
    env.update(HOME=str(tmp_path), ARGO_TOKEN="t")
    return subprocess.run(
        [sys.executable, "-m", "aegis_flow.cli", "submit", "--argo-server", argo_url,
         "--image", "IMG", "--namespace", NS, "--bootstrap-secret", "aegis-bootstrap", *args,
         "--", "python", "t.py"],
        capture_output=True, text=True, env=env, timeout=120)


def test_submit_refuses_until_the_objects_exist_then_posts(tmp_path: Path,
                                                           cluster: Cluster) -> None:
    with recording_server() as argo:
        argo.on("POST", f"/api/v1/workflows/{NS}", created)
        out = submit(tmp_path, argo.url, "--kubeconfig", str(cluster.kubeconfig))
        assert out.returncode == 1, out.stderr
        assert "not submitted" in out.stderr
        for obj in ("ServiceAccount ml/aegis-flow missing",
                    "ServiceAccount ml/aegis-flow-executor missing",
                    "Secret ml/aegis-auth missing", "Secret ml/aegis-bootstrap missing"):
            assert obj in out.stderr, out.stderr
        assert "aegis-flow nats-bootstrap aegis-auth" in out.stderr
        assert "kubectl -n ml create secret generic aegis-bootstrap" in out.stderr
        assert "--no-check" in out.stderr
        assert argo.requests == []  # nothing was sent
        # the real client asked for exactly these, with the kubeconfig's token
        asked = {(c.method, c.path.split("?")[0]) for c in cluster.api.calls}
        assert ("GET", "/api/v1/namespaces/ml/secrets/aegis-auth") in asked
        assert ("GET", "/api/v1/namespaces/ml/serviceaccounts/aegis-flow-executor") in asked
        assert {c.identity for c in cluster.api.calls} == {"alice"}

        cluster.add_everything(drop_key="nats.conf")
        out = submit(tmp_path, argo.url, "--kubeconfig", str(cluster.kubeconfig))
        assert out.returncode == 1
        assert "Secret ml/aegis-auth lacks key(s) nats.conf" in out.stderr
        assert "ServiceAccount" not in out.stderr and argo.requests == []

        cluster.add_everything()
        out = submit(tmp_path, argo.url, "--kubeconfig", str(cluster.kubeconfig))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "submitted ml/aegis-job-abcde"
        assert len(argo.requests) == 1


def test_a_check_the_api_forbids_is_not_a_pass(tmp_path: Path, cluster: Cluster) -> None:
    cluster.add_everything()
    cluster.kubeconfig.write_text(yaml.safe_dump(cluster.api.kubeconfig("no-secrets")))
    with recording_server() as argo:
        out = submit(tmp_path, argo.url, "--kubeconfig", str(cluster.kubeconfig))
        assert out.returncode == 1
        assert "cannot be checked" in out.stderr and "403" in out.stderr
        assert "secrets get in ml" in out.stderr  # which right is missing
        assert argo.requests == []


def test_no_cluster_to_ask_refuses_and_no_check_skips(tmp_path: Path) -> None:
    with recording_server() as argo:
        argo.on("POST", f"/api/v1/workflows/{NS}", created)
        out = submit(tmp_path, argo.url)
        assert out.returncode == 2
        assert "cannot check the workflow's service accounts and Secrets" in out.stderr
        assert "--no-check" in out.stderr and argo.requests == []
        out = submit(tmp_path, argo.url, "--no-check")
        assert out.returncode == 0, out.stderr
        assert len(argo.requests) == 1
