"""The phase builders: each template carries what DESIGN.md §5 asks of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import contract
from aegis_flow.templates.checks import bootcheck_template, troubleshoot_template
from aegis_flow.templates.master import master_template, service_template
from aegis_flow.templates.recovery import quarantine_template, report_template
from aegis_flow.templates.run import worker_template

SPEC = JobSpec(image="img:1", command=("python", "train.py", "--lr", "3"), workers=4,
               gpus_per_worker=8, max_retry=3)


def built(t: Any) -> dict[str, Any]:
    out: dict[str, Any] = t._build_template().model_dump(exclude_none=True, by_alias=True)
    return out


def test_worker_runs_the_user_command_under_the_supervisor() -> None:
    w = built(worker_template(SPEC))
    cmd = w["container"]["command"]
    assert cmd[:2] == ["python3", "/aegis/aegis-supervisor.pyz"]  # the injected bundle
    assert cmd[cmd.index("--creds") + 1] == "/aegis/creds"
    assert cmd[cmd.index("--") + 1:] == ["python", "train.py", "--lr", "3"]
    assert cmd[cmd.index("--rank") + 1] == "{{inputs.parameters.rank}}"
    assert cmd[cmd.index("--world-size") + 1] == "4"
    assert w["container"]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_worker_pods_get_the_bundle_and_credentials_from_init_containers() -> None:
    w = built(worker_template(SPEC))
    init = {c["name"]: c for c in w["initContainers"]}
    assert list(init) == ["aegis-bundle", "aegis-worker-init"]
    assert init["aegis-bundle"]["command"] == ["cp", "/opt/aegis/aegis-supervisor.pyz",
                                               "/aegis/aegis-supervisor.pyz"]
    assert init["aegis-bundle"]["image"] == SPEC.aegis_image
    args = init["aegis-worker-init"]["args"]
    assert init["aegis-worker-init"]["command"] == ["aegis-flow", "worker-init"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags == {"--master": "{{workflow.name}}-master:50051",
                     "--job": "{{workflow.name}}", "--namespace": "default",
                     "--worker": "{{inputs.parameters.rank}}",
                     "--token-file": "/var/run/aegis/bootstrap/token", "--out": "/aegis/creds",
                     # 900 s connect timeout / (10 s deadline + 4 s backoff): as long as the
                     # master waits for the ranks
                     "--deadline": "10", "--retries": "65",
                     # TLS by default: the CA of the Secret aegis-grpc-tls, the master's name
                     "--tls-ca": "/var/run/aegis/grpc-tls/ca.crt",
                     "--tls-server-name": "aegis-master.default.svc"}
    vols = {v["name"]: v for v in w["volumes"]}
    assert vols["grpc-tls"]["secret"] == {"secretName": "aegis-grpc-tls", "defaultMode": 0o440,
                                          "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert vols["aegis"] == {"name": "aegis", "emptyDir": {}}
    assert vols["bootstrap-token"]["secret"]["secretName"] == "{{workflow.name}}-bootstrap"
    assert {"name": "aegis", "mountPath": "/aegis"} in w["container"]["volumeMounts"]


def test_an_image_with_aegis_flow_needs_no_bundle() -> None:
    spec = SPEC.model_copy(update={"inject_supervisor": False})
    w = built(worker_template(spec))
    assert w["container"]["command"][:2] == ["aegis-flow", "worker"]
    assert [c["name"] for c in w["initContainers"]] == ["aegis-worker-init"]
    assert built(bootcheck_template(spec))["container"]["command"] == ["aegis-flow"]


def test_check_pods_run_the_checks_from_the_bundle() -> None:
    b = built(bootcheck_template(SPEC))
    assert b["container"]["command"] == ["python3", "/aegis/aegis-supervisor.pyz"]
    assert b["container"]["args"][0] == "check"
    assert [c["name"] for c in b["initContainers"]] == ["aegis-bundle"]


def test_master_probes_readyz_on_the_metrics_port_it_is_told_to_serve() -> None:
    spec = SPEC.model_copy(update={"metrics_port": 9999})
    mt = built(master_template(spec))
    probe = mt["container"]["readinessProbe"]["httpGet"]
    assert probe == {"path": "/readyz", "port": 9999}
    args = mt["container"]["args"]
    assert args[args.index("--metrics-port") + 1] == "9999"
    assert {"containerPort": 9999, "name": "http"} in mt["container"]["ports"]
    assert args[args.index("--grpc-listen") + 1] == f"0.0.0.0:{spec.grpc_port}"
    env = {e["name"]: e for e in mt["container"]["env"]}
    assert env["AEGIS_BOOTSTRAP_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "{{workflow.name}}-bootstrap", "key": "token"}


def test_worker_retry_moves_only_this_pod_and_never_to_a_quarantined_node() -> None:
    w = built(worker_template(SPEC))
    rs = w["retryStrategy"]
    assert rs["expression"] == contract.worker_retry_expression()
    assert rs["affinity"] == {"nodeAntiAffinity": {}}
    expr = w["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert expr["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "aegis.io/quarantined", "operator": "DoesNotExist"}]
    assert "NotIn" not in json.dumps(w["affinity"]) and "podSpecPatch" not in w
    assert "maxDuration" not in rs["backoff"]  # B3: a deadline from the first pod, in Argo
    env = {e["name"]: e.get("value") for e in w["container"]["env"]}
    assert env["AEGIS_EXPECT_GPUS"] == "8"  # GPUs asked for and none usable: a node fault


def test_worker_writes_its_outcome_as_an_output_parameter() -> None:
    params = built(worker_template(SPEC))["outputs"]["parameters"]
    outs = {p["name"]: p["valueFrom"] for p in params}
    assert outs["outcome"] == {"path": contract.OUTCOME_FILE, "default": contract.UNKNOWN}
    assert outs["node"]["path"] == contract.NODE_FILE


def test_master_is_a_retried_step_behind_a_service_that_writes_its_decision() -> None:
    m = built(master_template(SPEC))
    assert "daemon" not in m and "sidecars" not in m  # state in the cluster NATS
    assert m["container"]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9464}
    args = m["container"]["args"]
    assert args[args.index("--max-retry") + 1] == "{{workflow.parameters.max-retry}}"
    assert args[args.index("--nats-url") + 1] == "nats://aegis-nats.default:4222"
    assert args[args.index("--decision-dir") + 1] == "/tmp/aegis/decision"
    assert args[args.index("--connect-timeout") + 1] == "900"
    assert args[args.index("--replace-timeout") + 1] == "900"
    assert "--slow-window" not in args  # the master's own default (60 s)
    assert m["retryStrategy"]["expression"] == contract.master_retry_expression()
    assert "maxDuration" not in m["retryStrategy"]["backoff"]
    svc = built(service_template(SPEC))
    assert svc["resource"]["action"] == "create"
    assert svc["serviceAccountName"] == "aegis-flow-setup"  # services create, no node rights


def test_a_job_file_can_name_its_own_nats_and_timeouts() -> None:
    spec = SPEC.model_copy(update={"nats_url": "nats://nats.aegis:4222", "connect_timeout": 60,
                                   "slow_window": 300})
    m = built(master_template(spec))["container"]["args"]
    assert m[m.index("--nats-url") + 1] == "nats://nats.aegis:4222"
    assert m[m.index("--slow-window") + 1] == "300"
    w = built(worker_template(spec))["container"]["command"]
    assert w[w.index("--nats-url") + 1] == "nats://nats.aegis:4222"
    # a rank waits for the master's first order longer than the master waits for it
    assert float(w[w.index("--master-timeout") + 1]) > 60


def test_bootcheck_and_troubleshoot_call_aegis_flow_check() -> None:
    b, t = built(bootcheck_template(SPEC)), built(troubleshoot_template(SPEC))
    assert b["container"]["command"] == t["container"]["command"] == [
        "python3", "/aegis/aegis-supervisor.pyz"]  # aegis-flow check, from the bundle
    assert b["container"]["args"][:2] == ["check", "runtime,env,io,gpu,rdma"]  # vocab order
    assert "--expect-gpus" in b["container"]["args"]
    assert t["nodeSelector"] == {"kubernetes.io/hostname": "{{inputs.parameters.node}}"}
    assert {"key": "aegis.io/quarantined", "operator": "Exists"} in t["tolerations"]


def test_quarantine_runs_the_nodes_cli_and_records_the_result() -> None:
    q = built(quarantine_template(SPEC))
    cmd = q["container"]["command"]
    assert cmd[:4] == ["aegis-flow", "nodes", "quarantine", "{{inputs.parameters.node}}"]
    record = cmd[cmd.index("--record") + 1]
    assert q["outputs"]["parameters"] == [
        {"name": "record", "valueFrom": {"path": record, "default": "[]"}}]
    assert q["retryStrategy"]["limit"] == "2"
    assert built(report_template(SPEC))["script"]["command"] == ["python"]


def test_outcome_words_cover_every_exit_code() -> None:
    assert contract.outcome_of(0) == "succeeded"
    assert contract.outcome_of(70) == "node-fault"
    assert contract.outcome_of(1) == "failed"  # RunIndependent: the child's own code


def test_builders_import_no_runtime_and_never_submit() -> None:
    """Builders are pure (STYLE.md 6, 10): no runtime imports, no create()/submit calls."""
    import ast

    root = Path(__file__).resolve().parent.parent / "aegis_flow"
    files = [*sorted((root / "templates").glob("*.py")), root / "workflow.py", root / "jobspec.py"]
    runtimes = ("aegis_flow.master.runtime", "aegis_flow.local", "aegis_flow.supervisor",
                "nats", "kubernetes", "torch")
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                    a.name for a in node.names]
                assert not [x for x in mods if x.startswith(runtimes)], (path.name, mods)
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("create", "submit", "create_workflow"), path.name
