"""The master phase: one long-running daemon step for the whole workflow.

PURE: returns a Hera template; nothing is submitted. With an embedded NATS server the master
pod carries a ``nats`` sidecar and workers connect to ``{{steps.master.ip}}``.
"""

from __future__ import annotations

from hera.workflows import Container, FieldEnv, RetryStrategy, UserContainer
from hera.workflows import models as m

from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import common as c
from aegis_flow.templates import inject
from aegis_flow.templates.contract import master_retry_expression


def master_nats_url(spec: JobSpec) -> str:
    return f"nats://127.0.0.1:{c.NATS_PORT}" if spec.embedded_nats else spec.nats_url


def worker_nats_url(spec: JobSpec) -> str:
    """The URL workers use; embedded: the master pod's IP, known once the daemon is ready."""
    return (f"nats://{{{{steps.{c.MASTER}.ip}}}}:{c.NATS_PORT}" if spec.embedded_nats
            else spec.nats_url)


def master_addr(spec: JobSpec) -> str:
    """``HOST:PORT`` of the master's SyncWorkerCreds, for worker-init."""
    return f"{{{{steps.{c.MASTER}.ip}}}}:{spec.grpc_port}"


def master_args(spec: JobSpec) -> list[str]:
    return ["--job", "{{workflow.name}}", "--namespace", spec.namespace,
            "--workers", str(spec.workers), "--max-retry", c.wf_param("max-retry"),
            "--nats-url", master_nats_url(spec),
            "--metrics-port", str(spec.metrics_port),
            "--auth-dir", inject.AUTH_DIR, "--token-env", "AEGIS_BOOTSTRAP_TOKEN",
            "--grpc-listen", f"0.0.0.0:{spec.grpc_port}", "--quarantine-nodes",
            # each rank is a pod with its own loopback: meet at rank 0's pod address (B2)
            "--rendezvous-addr", "rank0",
            # the URL in each worker's credentials: embedded, this pod's IP (Kubernetes
            # expands $(POD_IP) from the env), not the 127.0.0.1 the master itself dials
            "--advertise-nats-url",
            f"nats://$(POD_IP):{c.NATS_PORT}" if spec.embedded_nats else spec.nats_url,
            *inject.master_tls_args(spec)]


def master_template(spec: JobSpec) -> Container:
    """The master daemon: readiness on /readyz (the metrics port, named ``http``); serves
    SyncWorkerCreds on the gRPC port; recreated unless it ended the job on purpose."""
    sidecars = None
    if spec.embedded_nats:  # operator mode: the nats.conf from the auth Secret
        sidecars = [UserContainer(
            name="nats", image=spec.aegis_image,
            command=["nats-server", "-c", f"{inject.AUTH_DIR}/nats.conf", "-a", "0.0.0.0",
                     "-p", str(c.NATS_PORT), "-js", "-sd", "/tmp/nats"],
            ports=[m.ContainerPort(container_port=c.NATS_PORT, name="nats")],
            volume_mounts=[inject.auth_mount()])]
    return Container(
        name=c.MASTER,
        image=spec.aegis_image,
        service_account_name=spec.service_account,  # it quarantines nodes (T10)
        command=["python", "-m", "aegis_flow.master"],
        args=master_args(spec),
        daemon=True,
        readiness_probe=m.Probe(
            http_get=m.HTTPGetAction(path="/readyz", port=spec.metrics_port),
            initial_delay_seconds=2, period_seconds=5, failure_threshold=3),
        ports=[m.ContainerPort(container_port=spec.metrics_port, name=c.METRICS_PORT_NAME),
               m.ContainerPort(container_port=spec.grpc_port, name="grpc")],
        env=[inject.bootstrap_token_env(spec), FieldEnv(name="POD_IP", field_path="status.podIP")],
        init_containers=[inject.copy_auth(spec)],
        volumes=[*inject.auth_volumes(spec), *inject.master_tls_volumes(spec)],
        volume_mounts=[inject.auth_mount(), *inject.master_tls_mounts(spec)],
        retry_strategy=RetryStrategy(
            limit=str(spec.master_retry_limit), retry_policy="Always",
            expression=master_retry_expression(),
            backoff=m.Backoff(duration="10s", factor=m.IntOrString("2"), max_duration="5m")),
        resources=m.ResourceRequirements(requests={"cpu": "500m", "memory": "512Mi"}),  # type: ignore[dict-item]
        sidecars=sidecars,
        node_selector=spec.node_selector or None,
        tolerations=c.tolerations(spec),
        affinity=c.not_quarantined(),
    )
