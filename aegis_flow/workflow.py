"""Assemble a whole Argo Workflow from a ``JobSpec`` (DESIGN.md §5), and the reusable
``aegis-checks`` WorkflowTemplate.

PURE: builds Hera objects and plain dicts; never submits, never writes a file.

Shape (``aegis_flow.phases``)::

    main:     master-service (resource: the Service <workflow>-master, owned by the workflow)
              ∥ bootstrap-token (the workflow's own token Secret, owned by it)
              → master ∥ run ×N (continueOn failed/error: the master decides the ending)
              → quarantine ×node (the nodes the master quarantined; when it decided)
              → give-up (when it decided failed/stopped/independent, or could not decide)
    onExit:   report
"""

from __future__ import annotations

from typing import Any

from hera.workflows import Parameter, Step, Steps, Workflow, WorkflowTemplate
from hera.workflows import models as m

from aegis_flow import phases
from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import common as c
from aegis_flow.templates.checks import SINGLE_CHECKS, check_template
from aegis_flow.templates.master import (
    SERVICE_TEMPLATE,
    TOKEN_TEMPLATE,
    master_template,
    service_template,
    token_template,
)
from aegis_flow.templates.recovery import give_up_template, quarantine_template, report_template
from aegis_flow.templates.run import worker_template

CHECKS_TEMPLATE = "aegis-checks"
MASTER_STATUS = "{{steps.master.status}}"


def decision(name: str) -> str:
    return "{{steps.master.outputs.parameters." + name + "}}"


def job_steps(spec: JobSpec) -> dict[str, Step]:
    """Every step of the job by its phase-graph name, without its ``when`` guard."""
    return {
        "master-service": Step(name="master-service", template=SERVICE_TEMPLATE),
        "bootstrap-token": Step(name="bootstrap-token", template=TOKEN_TEMPLATE),
        "master": Step(name=c.MASTER, template=c.MASTER),
        "run": Step(
            name="run", template=c.WORKER,
            with_sequence=m.Sequence(count=m.IntOrString(str(spec.workers))),
            continue_on=m.ContinueOn(failed=True, error=True),
            arguments=[Parameter(name="rank", value="{{item}}")]),
        "quarantine": Step(
            name="quarantine", template=c.QUARANTINE, with_param=decision("quarantined"),
            continue_on=m.ContinueOn(failed=True),
            arguments=[Parameter(name="node", value="{{item}}"),
                       Parameter(name="reason", value="{{workflow.name}}: "
                                 + decision("message"))]),
        "give-up": Step(
            name="give-up", template=c.GIVE_UP,
            arguments=[Parameter(name="verdict", value=decision("verdict")),
                       Parameter(name="message", value=decision("message"))]),
    }


def main_template(spec: JobSpec) -> Steps:
    """The job: the phase graph's steps in their groups, each branch guarded by the master's
    decision (``phases.guard``)."""
    steps = job_steps(spec)
    groups: list[Any] = []
    for names in phases.groups():
        group = []
        for name in names:
            if name == "bootstrap-token" and spec.bootstrap_secret:
                continue  # a Secret shared by jobs, made by the operator
            s = steps[name]
            if name in ("quarantine", "give-up"):
                s.when = phases.guard(name, MASTER_STATUS, decision("verdict"))
            group.append(s)
        groups.append(group if len(group) > 1 else group[0])
    return Steps(name=c.MAIN, sub_steps=groups)


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
            main_template(spec), service_template(spec),
            *([] if spec.bootstrap_secret else [token_template(spec)]), master_template(spec),
            worker_template(spec), quarantine_template(spec), give_up_template(spec),
            report_template(spec),
        ],
    )


def build_checks_template(*, image: str, namespace: str | None = None) -> WorkflowTemplate:
    """``aegis-checks``: ``bootcheck`` and ``check-<name>`` for each check, for templateRef.

    ``image`` is the **aegis-flow image** (the job's ``aegis_image``): every template runs
    ``aegis-flow check`` in it (input ``aegis-image``, defaulting to it), never in a caller's
    image; the templates that check GPUs request, tolerate and expect ``gpus`` of them
    (``templates.checks.check_template``)."""
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
