"""The contract between worker pods and the workflow: exit codes, outcomes, guards.

PURE and standard library only (plus the core's ``ExitCode``): no Hera, no I/O. The worker
supervisor writes its outcome word to ``OUTCOME_FILE`` (and its node to ``NODE_FILE``) when it
exits (the pod's own record; the job's ending is the master's decision, ``phases.ending``).
"""

from __future__ import annotations

from aegis_flow.master.model import ExitCode

# the outcome files and words are the supervisor's (aegis_flow.outcome); re-exported here
from aegis_flow.outcome import NODE_FILE as NODE_FILE
from aegis_flow.outcome import OUTCOME_BY_CODE as OUTCOME_BY_CODE
from aegis_flow.outcome import OUTCOME_DIR as OUTCOME_DIR
from aegis_flow.outcome import OUTCOME_FILE as OUTCOME_FILE
from aegis_flow.outcome import RESTARTS_FILE as RESTARTS_FILE
from aegis_flow.outcome import UNKNOWN as UNKNOWN
from aegis_flow.outcome import outcome_of as outcome_of

# exit codes the worker template's retryStrategy retries as a new pod (DESIGN.md §5)
POD_RETRY_CODES: tuple[int, ...] = (int(ExitCode.NODE_FAULT), int(ExitCode.CONTAINER_RESTART),
                                    int(ExitCode.SLOW_NODE_EVICTED))

def worker_retry_expression() -> str:
    """Argo ``retryStrategy.expression`` of the worker template (expr syntax).

    A pod that errored (node lost, pod deleted: no exit code) or exited node-fault,
    container-restart or slow-node (evicted at a checkpoint; its node quarantined by the
    master) is recreated; every other ending — success, job failed, stopped, the
    user's own code in RunIndependent — is final for the pod.
    """
    codes = " || ".join(f"asInt(lastRetry.exitCode) == {c}" for c in POD_RETRY_CODES)
    return f'lastRetry.status == "Error" || {codes}'


def master_retry_expression() -> str:
    """The master is recreated whenever it ends without having decided: with
    ``--decision-dir`` it exits 0 once the job has ended, whatever the ending (the decision is
    in its outputs); anything else — a crash, a lost node, a deleted pod (Error), NATS out of
    reach, another master still holding the job — is retried, and the new one resumes."""
    return 'lastRetry.status == "Error" || asInt(lastRetry.exitCode) != 0'
