"""One phase graph: the rendered Argo workflow and the local master walk the same path.

For each scenario, three walks are compared:
- ``phases.walk`` — the graph itself;
- the *rendered* workflow, executed on paper: the main template's step groups in order, each
  ``when`` guard evaluated with the master step's status and decision substituted, the
  quarantine step skipped on an empty node list as Argo does (this walk reads only the YAML,
  never ``aegis_flow.phases``);
- the *real* master state machine (``machine.step``) driven by the scenario's events: its
  phases, named with ``phases.step_of``, and its ending turned into the master's decision
  (``phases.ending``), which is what the master step's outputs carry.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from aegis_flow import phases
from aegis_flow.argo.expr import evaluate, substitute
from aegis_flow.jobspec import JobSpec
from aegis_flow.master.machine import (
    Ack,
    Error,
    Event,
    FaultClass,
    Finish,
    Phase,
    Status,
    Stop,
    initial_status,
    step,
)
from aegis_flow.workflow import render

MAX_RETRY = 2
WF = render(JobSpec(image="img", command=("python", "t.py"), workers=3, max_retry=MAX_RETRY))
TEMPLATES = {t["name"]: t for t in WF["spec"]["templates"]}


def argo_walk(verdict: str, quarantined: list[str], *, decided: bool = True) -> list[str]:
    """Run the rendered main template on paper."""
    values = {"steps.master.status": "Succeeded" if decided else "Failed",
              "steps.master.outputs.parameters.verdict": verdict,
              "steps.master.outputs.parameters.quarantined": json.dumps(quarantined)}
    path: list[str] = []
    for group in TEMPLATES["main"]["steps"]:
        for s in group:
            if "withParam" in s and not json.loads(substitute(s["withParam"], values)):
                continue  # Argo: "Skipped, empty params", before the guard is read
            if "when" in s and not evaluate(substitute(s["when"], values)):
                continue
            path.append(s["name"])
    if decided and verdict == phases.SUCCEEDED and "give-up" not in path:
        path.append(phases.SUCCEEDED)  # the workflow ends Succeeded
    return path


@pytest.mark.parametrize(("verdict", "quarantined", "decided"), [
    ("succeeded", [], True), ("failed", [], True), ("stopped", [], True),
    ("independent", [], True), ("succeeded", ["gpu-2"], True), ("failed", ["gpu-2", "gpu-3"],
                                                                True),
    ("undecided", [], False), ("failed", ["gpu-1"], False)])
def test_the_rendered_workflow_walks_the_graph(verdict: str, quarantined: list[str],
                                               decided: bool) -> None:
    assert argo_walk(verdict, quarantined, decided=decided) == phases.walk(
        verdict, quarantined=bool(quarantined), decided=decided)


def test_the_main_template_has_the_graph_steps_in_their_groups() -> None:
    groups = [[s["name"] for s in g] for g in TEMPLATES["main"]["steps"]]
    assert groups == phases.groups() == [["master-service", "bootstrap-token"],
                                         ["master", "run"], ["quarantine"], ["give-up"]]


def test_walk_refuses_an_unknown_verdict() -> None:
    with pytest.raises(ValueError, match="unknown verdict"):
        phases.walk("maybe")


def test_a_job_that_has_not_ended_has_no_decision() -> None:
    with pytest.raises(ValueError, match="has not ended"):
        phases.ending(initial_status(2, 1), "")


# -- the local master, driven through the same graph ---------------------------------------

def _start(status: Status) -> tuple[Status, list[Phase]]:
    seen = [status.phase]
    for r in range(3):
        status, _ = step(status, Ack(r, f"pod-{r}", node=f"node-{r}"))
        seen.append(status.phase)
    return status, seen


def _all(status: Status, make: Any, seen: list[Phase]) -> Status:
    for r in range(3):
        if status.phase.terminal:
            break
        status, _ = step(status, make(r, status))
        seen.append(status.phase)
    return status


def ok(r: int, s: Status) -> Event:
    return Finish(r, s.seq, ok=True)


def scenario(name: str) -> tuple[Status, list[Phase]]:
    status, seen = _start(initial_status(3, MAX_RETRY, nodes=("node-0", "node-1", "node-2")))
    status = _all(status, ok, seen)  # bootcheck passes → RunCommand
    if name == "crash-recovered":  # L1: restart in place, inside run
        status, _ = step(status, Error(1, status.seq, cause="SIGKILL"))
        seen.append(status.phase)
        status = _all(status, ok, seen)
    elif name == "too-many-crashes":
        for i in range(MAX_RETRY + 1):  # a different rank each time: every crash is L1 (the
            # same rank again would escalate to a container restart, another path)
            status, _ = step(status, Error(i % len(status.workers), status.seq))
            seen.append(status.phase)
            status = _all(status, ok, seen)
    elif name == "stopped":
        status, _ = step(status, Stop("operator"))
        seen.append(status.phase)
    elif name == "node-fault":  # a hardware diagnosis: that pod moves, the others wait
        status, _ = step(status, Error(2, status.seq, cause="xid 79"))
        seen.append(status.phase)
        status, _ = step(status, Finish(2, status.seq, ok=False, fault=FaultClass.HARDWARE))
        seen.append(status.phase)
        status, _ = step(status, Ack(2, "pod-2-g1", node="node-9"))  # the new pod elsewhere
        seen.append(status.phase)
        status = _all(status, ok, seen)
    if not status.phase.terminal:
        status = _all(status, ok, seen)  # every rank's command exits 0
    return status, seen


def local_path(seen: list[Phase]) -> list[str]:
    path: list[str] = []
    for ph in seen:
        name = phases.step_of(ph)
        if not path or path[-1] != name:
            path.append(name)
    return path


@pytest.mark.parametrize(("name", "expected", "quarantined"), [
    ("clean", "succeeded", []), ("crash-recovered", "succeeded", []),
    ("node-fault", "succeeded", ["node-2"]), ("too-many-crashes", "failed", []),
    ("stopped", "stopped", [])])
def test_the_local_master_walks_the_same_path(name: str, expected: str,
                                              quarantined: list[str]) -> None:
    """Locally the master's phases are the steps; on Argo the master step and the ranks
    run together, so the local walk (run, then its ending) is the graph's walk without the
    Argo-only steps in front (the Service, the master's own step)."""
    status, seen = scenario(name)
    assert status.phase.terminal, seen
    decision = phases.ending(status, "summary")
    assert (decision.verdict, list(decision.quarantined)) == (expected, quarantined)
    argo = argo_walk(decision.verdict, list(decision.quarantined))
    graph = phases.walk(decision.verdict, quarantined=bool(decision.quarantined))
    argo_only = {"master-service", "bootstrap-token", "master", "quarantine"}
    assert argo == graph
    assert local_path(seen) == [s for s in graph if s not in argo_only], seen


def test_every_master_phase_has_a_place_in_the_graph() -> None:
    placed = {ph for s in phases.JOB for ph in s.local} | set(phases.END_OF)
    assert placed | {Phase.INDEPENDENT} == set(Phase)  # Independent: fault tolerance is off


def test_local_status_names_the_graph_step() -> None:
    from aegis_flow.local.status import render as render_status
    from aegis_flow.master.store import encode_doc

    status, _ = scenario("crash-recovered")
    text = render_status(encode_doc(status))
    assert "phase        Succeed (step succeeded of the phase graph" in text
