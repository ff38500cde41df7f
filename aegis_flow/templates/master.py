"""The master phase: a Service named after the workflow, and the master step beside the ranks.

The master is an ordinary long-running step (not a daemon: Argo does not retry a daemon in a
steps group that has completed, and counts a daemon that exits 0 as Failed; review W1), in
the same step group as the ranks' pods. It keeps its status in the cluster NATS (JetStream,
``aegis-flow install``), so a master pod that dies is recreated by its ``retryStrategy`` and
resumes from the stored status while the ranks keep training. Workers reach it at the Service
``<workflow>-master``, created by a resource step and owned by the workflow (deleted with it),
which follows whichever master pod is ready. When the job ends, whatever the ending, the master
writes its decision as output parameters and exits 0: the branches read the outputs of a step
that succeeded (review B1).

PURE: returns Hera templates; nothing is submitted.
"""

from __future__ import annotations

import yaml
from hera.workflows import Container, FieldEnv, Parameter, Resource, RetryStrategy
from hera.workflows import models as m

from aegis_flow.jobspec import SLOW_WINDOW, JobSpec
from aegis_flow.templates import common as c
from aegis_flow.templates import contract, inject

MASTER_LABEL = "aegis.io/master"
SERVICE_TEMPLATE = "master-service"
DECISION_DIR = f"{contract.OUTCOME_DIR}/decision"
# the master step's outputs: the decision (phases.Ending.outputs), with what a master that
# never decided leaves (the branches test the step's status before reading them)
DECISION_OUTPUTS = {"verdict": "undecided", "quarantined": "[]",
                    "message": "the master did not decide"}


def service_name() -> str:
    """The Service in front of the master: the workflow's name + ``-master`` (a DNS label,
    at most 63 characters: JobSpec names are at most 40, generateName adds 6)."""
    return "{{workflow.name}}-master"


def master_addr(spec: JobSpec) -> str:
    """``HOST:PORT`` of the master's SyncWorkerCreds, for worker-init: the Service."""
    return f"{service_name()}:{spec.grpc_port}"


def master_args(spec: JobSpec) -> list[str]:
    return ["--job", "{{workflow.name}}", "--namespace", spec.namespace,
            "--workers", str(spec.workers), "--max-retry", c.wf_param("max-retry"),
            "--nats-url", spec.cluster_nats_url,
            "--metrics-port", str(spec.metrics_port),
            "--auth-dir", inject.AUTH_DIR, "--token-env", "AEGIS_BOOTSTRAP_TOKEN",
            "--grpc-listen", f"0.0.0.0:{spec.grpc_port}", "--quarantine-nodes",
            # each rank is a pod with its own loopback: meet at rank 0's pod address (B2)
            "--rendezvous-addr", "rank0",
            # pod-sized timeouts (B4, W3): scheduling, an image pull, the init containers
            "--connect-timeout", str(spec.connect_timeout),
            "--replace-timeout", str(spec.replace_timeout),
            # the slow mark's window (T13s), only when not the master's own default
            *(["--slow-window", str(spec.slow_window)]
              if spec.slow_window != SLOW_WINDOW else []),
            "--decision-dir", DECISION_DIR,
            "--advertise-nats-url", spec.cluster_nats_url,
            *inject.master_tls_args(spec)]


def service_template(spec: JobSpec) -> Resource:
    """``kubectl create`` of the master's Service, owned by the workflow (garbage-collected
    with it). Run with the setup account (``services create``: ``aegis-flow install``)."""
    manifest = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service_name(), "namespace": spec.namespace,
                     "labels": {"app.kubernetes.io/managed-by": "aegis-flow",
                                MASTER_LABEL: "{{workflow.name}}"}},
        "spec": {"selector": {MASTER_LABEL: "{{workflow.name}}"},
                 "ports": [{"name": "grpc", "port": spec.grpc_port, "targetPort": "grpc"},
                           {"name": c.METRICS_PORT_NAME, "port": spec.metrics_port,
                            "targetPort": c.METRICS_PORT_NAME}]}}
    return Resource(name=SERVICE_TEMPLATE, action="create", set_owner_reference=True,
                    service_account_name=spec.setup_service_account,
                    manifest=yaml.safe_dump(manifest, sort_keys=False))


TOKEN_TEMPLATE = "bootstrap-token"


def token_template(spec: JobSpec) -> Container:
    """``aegis-flow bootstrap-token``: this workflow's own bootstrap token, made in the pod
    (never in the workflow's spec or status), in a Secret the workflow owns (deleted with it).
    Run with the setup account (``secrets create``: ``aegis-flow install``)."""
    return Container(
        name=TOKEN_TEMPLATE, image=spec.aegis_image,
        service_account_name=spec.setup_service_account,
        command=["aegis-flow", "bootstrap-token", "--namespace", spec.namespace,
                 "--secret", spec.bootstrap_secret_name, "--workflow", "{{workflow.name}}",
                 "--workflow-uid", "{{workflow.uid}}"],
        retry_strategy=RetryStrategy(limit="3", retry_policy="Always",
                                     backoff=m.Backoff(duration="5s", factor=m.IntOrString("2"))),
        resources=m.ResourceRequirements(requests={"cpu": "50m", "memory": "64Mi"}),  # type: ignore[dict-item]
        node_selector=spec.node_selector or None,
        tolerations=c.tolerations(spec),
    )


def master_template(spec: JobSpec) -> Container:
    """The master: ready on /readyz; serves SyncWorkerCreds; recreated whenever it ends
    without having decided (a crash, a lost node, a deleted pod, NATS out of reach)."""
    return Container(
        name=c.MASTER,
        image=spec.aegis_image,
        labels={MASTER_LABEL: "{{workflow.name}}"},  # the Service's selector
        service_account_name=spec.service_account,  # it quarantines nodes (T10)
        command=["python", "-m", "aegis_flow.master"],
        args=master_args(spec),
        readiness_probe=m.Probe(
            http_get=m.HTTPGetAction(path="/readyz", port=spec.metrics_port),
            initial_delay_seconds=2, period_seconds=5, failure_threshold=3),
        ports=[m.ContainerPort(container_port=spec.metrics_port, name=c.METRICS_PORT_NAME),
               m.ContainerPort(container_port=spec.grpc_port, name="grpc")],
        env=[inject.bootstrap_token_env(spec), FieldEnv(name="POD_IP", field_path="status.podIP")],
        init_containers=[inject.copy_auth(spec)],
        volumes=[*inject.auth_volumes(spec), *inject.master_tls_volumes(spec)],
        volume_mounts=[inject.auth_mount(), *inject.master_tls_mounts(spec)],
        outputs=[Parameter(name=name, value_from=m.ValueFrom(path=f"{DECISION_DIR}/{name}",
                                                             default=default))
                 for name, default in DECISION_OUTPUTS.items()],
        retry_strategy=RetryStrategy(
            limit=str(spec.master_retry_limit), retry_policy="Always",
            expression=contract.master_retry_expression(),
            # no maxDuration: Argo reads it as a deadline from the first pod (review B3)
            backoff=m.Backoff(duration="10s", factor=m.IntOrString("2"))),
        resources=m.ResourceRequirements(requests={"cpu": "500m", "memory": "512Mi"}),  # type: ignore[dict-item]
        node_selector=spec.node_selector or None,
        tolerations=c.tolerations(spec),
        affinity=c.not_quarantined(),
    )
