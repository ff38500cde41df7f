"""``aegis-flow rehearse``'s fake cluster: quantities, the scheduler's filters and its wording,
node patches and conflicts (pure); then the HTTPS nodes API under the real ``kubernetes``
client, ``KubeNodeApi`` and the real ``aegis-flow nodes quarantine`` CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.argo.rehearse.cluster import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    ApiError,
    NodeStore,
    Placement,
    Unschedulable,
    amount,
    parse_quantity,
    parse_selector,
    pod_requests,
    schedule,
    strategic_merge_patch,
)
from aegis_flow.argo.rehearse.kubeapi import Grant, NodesApiServer, json_patch
from aegis_flow.k8s.nodes import LABEL

GPU = "nvidia.com/gpu"
BIG = {"cpu": "64", "memory": "512Gi", GPU: "8"}


def nodes(*specs: dict[str, Any]) -> list[dict[str, Any]]:
    return NodeStore(specs).snapshot()


def pod(requests: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"containers": [{"name": "main", "resources": {"requests": requests or {}}}], **spec}


def message(result: Placement | Unschedulable) -> str:
    assert isinstance(result, Unschedulable), result
    return result.message


# ---------------------------------------------------------------- quantities

@pytest.mark.parametrize(("text", "value"), [
    ("500m", Fraction(1, 2)), ("32", 32), ("256Gi", 256 * 2**30), ("1e3", 1000),
    ("128Mi", 128 * 2**20), ("2k", 2000), ("1.5", Fraction(3, 2)), (".5Ki", 512),
    ("1E", 10**18), ("1E3", 1000), ("100n", Fraction(1, 10**7)), ("-2M", -2 * 10**6)])
def test_quantities_parse_as_kubernetes_does(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


def test_amounts_round_up_cpu_to_millicores() -> None:
    assert amount("cpu", "500m") == 500 and amount("cpu", "0.0001") == 1
    assert amount("memory", "1.5Ki") == 1536 and amount(GPU, "1") == 1


@pytest.mark.parametrize("bad", ["", "1x", "Gi", "1.2.3", "1 Gi", "e3"])
def test_bad_quantities_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_pod_requests_default_from_limits_and_take_the_init_maximum() -> None:
    spec: dict[str, Any] = {"containers": [{"resources": {"requests": {"cpu": "1"}}},
                           {"resources": {"limits": {"cpu": "2", GPU: "4"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "5", "memory": "1Gi"}}},
                               {"restartPolicy": "Always",
                                "resources": {"requests": {"memory": "1Mi"}}}],
            "overhead": {"cpu": "100m"}}
    # the sidecar starts after the first init container: max(1Gi, 1Mi), not their sum
    assert pod_requests(spec) == {"cpu": 5100, GPU: 4, "memory": 2**30}
    spec["initContainers"].reverse()
    assert pod_requests(spec)["memory"] == 2**30 + 2**20


# ---------------------------------------------------------------- schedule()

def test_a_fitting_pod_goes_to_the_least_used_node_then_by_name() -> None:
    ns = nodes({"name": "b", "allocatable": BIG}, {"name": "a", "allocatable": BIG})
    got = schedule(pod({"cpu": "1", GPU: "1"}), ns)
    assert isinstance(got, Placement) and got.node == "a" and got.feasible == ("a", "b")
    assert got.requests == {"cpu": 1000, GPU: 1, "pods": 1}
    busy = {"a": {"cpu": 32000, "pods": 1}}  # ints: Placement.requests' units
    assert isinstance(p := schedule(pod({"cpu": "1"}), ns, busy), Placement) and p.node == "b"
    assert isinstance(p := schedule(pod({"cpu": "1"}), ns, {"a": {"cpu": "32"}}), Placement)
    assert p.node == "b"


def test_the_brief_example_message() -> None:
    ns = nodes({"name": "g0", "labels": {"pool": "gpu"}, "allocatable": BIG},
               {"name": "c0", "allocatable": {"cpu": "64"}},
               {"name": "c1", "allocatable": {"cpu": "64"}})
    got = schedule(pod({GPU: "1"}, nodeSelector={"pool": "gpu"}), ns, {"g0": {GPU: "8"}})
    assert message(got) == ("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, "
                            "2 node(s) didn't match Pod's node affinity/selector.")
    assert isinstance(got, Unschedulable) and got.reasons == {
        "Insufficient nvidia.com/gpu": 1, "node(s) didn't match Pod's node affinity/selector": 2}
    assert got.condition_message == got.message + (
        " preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod,"
        " 2 Preemption is not helpful for scheduling.")


def test_node_unschedulable_unless_tolerated() -> None:
    ns = nodes({"name": "n0", "unschedulable": True})
    assert message(schedule(pod(), ns)) == "0/1 nodes are available: 1 node(s) were unschedulable."
    tol = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    assert isinstance(schedule(pod(tolerations=[tol]), ns), Placement)


@pytest.mark.parametrize(("toleration", "fits"), [
    ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "value": "gpu"}, True),  # empty effect: every effect
    ({"key": "dedicated", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),  # empty key + Exists: every taint
    ({"key": "dedicated", "operator": "Equal", "value": "cpu"}, False),
    ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "other", "operator": "Exists"}, False)])
def test_taint_toleration(toleration: dict[str, str], fits: bool) -> None:
    ns = nodes({"name": "n0", "taints": [{"key": "dedicated", "value": "gpu",
                                          "effect": "NoSchedule"},
                                         {"key": "soft", "effect": "PreferNoSchedule"}]})
    got = schedule(pod(tolerations=[toleration]), ns)
    assert isinstance(got, Placement) == fits
    if not fits:
        assert message(got) == "0/1 nodes are available: 1 node(s) had untolerated taint(s)."
        assert message(schedule(pod(tolerations=[toleration]), ns, taint_values=True)) == (
            "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}.")


def test_no_execute_taints_count_and_the_first_failing_filter_decides() -> None:
    ns = nodes({"name": "n0", "unschedulable": True,
                "taints": [{"key": "k", "effect": "NoExecute"}]},
               {"name": "n1", "taints": [{"key": "k", "effect": "NoExecute"}]},
               {"name": "n2", "allocatable": {"cpu": "1"}})
    got = schedule(pod({"cpu": "2"}), ns, taint_values=True)
    assert message(got) == ("0/3 nodes are available: 1 Insufficient cpu, 1 node(s) had "
                            "untolerated taint {k: }, 1 node(s) were unschedulable.")


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


@pytest.mark.parametrize(("term", "fit"), [
    ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
     {"n0", "n1"}),
    ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]},
     {"n1", "n2"}),
    ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, {"n0", "n1"}),
    ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, {"n2"}),
    ({"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]}, {"n1"}),
    ({"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["8"]}]}, {"n0"}),
    ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                           {"key": "gpus", "operator": "Gt", "values": ["4"]}]}, {"n1"}),
    ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}]},
     {"n1", "n2"}),
    ({}, set())])  # an empty term matches nothing
def test_node_affinity_operators(term: dict[str, Any], fit: set[str]) -> None:
    ns = nodes({"name": "n0", "labels": {"zone": "a", "gpus": "4"}},
               {"name": "n1", "labels": {"zone": "b", "gpus": "8"}}, {"name": "n2"})
    got = schedule(pod(affinity=affinity(term)), ns)
    assert set(got.feasible if isinstance(got, Placement) else ()) == fit
    if not fit:
        assert message(got) == ("0/3 nodes are available: 3 node(s) didn't match Pod's node "
                                "affinity/selector.")


def test_terms_are_ored_and_node_selector_is_anded_with_them() -> None:
    ns = nodes({"name": "n0", "labels": {"zone": "a"}}, {"name": "n1", "labels": {"zone": "b"}},
               {"name": "n2", "labels": {"zone": "c", "ssd": "true"}})
    terms = affinity({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                     {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}]})
    got = schedule(pod(affinity=terms), ns)
    assert isinstance(got, Placement) and got.feasible == ("n0", "n2")
    got = schedule(pod(affinity=terms, nodeSelector={"ssd": "true"}), ns)
    assert isinstance(got, Placement) and got.feasible == ("n2",)


def test_match_fields_by_name_narrow_the_nodes_in_prefilter() -> None:
    ns = nodes({"name": "n0", "allocatable": {"cpu": "1"}}, {"name": "n1"}, {"name": "n2"})
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}
    assert message(schedule(pod({"cpu": "2"}, affinity=affinity(term)), ns)) == (
        "0/3 nodes are available: 1 Insufficient cpu, "
        "2 node(s) didn't satisfy plugin(s) [NodeAffinity].")
    clash = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]},
                             {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert message(schedule(pod(affinity=affinity(clash)), ns)) == (
        "0/3 nodes are available: pod affinity terms conflict.")


def test_resources_fit_reports_every_insufficient_resource_and_sorts_as_strings() -> None:
    specs = [{"name": f"n{i:02}", "allocatable": {"cpu": "4", "memory": "1Gi", "pods": "2"}}
             for i in range(12)]
    used = {"n00": {"pods": 2}}
    got = schedule(pod({"cpu": "8", "memory": "2Gi"}), nodes(*specs), used)
    assert message(got) == ("0/12 nodes are available: 1 Too many pods, 12 Insufficient cpu, "
                            "12 Insufficient memory.")  # "1 T" < "12 I": Go's sort.Strings
    assert isinstance(got, Unschedulable)
    assert got.nodes["n00"] == ("Too many pods", "Insufficient cpu", "Insufficient memory")
    assert schedule(pod(), []) == Unschedulable("no nodes available to schedule pods")


# ---------------------------------------------------------------- selectors and patches

def test_label_selectors() -> None:
    store = NodeStore([{"name": "a", "labels": {"x": "1"}}, {"name": "b", "labels": {"x": "2"}},
                       {"name": "c"}])

    def names(sel: str) -> list[str]:
        return [n["metadata"]["name"] for n in store.list(sel)]

    assert names("x=1") == ["a"] and names("x==1") == ["a"] and names("x!=1") == ["b", "c"]
    assert names("x") == ["a", "b"] and names("!x") == ["c"] and names("") == ["a", "b", "c"]
    assert names("x in (1, 2),kubernetes.io/hostname notin (b)") == ["a"]
    with pytest.raises(ValueError):
        parse_selector("x in 1")


def test_merge_patch_replaces_taints_and_deletes_with_null() -> None:
    store = NodeStore([{"name": "n0", "labels": {"a": "1"},
                        "taints": [{"key": "old", "effect": "NoSchedule"}]}])
    rv = store.get("n0")["metadata"]["resourceVersion"]
    after = store.patch("n0", {"metadata": {"labels": {"a": None, LABEL: "true"}},
                               "spec": {"taints": [{"key": LABEL, "value": "true",
                                                    "effect": "NoSchedule"}]},
                               "status": {"allocatable": {"cpu": "1000"}}})
    assert LABEL in after["metadata"]["labels"] and "a" not in after["metadata"]["labels"]
    assert [t["key"] for t in after["spec"]["taints"]] == [LABEL]
    assert after["status"] == store.get("n0")["status"] and "cpu" not in after["status"][
        "allocatable"]  # status is a subresource: ignored
    assert int(after["metadata"]["resourceVersion"]) > int(rv)
    again = store.patch("n0", {"metadata": {"labels": {LABEL: "true"}}})
    assert again["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]


def test_strategic_merge_patch_for_nodes() -> None:
    node = {"metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
            "spec": {"taints": [{"key": "t1", "effect": "NoSchedule"}],
                     "podCIDRs": ["10.0.0.0/24"]},
            "status": {"conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "DiskPressure", "status": "False"}]}}
    out = strategic_merge_patch(node, {
        "metadata": {"finalizers": ["b"], "labels": {"x": None}},
        "spec": {"taints": [{"key": "t2", "effect": "NoExecute"}], "podCIDRs": ["10.0.0.0/24"]},
        "status": {"conditions": [{"type": "Ready", "status": "False"},
                                  {"type": "DiskPressure", "$patch": "delete"}]}})
    assert out["metadata"] == {"finalizers": ["a", "b"], "labels": {}}
    assert out["spec"] == {"taints": [{"key": "t2", "effect": "NoExecute"}],
                           "podCIDRs": ["10.0.0.0/24"]}  # taints: replaced whole
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "False"}]
    assert strategic_merge_patch({"spec": {"a": 1, "b": 2}},
                                 {"spec": {"$patch": "replace", "c": 3}}) == {"spec": {"c": 3}}


def test_json_patch() -> None:
    doc = {"metadata": {"labels": {"a/b": "1"}}, "spec": {"taints": [{"key": "k"}]}}
    out = json_patch(doc, [
        {"op": "test", "path": "/metadata/labels/a~1b", "value": "1"},
        {"op": "add", "path": "/spec/taints/-", "value": {"key": "z"}},
        {"op": "remove", "path": "/spec/taints/0"},
        {"op": "copy", "from": "/metadata/labels/a~1b", "path": "/metadata/labels/c"},
        {"op": "move", "from": "/metadata/labels/a~1b", "path": "/metadata/labels/d"},
        {"op": "replace", "path": "/metadata/labels/c", "value": "2"}])
    assert out == {"metadata": {"labels": {"c": "2", "d": "1"}},
                   "spec": {"taints": [{"key": "z"}]}}
    for bad in ([{"op": "test", "path": "/spec", "value": 1}],
                [{"op": "remove", "path": "/nope"}],
                [{"op": "add", "path": "/spec/taints/5", "value": 1}]):
        with pytest.raises(ApiError) as err:
            json_patch(doc, bad)
        assert err.value.code == 422


def test_conflict_not_found_and_invalid() -> None:
    store = NodeStore([{"name": "n0"}])
    rv = store.get("n0")["metadata"]["resourceVersion"]
    store.patch("n0", {"metadata": {"resourceVersion": rv, "labels": {"a": "1"}}})
    with pytest.raises(ApiError) as err:  # rv is stale now
        store.patch("n0", {"metadata": {"resourceVersion": rv, "labels": {"a": "2"}}})
    assert (err.value.code, err.value.reason) == (409, "Conflict")
    assert "the object has been modified" in err.value.message
    with pytest.raises(ApiError) as err:
        store.get("nope")
    assert (err.value.code, err.value.message) == (404, 'nodes "nope" not found')
    with pytest.raises(ApiError) as err:
        store.patch("n0", {"spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}})
    assert err.value.code == 422
    with pytest.raises(ApiError) as err:
        store.patch("n0", {}, "application/yaml")
    assert err.value.code == 415


# ---------------------------------------------------------------- the HTTPS API

TOKENS: dict[str, Any] = {"tok-master": Grant("system:serviceaccount:aegis:master"),
                          "tok-worker": set()}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NodesApiServer]:
    store = NodeStore([{"name": "gpu-0", "labels": {"pool": "gpu"}, "allocatable": BIG,
                        "taints": [{"key": GPU, "effect": "NoSchedule"}]},
                       {"name": "gpu-1", "labels": {"pool": "gpu"}, "allocatable": BIG}])
    with NodesApiServer(store, host="127.0.0.1", tokens=TOKENS, cert_dir=tmp_path / "sa") as srv:
        yield srv


def core_v1(srv: NodesApiServer, token: str) -> Any:
    from kubernetes import client

    cfg = client.Configuration(host=srv.url)
    cfg.ssl_ca_cert = str(srv.ca_path)
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.CoreV1Api(client.ApiClient(cfg))


def test_the_kubernetes_client_lists_reads_and_patches(server: NodesApiServer) -> None:
    api = core_v1(server, "tok-master")
    assert [n.metadata.name for n in api.list_node(label_selector="pool=gpu").items] == [
        "gpu-0", "gpu-1"]
    assert [n.metadata.name for n in api.list_node(field_selector="metadata.name=gpu-1").items
            ] == ["gpu-1"]
    node = api.read_node("gpu-0")
    assert node.spec.taints[0].key == GPU and node.status.allocatable[GPU] == "8"
    for ctype, body in ((MERGE_PATCH, {"metadata": {"labels": {"m": "1"}}}),
                        (STRATEGIC_MERGE_PATCH, {"metadata": {"labels": {"s": "1"}}}),
                        (JSON_PATCH, [{"op": "add", "path": "/metadata/labels/j", "value": "1"}])):
        api.patch_node("gpu-1", body, _content_type=ctype)
    assert {"m", "s", "j"} <= set(server.store.get("gpu-1")["metadata"]["labels"])
    assert all(c.identity == "system:serviceaccount:aegis:master" and c.status == 200
               for c in server.calls)


def test_statuses_401_403_404_409(server: NodesApiServer) -> None:
    from kubernetes.client.exceptions import ApiException

    def refused(token: str, fn: str, *args: Any, **kw: Any) -> dict[str, Any]:
        with pytest.raises(ApiException) as err:
            getattr(core_v1(server, token), fn)(*args, **kw)
        body = json.loads(err.value.body or "{}")
        assert body["kind"] == "Status" and body["code"] == err.value.status
        return dict(body)

    assert refused("nope", "read_node", "gpu-0")["reason"] == "Unauthorized"
    forbidden = refused("tok-worker", "patch_node", "gpu-0", {}, _content_type=MERGE_PATCH)
    assert forbidden["reason"] == "Forbidden" and "cannot patch resource" in forbidden["message"]
    assert refused("tok-master", "read_node", "gpu-9")["reason"] == "NotFound"
    stale = {"metadata": {"resourceVersion": "0", "labels": {"x": "1"}}}
    assert refused("tok-master", "patch_node", "gpu-0", stale,
                   _content_type=MERGE_PATCH)["reason"] == "Conflict"
    assert [(c.identity, c.status) for c in server.calls] == [
        (None, 401), (server.grants["tok-worker"].user, 403),
        ("system:serviceaccount:aegis:master", 404), ("system:serviceaccount:aegis:master", 409)]
    assert "x" not in server.store.get("gpu-0")["metadata"]["labels"]


def test_kube_node_api_quarantines_through_the_server(server: NodesApiServer) -> None:
    from aegis_flow.k8s import ops
    from aegis_flow.k8s.client import KubeNodeApi

    api = KubeNodeApi(core_v1(server, "tok-master"))
    [record] = ops.quarantine(api, ["gpu-0"], reason="xid 79", now=1.8e9, by="job-1")
    assert record.action == "quarantined"
    node = server.store.get("gpu-0")
    assert node["metadata"]["labels"][LABEL] == "true"
    assert {t["key"] for t in node["spec"]["taints"]} == {GPU, LABEL}


def run_cli(server: NodesApiServer, tmp_path: Path, token: str, *args: str
            ) -> subprocess.CompletedProcess[str]:
    config = tmp_path / f"kubeconfig-{token}"
    config.write_text(json.dumps(server.kubeconfig(token)))  # JSON is YAML
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KUBERNETES_") and k != "KUBECONFIG"}
    cli = Path(sys.executable).with_name("aegis-flow")
    return subprocess.run([str(cli), "nodes", "--kubeconfig", str(config), *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def test_the_cli_quarantines_a_node_in_the_store(server: NodesApiServer, tmp_path: Path) -> None:
    got = run_cli(server, tmp_path, "tok-master", "quarantine", "gpu-1", "--reason", "r",
                  "--by", "t")
    assert got.returncode == 0, got.stderr + got.stdout
    node = server.store.get("gpu-1")
    assert node["metadata"]["labels"][LABEL] == "true"
    assert node["metadata"]["annotations"]["aegis.io/quarantined-by"] == "t"
    assert node["spec"]["taints"] == [{"key": LABEL, "effect": "NoSchedule", "value": "true"}]
    assert [c.method for c in server.calls] == ["GET", "PATCH"]


def test_the_cli_with_a_wrong_token_gets_401_and_one_line(server: NodesApiServer,
                                                          tmp_path: Path) -> None:
    got = run_cli(server, tmp_path, "planted-wrong-token", "quarantine", "gpu-1", "--reason",
                  "r", "--by", "t")
    assert got.returncode == 1
    lines = (got.stdout + got.stderr).strip().splitlines()
    assert len(lines) == 1 and "HTTP 401" in lines[0] and "failed" in lines[0], lines
    assert [(c.identity, c.status) for c in server.calls] == [(None, 401)]
    assert LABEL not in server.store.get("gpu-1")["metadata"]["labels"]


def test_a_taint_added_between_read_and_patch_survives_quarantine(
        server: NodesApiServer) -> None:
    """W6: the node lifecycle controller taints the node (unreachable:NoExecute, with its
    timeAdded) after quarantine read it; the merge patch carries the resourceVersion it read,
    the API answers 409, quarantine reads again and keeps both taints, timeAdded included."""
    from aegis_flow.k8s import ops
    from aegis_flow.k8s.client import KubeNodeApi

    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                   "timeAdded": "2026-12-01T10:00:00Z"}

    class Racing(KubeNodeApi):
        raced = False

        def get_node(self, name: str) -> Any:
            node = super().get_node(name)
            if not self.raced:  # another controller acts between our GET and our PATCH
                self.raced = True
                taints = server.store.get(name)["spec"].get("taints") or []
                server.store.patch(name, {"spec": {"taints": [*taints, unreachable]}})
            return node

    [record] = ops.quarantine(Racing(core_v1(server, "tok-master")), ["gpu-0"],
                              reason="xid 79", now=1.8e9, by="job-1")
    assert record.action == "quarantined", record
    taints = server.store.get("gpu-0")["spec"]["taints"]
    assert {t["key"] for t in taints} == {GPU, LABEL, unreachable["key"]}
    assert unreachable in taints
    assert [c.status for c in server.calls if c.method == "PATCH"] == [409, 200]
    [released] = ops.release(KubeNodeApi(core_v1(server, "tok-master")), ["gpu-0"])
    assert released.action == "released"
    assert unreachable in server.store.get("gpu-0")["spec"]["taints"]


def test_the_fake_refuses_a_stale_patch_and_quarantine_retries() -> None:
    from aegis_flow.k8s import ops
    from aegis_flow.k8s.api import FakeNodeApi

    api = FakeNodeApi([FakeNodeApi.node("n1")])
    real_get = api.get_node
    calls = {"n": 0}

    def racing_get(name: str) -> Any:
        node = real_get(name)
        calls["n"] += 1
        if calls["n"] == 1:
            api.patch_node(name, {"metadata": {"labels": {"other": "1"}}})
        return node

    api.get_node = racing_get  # type: ignore[method-assign]
    [record] = ops.quarantine(api, ["n1"], reason="r", now=1.8e9, by="t")
    assert record.action == "quarantined" and calls["n"] == 2
    assert api.nodes["n1"]["metadata"]["labels"] == {"other": "1", LABEL: "true"}
