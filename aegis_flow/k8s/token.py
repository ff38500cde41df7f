"""A bootstrap token for one workflow: made in the cluster, owned by the workflow.

The token lets a worker pod buy its NATS credentials from the master (SyncWorkerCreds). One
Secret per workflow (``<workflow>-bootstrap``, key ``token``) instead of one for the namespace:
a token seen in one job's pod is worthless for any other job, and the Secret is deleted with
its workflow (an ownerReference to it: Kubernetes' garbage collection). The first step of the
workflow runs ``aegis-flow bootstrap-token``; the token is generated in that pod and never
appears in the workflow's spec or status.

Side effects: one Kubernetes API call (create a Secret) through the ``ObjectApi``.
"""

from __future__ import annotations

import secrets
from typing import Any, Protocol

TOKEN_KEY = "token"


class SecretMaker(Protocol):
    def create_secret(self, namespace: str, name: str, string_data: dict[str, str],
                      owner: dict[str, Any] | None = None) -> bool: ...


def workflow_owner(name: str, uid: str) -> dict[str, Any]:
    """The ownerReference to an Argo Workflow (what ``setOwnerReference`` writes)."""
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": name,
            "uid": uid, "blockOwnerDeletion": True, "controller": True}


def mint(api: SecretMaker, *, namespace: str, secret: str, workflow: str, uid: str) -> bool:
    """Create ``secret`` with a fresh 256-bit token, owned by the workflow. False when it
    exists already (an earlier try of the same step made it: it is kept, so a master and
    workers that read it agree)."""
    if not uid:
        raise ValueError("the workflow's uid is needed for the owner reference "
                         "(--workflow-uid '{{workflow.uid}}')")
    return api.create_secret(namespace, secret, {TOKEN_KEY: secrets.token_urlsafe(32)},
                             workflow_owner(workflow, uid))
