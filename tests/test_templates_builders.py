"""The phase builders: each template carries what DESIGN.md §5 asks of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import contract
from aegis_flow.templates.checks import bootcheck_template, troubleshoot_template
from aegis_flow.templates.master import master_template, worker_nats_url
from aegis_flow.templates.recovery import quarantine_template, report_template
from aegis_flow.templates.run import verdict_source, worker_template

SPEC = JobSpec(image="img:1", command=("python", "train.py", "--lr", "3"), workers=4,
               gpus_per_worker=8, max_retry=3)


def built(t: Any) -> dict[str, Any]:
    out: dict[str, Any] = t._build_template().model_dump(exclude_none=True, by_alias=True)
    return out


def test_worker_runs_the_user_command_under_the_supervisor() -> None:
    w = built(worker_template(SPEC))
    cmd = w["container"]["command"]
    assert cmd[:2] == ["aegis-flow", "worker"]
    assert cmd[cmd.index("--") + 1:] == ["python", "train.py", "--lr", "3"]
    assert cmd[cmd.index("--rank") + 1] == "{{inputs.parameters.rank}}"
    assert cmd[cmd.index("--world-size") + 1] == "4"
    assert w["container"]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_worker_retry_moves_only_this_pod_and_never_to_a_quarantined_node() -> None:
    w = built(worker_template(SPEC))
    rs = w["retryStrategy"]
    assert rs["expression"] == contract.worker_retry_expression()
    assert rs["affinity"] == {"nodeAntiAffinity": {}}
    expr = w["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert expr["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "aegis.io/quarantined", "operator": "DoesNotExist"}]
    # the excluded list travels only through podSpecPatch (an affinity cannot take a list)
    assert w["podSpecPatch"] == "{{inputs.parameters.pod-spec-patch}}"
    assert "NotIn" not in json.dumps(w["affinity"])


def test_worker_writes_its_outcome_as_an_output_parameter() -> None:
    params = built(worker_template(SPEC))["outputs"]["parameters"]
    outs = {p["name"]: p["valueFrom"] for p in params}
    assert outs["outcome"] == {"path": contract.OUTCOME_FILE, "default": contract.UNKNOWN}
    assert outs["node"]["path"] == contract.NODE_FILE


def test_master_is_a_daemon_with_readiness_and_retries() -> None:
    m = built(master_template(SPEC))
    assert m["daemon"] is True
    assert m["container"]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8080}
    assert "--max-retry" in m["container"]["args"]
    assert "{{workflow.parameters.max-retry}}" in m["container"]["args"]
    assert m["retryStrategy"]["expression"] == contract.master_retry_expression()
    assert [s["name"] for s in m["sidecars"]] == ["nats"]  # embedded NATS


def test_external_nats_has_no_sidecar() -> None:
    spec = SPEC.model_copy(update={"nats_url": "nats://nats.aegis:4222"})
    assert "sidecars" not in built(master_template(spec))
    assert worker_nats_url(spec) == "nats://nats.aegis:4222"
    assert worker_nats_url(SPEC) == "nats://{{steps.master.ip}}:4222"


def test_bootcheck_and_troubleshoot_call_aegis_flow_check() -> None:
    b, t = built(bootcheck_template(SPEC)), built(troubleshoot_template(SPEC))
    assert b["container"]["command"] == ["aegis-flow"]
    assert b["container"]["args"][:2] == ["check", "env,io,gpu,runtime,rdma"]
    assert "--expect-gpus" in b["container"]["args"]
    assert t["nodeSelector"] == {"kubernetes.io/hostname": "{{inputs.parameters.node}}"}
    assert {"key": "aegis.io/quarantined", "operator": "Exists"} in t["tolerations"]


def test_quarantine_labels_the_node() -> None:
    q = built(quarantine_template())
    assert q["resource"]["action"] == "patch" and q["resource"]["mergeStrategy"] == "merge"
    assert "aegis.io/quarantined: 'true'" in q["resource"]["manifest"]
    assert built(report_template(SPEC))["script"]["command"] == ["python"]


@pytest.mark.parametrize(("outcomes", "nodes", "excluded", "verdict", "bad"), [
    (["succeeded"] * 3, ["a", "b", "c"], [], "succeeded", []),
    (["succeeded", "node-fault", "succeeded"], ["a", "b", "c"], [], "quarantine", ["b"]),
    (["slow-node", "succeeded"], ["a", "b"], ["z"], "quarantine", ["a"]),
    (["job-failed", "node-fault"], ["a", "b"], [], "failed", ["b"]),
    (["stopped", "job-failed"], ["a", "b"], [], "stopped", []),
    (["container-restart", "succeeded"], ["a", "b"], [], "retry", []),
    (["unknown", "succeeded"], ["", "b"], [], "retry", []),
    ([], [], [], "retry", []),
])
def test_verdict_table(outcomes: list[str], nodes: list[str], excluded: list[str],
                       verdict: str, bad: list[str]) -> None:
    out = contract.verdict(outcomes, nodes, excluded)
    assert out["verdict"] == verdict and json.loads(out["bad-nodes"]) == bad
    grown = sorted(set(excluded) | set(bad))
    assert json.loads(out["excluded-nodes"]) == grown
    patch = json.loads(out["pod-spec-patch"])
    if not grown:
        assert patch == {}  # NotIn [] is invalid
    else:
        terms = patch["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][1]["values"] == grown


def test_the_generated_verdict_script_runs(tmp_path: Path) -> None:
    """The script embedded in the workflow, run as the verdict pod would run it."""
    runs = [{"outcome": "succeeded", "node": "n1"}, {"outcome": "node-fault", "node": "n2"}]
    env = {**os.environ, "RUNS": json.dumps(runs), "ATTEMPT": "1", "EXCLUDED": '["n0"]',
           "AEGIS_OUTCOME_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", verdict_source()], env=env, check=True,
                   capture_output=True)
    assert (tmp_path / "verdict").read_text() == "quarantine"
    assert (tmp_path / "next-attempt").read_text() == "2"
    assert json.loads((tmp_path / "excluded-nodes").read_text()) == ["n0", "n2"]


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
