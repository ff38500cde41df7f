"""Pods in the rehearsal behave like pods: their own network, loopback, hostname, /tmp and
volumes; the kubelet's env; Secrets; scheduling onto fake nodes; quarantine through the nodes
API stand-in; the CLI. Real processes in real namespaces (skipped, with the reason, where
namespaces cannot be made)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_flow.argo.rehearse import netns
from aegis_flow.argo.rehearse.run import RehearseError, Result, load_workflow, rehearse
from aegis_flow.argo.rehearse.scenario import parse

_WHY = netns.why_unavailable()
needs_ns = pytest.mark.skipif(_WHY is not None, reason=f"rehearse needs namespaces: {_WHY}")
REPO = Path(__file__).resolve().parent.parent


def wf(templates: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "t-"},
            "spec": {"entrypoint": templates[0]["name"], "templates": templates, **spec}}


def sh(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "container": {"image": "busybox", "command": ["sh", "-c", script],
                                        **extra.pop("container", {})}, **extra}


def go(w: dict[str, Any], scenario: dict[str, Any] | None = None, **kw: Any) -> Result:
    return rehearse(w, scenario=parse(scenario) if scenario else None,
                    timeout=kw.pop("timeout", 60), **kw)


@needs_ns
def test_each_pod_has_its_own_network_loopback_and_hostname(tmp_path: Path) -> None:
    """Another pod is reached at its pod IP, never at 127.0.0.1; hostname = pod name."""
    server = {"name": "server", "daemon": True, "container": {
        "image": "python", "command": [sys.executable, "-c",
                                       "import socket; s = socket.create_server(('', 7000)); "
                                       "[s.accept()[0].close() for _ in iter(int, 1)]"],
        "readinessProbe": {"tcpSocket": {"port": 7000}, "periodSeconds": 1}}}
    dial = {"name": "dial", "inputs": {"parameters": [{"name": "host"}]}, "container": {
        "image": "python", "command": [sys.executable, "-c",
                                       "import socket, sys; socket.create_connection("
                                       "(sys.argv[1], 7000), timeout=3).close()",
                                       "{{inputs.parameters.host}}"]}}
    me = sh("me", "hostname > /tmp/h; ip -4 -o addr show eth0 | awk '{print $4}' > /tmp/ip",
            outputs={"parameters": [{"name": "h", "valueFrom": {"path": "/tmp/h"}},
                                    {"name": "ip", "valueFrom": {"path": "/tmp/ip"}}]})
    main = {"name": "main", "steps": [
        [{"name": "server", "template": "server"}],
        [{"name": "by-ip", "template": "dial",
          "arguments": {"parameters": [{"name": "host", "value": "{{steps.server.ip}}"}]}},
         {"name": "by-loopback", "template": "dial", "continueOn": {"failed": True},
          "arguments": {"parameters": [{"name": "host", "value": "127.0.0.1"}]}},
         {"name": "me", "template": "me"}]]}
    r = go(wf([main, server, dial, me]), keep=tmp_path)
    assert r.phase == "Succeeded", r.status
    assert r.node("by-ip")["phase"] == "Succeeded"
    assert r.node("by-loopback")["phase"] == "Failed"
    assert r.node("by-loopback")["message"] == "main: Error (exit code 1)"
    out = {p["name"]: p["value"] for p in r.node("me")["outputs"]["parameters"]}
    assert out["h"] == f"{r.name}-me-" + r.node("me")["id"].rsplit("-", 1)[1]
    assert out["ip"].startswith("198.18.") and out["ip"] != r.node("server")["podIP"] + "/16"
    assert not netns.Network().leftovers()


@needs_ns
def test_volumes_env_secrets_and_private_tmp(tmp_path: Path) -> None:
    """emptyDir shared by an init container and main; /tmp private per container; a Secret
    read-only with its mode; fieldRef and $(VAR) expansion; the host's files untouched."""
    t = {"name": "main",
         "volumes": [{"name": "shared", "emptyDir": {}},
                     {"name": "tok", "secret": {"secretName": "s", "defaultMode": 256}}],
         "initContainers": [{"name": "prep", "image": "busybox", "command": [
             "sh", "-c", "echo from-init > /shared/x; echo init-tmp > /tmp/t"],
             "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}],
         "container": {"image": "busybox", "command": ["sh", "-c", (
             "cat /shared/x > /tmp/o; test ! -e /tmp/t && echo private >> /tmp/o; "
             "stat -c %a /run/tok/key >> /tmp/o; cat /run/tok/key >> /tmp/o; echo >> /tmp/o; "
             "touch /run/tok/new 2>/dev/null || echo ro >> /tmp/o; "
             "echo $NODE $ME $ADDR >> /tmp/o; touch /usr/rehearse-was-here")],
             "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                     {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                     {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                     {"name": "ADDR", "value": "nats://$(IP):4222"}],
             "volumeMounts": [{"name": "shared", "mountPath": "/shared"},
                              {"name": "tok", "mountPath": "/run/tok", "readOnly": True}]},
         "outputs": {"parameters": [{"name": "o", "valueFrom": {"path": "/tmp/o"}}]}}
    r = go(wf([t]), {"secrets": {"s": {"key": "sekret"}}, "nodes": [{"name": "only"}]})
    assert r.phase == "Succeeded", r.status
    lines = r.status["nodes"][r.name]["outputs"]["parameters"][0]["value"].splitlines()
    assert lines[:5] == ["from-init", "private", "400", "sekret", "ro"]
    node, me, addr = lines[5].split()
    assert node == "only" and me.startswith(r.name) and addr.startswith("nats://198.18.")
    assert not Path("/usr/rehearse-was-here").exists()


@needs_ns
def test_missing_secret_keeps_the_pod_pending_until_the_deadline() -> None:
    """A missing Secret: ContainerCreating, as the kubelet leaves it, until a deadline ends it
    (B7's 7 days, in 3 s): the pod's activeDeadlineSeconds (the workflow's time left, truncated
    to whole seconds, as createWorkflowPod sets it) or the controller's workflow deadline,
    whichever is seen first - the same race as on a cluster."""
    t = sh("main", "true", container={"env": [{"name": "T", "valueFrom": {
        "secretKeyRef": {"name": "absent", "key": "token"}}}]})
    r = go(wf([t], activeDeadlineSeconds=3), timeout=30)
    assert r.phase == "Failed"
    assert r.status["nodes"][r.name]["message"] in (
        "Pod was active on the node longer than the specified deadline",
        "Step exceeded its deadline")


@needs_ns
def test_quarantine_moves_the_next_pod(tmp_path: Path) -> None:
    """The real `aegis-flow nodes quarantine` in a pod (service account aegis-flow) labels and
    taints the node through the nodes API stand-in; the next pod avoids it."""
    avoid = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "aegis.io/quarantined", "operator": "DoesNotExist"}]}]}}}
    where = sh("where", "true", nodeSelector={"kubernetes.io/hostname": "n-a"})
    quarantine = {"name": "quarantine", "serviceAccountName": "aegis-flow", "container": {
        "image": "aegis", "command": ["aegis-flow", "nodes", "quarantine", "n-a",
                                      "--reason", "rehearsal", "--by", "{{workflow.name}}"]}}
    after = sh("after", "true", affinity=avoid)
    main = {"name": "main", "steps": [[{"name": "where", "template": "where"}],
                                      [{"name": "quarantine", "template": "quarantine"}],
                                      [{"name": "after", "template": "after"}]]}
    r = go(wf([main, where, quarantine, after]),
           {"nodes": [{"name": "n-a"}, {"name": "n-b"}]})
    assert r.phase == "Succeeded", r.status
    node = next(n for n in r.nodes_after if n["metadata"]["name"] == "n-a")
    assert node["metadata"]["labels"]["aegis.io/quarantined"] == "true"
    assert any(t["key"] == "aegis.io/quarantined" for t in node["spec"]["taints"])
    assert r.node("after")["hostNodeName"] == "n-b"
    assert any(c.method == "PATCH" for c in r.api_calls)


