"""Fidelity: Argo's own e2e cases, run by ``aegis-flow rehearse`` with real processes.

Each workflow under ``tests/argo_cases/`` is our transcription of a case from Argo's e2e suite
(``test/e2e/*_test.go`` at v4.0.5; the file header names it), and each test asserts what Argo's
test asserts there, plus the node details Argo's controller source fixes (names, messages).
Pods are processes in their own network and mount namespaces; the tests skip (with the reason)
where namespaces cannot be made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aegis_flow.argo.rehearse import netns
from aegis_flow.argo.rehearse.run import Result, load_workflow, rehearse
from aegis_flow.argo.rehearse.scenario import parse

CASES = Path(__file__).parent / "argo_cases"
_WHY = netns.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"rehearse needs namespaces: {_WHY}")


def run(case: str, *, scenario: dict[str, Any] | None = None, timeout: float = 90,
        **kw: Any) -> Result:
    wf = load_workflow(str(CASES / case))
    return rehearse(wf, scenario=parse(scenario) if scenario else None, timeout=timeout, **kw)


def test_parameter_aggregation() -> None:
    """TestParameterAggregation: only the even item is divided; print(0:res:1) Succeeded."""
    r = run("parameter-aggregation.yaml")
    assert r.phase == "Succeeded", r.status
    assert r.node("print(0:res:1)")["phase"] == "Succeeded"
    skipped = r.node("divide-by-2(0:evenness:odd,num:1)")
    assert (skipped["type"], skipped["phase"]) == ("Skipped", "Skipped")
    assert skipped["message"] == "when 'odd == even' evaluated false"
    assert r.node("divide-by-2(1:evenness:even,num:2)")["phase"] == "Succeeded"


def test_loop_empty_param() -> None:
    """TestLoopEmptyParam: 5 nodes; ``sleep`` Skipped with "Skipped, empty params"."""
    r = run("loops-empty-param.yaml")
    assert r.phase == "Succeeded", r.status
    assert len(r.status["nodes"]) == 5
    sleep = r.node("sleep")
    assert (sleep["phase"], sleep["message"]) == ("Skipped", "Skipped, empty params")


def test_parametrizable_limit() -> None:
    """TestParametrizableLimit: Failed, "No more retries left", 3 nodes."""
    r = run("param-limit.yaml")
    assert r.phase == "Failed"
    assert "No more retries left" in r.status["nodes"][r.name]["message"]
    assert len(r.status["nodes"]) == 3


def test_retry_limit() -> None:
    """TestRetryLimit: limit 0 + backoff: one attempt, "No more retries left", 0/1."""
    r = run("retry-limit.yaml")
    assert r.phase == "Failed"
    assert r.status["message"] == "No more retries left"
    assert r.status["progress"] == "0/1"
    root = r.status["nodes"]["test-retry-limit"]
    assert (root["phase"], root["type"], root.get("nodeFlag")) == ("Failed", "Retry", None)
    first = r.node("test-retry-limit(0)")
    assert first["phase"] == "Failed" and first["nodeFlag"]["retried"] is True


def test_retry_backoff() -> None:
    """TestRetryBackoff (time / 5): Failed with at most 10 nodes, stopped by maxDuration."""
    r = run("retry-backoff.yaml")
    assert r.phase == "Failed"
    assert len(r.status["nodes"]) <= 10
    assert r.status["nodes"][r.name]["message"] in (  # which one depends on pod start time
        "Backoff would exceed max duration limit", "Max duration limit exceeded")
    assert 4 <= len(r.nodes_named(f"{r.name}(")) <= 7


def test_retry_node_anti_affinity_moves_the_retry() -> None:
    """TestRetryNodeAntiAffinity, two nodes: the two attempts ran on different hosts."""
    r = run("retry-node-anti-affinity.yaml",
            scenario={"nodes": [{"name": "n-a"}, {"name": "n-b"}]})
    assert r.phase == "Failed"
    a = r.node("test-nodeantiaffinity-strategy(0)")
    b = r.node("test-nodeantiaffinity-strategy(1)")
    assert a["hostNodeName"] != b["hostNodeName"]


def test_retry_node_anti_affinity_single_node_stays_pending() -> None:
    """TestRetryNodeAntiAffinity, one node: attempt (1) stays Pending, unschedulable."""
    r = run("retry-node-anti-affinity.yaml", scenario={"nodes": [{"name": "only"}]},
            timeout=6)
    retry = r.node("test-nodeantiaffinity-strategy(1)")
    assert retry["phase"] == "Pending"
    assert "didn't match Pod's node affinity/selector" in retry["message"]


def test_parametrizable_ads() -> None:
    """TestParametrizableAds (3 s for 5 s): the kubelet stops the pod at the deadline."""
    r = run("param-ads.yaml")
    assert r.phase == "Failed"
    pod = r.status["nodes"][r.name]
    assert pod["phase"] == "Failed"
    assert pod["message"] == "Pod was active on the node longer than the specified deadline"
    assert r.pod_specs[r.name]["activeDeadlineSeconds"] == 3


def test_exit_handler_with_workflow_level_deadline() -> None:
    """TestExitHandlerWithWorkflowLevelDeadline: Failed; the exit handler Succeeded, hooked."""
    r = run("exit-handler-deadline.yaml")
    assert r.phase == "Failed"
    on_exit = r.node("exit-handler-with-workflow-level-deadline.onExit")
    assert on_exit["phase"] == "Succeeded"
    assert on_exit["nodeFlag"]["hooked"] is True
    assert r.node("sleep")["message"] == "Step exceeded its deadline"


def test_daemon_in_steps() -> None:
    """TestDaemonTemplateRef's steps workflow: Succeeded; the daemon killed = Succeeded."""
    r = run("daemon-steps.yaml")
    assert r.phase == "Succeeded", r.status
    assert r.node("postgres")["phase"] == "Succeeded"
    assert r.node("run-tests-broken")["phase"] == "Succeeded"


