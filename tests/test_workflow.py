"""The whole Workflow (DESIGN.md §5), the aegis-checks WorkflowTemplate, and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_flow.argo import lint, validate_schema
from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import cli
from aegis_flow.workflow import build_checks_template, render
from tests.argo_schema import require_schema

SPEC = JobSpec(image="img:1", command=("python", "train.py"), workers=4, max_retry=3)


@pytest.fixture(scope="module")
def wf() -> dict[str, Any]:
    return render(SPEC)


def templates(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in wf["spec"]["templates"]}


def steps(t: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for group in t["steps"] for s in group}


def test_passes_the_strict_schema_and_the_lint(wf: dict[str, Any]) -> None:
    assert lint([wf]) == []
    require_schema()
    assert validate_schema(wf) == []


def test_service_then_the_master_beside_the_ranks(wf: dict[str, Any]) -> None:
    t = templates(wf)
    main = t[wf["spec"]["entrypoint"]]["steps"]
    assert [[s["name"] for s in g] for g in main] == [
        ["master-service", "bootstrap-token"], ["master", "run"], ["quarantine"], ["give-up"]]
    assert "daemon" not in t["master"]  # W1: a daemon in a finished steps group is not retried
    assert t["master"]["metadata"]["labels"] == {"aegis.io/master": "{{workflow.name}}"}
    service = yaml.safe_load(t["master-service"]["resource"]["manifest"])
    assert service["metadata"]["name"] == "{{workflow.name}}-master"
    assert service["spec"]["selector"] == t["master"]["metadata"]["labels"]
    assert t["master-service"]["resource"]["setOwnerReference"] is True
    run = steps(t["main"])["run"]
    assert run["withSequence"] == {"count": "4"}
    assert run["continueOn"] == {"failed": True, "error": True}
    init = t["worker"]["initContainers"][-1]["args"]
    assert init[init.index("--master") + 1] == "{{workflow.name}}-master:50051"


def test_branches_read_the_decision_of_a_master_that_succeeded(wf: dict[str, Any]) -> None:
    s = steps(templates(wf)["main"])
    for name in ("quarantine", "give-up"):
        assert "'{{steps.master.status}}'" in s[name]["when"]
    assert s["quarantine"]["withParam"] == "{{steps.master.outputs.parameters.quarantined}}"
    outputs = {p["name"]: p["valueFrom"] for p in
               templates(wf)["master"]["outputs"]["parameters"]}
    assert set(outputs) == {"verdict", "quarantined", "message"}
    assert all("default" in v for v in outputs.values())


def test_each_workflow_makes_its_own_bootstrap_token(wf: dict[str, Any]) -> None:
    t = templates(wf)
    cmd = t["bootstrap-token"]["container"]["command"]
    assert cmd[:2] == ["aegis-flow", "bootstrap-token"]
    assert cmd[cmd.index("--secret") + 1] == "{{workflow.name}}-bootstrap"
    assert cmd[cmd.index("--workflow-uid") + 1] == "{{workflow.uid}}"
    env = {e["name"]: e for e in t["master"]["container"]["env"]}
    assert env["AEGIS_BOOTSTRAP_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == \
        "{{workflow.name}}-bootstrap"
    vols = {v["name"]: v for v in t["worker"]["volumes"]}
    assert vols["bootstrap-token"]["secret"]["secretName"] == "{{workflow.name}}-bootstrap"
    shared = render(SPEC.model_copy(update={"bootstrap_secret": "aegis-bootstrap"}))
    assert "bootstrap-token" not in templates(shared)
    assert {v["name"]: v for v in templates(shared)["worker"]["volumes"]}[
        "bootstrap-token"]["secret"]["secretName"] == "aegis-bootstrap"


def test_no_retry_has_a_max_duration(wf: dict[str, Any]) -> None:
    """B3: Argo reads backoff.maxDuration as a deadline from the first pod."""
    for t in wf["spec"]["templates"]:
        assert "maxDuration" not in ((t.get("retryStrategy") or {}).get("backoff") or {}), t["name"]


def test_workflow_level_settings(wf: dict[str, Any]) -> None:
    spec = wf["spec"]
    assert spec["arguments"]["parameters"] == [{"name": "max-retry", "value": "3"}]
    assert spec["podGC"] == {"strategy": "OnPodSuccess"}
    assert spec["ttlStrategy"]["secondsAfterCompletion"] == SPEC.ttl_seconds_after_completion
    assert spec["activeDeadlineSeconds"] == SPEC.active_deadline_seconds
    assert spec["onExit"] == "report" and spec["serviceAccountName"] == "aegis-flow-executor"
    # W2: only the master and the quarantine step run as the account that may patch nodes;
    # the first steps (a Service, a Secret) as the setup account; all others as the executor
    accounts = {t["name"]: t.get("serviceAccountName") for t in spec["templates"]}
    assert sorted(n for n, a in accounts.items() if a == "aegis-flow") == [
        "master", "quarantine"]
    assert sorted(n for n, a in accounts.items() if a == "aegis-flow-setup") == [
        "bootstrap-token", "master-service"]
    assert wf["metadata"]["generateName"] == "aegis-job-"


def test_checks_template_exposes_bootcheck_and_each_check() -> None:
    wt = build_checks_template(image="aegis:1").to_dict()
    names = [t["name"] for t in wt["spec"]["templates"]]
    assert names == ["bootcheck", "check-env", "check-io", "check-gpu", "check-runtime",
                     "check-rdma", "check-all"]
    assert lint([wt]) == []
    require_schema()
    assert validate_schema(wt) == []


def test_cli_render_the_done_when_command(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wf.yaml"
    rc = cli.main(["render", "--workers", "4", "--max-retry", "3", "--image", "IMG",
                   "-o", str(out), "--", "python", "train.py", "--epochs", "2"])
    assert rc == 0
    (doc,) = list(yaml.safe_load_all(out.read_text()))
    assert lint([doc]) == []
    worker = templates(doc)["worker"]["container"]["command"]
    assert worker[-4:] == ["python", "train.py", "--epochs", "2"]
    require_schema()
    assert validate_schema(doc) == []
    assert cli.main(["lint", str(out)]) == 0


def test_cli_render_from_a_job_file_with_overrides(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: llm\nimage: img:2\ncommand: [python, t.py]\nworkers: 2\n")
    out = tmp_path / "wf.yaml"
    assert cli.main(["render", "-f", str(job), "--workers", "3", "--checks-template",
                     "-o", str(out)]) == 0
    wf, wt = yaml.safe_load_all(out.read_text())
    assert wf["metadata"]["generateName"] == "llm-" and wt["kind"] == "WorkflowTemplate"
    assert steps(templates(wf)["main"])["run"]["withSequence"] == {"count": "3"}


def test_cli_render_rejects_a_bad_job_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "--image", "IMG", "--name", "Bad_Name", "--", "x"]) == 2
    assert "e.g. 'bad-name'" in capsys.readouterr().err
    assert cli.main(["render", "--image", "IMG"]) == 2
    assert "after '--' (e.g. -- python train.py)" in capsys.readouterr().err


def test_cli_lint_reports_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata: {name: x}\n"
                   "spec:\n  entrypoint: nope\n  templates:\n  - name: a\n    container:\n"
                   "      image: i\n      imagePulPolicy: Always\n")
    assert cli.main(["lint", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "[entrypoint]" in out
    require_schema()
    assert "imagePulPolicy" in out
