"""Example of reusing the checks outside a training job: data-prep → node checks → train.

PURE: ``build()`` returns Hera objects; the golden file is ``data_pipeline.yaml``. The two
check tasks call the ``aegis-checks`` WorkflowTemplate through ``templateRef``. Hera cannot
``get_parameter()`` on a templateRef task, so the output reference is written literally.
"""

from __future__ import annotations

from typing import Any

from hera.workflows import DAG, Container, Parameter, Task, Workflow
from hera.workflows import models as m

IMAGE = "registry.example.com/team/train:1.0"
GPU_RESULT = "{{tasks.gpu-check.outputs.parameters.result}}"


def build() -> list[Any]:
    prep = Container(name="data-prep", image=IMAGE,
                     command=["python", "prep.py", "--out", "/data/shards"])
    train = Container(
        name="train", image=IMAGE, inputs=[Parameter(name="gpu-check")],
        command=["python", "train.py", "--data", "/data/shards", "--node-report",
                 "{{inputs.parameters.gpu-check}}"],
        resources=m.ResourceRequirements(limits={"nvidia.com/gpu": "1"}))  # type: ignore[dict-item]

    def check(name: str, template: str) -> Task:
        return Task(name=name, template_ref=m.TemplateRef(name="aegis-checks", template=template),
                    arguments=[Parameter(name="image", value=IMAGE)], dependencies=["data-prep"])

    pipeline = DAG(name="pipeline", tasks=[
        Task(name="data-prep", template="data-prep"),
        check("gpu-check", "check-gpu"),
        check("io-check", "check-io"),
        Task(name="train", template="train", dependencies=["gpu-check", "io-check"],
             arguments=[Parameter(name="gpu-check", value=GPU_RESULT)]),
    ])
    return [Workflow(generate_name="data-pipeline-", entrypoint="pipeline",
                     templates=[pipeline, prep, train],
                     pod_gc=m.PodGC(strategy="OnPodSuccess"),
                     ttl_strategy=m.TTLStrategy(seconds_after_completion=86400))]
