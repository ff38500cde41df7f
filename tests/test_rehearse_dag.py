"""DAG templates and ``templateRef`` in ``aegis-flow rehearse``, against Argo's own cases.

Each workflow under ``tests/argo_cases/`` named here is our transcription of an Argo v4.0.5 e2e
case or example (the file header names it). The tests assert what Argo's test asserts, plus
the node details Argo's controller source decides (``workflow/controller/dag.go``,
``workflow/common/ancestry.go``, ``workflow/templateresolution/context.go``), cited per test.
Pods are processes in their own namespaces; the tests skip where namespaces cannot be made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aegis_flow.argo.rehearse import netns
from aegis_flow.argo.rehearse.run import (
    RehearseError,
    Result,
    load_templates,
    load_workflow,
    rehearse,
)
from aegis_flow.argo.rehearse.scenario import parse
from aegis_flow.argo.rehearse.spec import Unsupported, check_workflow

CASES = Path(__file__).parent / "argo_cases"
_WHY = netns.why_unavailable()
needs_netns = pytest.mark.skipif(_WHY is not None, reason=f"rehearse needs namespaces: {_WHY}")


def run(case: str, *, scenario: dict[str, Any] | None = None, timeout: float = 90,
        templates: tuple[str, ...] = (), **kw: Any) -> Result:
    wf = load_workflow(str(CASES / case))
    wts = [t for f in templates for t in load_templates(str(CASES / f))]
    return rehearse(wf, scenario=parse(scenario) if scenario else None, timeout=timeout,
                    templates=wts, **kw)


def names(r: Result, ids: list[str] | None) -> list[str]:
    return sorted(r.status["nodes"][i]["displayName"] for i in ids or [])


@needs_netns
def test_dag_diamond() -> None:
    """examples/dag-diamond.yaml: Succeeded. ``connectDependencies`` makes each task a child of
    its dependencies' outbound nodes (D of both B and C; A of the DAG node); the DAG's
    outbound nodes are its target (leaf) task's, ``findLeafTaskNames`` /
    ``updateOutboundNodesForTargetTasks``."""
    r = run("dag-diamond.yaml")
    assert r.phase == "Succeeded", r.status
    root = r.status["nodes"][r.name]
    assert root["type"] == "DAG" and names(r, root["children"]) == ["A"]
    assert names(r, r.node("A").get("children")) == ["B", "C"]
    assert names(r, r.node("B").get("children")) == ["D"]
    assert names(r, r.node("C").get("children")) == ["D"]
    assert names(r, root["outboundNodes"]) == ["D"]
    assert r.node("D")["inputs"]["parameters"][0]["value"] == "D"
    assert r.status["progress"] == "4/4"


@needs_netns
def test_dag_depends() -> None:
    """TestDAGDepends: should-execute-1/2 Succeeded, should-not-execute Omitted ("omitted:
    depends condition not met", a Skipped-type node, ``executeDAGTask``); ``P || F`` runs once
    both are fulfilled even though F Failed (``evaluateDependsLogic``); F is no target, so the
    DAG and the workflow Succeed (``assessDAGPhase`` over the leaves)."""
    r = run("dag-depends.yaml")
    assert r.node("should-execute-1")["phase"] == "Succeeded"
    assert r.node("should-execute-2")["phase"] == "Succeeded"
    omitted = r.node("should-not-execute")
    assert (omitted["type"], omitted["phase"], omitted["message"]) == (
        "Skipped", "Omitted", "omitted: depends condition not met")
    # "should-execute-2.Succeeded || should-not-execute": the bare name expands to
    # (…Succeeded || …Skipped || …Daemoned), false, but the first operand holds
    assert r.node("should-execute-3")["phase"] == "Succeeded"
    assert r.node("F")["phase"] == "Failed"
    assert r.node("F")["message"] == "main: Error (exit code 1)"
    assert r.phase == "Succeeded", r.status


@needs_netns
def test_continue_on_fail_dag() -> None:
    """TestContinueOnFailDag: F Failed, P Succeeded, the workflow Succeeded: ``dependencies:
    [F]`` with F ``continueOn.failed`` expands to ``(F.Succeeded || F.Skipped || F.Daemoned ||
    F.Failed)`` (``expandDependency``)."""
    r = run("dag-continue-on-fail.yaml")
    assert r.node("F")["phase"] == "Failed"
    assert r.node("P")["phase"] == "Succeeded"
    assert r.phase == "Succeeded", r.status


@needs_netns
def test_dag_omitted_output_ref() -> None:
    """TestDAGOmittedOutputRef: stage-a Succeeded, stage-b Omitted, stage-c Succeeded; stage-c
    got stage-b's declared output as "" (``buildLocalScopeFromTask``: Skipped/Omitted ancestors
    without outputs) and stage-a's through ``{{tasks.stage-a.outputs.parameters.…}}``."""
    r = run("dag-omitted-output-ref.yaml")
    assert r.phase == "Succeeded", r.status
    assert r.node("stage-a")["phase"] == "Succeeded"
    assert r.node("stage-b")["phase"] == "Omitted"
    c = r.node("stage-c")
    assert c["phase"] == "Succeeded"
    got = {p["name"]: p["value"] for p in c["inputs"]["parameters"]}
    assert got == {"message-from-a": "hello from stage A", "message-from-b": ""}


