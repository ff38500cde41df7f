"""Example of reusing the checks outside a training job: data-prep → train, train behind a GPU
check on its own node.

PURE: ``build()`` returns Hera objects; the golden file is ``data_pipeline.yaml``.

**Data.** data-prep writes ``/data/shards`` and train reads it, in two pods: both mount
``data``, a ``volumeClaimTemplates`` claim. Argo creates the PersistentVolumeClaim
``<workflow>-data`` when the workflow starts (``createPVCs``) and deletes it when it ends
(``volumeClaimGC``, default OnWorkflowCompletion). ``ReadWriteOnce`` is enough: the two pods never
run at once (train depends on data-prep), and the volume follows train to its node; with a
``WaitForFirstConsumer`` storage class the volume is made in data-prep's zone and the
scheduler then places train (check included) where it can attach. A ``hostPath`` would tie
both pods to one node; an artifact repository is not assumed to exist.

**GPU check.** The check runs as an *init container of the train pod*
(``checks.gpu_check_init_container``), not as a task before it. Only then is the node checked
the node train runs on, and the GPUs checked the GPUs train gets: the kubelet hands the init
container's devices on to the main container, with no window for another pod to take the
node's GPUs in between and no second scheduling decision (a task pinned to the check's node
through ``{{tasks.gpu-check.outputs.parameters.node}}`` could check other GPUs than train's,
or be unschedulable when the data volume lives in another zone). It runs in the **aegis-flow
image** (parameter ``aegis-image``), requests, tolerates and expects ``gpus`` GPUs
(``AEGIS_EXPECT_GPUS``; both containers' GPUs are set by ``podSpecPatch``, since Argo refuses a
parameter in ``resources``), so a node whose GPUs or driver are gone fails the pod before training
starts; its JSON results reach train through a shared ``emptyDir``
(``--node-report /aegis-report/gpu-check.json``). The same check is ``check-gpu`` in the
``aegis-checks`` WorkflowTemplate, for pipelines that want it as a step of its own.
"""

from __future__ import annotations

from typing import Any

from hera.workflows import DAG, Container, Parameter, Task, Workflow
from hera.workflows import models as m

from aegis_flow.jobspec import DEFAULT_AEGIS_IMAGE
from aegis_flow.templates.checks import gpu_check_init_container, gpu_patch, gpu_toleration

IMAGE = "registry.example.com/team/train:1.0"
DATA_VOLUME, DATA_DIR = "data", "/data"
REPORT_VOLUME, REPORT_DIR = "node-report", "/aegis-report"
GPU_REPORT = f"{REPORT_DIR}/gpu-check.json"
GPUS = "{{workflow.parameters.gpus}}"
DATA_SIZE = "10Gi"


def build() -> list[Any]:
    data = m.VolumeMount(name=DATA_VOLUME, mount_path=DATA_DIR)
    report = m.VolumeMount(name=REPORT_VOLUME, mount_path=REPORT_DIR)
    prep = Container(name="data-prep", image=IMAGE,
                     command=["python", "prep.py", "--out", f"{DATA_DIR}/shards"],
                     volume_mounts=[data])
    train = Container(
        name="train", image=IMAGE,
        command=["python", "train.py", "--data", f"{DATA_DIR}/shards",
                 "--node-report", GPU_REPORT],
        init_containers=[gpu_check_init_container(
            aegis_image="{{workflow.parameters.aegis-image}}", gpus=GPUS, out=GPU_REPORT,
            volume_mounts=[report])],
        volumes=[m.Volume(name=REPORT_VOLUME, empty_dir=m.EmptyDirVolumeSource())],
        volume_mounts=[data, report],
        pod_spec_patch=gpu_patch(GPUS, init_containers=("gpu-check",)),
        tolerations=[gpu_toleration()])
    pipeline = DAG(name="pipeline", tasks=[
        Task(name="data-prep", template="data-prep"),
        Task(name="train", template="train", dependencies=["data-prep"]),
    ])
    claim = m.PersistentVolumeClaim(
        metadata=m.ObjectMeta(name=DATA_VOLUME),
        spec=m.PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"],
            resources=m.VolumeResourceRequirements(
                requests={"storage": m.Quantity(DATA_SIZE)})))
    return [Workflow(generate_name="data-pipeline-", entrypoint="pipeline",
                     arguments=[Parameter(name="aegis-image", value=DEFAULT_AEGIS_IMAGE),
                                Parameter(name="gpus", value="1")],
                     templates=[pipeline, prep, train],
                     volume_claim_templates=[claim],
                     pod_gc=m.PodGC(strategy="OnPodSuccess"),
                     ttl_strategy=m.TTLStrategy(seconds_after_completion=86400))]
