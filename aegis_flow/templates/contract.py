"""The contract between worker pods and the workflow: exit codes, outcomes, guards.

PURE and standard library only (plus the core's ``ExitCode``): no Hera, no I/O. The worker
supervisor writes its outcome word to ``OUTCOME_FILE`` (and its node to ``NODE_FILE``) when it
exits; the ``verdict`` step reduces the per-rank outcomes with :func:`verdict` (its source is
embedded into the generated workflow, so the code here is the code that runs in the cluster).
"""

from __future__ import annotations

from aegis_flow.master.model import ExitCode

# the outcome files and words are the supervisor's (aegis_flow.outcome); re-exported here
from aegis_flow.outcome import NODE_FILE as NODE_FILE
from aegis_flow.outcome import OUTCOME_BY_CODE as OUTCOME_BY_CODE
from aegis_flow.outcome import OUTCOME_DIR as OUTCOME_DIR
from aegis_flow.outcome import OUTCOME_FILE as OUTCOME_FILE
from aegis_flow.outcome import UNKNOWN as UNKNOWN
from aegis_flow.outcome import outcome_of as outcome_of

# exit codes the worker template's retryStrategy retries as a new pod (DESIGN.md §5)
POD_RETRY_CODES: tuple[int, ...] = (int(ExitCode.NODE_FAULT), int(ExitCode.CONTAINER_RESTART))

# verdicts of one attempt (the phase graph's branch labels); ESCALATE ones resume
from aegis_flow.phases import ESCALATE as ESCALATE  # noqa: E402
from aegis_flow.phases import FAILED as FAILED  # noqa: E402
from aegis_flow.phases import QUARANTINE as QUARANTINE  # noqa: E402
from aegis_flow.phases import RETRY as RETRY  # noqa: E402
from aegis_flow.phases import STOPPED as STOPPED  # noqa: E402
from aegis_flow.phases import SUCCEEDED as SUCCEEDED  # noqa: E402


def worker_retry_expression() -> str:
    """Argo ``retryStrategy.expression`` of the worker template (expr syntax).

    A pod that errored (node lost, pod deleted: no exit code) or exited node-fault or
    container-restart is recreated; every other ending — success, job failed, stopped, the
    user's own code in RunIndependent — is final for the pod.
    """
    codes = " || ".join(f"asInt(lastRetry.exitCode) == {c}" for c in POD_RETRY_CODES)
    return f'lastRetry.status == "Error" || {codes}'


def master_retry_expression() -> str:
    """The master daemon is recreated unless it ended the job on purpose (0, 73, 74)."""
    final = (0, int(ExitCode.JOB_FAILED), int(ExitCode.STOPPED))
    keep = " && ".join(f"asInt(lastRetry.exitCode) != {c}" for c in final)
    return f'lastRetry.status == "Error" || ({keep})'


def verdict(outcomes: list[str], nodes: list[str], excluded: list[str]) -> dict[str, str]:
    """Reduce one attempt's per-rank outcomes to a verdict and the next attempt's inputs.

    Returns string values (Argo parameters): ``verdict``; ``bad-nodes`` (JSON list of nodes to
    quarantine); ``excluded-nodes`` (JSON list, grown); ``pod-spec-patch`` (a pod-spec patch
    whose required node affinity keeps workers off quarantined and excluded nodes - ``{}`` when
    the list is empty, since ``NotIn []`` is invalid).
    """
    import json

    if outcomes and all(o == "succeeded" for o in outcomes):
        result = "succeeded"
    elif "stopped" in outcomes:
        result = "stopped"
    elif "job-failed" in outcomes:
        result = "failed"
    elif any(o in ("node-fault", "slow-node") for o in outcomes):
        result = "quarantine"
    else:
        result = "retry"  # container restarts exhausted, a lost pod, RunIndependent failure
    bad = sorted({n for o, n in zip(outcomes, nodes, strict=False)
                  if n and o in ("node-fault", "slow-node")})
    grown = sorted(set(excluded) | set(bad))
    patch: dict[str, object] = {}
    if grown:
        patch = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "aegis.io/quarantined", "operator": "DoesNotExist"},
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": grown},
            ]}]}}}}
    return {"verdict": result, "bad-nodes": json.dumps(bad), "excluded-nodes": json.dumps(grown),
            "pod-spec-patch": json.dumps(patch, sort_keys=True)}
