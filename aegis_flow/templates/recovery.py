"""The branches after the master's decision: quarantine (label and taint a node the master
quarantined: idempotent, and recorded on the step), give-up (end the workflow Failed with the
master's message) and report (onExit).

PURE: returns Hera templates and steps; nothing is submitted.
"""

from __future__ import annotations

from hera.workflows import Container, Env, Parameter, RetryStrategy, Script
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
        tolerations=c.tolerations(spec), node_selector=spec.node_selector or None,
    )


GIVE_UP_MESSAGE = "/tmp/termination-log"  # the kubelet's termination message: the UI shows it
GIVE_UP_SOURCE = (
    "import sys; verdict, message = sys.argv[1:3]; "
    "text = f'the job ended {verdict}: {message}'; "
    f"open('{GIVE_UP_MESSAGE}', 'w').write(text); "
    "sys.exit('aegis-flow: ' + text)")


def give_up_template(spec: JobSpec) -> Container:
    """End the workflow Failed, saying why: the master's verdict and one-line message, as the
    container's termination message, which Argo puts in the node's message."""
    return Container(
        name=c.GIVE_UP, image=spec.aegis_image, termination_message_path=GIVE_UP_MESSAGE,
        command=["python", "-c", GIVE_UP_SOURCE, c.inp("verdict"), c.inp("message")],
        inputs=c.params("verdict", "message"),
        resources=m.ResourceRequirements(requests={"cpu": "50m", "memory": "32Mi"}),  # type: ignore[dict-item]
        tolerations=c.tolerations(spec), node_selector=spec.node_selector or None)


REPORT_SOURCE = '''
import json, os
print(json.dumps({k: os.environ.get(k, "") for k in
                  ("WORKFLOW", "STATUS", "DURATION")}, indent=1))
'''


def report_template(spec: JobSpec) -> Script:
    """onExit: a one-screen summary in the log of the exit handler. (Not
    ``{{workflow.failures}}``: a JSON entry per failed node, which past a few hundred failed
    pods would not fit in one environment variable, and the container would not start.)"""
    return Script(
        name=c.REPORT, image=spec.aegis_image, command=["python"], source=REPORT_SOURCE,
        add_cwd_to_sys_path=False,
        env=[Env(name="WORKFLOW", value="{{workflow.name}}"),
             Env(name="STATUS", value="{{workflow.status}}"),
             Env(name="DURATION", value="{{workflow.duration}}")],
        tolerations=c.tolerations(spec), node_selector=spec.node_selector or None)
