"""The commands the workflow templates run parse with the real command-line parsers.

A flag renamed in a CLI (the master, the supervisor, worker-init, the checks, ``nodes``) but
not in a template would only show on a cluster; here every rendered command line, with its
``{{…}}`` placeholders replaced by sample values, is parsed by the parser that will read it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.jobspec import JobSpec
from aegis_flow.k8s.api import FakeNodeApi
from aegis_flow.k8s.client import KubeNodeApi
from aegis_flow.workflow import render

SAMPLE = {"inputs.parameters.rank": "1", "inputs.parameters.nats-url": "nats://10.0.0.5:4222",
          "inputs.parameters.master-addr": "10.0.0.5:50051", "inputs.parameters.node": "n-7",
          "inputs.parameters.reason": "wf-abc attempt 0", "workflow.name": "wf-abc",
          "workflow.parameters.max-retry": "3"}
WF = render(JobSpec(image="img", command=("python", "train.py", "--lr", "3"), workers=4,
                    gpus_per_worker=2, max_retry=3))
T = {t["name"]: t for t in WF["spec"]["templates"]}
# the same job with mutual TLS on the credential exchange
WF_TLS = render(JobSpec(image="img", command=("python", "train.py"), workers=4,
                        grpc_tls_secret="grpc-tls", grpc_tls_client_secret="grpc-client"))
T_TLS = {t["name"]: t for t in WF_TLS["spec"]["templates"]}
# plaintext gRPC, asked for by name (the default is TLS with the Secret aegis-grpc-tls)
WF_PLAIN = render(JobSpec(image="img", command=("python", "train.py"), workers=4,
                          grpc_plaintext=True))
T_PLAIN = {t["name"]: t for t in WF_PLAIN["spec"]["templates"]}


def fill(argv: list[str]) -> list[str]:
    out = [re.sub(r"\{\{([^}]+)\}\}", lambda m: SAMPLE[m.group(1).strip()], a) for a in argv]
    assert not any("{{" in a for a in out), out
    return out


def test_the_worker_command_parses_with_the_supervisor() -> None:
    from aegis_flow.supervisor.__main__ import parse

    c = T["worker"]["container"]
    argv = fill(c["command"])
    assert argv[:2] == ["python3", "/aegis/aegis-supervisor.pyz"]
    cfg, outcome_dir = parse(argv[2:])
    assert (cfg.rank, cfg.world_size, cfg.job) == (1, 4, "wf-abc")
    assert cfg.command == ("python", "train.py", "--lr", "3")
    assert cfg.creds == "/aegis/creds"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["AEGIS_OUTCOME_DIR"] == "/tmp/aegis"  # the supervisor's --outcome-dir default


def test_worker_init_parses_with_worker_init() -> None:
    from aegis_flow.security.worker_init import build_parser

    init = {i["name"]: i for i in T["worker"]["initContainers"]}["aegis-worker-init"]
    argv = fill(init["command"] + init["args"])
    assert argv[:2] == ["aegis-flow", "worker-init"]
    a = build_parser().parse_args(argv[2:])
    assert (a.master, a.job, a.worker, a.out) == ("wf-abc-master:50051", "wf-abc", "1",
                                                  "/aegis/creds")  # the master's Service
    assert a.token_file == "/var/run/aegis/bootstrap/token"


def test_worker_init_tls_flags_parse_with_worker_init() -> None:
    from aegis_flow.security.worker_init import build_parser

    init = {i["name"]: i for i in T_TLS["worker"]["initContainers"]}["aegis-worker-init"]
    a = build_parser().parse_args(fill(init["command"] + init["args"])[2:])
    assert a.master == "wf-abc-master:50051"
    assert (a.tls_ca, a.tls_server_name) == ("/var/run/aegis/grpc-tls/ca.crt",
                                             "aegis-master.default.svc")
    assert (a.tls_cert, a.tls_key) == ("/var/run/aegis/grpc-tls-client/tls.crt",
                                       "/var/run/aegis/grpc-tls-client/tls.key")
    plain = {i["name"]: i for i in T_PLAIN["worker"]["initContainers"]}["aegis-worker-init"]
    b = build_parser().parse_args(fill(plain["command"] + plain["args"])[2:])
    assert (b.tls_ca, b.tls_cert, b.tls_key, b.tls_server_name) == ("", "", "", "")
    default = {i["name"]: i for i in T["worker"]["initContainers"]}["aegis-worker-init"]
    c = build_parser().parse_args(fill(default["command"] + default["args"])[2:])
    assert (c.tls_ca, c.tls_cert, c.tls_server_name) == (
        "/var/run/aegis/grpc-tls/ca.crt", "", "aegis-master.default.svc")  # TLS by default


def test_the_quarantine_step_parses_with_aegis_flow() -> None:
    from aegis_flow.cli import build_parser

    argv = fill(T["quarantine"]["container"]["command"])
    a = build_parser().parse_args(argv[1:])
    assert (a.nodes_command, a.names, a.reason, a.by) == ("quarantine", ["n-7"],
                                                          "wf-abc attempt 0", "wf-abc")
    assert a.record == "/tmp/aegis/quarantine.json"


def run_master_main(c: dict[str, Any], tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The real master entry point on the container's command line, up to the moment it would
    start (Master is replaced): what it would have started with."""
    import aegis_flow.master.__main__ as master_main
    from aegis_flow.security.operator import bootstrap

    argv = fill(c["command"] + c["args"])
    assert argv[:3] == ["python", "-m", "aegis_flow.master"]
    auth = tmp_path / "auth"
    bootstrap(auth)
    args = argv[3:]
    args[args.index("--auth-dir") + 1] = str(auth)  # the pod's emptyDir, here a real auth dir
    monkeypatch.setenv("AEGIS_BOOTSTRAP_TOKEN", "t" * 32)
    seen: dict[str, Any] = {}

    class Capture:
        def __init__(self, cfg: Any, *, security: Any = None, nodes: Any = None,
                     placement: Any = None) -> None:
            seen.update(cfg=cfg, security=security, nodes=nodes, placement=placement)

        async def run(self) -> int:
            return 0

        def request_stop(self, by: str) -> None:  # the signal handlers' target
            seen.update(stopped_by=by)

    monkeypatch.setattr(master_main, "Master", Capture)
    monkeypatch.setattr(KubeNodeApi, "connect", classmethod(lambda cls, **kw: FakeNodeApi()))
    assert master_main.main(args) == 0
    return seen


