"""Example: a 4-worker, 8-GPU-per-worker fine-tuning job as an Argo Workflow.

PURE: ``build()`` returns Hera objects; ``python -m aegis_flow.templates.golden --write``
renders them into ``training.yaml`` beside this file.
"""

from __future__ import annotations

from typing import Any

from aegis_flow.jobspec import JobSpec, Toleration
from aegis_flow.workflow import build_workflow

SPEC = JobSpec(
    name="llama-finetune",
    image="registry.example.com/team/train:1.0",
    command=("python", "train.py", "--checkpoint-dir", "/ckpt"),
    workers=4,
    gpus_per_worker=8,
    cpu="32",
    memory="256Gi",
    max_retry=3,
    namespace="training",
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),),
)


def build() -> list[Any]:
    return [build_workflow(SPEC)]
