"""Submit a rendered Workflow to an Argo Server with Hera's ``WorkflowsService``.

Side effects: one HTTPS (or HTTP) POST to ``{server}/api/v1/workflows/{namespace}``; the body
is ``{"workflow": <the rendered manifest>}``. Builders never submit (STYLE.md 10); only this
module and the ``submit`` command do. Hera loads only when :func:`submit` runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class SubmitError(Exception):
    """The server refused the workflow or could not be reached; the message says which."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class Submitted:
    name: str
    namespace: str
    uid: str


def bearer(token: str) -> str:
    """``argo auth token`` prints ``Bearer …``; a bare token gets the prefix."""
    token = token.strip()
    return token if token.lower().startswith(("bearer ", "basic ")) else f"Bearer {token}"


_HINTS = {401: "check ARGO_TOKEN (argo auth token)",
          403: "the token's service account may not create workflows in this namespace",
          404: "is --argo-server the Argo Server's URL (not the Kubernetes API)?",
          409: "a workflow with this name exists already"}


def submit(manifest: dict[str, Any], *, server: str, token: str, namespace: str,
           verify_ssl: bool = True) -> Submitted:
    """POST the manifest; return the created workflow's name."""
    import requests
    from hera.exceptions import HeraException
    from hera.workflows.models import Workflow, WorkflowCreateRequest
    from hera.workflows.service import WorkflowsService

    if not server.startswith(("http://", "https://")):
        raise SubmitError(f"--argo-server {server!r} needs a scheme: https://HOST:2746",
                          retryable=False)
    service = WorkflowsService(host=server.rstrip("/") + "/", verify_ssl=verify_ssl,
                               token=bearer(token) if token else None, namespace=namespace)
    request = WorkflowCreateRequest(workflow=Workflow.model_validate(manifest),
                                    namespace=namespace)
    try:
        created = service.create_workflow(request, namespace=namespace)
    except HeraException as exc:
        status = getattr(exc, "status_code", None) or _status_of(str(exc))
        hint = _HINTS.get(status or 0, "")
        raise SubmitError(f"the Argo Server refused the workflow: {exc}"
                          + (f" ({hint})" if hint else ""),
                          retryable=status is None or status >= 500) from None
    except requests.RequestException as exc:
        raise SubmitError(f"cannot reach the Argo Server at {server}: {exc}",
                          retryable=True) from None
    except (KeyError, ValueError) as exc:  # an error body without a message, or not JSON
        raise SubmitError(f"the Argo Server answered something unexpected: {exc!r}",
                          retryable=True) from None
    meta = created.metadata
    return Submitted(meta.name or "", meta.namespace or namespace, meta.uid or "")


def _status_of(text: str) -> int | None:
    import re

    m = re.search(r"status code (\d{3})", text)
    return int(m.group(1)) if m else None
