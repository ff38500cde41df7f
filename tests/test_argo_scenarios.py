"""The rendered training workflow, through the faults that decide real outcomes, on the local
Argo executor (``aegis-flow rehearse``) with the real stack.

Every scenario renders ``workflows/training.yaml``'s shape for a 2-rank job (8 GPUs per rank,
a shared checkpoint claim) and runs it on a seven-node cluster (``tests/argo_scenarios``):
Argo's controller rules as v4.0.5 implements them, pods as real processes in their own network
namespaces, the cluster NATS of ``aegis-flow install`` as a Pod behind a Service, this
checkout's master, worker-init and supervisor, and ``examples/train_ddp.py`` training with
gloo. Each asserts the workflow's phase, the node tree, the master's decision (its output
parameters and its log) and the nodes' labels.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_flow.argo.rehearse import netns, scenario
from aegis_flow.argo.rehearse.run import Result, rehearse
from aegis_flow.jobspec import JobSpec
from aegis_flow.workflow import render

HERE = Path(__file__).parent
STACK = HERE / "argo_scenarios" / "_stack.yaml"
FAKE_NVML = HERE / "fixtures" / "fake_nvml"
NATS_SERVER = Path(sys.executable).parent / "nats-server"
QUARANTINED = "aegis.io/quarantined"
_WHY = netns.why_unavailable()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(_WHY is not None, reason=f"rehearse needs namespaces: {_WHY}"),
]

JOB = JobSpec(
    name="llm", image="registry.example.com/team/train:1.0",
    command=("python3", "train.py", "--steps", "120", "--step-time", "0.1",
             "--checkpoint-every", "10"),
    workers=2, gpus_per_worker=8, max_retry=3, checkpoint_claim="llm-checkpoints",
    tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
    connect_timeout=120, replace_timeout=120)


def workflow(**changes: Any) -> dict[str, Any]:
    return render(JOB.model_copy(update=changes))


def secrets(tmp: Path) -> Path:
    """The Secrets `aegis-flow install --create-secrets` makes: the NATS operator keys with
    the server's config, and the bootstrap token."""
    from aegis_flow.security.cli import MASTER_FILES
    from aegis_flow.security.operator import bootstrap

    auth = bootstrap(tmp / "auth")
    auth.write_server_config(None)
    out = tmp / "secrets"
    (out / "aegis-auth").mkdir(parents=True)
    for name in (*MASTER_FILES, "nats.conf"):
        (out / "aegis-auth" / name).write_bytes((tmp / "auth" / name).read_bytes())
    (out / "aegis-bootstrap").mkdir()
    (out / "aegis-bootstrap" / "token").write_text("scenario-token-0123456789abcdef")
    # the credential exchange is TLS by default: the CA and the master's certificate that
    # install --create-secrets makes (security/tls.py)
    from aegis_flow.security import tls

    (out / "aegis-grpc-tls").mkdir()
    for name, text in tls.ensure(tmp / "grpc-tls", "aegis-master.default.svc").items():
        (out / "aegis-grpc-tls" / name).write_text(text)
    return out


def stack(tmp: Path, *, pods: list[dict[str, Any]] = (), faults: list[dict[str, Any]] = (),
          parameters: dict[str, str] | None = None, env: dict[str, str] | None = None
          ) -> scenario.Scenario:
    """The cluster of ``_stack.yaml`` with this machine's paths, plus the scenario's pods
    rules (first, so they win), faults, parameters and worker env."""
    doc = yaml.safe_load(STACK.read_text())
    doc["include"] = str((STACK.parent / doc["include"]).resolve())
    doc["images"] = {k: {"workingDir": str((STACK.parent / v["workingDir"]).resolve())}
                     for k, v in doc["images"].items()}
    doc["objects"][0]["spec"]["containers"][0]["command"] = [str(NATS_SERVER)]
    base = {"PYTHONPATH": str(FAKE_NVML), "FAKE_NVML_GPUS": "8", **(env or {})}
    doc["pods"] = [{**rule, "env": {**base, **rule.get("env", {})}} for rule in pods] + [
        {"template": "worker", "env": base}]
    if faults:
        doc["faults"] = list(faults)
    if parameters:
        doc["parameters"] = parameters
    path = tmp / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return scenario.load(str(path))


