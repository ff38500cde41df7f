"""Example: the credential exchange over mutual TLS (a 2-worker job, external NATS).

Every rendered workflow serves the credential exchange over TLS (the master's certificate in
Secret ``aegis-grpc-tls``: tls.crt, tls.key, ca.crt, for the DNS name
``aegis-master.training.svc``, which workers check whatever address they dial). This one adds
the workers' client certificate (Secret ``aegis-grpc-client``), so the master checks them too.
Both can come from one cert-manager Issuer.

PURE: ``build()`` returns Hera objects; ``python -m aegis_flow.templates.golden --write``
renders them into ``training_tls.yaml`` beside this file.
"""

from __future__ import annotations

from typing import Any

from aegis_flow.jobspec import JobSpec
from aegis_flow.workflow import build_workflow

SPEC = JobSpec(
    name="tls-finetune",
    image="registry.example.com/team/train:1.0",
    command=("python", "train.py", "--checkpoint-dir", "/ckpt"),
    workers=2,
    gpus_per_worker=8,
    namespace="training",
    nats_url="nats://aegis-nats.training:4222",
    grpc_tls_secret="aegis-grpc-tls",
    grpc_tls_client_secret="aegis-grpc-client",
)


def build() -> list[Any]:
    return [build_workflow(SPEC)]