def test_the_master_tls_flags_configure_its_grpc_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = run_master_main(T_TLS["master"]["container"], tmp_path, monkeypatch)["security"].cfg
    assert (cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) == (
        "/var/run/aegis/grpc-tls/tls.crt", "/var/run/aegis/grpc-tls/tls.key",
        "/var/run/aegis/grpc-tls/ca.crt")
    plain = run_master_main(T_PLAIN["master"]["container"], tmp_path / "plain", monkeypatch)
    assert (plain["security"].cfg.tls_cert, plain["security"].cfg.tls_client_ca) == ("", "")
    default = run_master_main(T["master"]["container"], tmp_path / "default", monkeypatch)
    assert (default["security"].cfg.tls_cert, default["security"].cfg.tls_client_ca) == (
        "/var/run/aegis/grpc-tls/tls.crt", "")  # TLS by default, not mutual


def test_the_master_command_parses_and_configures_the_master(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real master entry point up to the moment it would start (Master is replaced)."""
    c = T["master"]["container"]
    seen = run_master_main(c, tmp_path, monkeypatch)
    cfg = seen["cfg"]
    assert (cfg.job, cfg.workers, cfg.max_retry, cfg.metrics_port) == ("wf-abc", 4, 3, 9464)
    probe = c["readinessProbe"]["httpGet"]
    assert probe == {"path": "/readyz", "port": cfg.metrics_port}
    assert isinstance(seen["nodes"], FakeNodeApi)  # --quarantine-nodes: the kubernetes client
    security = seen["security"]  # --auth-dir: it serves SyncWorkerCreds, where workers dial
    from aegis_flow.master.placement import PodsByAddress

    # where ranks run: from the pod behind each credential exchange, not from heartbeats (F1)
    assert isinstance(seen["placement"], PodsByAddress)
    assert security.placement is seen["placement"]
    assert security.cfg.grpc_listen == "0.0.0.0:50051"
    assert security.cfg.token == "t" * 32  # from the Secret, through the environment
    # workers get the cluster NATS in their credentials, as the master itself dials it
    assert security.cfg.advertise_nats_urls == ("nats://aegis-nats.default:4222",)
    assert cfg.nats_url == "nats://aegis-nats.default:4222"
    assert (cfg.connect_timeout, cfg.replace_timeout) == (900, 900)
    assert cfg.decision_dir == "/tmp/aegis/decision"  # → the master step's outputs
    outputs = {p["name"]: p["valueFrom"]["path"] for p in T["master"]["outputs"]["parameters"]}
    assert outputs == {n: f"{cfg.decision_dir}/{n}" for n in ("verdict", "quarantined",
                                                               "message")}


def test_a_jobs_slow_window_configures_the_master(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wf = render(JobSpec(image="img", command=("python", "train.py"), workers=4, slow_window=5))
    c = next(t for t in wf["spec"]["templates"] if t["name"] == "master")["container"]
    assert run_master_main(c, tmp_path, monkeypatch)["cfg"].slow_window == 5
    # the default renders no flag: the master's own default holds
    assert run_master_main(T["master"]["container"], tmp_path / "default",
                           monkeypatch)["cfg"].slow_window == 60


def test_nproc_per_node_reaches_the_supervisor_and_the_pod_asks_for_its_gpus() -> None:
    from aegis_flow.supervisor.__main__ import parse

    wf = render(JobSpec(image="img", command=("python", "train.py"), workers=4,
                        gpus_per_worker=8, nproc_per_node=8))
    c = next(t for t in wf["spec"]["templates"] if t["name"] == "worker")["container"]
    cfg, _ = parse(fill(c["command"])[2:])
    assert (cfg.nproc_per_node, cfg.world_size, cfg.rank) == (8, 4, 1)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # the default renders no flag: one rank per worker, as before
    default, _ = parse(fill(T["worker"]["container"]["command"])[2:])
    assert default.nproc_per_node == 1
    assert "--nproc-per-node" not in T["worker"]["container"]["command"]