@needs_netns
def test_loops_dag_task_group() -> None:
    """examples/loops-dag.yaml: B with withItems is a TaskGroup (Succeeded once every B(i:x) is)
    whose children are B(0:foo), B(1:bar), B(2:baz) (``expandTask``, ``processItem``); C
    depends on the group and is a child of each of them (``getOutboundNodes`` of a
    TaskGroup)."""
    r = run("loops-dag.yaml")
    assert r.phase == "Succeeded", r.status
    group = r.node("B")
    assert (group["type"], group["phase"]) == ("TaskGroup", "Succeeded")
    assert names(r, group["children"]) == ["B(0:foo)", "B(1:bar)", "B(2:baz)"]
    for kid in ("B(0:foo)", "B(1:bar)", "B(2:baz)"):
        assert names(r, r.node(kid).get("children")) == ["C"]
    assert r.node("B(1:bar)")["inputs"]["parameters"][0]["value"] == "bar"


@needs_netns
def test_failed_root_fails_the_diamond() -> None:
    """dag-diamond with A failing (a scenario stand-in): B and C are Omitted (``depends: "A"``
    is ``A.Succeeded || A.Skipped || A.Daemoned``), D Omitted too, and the DAG Failed: the
    Omitted target D inherits its branch's phase, Failed (``assessDAGPhase``)."""
    r = run("dag-diamond.yaml", scenario={"pods": [
        {"match": "*.A", "containers": {"main": {"command": ["sh", "-c", "exit 3"]}}}]})
    assert r.node("A")["message"] == "main: Error (exit code 3)"
    for task in ("B", "C", "D"):
        assert r.node(task)["phase"] == "Omitted"
    assert r.status["nodes"][r.name]["phase"] == "Failed"
    assert r.phase == "Failed"


@needs_netns
def test_nested_workflow_template() -> None:
    """TestNestedWorkflowTemplate: Succeeded. A templateRef switches the template context to
    that WorkflowTemplate, so its steps' ``template: whalesay-inner-template`` resolves there,
    and its own templateRef to the second WorkflowTemplate (``ResolveTemplate`` /
    ``WithTemplateHolder``); a node from a templateRef records it and no templateName
    (``initializeExecutableNode``)."""
    r = run("workflow-template-nested.yaml", templates=("workflow-templates-nested.yaml",))
    assert r.phase == "Succeeded", r.status
    outer = r.node("call-whalesay-template")
    assert outer["templateRef"] == {"name": "workflow-template-nested-template",
                                    "template": "whalesay-template"}
    assert "templateName" not in outer
    pods = [n for n in r.status["nodes"].values() if n["type"] == "Pod"]
    assert len(pods) == 1
    assert pods[0]["templateRef"]["name"] == "workflow-template-whalesay-template"
    assert pods[0]["inputs"]["parameters"][0]["value"] == "hello from nested"


@needs_netns
def test_templates_from_the_scenario() -> None:
    """The scenario's ``workflowTemplates:`` (a file, relative to the scenario) serve
    templateRef the same way as ``--templates``."""
    r = run("workflow-template-nested.yaml", scenario={"workflowTemplates": [
        str(CASES / "workflow-templates-nested.yaml")]})
    assert r.phase == "Succeeded", r.status


def test_refused_before_running() -> None:
    """What rehearse refuses is refused before anything runs: a ClusterWorkflowTemplate
    reference, a dependency naming no task (validate.go), a WorkflowTemplate that is not one,
    a templateRef to a WorkflowTemplate that was not given (Argo's validation at submission)."""
    wf = load_workflow(str(CASES / "dag-diamond.yaml"))
    wf["spec"]["templates"][0]["dag"]["tasks"][1]["templateRef"] = {
        "name": "x", "template": "y", "clusterScope": True}
    with pytest.raises(Unsupported, match="clusterScope"):
        check_workflow(wf)
    wf = load_workflow(str(CASES / "dag-continue-on-fail.yaml"))
    wf["spec"]["templates"][0]["dag"]["tasks"][1]["dependencies"] = ["nope"]
    with pytest.raises(Unsupported, match="dependency 'nope' not defined"):
        check_workflow(wf)
    with pytest.raises(RehearseError, match="expected a WorkflowTemplate"):
        rehearse(load_workflow(str(CASES / "dag-diamond.yaml")), templates=[wf])
    with pytest.raises(RehearseError, match="WorkflowTemplate workflow-template-nested-template"
                                            ", which was not given"):
        rehearse(load_workflow(str(CASES / "workflow-template-nested.yaml")))
