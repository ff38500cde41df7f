"""The run phase: N worker pods, each the supervisor ``-- <user command>``.

Each pod does everything the master orders inside it: the bootcheck of the node it will train
on (a node that fails it ends the pod node-fault: the master quarantines the node and Argo
recreates only this pod elsewhere, DESIGN T3), training, in-place restarts and troubleshooting.

PURE: returns Hera templates; nothing is submitted.
"""

from __future__ import annotations

from hera.workflows import Container, Env, Parameter, RetryStrategy
from hera.workflows import models as m

from aegis_flow.jobspec import JobSpec
from aegis_flow.settings import master_timeout_for
from aegis_flow.templates import common as c
from aegis_flow.templates import contract, inject
from aegis_flow.templates.master import master_addr

MASTER_BACK = 120  # seconds: a master pod recreated by Argo (backoff, scheduling, start)


def supervisor_argv(spec: JobSpec) -> list[str]:
    """The injected bundle run by the image's Python, or the image's own ``aegis-flow``."""
    return [spec.python, inject.BUNDLE] if spec.inject_supervisor else [*spec.supervisor]


def worker_command(spec: JobSpec, *, rank: str) -> list[str]:
    """``<supervisor> --job … --rank R --world-size N --nats-url URL --creds F [--saver S] --
    <cmd>``.

    ``--master-timeout``: how long a rank waits for the master's first order before running
    on its own; more than the master's connect timeout (the master waits that long for every
    rank), plus the time a recreated master takes to come back; ``--orphan-timeout``: how
    long a training rank waits for a master that is gone (a recreated one resumes)."""
    return [*supervisor_argv(spec), "--job", "{{workflow.name}}", "--namespace",
            spec.namespace, "--rank", rank, "--world-size", str(spec.workers),
            "--nats-url", spec.cluster_nats_url, "--creds", inject.CREDS,
            "--master-timeout", str(int(master_timeout_for(spec.connect_timeout)) + MASTER_BACK),
            "--orphan-timeout", str(MASTER_BACK + 180),
            *(["--work-dir", spec.checkpoint_dir] if spec.checkpoint_claim else []),
            *(["--saver", spec.saver] if spec.saver else []),
            *(["--nproc-per-node", str(spec.nproc_per_node)] if spec.nproc_per_node > 1
              else []),
            "--", *spec.command]


CHECKPOINT_VOLUME = "checkpoints"


def checkpoint_volumes(spec: JobSpec) -> list[m.Volume]:
    if not spec.checkpoint_claim:
        return []
    claim = m.PersistentVolumeClaimVolumeSource(claim_name=spec.checkpoint_claim)
    return [m.Volume(name=CHECKPOINT_VOLUME, persistent_volume_claim=claim)]


def checkpoint_mounts(spec: JobSpec) -> list[m.VolumeMount]:
    return [m.VolumeMount(name=CHECKPOINT_VOLUME, mount_path=spec.checkpoint_dir)] \
        if spec.checkpoint_claim else []


def worker_template(spec: JobSpec) -> Container:
    """One rank. A node fault or container restart recreates only this pod, elsewhere
    (nodeAntiAffinity) and never on a quarantined node; the others wait in Restarting."""
    return Container(
        name=c.WORKER,
        image=spec.image,
        command=worker_command(spec, rank=c.inp("rank")),
        inputs=c.params("rank"),
        init_containers=[
            *([inject.copy_bundle(spec)] if spec.inject_supervisor else []),
            inject.worker_init(spec, master_addr=master_addr(spec), rank=c.inp("rank"))],
        volumes=[inject.shared_volume(), inject.token_volume(spec),
                 *inject.worker_tls_volumes(spec), *checkpoint_volumes(spec)],
        volume_mounts=[inject.shared_mount(), *checkpoint_mounts(spec)],
        outputs=[
            Parameter(name="outcome", value_from=m.ValueFrom(
                path=contract.OUTCOME_FILE, default=contract.UNKNOWN)),
            Parameter(name="node", value_from=m.ValueFrom(path=contract.NODE_FILE, default="")),
            # how often this pod restarted the command in place (L1): shown on the rank's node
            Parameter(name="restarts", value_from=m.ValueFrom(path=contract.RESTARTS_FILE,
                                                              default="0")),
        ],
        env=[*c.pod_env(spec), Env(name="AEGIS_POD_RETRY", value="{{retries}}"),
             # the pod's self-reported progress while it runs: the job's restarts of max-retry
             Env(name="AEGIS_MAX_RETRY", value=c.wf_param("max-retry")),
             *([Env(name="AEGIS_CHECKPOINT_DIR", value=spec.checkpoint_dir)]
               if spec.checkpoint_claim else []),
             # GPUs asked for and none usable: the node lost them (a gpu check fail, not
             # not_applicable): the bootcheck ends the pod node-fault
             *([Env(name="AEGIS_EXPECT_GPUS", value=str(spec.gpus_per_worker))]
               if spec.gpus_per_worker else [])],
        resources=c.resources(spec),
        node_selector=spec.node_selector or None,
        tolerations=c.tolerations(spec),
        affinity=c.not_quarantined(),
        retry_strategy=RetryStrategy(
            limit=str(spec.pod_retry_limit), retry_policy="Always",
            expression=contract.worker_retry_expression(),
            affinity=m.RetryAffinity(node_anti_affinity=m.RetryNodeAntiAffinity()),
            # no maxDuration: Argo reads it as a deadline from the first pod (review B3)
            backoff=m.Backoff(duration="5s", factor=m.IntOrString("2"))),
    )
