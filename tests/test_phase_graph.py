"""One phase graph: the rendered Argo workflow and the local master walk the same path.

For each scenario, three walks are compared:
- ``phases.walk`` — the graph itself;
- the *rendered* workflow, executed on paper: the attempt template's steps in order, each
  ``when`` guard evaluated with the verdict substituted, ``resume`` recursing into the next
  attempt (this walk reads only the YAML, never ``aegis_flow.phases``);
- the *real* master state machine (``machine.step``) driven by the scenario's events: its
  phases, named with ``phases.step_of``, and its ending turned into the workers' exit codes,
  outcome words and the attempt's verdict exactly as the pods would report them.
``verdict`` is a step only on Argo (a daemon step has no outputs, so the pods' outcomes are
reduced by a step); locally the master decides, so it is left out of the local comparison.
"""

from __future__ import annotations

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
    Outcome,
    Phase,
    Status,
    Stop,
    initial_status,
    step,
)
from aegis_flow.outcome import outcome_of, quit_exit_code
from aegis_flow.templates.contract import verdict
from aegis_flow.workflow import render

MAX_RETRY = 2
WF = render(JobSpec(image="img", command=("python", "t.py"), workers=3, max_retry=MAX_RETRY))
TEMPLATES = {t["name"]: t for t in WF["spec"]["templates"]}


def argo_walk(verdicts: list[str], attempt: int = 0) -> list[str]:
    """Run the rendered attempt template on paper."""
    path: list[str] = []
    for group in TEMPLATES["attempt"]["steps"]:
        for s in group:
            if "when" in s:
                values = {"steps.verdict.outputs.parameters.verdict": verdicts[attempt],
                          "inputs.parameters.attempt": str(attempt),
                          "workflow.parameters.max-retry": WF["spec"]["arguments"][
                              "parameters"][0]["value"]}
                if not evaluate(substitute(s["when"], values)):
                    continue
            path.append(s["name"])
            if s["template"] == "attempt":
                path += argo_walk(verdicts, attempt + 1)
    if path[-1] == "verdict" and verdicts[attempt] == phases.SUCCEEDED:
        path.append(phases.SUCCEEDED)  # no step runs; the workflow ends Succeeded
    return path


@pytest.mark.parametrize("verdicts", [
    ["succeeded"], ["failed"], ["stopped"], ["quarantine", "succeeded"],
    ["retry", "quarantine", "succeeded"], ["retry", "retry", "retry"],
    ["quarantine", "quarantine", "quarantine"], ["quarantine", "failed"]])
def test_the_rendered_workflow_walks_the_graph(verdicts: list[str]) -> None:
    assert argo_walk(verdicts) == phases.walk(verdicts, max_retry=MAX_RETRY)


def test_the_attempt_template_has_the_graph_steps_in_order() -> None:
    names = [s["name"] for g in TEMPLATES["attempt"]["steps"] for s in g]
    assert names == phases.step_names()


def test_walk_refuses_impossible_histories() -> None:
    with pytest.raises(ValueError, match="left over"):
        phases.walk(["succeeded", "failed"], max_retry=2)
    with pytest.raises(ValueError, match="has not ended"):
        phases.walk(["retry"], max_retry=2)
    with pytest.raises(ValueError, match="unknown verdict"):
        phases.walk(["maybe"], max_retry=2)


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


def pods_verdict(status: Status) -> str:
    """What the worker pods would write at the end, reduced as the verdict step does."""
    if status.phase is Phase.SUCCEED:
        outcome = Outcome.SUCCESS
    else:
        outcome = Outcome.STOPPED if status.stop_reason else Outcome.FAILED
    words = [outcome_of(quit_exit_code(outcome.value)) for _ in status.workers]
    return verdict(words, [p.node for p in status.workers], [])["verdict"]


@pytest.mark.parametrize(("name", "expected"), [
    ("clean", "succeeded"), ("crash-recovered", "succeeded"), ("node-fault", "succeeded"),
    ("too-many-crashes", "failed"), ("stopped", "stopped")])
def test_the_local_master_walks_the_same_path(name: str, expected: str) -> None:
    status, seen = scenario(name)
    assert status.phase.terminal, seen
    v = pods_verdict(status)
    assert v == expected
    argo = [s for s in argo_walk([v]) if s != "verdict"]
    graph = [s for s in phases.walk([v], max_retry=MAX_RETRY) if s != "verdict"]
    assert local_path(seen) == argo == graph, seen


def test_every_master_phase_has_a_place_in_the_graph() -> None:
    placed = {ph for s in phases.ATTEMPT for ph in s.local} | set(phases.END_OF)
    assert placed | {Phase.INDEPENDENT} == set(Phase)  # Independent: fault tolerance is off


def test_local_status_names_the_graph_step() -> None:
    from aegis_flow.local.status import render as render_status
    from aegis_flow.master.store import encode_doc

    status, _ = scenario("crash-recovered")
    text = render_status(encode_doc(status))
    assert "phase        Succeed (step succeeded of the phase graph" in text