PICTURES = HERE.parent / "docs" / "scenarios"


def run(tmp: Path, sc: scenario.Scenario, wf: dict[str, Any] | None = None, *,
        picture: str = "") -> Result:
    """Rehearse; with ``$AEGIS_WRITE_PICTURES`` set, also write what the Argo UI would show
    (the node tree as ``argo get`` prints it, and the graph) to docs/scenarios/PICTURE.*."""
    import os

    from aegis_flow.argo.rehearse import view

    r = rehearse(wf or workflow(), scenario=sc, secrets_dir=secrets(tmp), keep=tmp / "run",
                 timeout=240)
    if picture and os.environ.get("AEGIS_WRITE_PICTURES"):
        PICTURES.mkdir(exist_ok=True)
        tree = "\n".join(line.rstrip() for line in view.tree_text(r.name, r.status).splitlines())
        (PICTURES / f"{picture}.txt").write_text(tree.rstrip() + "\n")
        view.write_svg(r.name, r.status, PICTURES / f"{picture}.svg")
    return r


def outputs(node: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p.get("value", "") for p in (node.get("outputs") or {}).get(
        "parameters", [])}


def pods_of(r: Result, prefix: str) -> list[dict[str, Any]]:
    return sorted((n for n in r.status["nodes"].values()
                   if n["type"] == "Pod" and n["displayName"].startswith(prefix)),
                  key=lambda n: n["displayName"])


def master_log(tmp: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(
        (tmp / "run" / "pods").glob("*-master-*/containers/main/stderr")))


def labelled(r: Result) -> set[str]:
    return {n["metadata"]["name"] for n in r.nodes_after
            if QUARANTINED in (n["metadata"].get("labels") or {})}


def skipped(r: Result, name: str) -> str:
    n = r.node(name)
    assert n["phase"] == "Skipped", n
    return str(n.get("message", ""))


def story(r: Result, lines: int = 25) -> str:
    """What a failed rehearsal left: each node's phase and message, and the end of every pod's
    main container's stderr (the master's decisions, the supervisors' orders), so that a run
    that failed on a busy machine says where it stopped."""
    out = [f"{n['displayName']}: {n['phase']} {n.get('message', '')}".rstrip()
           for n in r.status.get("nodes", {}).values()]
    if r.workdir is not None:
        for err in sorted((r.workdir / "pods").glob("*/containers/main/stderr")):
            tail = err.read_text(errors="replace").splitlines()[-lines:]
            out += [f"--- {err.parts[-4]}", *tail]
    return "\n".join(out)


def assert_succeeded_clean(r: Result) -> dict[str, str]:
    assert r.phase == "Succeeded", f"{r.status.get('message')}\n{story(r)}"
    for name in ("master-service", "master"):
        assert r.node(name)["phase"] == "Succeeded"
    decision = outputs(r.node("master"))
    assert decision["verdict"] == "succeeded"
    assert skipped(r, "give-up").startswith("when ")
    return decision


def test_a_clean_run_of_two_ranks(tmp_path: Path) -> None:
    r = run(tmp_path, stack(tmp_path), picture="clean")
    decision = assert_succeeded_clean(r)
    assert decision["quarantined"] == "[]"
    assert "restarted 0 times" in decision["message"]
    assert skipped(r, "quarantine") == "Skipped, empty params"
    assert [p["phase"] for p in pods_of(r, "run(")] == ["Succeeded", "Succeeded"]
    assert [outputs(p)["restarts"] for p in pods_of(r, "run(")] == ["0", "0"]
    assert r.node("bootstrap-token")["phase"] == "Succeeded"  # this workflow's own token
    assert [p["displayName"] for p in pods_of(r, "master(")] == ["master(0)"]
    assert "T2: every check passed; run" in master_log(tmp_path)
    # the credential exchange ran over TLS (the default), checked for the master's name
    assert "credentials: gRPC on port 50051 (TLS)" in master_log(tmp_path)
    assert labelled(r) == set()