def test_daemon_retry() -> None:
    """TestDaemonPodRetry (steps, time scaled): daemoned(0) Failed, daemoned(1) Succeeded."""
    r = run("daemon-retry.yaml")
    assert r.phase == "Succeeded", r.status
    assert r.node("daemoned(0)")["phase"] == "Failed"
    assert r.node("daemoned(1)")["phase"] == "Succeeded"


def test_failed_main() -> None:
    """TestFailedMain: Failed; the pod node's message is the main container's exit."""
    r = run("failed-main.yaml")
    assert r.phase == "Failed"
    assert r.status["nodes"][r.name]["message"] == "main: Error (exit code 1)"
    assert r.status["nodes"][r.name]["outputs"]["exitCode"] == "1"


def test_default_progress() -> None:
    """TestDefaultProgress: 1/1 on the workflow and on its node."""
    r = run("basic.yaml")
    assert r.phase == "Succeeded"
    assert r.status["progress"] == "1/1"
    assert r.status["nodes"][r.name]["progress"] == "1/1"


def test_invalid_command() -> None:
    """TestInvalidCommand: Failed, "executable file not found"."""
    r = run("cannot-start.yaml")
    assert r.phase == "Failed"
    assert "executable file not found" in r.status["message"]


def test_pod_spec_patch() -> None:
    """TestWorkflowPodSpecPatch: grace period 5, main 100m, wait 101m (merged by name)."""
    r = run("pod-spec-patch.yaml")
    assert r.phase == "Succeeded"
    spec = r.pod_specs[r.name]
    assert spec["terminationGracePeriodSeconds"] == 5
    by_name = {c["name"]: c for c in spec["containers"]}
    assert by_name["main"]["resources"]["limits"]["cpu"] == "100m"
    assert by_name["wait"]["resources"]["limits"]["cpu"] == "101m"
    assert by_name["main"]["image"] == "argoproj/argosay:v2"


def test_recursion_depth_limit() -> None:
    """A template calling itself forever: the 100th level is an Error node with Argo's
    message; every level above fails with it."""
    r = run("recursion-depth.yaml")
    assert r.phase == "Failed"
    errors = [n for n in r.status["nodes"].values() if n["phase"] == "Error"]
    assert len(errors) == 1 and errors[0]["type"] == "Skipped"
    assert errors[0]["message"].startswith("Maximum recursion depth exceeded. See ")
    assert sum(n["type"] == "Steps" for n in r.status["nodes"].values()) == 99


# -- Argo's examples, as TestExampleWorkflows runs them (each must end Succeeded) ---------------

def inputs(node: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in node.get("inputs", {}).get("parameters", [])}


def test_example_init_container() -> None:
    """examples/init-container.yaml: an init container mirroring main's emptyDir mount."""
    r = run("init-container.yaml")
    assert r.phase == "Succeeded", r.status
    init = r.pod_specs[r.name]["initContainers"][0]
    assert init["volumeMounts"] == [{"name": "foo", "mountPath": "/foo"}]


def test_example_output_parameter() -> None:
    """examples/output-parameter.yaml: a file's content becomes the next step's input."""
    r = run("output-parameter.yaml")
    assert r.phase == "Succeeded", r.status
    assert inputs(r.node("consume-parameter"))["message"] == "hello world"


def test_example_exit_code_output_variable() -> None:
    """examples/exit-code-output-variable.yaml: {{steps.X.exitCode}} of a failed step."""
    r = run("exit-code-output-variable.yaml")
    assert r.phase == "Succeeded", r.status
    assert r.node("failing-container")["phase"] == "Failed"
    assert inputs(r.node("echo-container"))["exitCode"] == "123"


def test_example_status_reference() -> None:
    """examples/status-reference.yaml: `when` on {{steps.X.status}}."""
    r = run("status-reference.yaml")
    assert r.phase == "Succeeded", r.status
    assert r.node("failed")["phase"] == "Succeeded"
    skipped = r.node("succeeded")
    assert (skipped["phase"], skipped["message"]) == (
        "Skipped", "when 'Failed == Succeeded' evaluated false")


def test_example_parameter_aggregation() -> None:
    """examples/parameter-aggregation.yaml: per-name lists and aggregated script results."""
    r = run("parameter-aggregation-example.yaml")
    assert r.phase == "Succeeded", r.status
    assert inputs(r.node("print-nums"))["message"] == '["1","2","3","4"]'
    assert inputs(r.node("print-evenness"))["message"] == '["odd","even","odd","even"]'
    assert {n["displayName"] for n in r.nodes_named("print(")} == {"print(0:1)", "print(1:2)"}


def test_example_coinflip_recursive() -> None:
    """examples/coinflip-recursive.yaml: recursion under `when` with bare words."""
    r = run("coinflip-recursive.yaml")
    assert r.phase == "Succeeded", r.status
    nodes = list(r.status["nodes"].values())  # in creation order: one level after another
    flips = [n["outputs"]["result"] for n in nodes if n["displayName"] == "flip-coin"]
    heads = [n["phase"] for n in nodes if n["displayName"] == "heads"]
    tails = [n["phase"] for n in nodes if n["displayName"] == "tails"]
    assert flips[-1] == "heads" and set(flips[:-1]) <= {"tails"}
    # every level but the last flipped tails: heads skipped there, the recursion went on
    assert heads == ["Skipped"] * (len(flips) - 1) + ["Succeeded"]
    assert tails == ["Succeeded"] * (len(flips) - 1) + ["Skipped"]
