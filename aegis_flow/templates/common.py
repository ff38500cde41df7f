"""Shared pieces of the phase builders: names, pod scheduling, resources, env.

PURE: functions that return Hera/Argo model objects; nothing is submitted or written.
"""

from __future__ import annotations

from hera.workflows import Env, FieldEnv, Parameter
from hera.workflows import models as m

from aegis_flow.jobspec import JobSpec
from aegis_flow.templates.contract import OUTCOME_DIR
from aegis_flow.vocab import BOOTCHECK_PLAN, COLLECTIVE_CHECKS, NODE_LOCAL_PLAN

QUARANTINE_LABEL = "aegis.io/quarantined"
HOSTNAME_LABEL = "kubernetes.io/hostname"
METRICS_PORT_NAME = "http"  # the master's /metrics, /healthz, /readyz (JobSpec.metrics_port)
NATS_PORT = 4222

# template names: the Argo UI shows these
MAIN, MASTER, ATTEMPT, BOOTCHECK, WORKER, VERDICT = (
    "main", "master", "attempt", "bootcheck", "worker", "verdict")
TROUBLESHOOT, QUARANTINE, GIVE_UP, REPORT = "troubleshoot", "quarantine", "give-up", "report"

# the checks each phase runs (aegis-flow check NAMES); the collective ones need every rank
# (vocab's plans without the collectives: on Argo those run as their own steps)
BOOTCHECK_CHECKS = ",".join(c.value for c in BOOTCHECK_PLAN if c not in COLLECTIVE_CHECKS)
TROUBLESHOOT_CHECKS = ",".join(c.value for c in NODE_LOCAL_PLAN)
CHECK_OUT = f"{OUTCOME_DIR}/check.json"


def inp(name: str) -> str:
    return "{{inputs.parameters." + name + "}}"


def wf_param(name: str) -> str:
    return "{{workflow.parameters." + name + "}}"


def not_quarantined() -> m.Affinity:
    """Required node affinity: never schedule on a node labelled ``aegis.io/quarantined``."""
    return m.Affinity(node_affinity=m.NodeAffinity(
        required_during_scheduling_ignored_during_execution=m.NodeSelector(node_selector_terms=[
            m.NodeSelectorTerm(match_expressions=[
                m.NodeSelectorRequirement(key=QUARANTINE_LABEL, operator="DoesNotExist")])])))


def resources(spec: JobSpec) -> m.ResourceRequirements:
    req: dict[str, str] = {"cpu": spec.cpu, "memory": spec.memory}
    lim: dict[str, str] = {"memory": spec.memory}
    if spec.gpus_per_worker:
        req["nvidia.com/gpu"] = lim["nvidia.com/gpu"] = str(spec.gpus_per_worker)
    return m.ResourceRequirements(requests=req, limits=lim)  # type: ignore[arg-type]


def tolerations(spec: JobSpec) -> list[m.Toleration] | None:
    out = [m.Toleration(key=t.key or None, operator=t.operator, value=t.value or None,
                        effect=t.effect or None) for t in spec.tolerations]
    return out or None


def pod_env(spec: JobSpec) -> list[Env | FieldEnv]:
    """Who and where this pod is: the supervisor and checks read these."""
    return [
        FieldEnv(name="AEGIS_NODE", field_path="spec.nodeName"),
        FieldEnv(name="POD_IP", field_path="status.podIP"),
        Env(name="AEGIS_NAMESPACE", value=spec.namespace),
        Env(name="AEGIS_OUTCOME_DIR", value=OUTCOME_DIR),
    ]


def params(*names: str, **defaults: str) -> list[Parameter]:
    out = [Parameter(name=n) for n in names]
    out += [Parameter(name=n.replace("_", "-"), default=v) for n, v in defaults.items()]
    return out