def test_a_crash_is_recovered_in_place(tmp_path: Path) -> None:
    r = run(tmp_path, stack(tmp_path, env={"FAULT": "crash:1:4"}), picture="in-place")
    decision = assert_succeeded_clean(r)
    assert "restarted 1 times" in decision["message"], decision
    # in place: the same two pods from start to end, none recreated
    assert [p["displayName"] for p in pods_of(r, "run(")] == ["run(0:0)(0)", "run(1:1)(0)"]
    # every rank restarted its command in place once, in the same pods
    assert [outputs(p)["restarts"] for p in pods_of(r, "run(")] == ["1", "1"]
    assert labelled(r) == set()


def test_a_gpu_lost_after_training_for_a_while_moves_only_that_pod(tmp_path: Path) -> None:
    """The old workflow's maxDuration (review B3; 2 min, scaled to 6 s in
    test_rehearse_7d0199d) would have refused this retry: rank 1 fails 8 s into training."""
    r = run(tmp_path, stack(tmp_path, env={"FAULT": "xid:1:8"}), picture="hardware-fault")
    decision = assert_succeeded_clean(r)
    first, second = pods_of(r, "run(1:1)")
    assert (first["phase"], first["message"]) == ("Failed", "main: Error (exit code 70)")
    assert second["phase"] == "Succeeded"
    assert second["hostNodeName"] != first["hostNodeName"]
    bad = first["hostNodeName"]
    assert decision["quarantined"] == f'["{bad}"]'
    assert labelled(r) == {bad}
    step = r.node(f"quarantine(0:{bad})")
    assert step["phase"] == "Succeeded"
    # the master had quarantined it already: the step records that, and changes nothing
    assert '"already-quarantined"' in outputs(step)["record"], outputs(step)
    assert [p["displayName"] for p in pods_of(r, "run(0:0)")] == ["run(0:0)(0)"]


def test_a_slow_node_is_evicted_right_after_the_next_checkpoint_and_the_rank_moves(
        tmp_path: Path) -> None:
    """Rank 1's first node is slow: every forward of its model takes 60 ms longer (a
    throttled node; ``FAULT=slow:1:60``, its first pod only). The master marks it slow after
    the job's 3 s ``slow_window`` (T13s) and keeps training until the next checkpoint
    completes (rank 0's supervisor sees ``ckpt-<step>.pt`` in the shared claim), then evicts
    it (T13e): its node is quarantined as slow and the pod exits 72, which the worker
    template's retry recreates on another node; both ranks resume from that checkpoint. The
    forward times come from the pre-warmed interpreter; train_ddp reports its steps with
    ``progress.step`` and saves right after them (the checkpoint reports used to be dropped
    as "beyond every step the ranks have reported" until the supervisor sent the steps
    first: the eviction then never came)."""
    wf = workflow(slow_window=3, command=(
        "python3", "train.py", "--steps", "120", "--step-time", "0.1",
        "--checkpoint-every", "10", "--keep", "3"))  # ckpt-<step>.pt: what the supervisor sees
    args = next(t for t in wf["spec"]["templates"] if t["name"] == "master")["container"]["args"]
    assert args[args.index("--slow-window") + 1] == "3"
    r = run(tmp_path, stack(tmp_path, env={"FAULT": "slow:1:60"}), wf,
            picture="slow-node")
    decision = assert_succeeded_clean(r)
    log = master_log(tmp_path).splitlines()

    def first(pattern: str) -> int:
        return next(i for i, line in enumerate(log) if re.search(pattern, line))

    marked = first(r"T13s: rank 1 is slow \(forward [\d.]+ ms vs its peers' median")
    evicted = first(r"T13e: rank 1 is being replaced \(slow\)")
    # evicted only once a checkpoint completed after the mark: never before one
    ckpts = [i for i, line in enumerate(log[:evicted])
             if re.search(r"checkpoint at step \d+$", line)]
    assert ckpts and marked < ckpts[-1] < evicted, "\n".join(log)
    at = int(log[ckpts[-1]].rsplit(" ", 1)[1])
    first_pod, second_pod = pods_of(r, "run(1:1)")
    assert (first_pod["phase"], first_pod["message"]) == ("Failed", "main: Error (exit code 72)")
    assert second_pod["phase"] == "Succeeded"
    slow = first_pod["hostNodeName"]
    assert second_pod["hostNodeName"] != slow
    assert any(f"node {slow} of rank 1 quarantined (slow)" in line for line in log)
    assert decision["quarantined"] == f'["{slow}"]'
    assert labelled(r) == {slow}
    (node,) = [n for n in r.nodes_after if n["metadata"]["name"] == slow]
    assert node["metadata"]["annotations"]["aegis.io/quarantine-reason"] == "slow node of rank 1"
    assert "restarted 0 times" in decision["message"], decision  # an eviction is no failure
    assert [p["displayName"] for p in pods_of(r, "run(0:0)")] == ["run(0:0)(0)"]
    # rank 0 in place and rank 1 in its new pod resumed from a checkpoint the eviction waited
    # for (or one rank 0 saved before it stopped), not from the start
    resumed = [int(step) for out in sorted((tmp_path / "run" / "pods").glob(
        "*-worker-*/containers/main/stdout"))
        for step in re.findall(r"resumed from step (\d+)", out.read_text())]
    assert len(resumed) == 2 and resumed[0] == resumed[1] >= at, resumed


