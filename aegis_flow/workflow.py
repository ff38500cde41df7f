"""Assemble a whole Argo Workflow from a ``JobSpec`` (DESIGN.md §5), and the reusable
``aegis-checks`` WorkflowTemplate.

PURE: builds Hera objects and plain dicts; never submits, never writes a file.

Shape::

    main:     master (daemon, top level, spans every attempt)  →  attempt(0, [], {})
    attempt:  bootcheck ×N → run ×N (continueOn failed) → verdict
              → troubleshoot ×bad (when quarantine) → quarantine ×bad (when quarantine)
              → resume = attempt(attempt+1, grown list) (when escalate && attempt < max-retry)
              → give-up (when failed/stopped, or escalate with no retries left)
    onExit:   report
"""

from __future__ import annotations

from typing import Any

from hera.workflows import Parameter, Step, Steps, Workflow, WorkflowTemplate
from hera.workflows import models as m

from aegis_flow import phases
from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import common as c
from aegis_flow.templates.checks import (
    SINGLE_CHECKS,
    bootcheck_template,
    check_template,
    troubleshoot_template,
)
from aegis_flow.templates.master import master_addr, master_template, worker_nats_url
from aegis_flow.templates.recovery import (
    give_up_template,
    quarantine_template,
    report_template,
    resume_step,
)
from aegis_flow.templates.run import verdict_template, worker_template

CHECKS_TEMPLATE = "aegis-checks"
VERDICT_PARAM = "{{steps.verdict.outputs.parameters.verdict}}"
BAD_NODES = "{{steps.verdict.outputs.parameters.bad-nodes}}"


def _ranks(spec: JobSpec) -> m.Sequence:
    return m.Sequence(count=m.IntOrString(str(spec.workers)))


def attempt_steps(spec: JobSpec) -> dict[str, Step]:
    """Every step of an attempt by its phase-graph name, without its ``when`` guard."""
    return {
        "bootcheck": Step(
            name="bootcheck", template=c.BOOTCHECK, with_sequence=_ranks(spec),
            arguments=[Parameter(name="rank", value="{{item}}"),
                       Parameter(name="pod-spec-patch", value=c.inp("pod-spec-patch"))]),
        "run": Step(
            name="run", template=c.WORKER, with_sequence=_ranks(spec),
            continue_on=m.ContinueOn(failed=True, error=True),
            arguments=[Parameter(name="rank", value="{{item}}"),
                       Parameter(name="nats-url", value=c.inp("nats-url")),
                       Parameter(name="master-addr", value=c.inp("master-addr")),
                       Parameter(name="pod-spec-patch", value=c.inp("pod-spec-patch"))]),
        "verdict": Step(
            name="verdict", template=c.VERDICT,
            arguments=[Parameter(name="runs", value="{{steps.run.outputs.parameters}}"),
                       Parameter(name="attempt", value=c.inp("attempt")),
                       Parameter(name="excluded-nodes", value=c.inp("excluded-nodes"))]),
        "troubleshoot": Step(
            name="troubleshoot", template=c.TROUBLESHOOT, with_param=BAD_NODES,
            continue_on=m.ContinueOn(failed=True),
            arguments=[Parameter(name="node", value="{{item}}")]),
        "quarantine": Step(
            name="quarantine", template=c.QUARANTINE, with_param=BAD_NODES,
            continue_on=m.ContinueOn(failed=True),
            arguments=[Parameter(name="node", value="{{item}}"),
                       Parameter(name="reason",
                                 value="{{workflow.name}} attempt " + c.inp("attempt"))]),
        "resume": resume_step(),
        "give-up": Step(
            name="give-up", template=c.GIVE_UP,
            arguments=[Parameter(name="verdict", value=VERDICT_PARAM),
                       Parameter(name="attempt", value=c.inp("attempt"))]),
    }


def attempt_template(spec: JobSpec) -> Steps:
    """One attempt of the job, recursive through ``resume``: the steps of the phase graph
    (``aegis_flow.phases``) in its order, each after-verdict step guarded by its branches."""
    steps = attempt_steps(spec)
    ordered: list[Any] = []
    for ps in phases.ATTEMPT:
        s = steps[ps.name]
        if ps.after_verdict:
            s.when = phases.guard(ps.name, VERDICT_PARAM, c.inp("attempt"),
                                  c.wf_param("max-retry"))
        ordered.append(s)
    return Steps(
        name=c.ATTEMPT,
        inputs=c.params("attempt", "nats-url", "master-addr", excluded_nodes="[]",
                        pod_spec_patch="{}"),
        sub_steps=ordered)


def main_template(spec: JobSpec) -> Steps:
    return Steps(name=c.MAIN, sub_steps=[
        Step(name=c.MASTER, template=c.MASTER),
        Step(name="attempt", template=c.ATTEMPT, arguments=[
            Parameter(name="attempt", value="0"),
            Parameter(name="nats-url", value=worker_nats_url(spec)),
            Parameter(name="master-addr", value=master_addr(spec)),
            Parameter(name="excluded-nodes", value="[]"),
            Parameter(name="pod-spec-patch", value="{}")]),
    ])


def build_workflow(spec: JobSpec) -> Workflow:
    """The training job as one Workflow; ``max-retry`` is a workflow parameter."""
    return Workflow(
        generate_name=f"{spec.name}-",
        namespace=spec.namespace,
        labels={"app.kubernetes.io/managed-by": "aegis-flow", "aegis.io/job": spec.name},
        entrypoint=c.MAIN,
        on_exit=c.REPORT,
        # every pod runs the user's code or ours without node rights (Argo's executor needs
        # only workflowtaskresults); the master and the quarantine step name the node-patching
        # account themselves
        service_account_name=spec.executor_service_account,
        arguments=[Parameter(name="max-retry", value=str(spec.max_retry))],
        active_deadline_seconds=spec.active_deadline_seconds,
        ttl_strategy=m.TTLStrategy(seconds_after_completion=spec.ttl_seconds_after_completion),
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        templates=[
            main_template(spec), master_template(spec), attempt_template(spec),
            bootcheck_template(spec), worker_template(spec), verdict_template(spec),
            troubleshoot_template(spec), quarantine_template(spec), give_up_template(spec),
            report_template(spec),
        ],
    )


def build_checks_template(*, image: str, namespace: str | None = None) -> WorkflowTemplate:
    """``aegis-checks``: ``bootcheck`` and ``check-<name>`` for each check, for templateRef."""
    templates: list[Any] = [check_template("bootcheck", c.BOOTCHECK_CHECKS, image=image)]
    templates += [check_template(f"check-{w}", w, image=image) for w in SINGLE_CHECKS]
    return WorkflowTemplate(
        name=CHECKS_TEMPLATE, namespace=namespace,
        labels={"app.kubernetes.io/managed-by": "aegis-flow"},
        templates=templates)


def render(spec: JobSpec) -> dict[str, Any]:
    """The Workflow manifest as a plain dict (what ``render`` writes as YAML)."""
    out: dict[str, Any] = build_workflow(spec).to_dict()
    return out


def to_yaml(*manifests: Workflow | WorkflowTemplate) -> str:
    """Hera's human-ordered YAML (multi-line strings as ``|`` blocks), ``---`` between."""
    texts = [str(m_.to_yaml()) for m_ in manifests]
    return "---\n".join(t if t.endswith("\n") else t + "\n" for t in texts)
