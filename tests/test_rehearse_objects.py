"""Cluster objects in the rehearsal: resource templates (``action: create`` of a Service),
Services with a ClusterIP that works (proxy to ready endpoints, /etc/hosts names), the
scenario's ``objects:`` (a NATS server pod and its Service), ``faults:`` (kill, delete-pod),
pod rules by ``host:``, and self-reported progress (``ARGO_PROGRESS_FILE``). Real processes in
real namespaces (skipped, with the reason, where namespaces cannot be made)."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.argo.rehearse import netns
from aegis_flow.argo.rehearse.objects import ObjectStore
from aegis_flow.argo.rehearse.run import RehearseError, Result, rehearse
from aegis_flow.argo.rehearse.scenario import ScenarioError, parse
from aegis_flow.argo.rehearse.spec import Unsupported, check_template

_WHY = netns.why_unavailable()
needs_ns = pytest.mark.skipif(_WHY is not None, reason=f"rehearse needs namespaces: {_WHY}")
NATS = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
PY = sys.executable

# a TCP server answering each connection with "hello from <its pod IP>"
ECHO = ("import os, socket\n"
        "s = socket.create_server(('', 8080))\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    c.sendall(('hello from ' + os.environ['POD_IP'] + '\\n').encode())\n"
        "    c.close()\n")
# dial HOST:PORT, print what it answers (or the error); output in /tmp/out
DIAL = ("import socket, sys\n"
        "try:\n"
        "    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
        "    out = c.recv(200).decode().strip() or 'closed'\n"
        "except OSError as e:\n"
        "    out = 'error: ' + type(e).__name__\n"
        "open('/tmp/out', 'w').write(out)\n"
        "print(out)\n")


def wf(templates: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "obj-"},
            "spec": {"entrypoint": templates[0]["name"], "templates": templates, **spec}}


def go(w: dict[str, Any], scenario: dict[str, Any] | None = None, **kw: Any) -> Result:
    return rehearse(w, scenario=parse(scenario) if scenario else None,
                    timeout=kw.pop("timeout", 90), **kw)


def echo_server(labels: dict[str, str]) -> dict[str, Any]:
    return {"name": "server", "daemon": True, "metadata": {"labels": labels}, "container": {
        "image": "python", "command": [PY, "-c", ECHO],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}}


def service(name: str, selector: dict[str, str], target: int | str, *, owner: bool = True,
            sa: str | None = "aegis-flow-setup") -> dict[str, Any]:
    """A resource template creating a Service (as ``aegis-flow-setup``, which may by
    default)."""
    manifest = (f"apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n"
                f"  selector: {selector}\n  ports:\n  - port: 80\n    targetPort: {target}\n")
    t: dict[str, Any] = {"name": f"svc-{name}", "resource": {
        "action": "create", "manifest": manifest, "setOwnerReference": owner}}
    if sa:
        t["serviceAccountName"] = sa
    return t


def dial(name: str = "dial") -> dict[str, Any]:
    return {"name": name, "inputs": {"parameters": [{"name": "host"}]},
            "outputs": {"parameters": [{"name": "out", "valueFrom": {"path": "/tmp/out"}}]},
            "container": {"image": "python",
                          "command": [PY, "-c", DIAL, "{{inputs.parameters.host}}", "80"]}}


def out(node: dict[str, Any]) -> str:
    return str(next(p["value"] for p in node["outputs"]["parameters"] if p["name"] == "out"))


def no_proxy_threads() -> bool:
    return not [t for t in threading.enumerate() if t.name.startswith("svc-") and t.is_alive()]


# ------------------------------------------------------------------ resource templates, Services


@needs_ns
def test_resource_template_creates_a_service_whose_cluster_ip_reaches_the_ready_pod() -> None:
    """A Service created by a resource template (manifest substituted, setOwnerReference)
    gets a ClusterIP in 198.18.240.0/20; a later pod reaches it by its DNS names (its
    /etc/hosts) and lands on the selected pod's named targetPort; the node is a Pod node,
    Succeeded, with only ``exitCode`` in its outputs; nothing is left running."""
    labels = {"app": "echo-{{workflow.name}}"}
    svc = service("echo", {"app": "echo-{{workflow.name}}"}, "http")
    main = {"name": "main", "steps": [
        [{"name": "server", "template": "server"}],
        [{"name": "svc", "template": "svc-echo"}],
        [{"name": "short", "template": "dial", "arguments": {"parameters": [
            {"name": "host", "value": "echo"}]}},
         {"name": "fqdn", "template": "dial", "arguments": {"parameters": [
             {"name": "host", "value": "echo.default.svc.cluster.local"}]}}]]}
    r = go(wf([main, echo_server(labels), svc, dial()]))
    assert r.phase == "Succeeded", r.status
    node = r.node("svc")
    assert node["type"] == "Pod" and node["phase"] == "Succeeded"
    assert node["outputs"] == {"exitCode": "0"}
    server_ip = r.node("server")["podIP"]
    assert out(r.node("short")) == out(r.node("fqdn")) == f"hello from {server_ip}"
    [s] = r.services
    assert ipaddress.ip_address(s["spec"]["clusterIP"]) in ipaddress.ip_network("198.18.240.0/20")
    assert s["spec"]["selector"] == {"app": f"echo-{r.name}"}  # substituted like Argo
    [ref] = s["metadata"]["ownerReferences"]
    assert ref["kind"] == "Workflow" and ref["name"] == r.name and ref["controller"] is True
    spec = r.pod_specs[node["id"]]
    assert [c["name"] for c in spec["containers"]] == ["main"]  # no wait container
    assert no_proxy_threads()
    assert not netns.Network().leftovers()


@needs_ns
def test_create_twice_fails_already_exists_and_a_service_account_without_the_right_is_forbidden(
        ) -> None:
    svc = service("dup", {"app": "x"}, 8080)
    nosa = {**service("other", {"app": "x"}, 8080), "name": "svc-nosa",
            "serviceAccountName": "builder"}
    main = {"name": "main", "steps": [
        [{"name": "first", "template": "svc-dup"}],
        [{"name": "again", "template": "svc-dup", "continueOn": {"failed": True}},
         {"name": "nosa", "template": "svc-nosa", "continueOn": {"failed": True}}]]}
    r = go(wf([main, svc, nosa]))
    assert r.node("first")["phase"] == "Succeeded"
    again = r.node("again")
    assert again["phase"] == "Failed"
    assert again["message"] == (
        'main: Error (exit code 1): no more retries Error from server (AlreadyExists): error '
        'when creating "/tmp/manifest.yaml": services "dup" already exists')
    nosa_node = r.node("nosa")
    assert nosa_node["phase"] == "Failed"
    assert nosa_node["message"] == (
        'main: Error (exit code 1): no more retries Error from server (Forbidden): error when '
        'creating "/tmp/manifest.yaml": services is forbidden: User '
        '"system:serviceaccount:default:builder" cannot create resource "services" in API '
        'group "" in the namespace "default"')
    assert no_proxy_threads()


@needs_ns
def test_no_ready_endpoint_rejects_and_a_replaced_pod_is_reached_at_the_same_cluster_ip(
        ) -> None:
    """Before any pod is ready the connection is reset; the selected daemon is killed and a
    new one (new IP) started: the same ClusterIP reaches the new one."""
    labels = {"app": "rr"}
    main = {"name": "main", "steps": [
        [{"name": "svc", "template": "svc-rr"}],
        [{"name": "before", "template": "dial", "arguments": {"parameters": [
            {"name": "host", "value": "rr.default"}]}}],
        [{"name": "one", "template": "round"}],
        [{"name": "two", "template": "round"}]]}
    round_ = {"name": "round", "steps": [
        [{"name": "server", "template": "server"}],
        [{"name": "call", "template": "dial", "arguments": {"parameters": [
            {"name": "host", "value": "rr.default.svc"}]}}]]}
    r = go(wf([main, service("rr", labels, 8080), dial(), round_, echo_server(labels)]))
    assert r.phase == "Succeeded", r.status
    assert out(r.node("before")).startswith(("error", "closed"))
    calls = [n for n in r.status["nodes"].values() if n["displayName"] == "call"]
    servers = [n for n in r.status["nodes"].values() if n["displayName"] == "server"]
    got = sorted(out(c) for c in calls)
    assert got == sorted(f"hello from {s['podIP']}" for s in servers)
    assert len(set(got)) == 2  # two pods, two IPs, one ClusterIP
    assert no_proxy_threads()


# ------------------------------------------------------------------ scenario objects


NATS_OBJECTS = [
    {"apiVersion": "v1", "kind": "Pod",
     "metadata": {"name": "nats", "namespace": "aegis-flow", "labels": {"app": "aegis-nats"}},
     "spec": {"containers": [{"name": "nats", "image": "nats:2.10",
                              "command": [NATS, "-p", "4222", "-a", "0.0.0.0"],
                              "ports": [{"name": "client", "containerPort": 4222}],
                              "readinessProbe": {"tcpSocket": {"port": "client"},
                                                 "periodSeconds": 1}}]}},
    {"apiVersion": "v1", "kind": "Service",
     "metadata": {"name": "aegis-nats", "namespace": "aegis-flow"},
     "spec": {"selector": {"app": "aegis-nats"},
              "ports": [{"name": "client", "port": 4222, "targetPort": "client"}]}}]
NATS_PING = ("import socket, urllib.parse, sys\n"
             "u = urllib.parse.urlparse(sys.argv[1])\n"
             "c = socket.create_connection((u.hostname, u.port), timeout=5)\n"
             "info = c.recv(4096).decode()\n"
             "c.sendall(b'CONNECT {\"verbose\":false}\\r\\nPING\\r\\n')\n"
             "pong = c.recv(100).decode()\n"
             "print(info.split(' ')[0], pong.strip())\n"
             "assert info.startswith('INFO') and 'PONG' in pong\n")


@needs_ns
@pytest.mark.skipif(not Path(NATS).exists(), reason="nats-server not installed")
def test_scenario_objects_nats_pod_and_service_reached_from_a_workflow_pod() -> None:
    w = wf([{"name": "ping", "container": {"image": "python", "command": [
        PY, "-c", NATS_PING, "nats://aegis-nats.aegis-flow:4222"]}}])
    r = go(w, {"objects": NATS_OBJECTS})
    assert r.phase == "Succeeded", r.status
    [svc] = r.services
    assert svc["metadata"]["namespace"] == "aegis-flow"
    assert no_proxy_threads()
    assert not netns.Network().leftovers()


@needs_ns
def test_an_object_pod_that_never_gets_ready_is_named() -> None:
    w = wf([{"name": "x", "container": {"image": "busybox", "command": ["true"]}}])
    bad = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "broken", "namespace": "ops"},
            "spec": {"containers": [{"name": "c", "image": "x",
                                     "command": ["sh", "-c", "echo boom >&2; sleep 1; exit 3"],
                                     "readinessProbe": {"exec": {"command": ["false"]},
                                                        "periodSeconds": 1}}]}}]
    with pytest.raises(RehearseError, match=r"scenario object Pod ops/broken ended before it "
                                            r"was ready .*boom"):
        go(w, {"objects": bad})


# ------------------------------------------------------------------ faults


@needs_ns
def test_fault_kill_ends_the_pod_with_exit_137() -> None:
    w = wf([{"name": "work", "container": {"image": "busybox", "command": [
        "sh", "-c", "echo started; sleep 30"]}}])
    r = go(w, {"faults": [{"match": "*", "when-log": "started", "action": "kill"}]})
    node = r.node(r.name)
    assert node["phase"] == "Failed"
    assert node["message"] == "main: Error (exit code 137)"
    assert node["outputs"]["exitCode"] == "137"
    [f] = r.faults
    assert f["action"] == "kill" and f["node"] == r.name


@needs_ns
def test_fault_delete_pod_terms_then_the_controller_marks_pod_deleted() -> None:
    """SIGTERM first (the trap runs), the pod gone after it: Error ``pod deleted``, but only
    once the node started more than 10 s ago (``recentlyStarted`` requeues until then)."""
    w = wf([{"name": "main", "steps": [[{"name": "work", "template": "work"}]]},
            {"name": "work", "container": {"image": "busybox", "command": [
                "sh", "-c", "trap 'echo got TERM; exit 0' TERM; while true; do sleep 0.1; "
                "done"]}}])
    t0 = time.time()
    r = go(w, {"faults": [{"match": "*.work", "template": "work", "after": 1,
                           "action": "delete-pod"}]}, keep=None)
    node = r.node("work")
    assert node["phase"] == "Error" and node["message"] == "pod deleted"
    assert r.phase == "Failed"  # the steps node: "child '…' failed"
    # recentlyStarted counts from the node's startedAt (whole seconds, as Argo stores it)
    started, finished = (datetime.datetime.fromisoformat(node[k].replace("Z", "+00:00"))
                         for k in ("startedAt", "finishedAt"))
    assert (finished - started).total_seconds() >= 10 and time.time() - t0 >= 9
    [f] = r.faults
    assert f["action"] == "delete-pod" and f["displayName"] == "work" and f["after"] >= 1


# ------------------------------------------------------------------ rules by host, progress


@needs_ns
def test_pod_rule_by_host_applies_only_on_that_node() -> None:
    probe = {"name": "probe", "inputs": {"parameters": [{"name": "n"}]},
             "nodeSelector": {"kubernetes.io/hostname": "{{inputs.parameters.n}}"},
             "outputs": {"parameters": [{"name": "out", "valueFrom": {"path": "/tmp/out"}}]},
             "container": {"image": "busybox", "command": [
                 "sh", "-c", "echo ${MARK:-none} > /tmp/out"]}}
    main = {"name": "main", "steps": [[
        {"name": "a", "template": "probe", "arguments": {"parameters": [{"name": "n",
                                                                         "value": "node-0"}]}},
        {"name": "b", "template": "probe", "arguments": {"parameters": [{"name": "n",
                                                                         "value": "node-1"}]}}]]}
    nodes = [{"name": f"node-{i}", "labels": {"kubernetes.io/hostname": f"node-{i}"}}
             for i in range(2)]
    r = go(wf([main, probe]), {"nodes": nodes,
                               "pods": [{"match": "*", "host": "node-1", "env": {"MARK": "hit"}}]})
    assert r.phase == "Succeeded", r.status
    assert out(r.node("a")) == "none" and out(r.node("b")) == "hit"


@needs_ns
def test_self_reported_progress_is_kept_when_failed_and_completed_when_succeeded() -> None:
    report = ("echo 1/4 > $ARGO_PROGRESS_FILE; sleep 1.5; echo 3/4 >> $ARGO_PROGRESS_FILE; "
              "sleep 1.5; exit {{inputs.parameters.rc}}")
    work = {"name": "work", "inputs": {"parameters": [{"name": "rc"}]},
            "container": {"image": "busybox", "command": ["sh", "-c", report]}}
    main = {"name": "main", "steps": [[
        {"name": "ok", "template": "work", "arguments": {"parameters": [{"name": "rc",
                                                                         "value": "0"}]}},
        {"name": "bad", "template": "work", "arguments": {"parameters": [{"name": "rc",
                                                                          "value": "1"}]}}]]}
    r = go(wf([main, work]), {"controller-env": {"ARGO_PROGRESS_PATCH_TICK_DURATION": "500ms",
                                                 "ARGO_PROGRESS_FILE_TICK_DURATION": "200ms"}})
    assert r.node("ok")["progress"] == "4/4"
    assert r.node("bad")["progress"] == "3/4"
    assert r.status["progress"] == "7/8"


# ------------------------------------------------------------------ pure: parsing, refusals


def test_rbac_lists_mean_nodes_and_mappings_name_resources() -> None:
    sc = parse({"rbac": {"a": ["get"], "b": {"nodes": ["list"], "services": ["create"]}}})
    assert sc.rbac == {"a": {"nodes": ("get",)}, "b": {"nodes": ("list",),
                                                        "services": ("create",)}}
    default = parse({}).rbac
    assert default == {"aegis-flow": {"nodes": ("get", "list", "patch")},
                       "aegis-flow-setup": {"services": ("create", "get", "delete"),
                                            "secrets": ("create",)}}
    with pytest.raises(ScenarioError, match="faults"):
        parse({"faults": [{"action": "explode"}]})
    with pytest.raises(ScenarioError, match="objects"):
        parse({"objects": [{"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "x"}}]})


def test_resource_templates_other_than_create_of_service_secret_configmap_are_refused() -> None:
    ok = service("s", {"a": "b"}, 80)
    check_template(ok)
    with pytest.raises(Unsupported, match="action 'apply' is not supported"):
        check_template({**ok, "resource": {**ok["resource"], "action": "apply"}})
    with pytest.raises(Unsupported, match="successCondition"):
        check_template({**ok, "resource": {**ok["resource"], "successCondition": "x"}})
    with pytest.raises(Unsupported, match="apps/v1 Deployment"):
        check_template({**ok, "resource": {"action": "create", "manifest":
                                           "apiVersion: apps/v1\nkind: Deployment\n"}})


def test_object_store_allocates_addresses_and_answers_like_the_apiserver() -> None:
    store = ObjectStore()
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
           "spec": {"selector": {"x": "y"}, "ports": [{"port": 80}]}}
    made = store.create("services", "ns", svc)
    assert made["spec"]["clusterIP"] == "198.18.240.1"
    assert made["spec"]["ports"][0]["targetPort"] == 80
    with pytest.raises(Exception, match='services "a" already exists'):
        store.create("services", "ns", svc)
    assert store.hosts_lines("ns") == [
        "198.18.240.1\ta.ns.svc.cluster.local a.ns.svc a.ns a"]
    assert store.hosts_lines("other") == ["198.18.240.1\ta.ns.svc.cluster.local a.ns.svc a.ns"]
    store.close()
    assert store.items_all("services") == []