def test_a_node_that_fails_the_bootcheck_is_quarantined_and_the_rank_moves(
        tmp_path: Path) -> None:
    """Rank 1's first node has lost its GPUs (NVML sees none of the 8 it asked for)."""
    sc = stack(tmp_path, pods=[{"template": "worker", "host": "gpu-1",
                                "env": {"FAKE_NVML_GPUS": "0"}}])
    r = run(tmp_path, sc, picture="bootcheck-node-fault")
    decision = assert_succeeded_clean(r)
    broken = [p for p in pods_of(r, "run(") if p["hostNodeName"] == "gpu-1"]
    assert len(broken) == 1 and broken[0]["message"] == "main: Error (exit code 70)"
    assert decision["quarantined"] == '["gpu-1"]'
    assert labelled(r) == {"gpu-1"}
    assert "T3" in master_log(tmp_path)


def test_retries_exhausted_give_up_with_the_masters_reason(tmp_path: Path) -> None:
    r = run(tmp_path, stack(tmp_path, env={"FAULT": "crash-always:1:3"},
                            parameters={"max-retry": "1"}), picture="retries-exhausted")
    assert r.phase == "Failed"
    assert r.node("master")["phase"] == "Succeeded"  # it decided
    decision = outputs(r.node("master"))
    assert decision["verdict"] == "failed", decision
    give_up = r.node("give-up")
    assert give_up["phase"] == "Failed"
    assert give_up["message"].startswith("main: Error (exit code 1): the job ended failed: "), \
        give_up  # the master's one-line reason, as the termination message
    # a failed pod keeps its last self-reported progress: the job's restarts of max-retry
    assert {p.get("progress") for p in pods_of(r, "run(")} == {"1/1"}
    assert labelled(r) == set()


def test_the_master_pod_killed_mid_run_comes_back_and_resumes(tmp_path: Path) -> None:
    """The master pod is killed once training runs; Argo recreates it (the step's
    retryStrategy), the Service follows the new pod, and it resumes from the status it
    stored in the cluster NATS. The ranks train on meanwhile: no rank's pod is recreated.
    (Whether a rank is restarted in place depends on whether its heartbeats reach NATS in
    time while the machine is loaded: the rehearsal's Services are a userspace proxy.)"""
    sc = stack(tmp_path, faults=[{"template": "master", "when-log": "T2: every check passed",
                                  "action": "kill"}])
    r = run(tmp_path, sc, picture="master-killed")
    decision = assert_succeeded_clean(r)
    first, second = pods_of(r, "master(")
    assert (first["phase"], first["message"]) == ("Failed", "main: Error (exit code 137)")
    assert second["phase"] == "Succeeded"
    log = master_log(tmp_path)
    assert "resumed from stored status: RunCommand" in log
    assert decision["verdict"] == "succeeded"
    assert [p["displayName"] for p in pods_of(r, "run(")] == ["run(0:0)(0)", "run(1:1)(0)"]


