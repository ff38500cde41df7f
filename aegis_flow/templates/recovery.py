"""The recovery phases: quarantine (label and taint a node), resume (the recursive attempt step),
give-up (end a failed attempt visibly) and report (onExit).

PURE: returns Hera templates and steps; nothing is submitted.
"""

from __future__ import annotations

from hera.workflows import Container, Env, Parameter, RetryStrategy, Script, Step
from hera.workflows import models as m

from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import common as c
from aegis_flow.templates import contract

QUARANTINE_RECORD = f"{contract.OUTCOME_DIR}/quarantine.json"


def quarantine_template(spec: JobSpec) -> Container:
    """Quarantine one node with ``aegis-flow nodes quarantine`` (the kubernetes client: label,
    taint and annotate it; needs the nodes get/patch RBAC of ``aegis-flow install``). The
    record — node, reason, time, by — is the step's ``record`` output, so the job's status in
    Argo shows every node it quarantined. Transient API errors are retried."""
    return Container(
        name=c.QUARANTINE, image=spec.aegis_image,
        service_account_name=spec.service_account,  # nodes get/patch
        command=["aegis-flow", "nodes", "quarantine", c.inp("node"),
                 "--reason", c.inp("reason"), "--by", "{{workflow.name}}",
                 "--record", QUARANTINE_RECORD],
        inputs=c.params("node", "reason"),
        outputs=[Parameter(name="record", value_from=m.ValueFrom(path=QUARANTINE_RECORD,
                                                                 default="[]"))],
        retry_strategy=RetryStrategy(limit="2", retry_policy="OnFailure",
                                     backoff=m.Backoff(duration="5s", factor=m.IntOrString("2"))),
        resources=m.ResourceRequirements(requests={"cpu": "100m", "memory": "128Mi"}),  # type: ignore[dict-item]
    )


def resume_step() -> Step:
    """``attempt`` again with attempt+1 and the grown exclusion list (its ``when`` guard —
    escalate and ``attempt < max-retry``, the recursion guard — comes from the phase graph)."""
    return Step(
        name="resume",
        template=c.ATTEMPT,
        arguments=[
            Parameter(name="attempt", value="{{steps.verdict.outputs.parameters.next-attempt}}"),
            Parameter(name="excluded-nodes",
                      value="{{steps.verdict.outputs.parameters.excluded-nodes}}"),
            Parameter(name="pod-spec-patch",
                      value="{{steps.verdict.outputs.parameters.pod-spec-patch}}"),
            Parameter(name="nats-url", value=c.inp("nats-url")),
            Parameter(name="master-addr", value=c.inp("master-addr")),
        ])


def give_up_template(spec: JobSpec) -> Container:
    """Fail the attempt with a message naming the verdict (so the workflow shows Failed)."""
    return Container(
        name=c.GIVE_UP, image=spec.aegis_image,
        command=["python", "-c",
                 "import sys; sys.exit('aegis-flow: the job ended ' + sys.argv[1] + "
                 "' after attempt ' + sys.argv[2])",
                 c.inp("verdict"), c.inp("attempt")],
        inputs=c.params("verdict", "attempt"))


REPORT_SOURCE = '''
import json, os
print(json.dumps({k: os.environ.get(k, "") for k in
                  ("WORKFLOW", "STATUS", "DURATION", "FAILURES")}, indent=1))
'''


def report_template(spec: JobSpec) -> Script:
    """onExit: a one-screen summary in the log of the exit handler."""
    return Script(
        name=c.REPORT, image=spec.aegis_image, command=["python"], source=REPORT_SOURCE,
        add_cwd_to_sys_path=False,
        env=[Env(name="WORKFLOW", value="{{workflow.name}}"),
             Env(name="STATUS", value="{{workflow.status}}"),
             Env(name="DURATION", value="{{workflow.duration}}"),
             Env(name="FAILURES", value="{{workflow.failures}}")])
