"""Node quarantine: the patch bodies (pure), the batch operations over the in-memory fake,
the CLI, and the real ``kubernetes`` client adapter against a local recording HTTP server."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs

import pytest

from aegis_flow.cli import main
from aegis_flow.k8s import ops
from aegis_flow.k8s.api import FakeNodeApi, NodeApiError, NodeNotFound
from aegis_flow.k8s.client import MERGE_PATCH, KubeNodeApi
from aegis_flow.k8s.nodes import (
    LABEL,
    NodeInfo,
    Taint,
    merge_patch,
    quarantine_patch,
    release_patch,
)
from tests.http_recorder import Request, recording_server

NOW = 1_796_000_000.0  # date -u -d @1796000000: 2026-11-30T00:53:20Z
GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}


def cluster() -> FakeNodeApi:
    return FakeNodeApi([FakeNodeApi.node("gpu-1", labels={"zone": "a"}, taints=[GPU_TAINT]),
                        FakeNodeApi.node("gpu-2"), FakeNodeApi.node("cpu-1", ready=False)])


def test_quarantine_patch_labels_taints_annotates_and_keeps_other_taints() -> None:
    node = NodeInfo("gpu-1", {"zone": "a"}, {}, (Taint("nvidia.com/gpu", "NoSchedule"),))
    body = quarantine_patch(node, reason="xid 79", now=NOW, by="job-1")
    assert body == {
        "metadata": {"labels": {LABEL: "true"},
                     "annotations": {"aegis.io/quarantine-reason": "xid 79",
                                     "aegis.io/quarantined-at": "2026-11-30T00:53:20Z",
                                     "aegis.io/quarantined-by": "job-1"}},
        "spec": {"taints": [GPU_TAINT, {"key": LABEL, "effect": "NoSchedule",
                                        "value": "true"}]}}
    assert "spec" not in quarantine_patch(node, reason="r", now=NOW, by="b", taint=False)


def test_release_patch_removes_exactly_ours() -> None:
    node = NodeInfo("n", {LABEL: "true"}, {"aegis.io/quarantine-reason": "x"},
                    (Taint("nvidia.com/gpu", "NoSchedule"), Taint(LABEL, "NoSchedule", "true")))
    body = release_patch(node)
    assert body["metadata"]["labels"] == {LABEL: None}
    assert set(body["metadata"]["annotations"]) == {"aegis.io/quarantine-reason",
                                                   "aegis.io/quarantined-at",
                                                   "aegis.io/quarantined-by"}
    assert body["spec"]["taints"] == [GPU_TAINT]


def test_merge_patch_is_rfc_7386() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1, 2]}, {"a": {"b": None, "d": 3},
                                                              "l": [3]}) == {
        "a": {"c": 2, "d": 3}, "l": [3]}


def test_batch_quarantine_goes_on_past_a_missing_node_and_is_idempotent() -> None:
    api = cluster()
    records = ops.quarantine(api, ["gpu-1", "nope", "gpu-2"], reason="xid 79", now=NOW,
                             by="job-1")
    assert [(r.node, r.action) for r in records] == [
        ("gpu-1", "quarantined"), ("nope", "failed"), ("gpu-2", "quarantined")]
    assert "not found" in records[1].error
    info = api.get_node("gpu-1")
    assert info.quarantined and info.reason == "xid 79" and info.by == "job-1"
    assert set(info.taints) == {Taint("nvidia.com/gpu", "NoSchedule"),
                                Taint(LABEL, "NoSchedule", "true")}
    assert info.labels["zone"] == "a"
    patches = len(api.patches)
    again = ops.quarantine(api, ["gpu-1"], reason="other", now=NOW + 60, by="job-2")
    assert again[0].action == "already-quarantined" and again[0].reason == "xid 79"
    assert len(api.patches) == patches  # not patched twice
    assert [n.name for n in api.list_nodes(LABEL)] == ["gpu-1", "gpu-2"]


def test_release_restores_the_node_and_leaves_others_alone() -> None:
    api = cluster()
    before = api.nodes["gpu-1"]
    ops.quarantine(api, ["gpu-1"], reason="r", now=NOW, by="b")
    records = ops.release(api, ["gpu-1", "gpu-2"])
    assert [(r.node, r.action) for r in records] == [("gpu-1", "released"),
                                                     ("gpu-2", "not-quarantined")]
    after = api.nodes["gpu-1"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert after["spec"]["taints"] == [GPU_TAINT]
    assert not after["metadata"].get("annotations")


class IgnoringApi(FakeNodeApi):
    """A planted fault: the API server accepts the patch but nothing changes."""

    def patch_node(self, name: str, body: dict[str, Any]) -> NodeInfo:
        self.patches.append((name, body))
        return self.get_node(name)


def test_a_patch_that_did_not_stick_is_an_error() -> None:
    records = ops.quarantine(IgnoringApi([FakeNodeApi.node("n")]), ["n"], reason="r",
                             now=NOW, by="b")
    assert records[0].action == "failed" and "did not stick" in records[0].error


def test_nodes_cli_quarantine_record_list_release(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def run_cli(*args: str) -> SimpleNamespace:
        code = main(list(args))
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    state = tmp_path / "nodes.json"
    state.write_text(json.dumps(list(cluster().nodes.values())))
    fake = ["nodes", "--fake-cluster", str(state)]
    q = run_cli(*fake, "quarantine", "gpu-1", "gpu-2", "--reason", "ecc", "--by", "wf-1",
                "--record", str(tmp_path / "rec.json"))
    assert q.returncode == 0, q.stderr
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert [(r["node"], r["action"], r["by"]) for r in rec] == [
        ("gpu-1", "quarantined", "wf-1"), ("gpu-2", "quarantined", "wf-1")]
    ls = run_cli(*fake, "--json", "list")
    assert [n["name"] for n in json.loads(ls.stdout)] == ["gpu-1", "gpu-2"]
    bad = run_cli(*fake, "release", "gpu-1", "ghost")
    assert bad.returncode == 1 and "ghost" in bad.stdout and "released" in bad.stdout
    assert [n["name"] for n in json.loads(run_cli(*fake, "--json", "list").stdout)] == ["gpu-2"]
    missing = run_cli("nodes", "--fake-cluster", str(tmp_path / "none.json"), "list")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


# -- the real client adapter, against a recording HTTP server ------------------------------

def node_json(name: str, **kw: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", **FakeNodeApi.node(name, **kw)}


def test_the_kubernetes_adapter_sends_merge_patches_to_the_node() -> None:
    store = {"gpu-1": node_json("gpu-1", taints=[GPU_TAINT])}

    def patch(req: Request) -> tuple[int, Any]:
        store["gpu-1"] = merge_patch(store["gpu-1"], req.json())
        return 200, store["gpu-1"]

    with recording_server() as srv:
        srv.on("GET", "/api/v1/nodes/gpu-1", lambda _r: (200, store["gpu-1"]))
        srv.on("PATCH", "/api/v1/nodes/gpu-1", patch)
        srv.on("GET", "/api/v1/nodes", lambda _r: (200, {
            "kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [store["gpu-1"]]}))
        api = KubeNodeApi.from_host(srv.url, token="t0k")
        records = ops.quarantine(api, ["gpu-1"], reason="xid 79", now=NOW, by="job-1")
        assert records[0].action == "quarantined", records
        listed = api.list_nodes(LABEL)
    patches = [r for r in srv.requests if r.method == "PATCH"]
    assert len(patches) == 1
    assert patches[0].headers["content-type"] == MERGE_PATCH
    assert patches[0].headers["authorization"] == "Bearer t0k"
    assert patches[0].json() == quarantine_patch(
        NodeInfo.from_dict(node_json("gpu-1", taints=[GPU_TAINT])), reason="xid 79", now=NOW,
        by="job-1")
    lists = [r for r in srv.requests if r.method == "GET" and r.path == "/api/v1/nodes"]
    assert parse_qs(lists[0].query) == {"labelSelector": ["aegis.io/quarantined"]}
    assert listed[0].quarantined


@pytest.mark.parametrize(("status", "kind", "text"), [
    (404, NodeNotFound, "not found"), (403, NodeApiError, "nodes get/list/patch"),
    (503, NodeApiError, "HTTP 503")])
def test_the_adapter_turns_http_errors_into_clear_ones(status: int, kind: type[Exception],
                                                       text: str) -> None:
    with recording_server() as srv:
        srv.on("GET", "/api/v1/nodes/n", (status, {"kind": "Status", "code": status}))
        with pytest.raises(kind, match=text) as info:
            KubeNodeApi.from_host(srv.url).get_node("n")
    assert isinstance(info.value, NodeApiError)
    assert info.value.retryable == (status == 503)


def test_the_master_quarantines_the_node_of_a_hardware_fault() -> None:
    """The master's Quarantine effect, executed with a NodeApi (the fake; a thread)."""
    import asyncio

    from aegis_flow.master import model as mm
    from aegis_flow.master.runtime import Master, MasterConfig

    api = cluster()

    async def go() -> None:
        master = Master(MasterConfig(job="job-7", workers=2, observe=False), nodes=api)
        await master._execute(mm.Quarantine(rank=1, node="gpu-2"))
        await asyncio.wait_for(asyncio.gather(*master.node_jobs), 30)

    asyncio.run(go())
    info = api.get_node("gpu-2")
    assert info.quarantined and info.by == "job-7" and "rank 1" in info.reason
    assert not api.get_node("gpu-1").quarantined