@needs_ns
def test_a_pod_without_rights_cannot_patch_nodes() -> None:
    """The default service account has no verbs on nodes: the API answers 403."""
    t = {"name": "main", "container": {"image": "aegis", "command": [
        "aegis-flow", "nodes", "quarantine", "node-0", "--reason", "x"]}}
    r = go(wf([t]))
    assert r.phase == "Failed"
    assert any(c.status == 403 for c in r.api_calls)


def test_unsupported_fields_are_refused_not_ignored(tmp_path: Path) -> None:
    suspend = wf([{"name": "main", "suspend": {}}])
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(suspend))
    with pytest.raises(RehearseError, match="suspend is not supported"):
        load_workflow(str(path))
    odd = wf([{**sh("main", "true"), "memoize": {"key": "k"}}])
    path.write_text(yaml.safe_dump(odd))
    with pytest.raises(RehearseError, match="memoize is not supported"):
        load_workflow(str(path))


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Pod\n")
    for args, text in ((["/nonexistent.yaml"], "cannot read /nonexistent.yaml"),
                       ([str(bad)], "rehearse runs a Workflow document"),
                       ([str(REPO / "tests/argo_cases/basic.yaml"), "-p", "x=1"],
                        "declares no parameter 'x'")):
        res = subprocess.run([sys.executable, "-m", "aegis_flow.cli", "rehearse", *args],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stderr
        assert text in res.stderr and len(res.stderr.strip().splitlines()) == 1


@needs_ns
def test_cli_json_tree_and_picture(tmp_path: Path) -> None:
    svg = tmp_path / "tree.svg"
    res = subprocess.run([sys.executable, "-m", "aegis_flow.cli", "rehearse", "-q", "--json",
                          "--svg", str(svg), str(REPO / "tests/argo_cases/failed-main.yaml")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 1, res.stderr
    status = json.loads(res.stdout)
    assert status["phase"] == "Failed" and status["progress"] == "0/1"
    assert "main: Error (exit code 1)" in svg.read_text()
    res = subprocess.run([sys.executable, "-m", "aegis_flow.cli", "rehearse", "-q",
                          str(REPO / "tests/argo_cases/basic.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "Succeeded" in res.stdout and "STEP" in res.stdout


def test_a_checkout_or_interpreter_under_tmp_is_bound_into_every_container(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every container's /tmp is its own; a clean clone in /tmp (its venv, its code) would be
    hidden from the pods that run its commands. Those paths are bound in again, and only
    those (a checkout elsewhere needs nothing)."""
    from aegis_flow.argo.rehearse import pods

    checkout = str(Path(pods.__file__).resolve().parents[3])
    monkeypatch.setattr(sys, "prefix", "/tmp/clone/.venv")
    got = pods.hidden_by_tmp()
    assert "/tmp/clone/.venv" in got
    assert (checkout in got) == checkout.startswith("/tmp/")
    monkeypatch.setattr(sys, "prefix", "/opt/venv")
    assert all(p.startswith("/tmp/") for p in pods.hidden_by_tmp())


def _bridge_mac(hub: str) -> str:
    out = subprocess.run(["ip", "-n", hub, "-o", "link", "show", "br0"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return out.split("link/ether ", 1)[1].split()[0]


@needs_ns
@pytest.mark.parametrize("fixed", [True, False], ids=["rehearsal-bridge", "planted-plain"])
def test_the_bridge_keeps_its_mac_as_pods_come_and_go(fixed: bool) -> None:
    """Regression: br0 took the lowest MAC of its ports, so pods starting and ending moved it,
    and every host's ARP entry for the bridge's addresses (API stand-in, ClusterIPs) went
    stale: 10-15 s of silence on each, a master's NATS connection through a Service lost
    after every pod removal. The planted error: a bridge without its own address moves."""
    net = netns.Network().create()
    try:
        if not fixed:  # what the bridge does left to itself: "set address" never happened
            netns._ip("-n", net.hub, "link", "del", "br0")
            netns._ip("-n", net.hub, "link", "add", "name", "br0", "type", "bridge")
            netns._ip("-n", net.hub, "link", "set", "br0", "up")
        seen = {_bridge_mac(net.hub)}
        pods = []
        for _ in range(4):
            pods.append(net.add_pod()[0])
            seen.add(_bridge_mac(net.hub))
        for ns in pods[:3]:
            net.remove(ns)
            seen.add(_bridge_mac(net.hub))
    finally:
        net.destroy()
    if fixed:
        assert seen == {netns.BRIDGE_MAC}, seen
    else:
        assert len(seen) > 1, seen
