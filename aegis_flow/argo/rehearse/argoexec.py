"""A stand-in for Argo's executor running a resource template: ``argoexec resource create``.

Runs as the ``main`` container of a resource template's pod (``podspec._resource_pod_spec``),
as Argo's ``cmd/argoexec/commands/resource.go`` ``execResource`` does (v4.0.5): ``StageFiles``
writes the template's manifest to ``/tmp/manifest.yaml``, ``ExecResource``
(``workflow/executor/resource.go``) creates it with the pod's service account (there it runs
``kubectl create -f /tmp/manifest.yaml -o json``; here one POST to the API stand-in with the
token mounted at ``/var/run/secrets/kubernetes.io/serviceaccount``), and on an error
``HandleError`` writes the error as the termination message and the container exits 1. The
error reads as Argo's does: ``no more retries `` + kubectl's stderr (``Error from server
(AlreadyExists): error when creating "/tmp/manifest.yaml": services "x" already exists``).

The termination message goes to ``/tmp/termination-log`` (the container's own ``/tmp``; the
pod's ``terminationMessagePath``) because ``/dev`` in a rehearsed container is the host's.

Side effects: one API request; files in the container's ``/tmp``; stdout/stderr.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import yaml

MANIFEST = "/tmp/manifest.yaml"  # common.ExecutorResourceManifestPath
TERMINATION_LOG = "/tmp/termination-log"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PLURALS = {"Service": "services", "Secret": "secrets", "ConfigMap": "configmaps"}


def _fail(message: str) -> int:
    """``HandleError``: the first error becomes the termination message; exit 1."""
    with open(TERMINATION_LOG, "w") as f:
        f.write(message)
    print(f'time="{time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}" level=error '
          f'msg="executor error: {message}"', file=sys.stderr)
    print(f"Error: {message}", file=sys.stderr)
    return 1


def _create(obj: dict[str, Any], namespace: str) -> tuple[int, dict[str, Any]]:
    plural = PLURALS[str(obj.get("kind"))]
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    with open(f"{SA_DIR}/token") as f:
        token = f.read().strip()
    ctx = ssl.create_default_context(cafile=f"{SA_DIR}/ca.crt")
    req = urllib.request.Request(
        f"https://{host}:{port}/api/v1/namespaces/{namespace}/{plural}",
        data=json.dumps(obj).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                 "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:  # noqa: S310
            return int(r.status), dict(json.loads(r.read()))
    except urllib.error.HTTPError as exc:
        return int(exc.code), dict(json.loads(exc.read() or b"{}"))


def resource(action: str) -> int:
    template = json.loads(os.environ["ARGO_TEMPLATE"])
    manifest = str((template.get("resource") or {}).get("manifest") or "")
    with open(MANIFEST, "w") as f:  # StageFiles
        f.write(manifest)
    if action != "create":
        return _fail(f"rehearse: resource action {action!r} is not supported (create is)")
    try:
        obj = yaml.safe_load(manifest)
    except yaml.YAMLError as exc:
        return _fail(f"no more retries error: error parsing {MANIFEST}: {exc}")
    if not isinstance(obj, dict) or str(obj.get("kind")) not in PLURALS or \
            obj.get("apiVersion") != "v1":
        kind = obj.get("kind") if isinstance(obj, dict) else None
        version = obj.get("apiVersion") if isinstance(obj, dict) else None
        name = (obj.get("metadata") or {}).get("name", "") if isinstance(obj, dict) else ""
        return _fail(f'no more retries error: resource mapping not found for name: "{name}" '
                     f'namespace: "" from "{MANIFEST}": no matches for kind "{kind}" in version '
                     f'"{version}"\nensure CRDs are installed first')
    try:
        with open(f"{SA_DIR}/namespace") as f:
            default_ns = f.read().strip()
    except OSError:
        default_ns = "default"
    namespace = str((obj.get("metadata") or {}).get("namespace") or default_ns)
    try:
        code, body = _create(obj, namespace)
    except OSError as exc:
        return _fail(f"no more retries error: {exc}")
    if code >= 300:
        reason = body.get("reason") or "Unknown"
        message = body.get("message") or f"status {code}"
        return _fail(f'no more retries Error from server ({reason}): error when creating '
                     f'"{MANIFEST}": {message}')
    meta = body.get("metadata") or {}
    print(f'time="{time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}" level=info '
          f'msg="Resource" namespace={meta.get("namespace")} '
          f'resource={str(body.get("kind")).lower()}./{meta.get("name")} '
          f'selfLink=api/v1/namespaces/{meta.get("namespace")}/{PLURALS[str(body.get("kind"))]}'
          f'/{meta.get("name")}', file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "resource":
        print("usage: argoexec resource ACTION", file=sys.stderr)
        return 2
    return resource(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
