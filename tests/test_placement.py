"""Nothing a worker says about where it runs is trusted (review F1).

Unit tier: the pure rule and the two trusted sources (the runner's file; on Kubernetes the pod
behind a credential exchange, through a fake of the API). Real tier: a real master and a real
nats-server; a hostile rank 1 (a NATS client speaking the protocol, as the review's attacker
did) claims to run on the cluster's control-plane node and fails its bootcheck with a
"hardware" fault. The master quarantines the node the runner says rank 1 runs on, never the
claimed one, and counts and names the lie once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest

from aegis_flow import protocol as p
from aegis_flow.local.natsserver import EmbeddedNats
from aegis_flow.master.placement import (
    Pod,
    PodsByAddress,
    RunnerFile,
    peer_address,
    trusted_node,
)
from tests.fake_ranks import rank1_fails_bootcheck
from tests.jobs import Proc


def test_the_claim_stands_only_without_a_trusted_answer() -> None:
    assert trusted_node("node-a", None) == ("node-a", False)
    assert trusted_node("node-a", "node-a") == ("node-a", False)
    assert trusted_node("control-plane", "node-b") == ("node-b", True)
    assert trusted_node("", "node-b") == ("node-b", False)


def test_the_runner_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    where = RunnerFile(str(path))
    assert where.node_of(0) is None  # not written yet
    path.write_text(json.dumps({"0": "local-node-0", "1": "local-node-1"}))
    assert where.node_of(1) == "local-node-1"
    time.sleep(0.01)
    path.write_text(json.dumps({"0": "local-node-0", "1": "local-node-1-2"}))
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert where.node_of(1) == "local-node-1-2"
    path.write_text("{half a file")  # being rewritten: the last good answer stands
    os.utime(path, (time.time() + 10, time.time() + 10))
    assert where.node_of(1) == "local-node-1-2"


class FakePods:
    def __init__(self, pods: dict[str, Pod]) -> None:
        self.pods = pods
        self.asked: list[str] = []

    def pod_at(self, address: str) -> Pod | None:
        self.asked.append(address)
        if address == "10.0.0.99":
            raise OSError("the API is out of reach")
        return self.pods.get(address)


def test_on_kubernetes_the_node_comes_from_the_pod_behind_the_exchange() -> None:
    api = FakePods({"10.0.0.7": Pod("wf-run-1", "gpu-node-3", "wf"),
                    "10.0.0.8": Pod("other-run-0", "gpu-node-4", "other-wf")})
    where = PodsByAddress(api, "wf")
    assert where.record(1, "ipv4:10.0.0.7:41234") == "gpu-node-3"
    assert where.node_of(1) == "gpu-node-3"
    # a pod of another workflow, an unknown address, the API down: no trusted node
    assert where.record(1, "ipv4:10.0.0.8:5000") is None and where.node_of(1) is None
    assert "no pod of workflow 'wf'" in where.refused[-1]
    assert where.record(2, "ipv4:10.0.0.9:1") is None
    assert where.record(3, "ipv4:10.0.0.99:1") is None
    assert "out of reach" in where.refused[-1]
    assert api.asked == ["10.0.0.7", "10.0.0.8", "10.0.0.9", "10.0.0.99"]


@pytest.mark.parametrize(("peer", "address"), [
    ("ipv4:10.1.2.3:4567", "10.1.2.3"), ("ipv6:[fd00::1]:4567", "fd00::1"),
    ("ipv6:%5B::1%5D:80", "::1"), ("unix:/tmp/sock", ""), ("", "")])
def test_peer_addresses(peer: str, address: str) -> None:
    assert peer_address(peer) == address


@pytest.mark.e2e
def test_a_lying_worker_cannot_get_another_node_quarantined(tmp_path: Path) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"0": "local-node-0", "1": "local-node-1"}))
    subjects = p.Subjects("default", "j")
    with EmbeddedNats(tmp_path / "nats") as server:
        master = Proc([sys.executable, "-m", "aegis_flow.master", "--job", "j", "--workers",
                       "2", "--nats-url", server.url, "--node-file", str(nodes),
                       "--replace-timeout", "600", "--metrics-addr", "127.0.0.1",
                       "--metrics-port", "0", "--port-file", str(tmp_path / "port")],
                      env, tmp_path, label="master")
        try:
            async def go() -> dict[str, Any]:
                nc = await nats.connect(server.url)
                claims = {0: "local-node-0", 1: "kube-control-plane"}  # rank 1 lies
                await rank1_fails_bootcheck(
                    nc, subjects, lambda: master.output,
                    acks={rank: {"node": node} for rank, node in claims.items()},
                    detail="gpu: lost (so it says)")
                deadline = time.monotonic() + 60
                port = ""
                while True:
                    assert time.monotonic() < deadline, master.output
                    await asyncio.sleep(0.2)
                    port = port or (tmp_path / "port").read_text().strip()
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress") as resp:
                        snap: dict[str, Any] = json.loads(resp.read())
                    if snap.get("error_nodes"):
                        await nc.close()
                        return snap

            snap = asyncio.run(go())
            assert snap["error_nodes"] == ["local-node-1"], snap
            master.wait_for("node local-node-1 of rank 1 quarantined", timeout=10)
            assert "kube-control-plane" not in "".join(
                line for line in master.lines if "quarantined" in line)
            said = [line for line in master.lines if "claims to run on node" in line]
            assert said == ["[aegis-flow master] rank 1 claims to run on node "
                            "'kube-control-plane', but runs on local-node-1: the claim is "
                            "ignored"], master.output
        finally:
            master.kill()