def test_a_deleted_worker_pod_is_recreated_and_the_job_recovers(tmp_path: Path) -> None:
    sc = stack(tmp_path, faults=[{"template": "worker", "match": "*run(1:1)*",
                                  "when-log": "restart_count 0", "after": 6,
                                  "action": "delete-pod"}])
    r = run(tmp_path, sc, picture="pod-deleted")
    decision = assert_succeeded_clean(r)
    first, second = pods_of(r, "run(1:1)")
    assert first["phase"] == "Error" and "deleted" in first["message"], first
    assert second["phase"] == "Succeeded"
    assert decision["quarantined"] == "[]"
    assert [p["displayName"] for p in pods_of(r, "run(0:0)")] == ["run(0:0)(0)"]


def test_a_worker_pod_cannot_patch_nodes(tmp_path: Path) -> None:
    """W2 on the current workflow: the user's code in a worker pod tries to quarantine gpu-5
    with the pod's own service-account token (the executor account): 403, the node untouched.
    Stand-ins for the master (it decides at once) and the training: no NATS traffic needed."""
    decide = ("mkdir -p /tmp/www /tmp/aegis/decision && echo ok > /tmp/www/readyz && "
              "printf succeeded > /tmp/aegis/decision/verdict && "
              "printf '[]' > /tmp/aegis/decision/quarantined && "
              "printf 'job Succeed' > /tmp/aegis/decision/message && cd /tmp/www && "
              "(python3 -m http.server 9464 & sleep 8; kill $!)")
    grab = "aegis-flow nodes quarantine gpu-5 --reason takeover --by user-code; true"
    sc = stack(tmp_path, pods=[
        {"template": "master", "containers": {"main": {"command": ["sh", "-c", decide],
                                                        "args": []}}},
        {"template": "worker", "containers": {
            "aegis-worker-init": {"command": ["true"], "args": []},
            "main": {"command": ["sh", "-c", grab], "args": []}}}])
    r = run(tmp_path, sc)
    assert r.phase == "Succeeded", r.status.get("message")
    assert any(c.status == 403 for c in r.api_calls)
    assert labelled(r) == set()
    accounts = {spec.get("serviceAccountName") for spec in r.pod_specs.values()}
    assert "aegis-flow-executor" in accounts and "aegis-flow" in accounts
    for nid, spec in r.pod_specs.items():
        template = r.status["nodes"][nid].get("templateName")
        assert (spec.get("serviceAccountName") == "aegis-flow") is (
            template in ("master", "quarantine")), template


def test_aegis_flow_stop_ends_the_job_stopped(tmp_path: Path) -> None:
    """An operator runs `aegis-flow stop` against the cluster NATS (from the cluster network,
    as through `kubectl port-forward`) with the aegis-auth Secret's keys, once rank 0 has
    trained 30 steps: every rank quits (74), the master decides `stopped`, give-up fails the
    workflow with the reason."""
    stop = ["aegis-flow", "stop", "{workflow}", "--namespace", "default",
            "--nats-url", "nats://{svc:aegis-nats.default}:4222",
            "--auth-dir", "{secrets}/aegis-auth", "--reason", "maintenance window"]
    sc = stack(tmp_path, faults=[{"template": "worker", "match": "*run(0:0)*",
                                  "when-log": "step 30 ", "action": "exec",
                                  "command": stop}])
    r = run(tmp_path, sc, picture="stopped")
    (fired,) = r.faults
    assert fired["rc"] == 0, fired
    assert r.phase == "Failed"
    assert r.node("master")["phase"] == "Succeeded"
    decision = outputs(r.node("master"))
    assert decision["verdict"] == "stopped", decision
    assert "maintenance window" in decision["message"]
    give_up = r.node("give-up")
    assert give_up["phase"] == "Failed", give_up
    assert "the job ended stopped: " in give_up["message"], give_up
    assert "maintenance window" in give_up["message"]
    assert {p["message"] for p in pods_of(r, "run(")} == {"main: Error (exit code 74)"}
    assert labelled(r) == set()
