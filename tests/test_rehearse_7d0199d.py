"""The Argo workflow of commit 7d0199d, rehearsed: B1, B2, B3, B5 and B6 of the review
``argo-on-a-real-cluster.md``, each shown the way Argo's controller would produce it.

``tests/fixtures/training-7d0199d.yaml`` is ``workflows/training.yaml`` as it was at that
commit, unchanged. The scenarios under ``tests/rehearse_scenarios/`` give the cluster (six
tainted H100 nodes, one CPU node), the Secrets, and what the containers do (stand-ins for the
master and bootcheck, and the fault each problem needs); Argo's rules do the rest.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.argo.rehearse import netns, scenario
from aegis_flow.argo.rehearse.run import Result, load_workflow, rehearse

HERE = Path(__file__).parent
FIXTURE = HERE / "fixtures" / "training-7d0199d.yaml"
SCENARIOS = HERE / "rehearse_scenarios"
_WHY = netns.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"rehearse needs namespaces: {_WHY}")


def run(name: str, *, wf: dict[str, Any] | None = None) -> Result:
    sc = scenario.load(str(SCENARIOS / name))
    return rehearse(wf or load_workflow(str(FIXTURE)), scenario=sc)


def params(node: dict[str, Any], kind: str = "outputs") -> dict[str, str]:
    return {p["name"]: p.get("value", "") for p in (node.get(kind) or {}).get("parameters", [])}


def test_fixture_is_the_7d0199d_workflow() -> None:
    """The fixture is pinned: the old verdict input and the old retry cap are in it."""
    text = FIXTURE.read_text()
    assert "value: '{{steps.run.outputs.parameters}}'" in text
    assert "maxDuration: 2m" in text and "name: RUNS" in text


def test_b1_a_failed_rank_never_reaches_the_verdict() -> None:
    """B1: rank 1 exits 70 on all 4 attempts; the verdict sees 3 ranks and says succeeded.
    (The worker's backoff, 5 s doubling, is scaled to 1 s doubling: same attempts.)"""
    wf = load_workflow(str(FIXTURE))
    worker = next(t for t in wf["spec"]["templates"] if t["name"] == "worker")
    assert worker["retryStrategy"]["backoff"]["duration"] == "5s"
    worker["retryStrategy"]["backoff"]["duration"] = "1s"
    r = run("b1-one-rank-node-fault.yaml", wf=wf)
    assert r.phase == "Succeeded", r.status.get("message")
    rank1 = r.node("run(1:1)")
    assert (rank1["type"], rank1["phase"], rank1["message"]) == \
        ("Retry", "Failed", "No more retries left")
    attempts = [r.node(f"run(1:1)({i})") for i in range(4)]
    assert all(a["message"] == "main: Error (exit code 70)" for a in attempts)
    assert len({a["hostNodeName"] for a in attempts}) == 4  # nodeAntiAffinity moved each retry
    verdict = params(r.node("verdict"))
    assert verdict["verdict"] == "succeeded" and verdict["bad-nodes"] == "[]"
    for skipped in ("troubleshoot", "quarantine"):
        n = r.node(skipped)
        assert (n["phase"], n["message"]) == ("Skipped", "Skipped, empty params")


def test_b3_max_duration_is_a_deadline_not_a_cap() -> None:
    """B3: a rank that failed after running longer than maxDuration is not retried."""
    wf = load_workflow(str(FIXTURE))
    worker = next(t for t in wf["spec"]["templates"] if t["name"] == "worker")
    assert worker["retryStrategy"]["backoff"]["maxDuration"] == "2m"
    worker["retryStrategy"]["backoff"]["maxDuration"] = "6s"  # same rule, 20x faster
    r = run("b3-max-duration.yaml", wf=wf)
    rank1 = r.node("run(1:1)")
    assert (rank1["phase"], rank1["message"]) == ("Failed", "Max duration limit exceeded")
    assert len(rank1["children"]) == 1  # never replaced
    assert r.node("run(1:1)(0)")["message"] == "main: Error (exit code 70)"
    assert r.phase == "Succeeded"  # and B1 hides it from the verdict


def test_b5_the_resumed_attempt_has_no_master() -> None:
    """B5: the resumed attempt's pods are given the dead master's address. (The master's
    backoff, 10 s in the workflow, is made 60 s here: the same rule - the old address until a
    new master pod is ready - with a margin that does not depend on this machine's load.)"""
    wf = load_workflow(str(FIXTURE))
    master = next(t for t in wf["spec"]["templates"] if t["name"] == "master")
    assert master["retryStrategy"]["backoff"]["duration"] == "10s"
    master["retryStrategy"]["backoff"]["duration"] = "60s"
    r = run("b5-resume-without-master.yaml", wf=wf)
    first = r.node("master(0)")
    assert (first["phase"], first["message"]) == ("Failed", "main: Error (exit code 1)")
    old = first["podIP"]
    resumed = [n for n in r.status["nodes"].values()
               if ".resume[" in n["name"] and n["type"] == "Pod"
               and n["templateName"] == "worker"]
    assert len(resumed) == 4
    for pod in resumed:
        assert params(pod, "inputs")["master-addr"] == f"{old}:50051"
        assert pod["message"] == "aegis-worker-init: Error (exit code 1)"
        assert pod["startedAt"] >= first["finishedAt"]
    assert r.phase == "Failed"
    assert params(r.node("verdict"))["verdict"] == "retry"


def test_b6_the_verdict_cannot_start_past_the_env_limit() -> None:
    """B6: RUNS over 128 KiB: the verdict's container cannot be started; the job fails."""
    r = run("b6-verdict-env.yaml")
    verdict = r.node("verdict")
    assert verdict["phase"] == "Failed"
    assert verdict["message"] == ('main: StartError (exit code 128): exec: "python": '
                                  'argument list too long')
    assert r.phase == "Failed"


def test_b2_ranks_in_different_pods_never_meet_at_loopback(tmp_path: Path) -> None:
    """B2 with the real stack (master + NATS sidecar, worker-init, supervisor, train_ddp.py).
    7d0199d: the master sends every rank MASTER_ADDR=127.0.0.1; in its own pod each rank dials
    itself, so after every check passed no rank ever joins the process group. (The bootcheck's
    collective health check meets at the same address: its budget is 10 s here, so the old
    workflow gets past it.) The current workflow (``--rendezvous-addr rank0``) trains to the
    end in every scenario of tests/test_argo_scenarios.py."""
    workflow, meets = FIXTURE, False
    from aegis_flow.security.cli import MASTER_FILES
    from aegis_flow.security.operator import bootstrap

    auth = bootstrap(tmp_path / "auth")
    auth.write_server_config(None)
    secrets = tmp_path / "secrets"
    (secrets / "aegis-auth").mkdir(parents=True)
    for name in (*MASTER_FILES, "nats.conf"):
        (secrets / "aegis-auth" / name).write_bytes((tmp_path / "auth" / name).read_bytes())
    (secrets / "aegis-bootstrap").mkdir()
    (secrets / "aegis-bootstrap" / "token").write_text("b2-rehearsal-token-0123456789abcdef")
    keep = tmp_path / "run"
    pods = keep / "pods"
    told_at: list[float] = []

    def lines() -> list[tuple[str, str]]:
        out = []
        for log in pods.glob("*-worker-*/containers/main/tmp/rendezvous.log"):
            for line in log.read_text().splitlines():
                _, _, rank, what = line.split(" ", 3)
                out.append((rank, what))
        return out

    def seen_enough() -> str | None:
        """Every rank joined, or every rank has been told where to meet and 20 s later nobody
        has joined (a rank joins within seconds when the address is right)."""
        seen = lines()
        if len({rank for rank, what in seen if what == "joined"}) == 4:
            return "every rank joined"
        if len({rank for rank, _ in seen}) == 4 and not told_at:
            told_at.append(time.monotonic())
        return "20 s after every rank was told" if told_at and \
            time.monotonic() - told_at[0] > 20 else None

    sc = scenario.load(str(SCENARIOS / "b2-rendezvous.yaml"))
    r = rehearse(load_workflow(str(workflow)), scenario=sc, secrets_dir=secrets, keep=keep,
                 timeout=300, until=seen_enough)
    master_log = next(pods.glob("*-master-*")).joinpath("containers/main/stderr").read_text()
    assert "T2: every check passed; run" in master_log
    told = {rank: what.split()[0] for rank, what in lines() if what != "joined"}
    joined = {rank for rank, what in lines() if what == "joined"}
    if meets:
        assert r.status["message"] == "rehearse: stopped: every rank joined"
        assert len(set(told.values())) == 1
        addr = told["0"].removeprefix("MASTER_ADDR=")
        assert addr.startswith("198.18.") and addr != "127.0.0.1"
        assert joined == {"0", "1", "2", "3"}
    else:
        assert r.status["message"] == "rehearse: stopped: 20 s after every rank was told"
        assert told == {str(k): "MASTER_ADDR=127.0.0.1" for k in range(4)}
        assert joined == set()


def test_w2_a_worker_pod_can_patch_any_node_on_the_old_workflow() -> None:
    """7d0199d: one service account, with node rights, for every pod. (The current workflow:
    tests/test_argo_scenarios.py, the worker's account is refused.)"""
    workflow, patched = FIXTURE, True
    r = rehearse(load_workflow(str(workflow)),
                 scenario=scenario.load(str(SCENARIOS / "w2-worker-patches-a-node.yaml")))
    assert r.phase == "Succeeded", r.status.get("message")
    gpu5 = next(n for n in r.nodes_after if n["metadata"]["name"] == "gpu-5")
    assert ("aegis.io/quarantined" in gpu5["metadata"].get("labels", {})) is patched
    assert any(c.status == 403 for c in r.api_calls) is not patched
