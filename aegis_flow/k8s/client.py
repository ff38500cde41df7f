"""``KubeNodeApi``: the ``NodeApi`` and ``ObjectApi`` Protocols over the ``kubernetes`` client.

Side effects: HTTP calls to the Kubernetes API server (nodes get/list/patch; Secrets and
ServiceAccounts get, for ``submit``'s checks — of a Secret only the key names are kept). Patches are
sent as ``application/merge-patch+json`` (the bodies in ``nodes.py`` are JSON merge patches);
without that header the client would pick JSON Patch, which takes a list. The ``kubernetes``
package is imported only here, when a client is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aegis_flow.k8s.api import NodeApiError, NodeNotFound, ObjectNotFound
from aegis_flow.k8s.nodes import NodeInfo

MERGE_PATCH = "application/merge-patch+json"

#: every call is bounded: (connect, read) seconds per attempt, and one more attempt where
#: urllib3 retries (a failed connection; a read only for GET). Without a bound, an API server
#: that accepts and never answers held a quarantine, a credential grant's pod lookup and the
#: master's exit (which joins its worker threads) for ever; urllib3's default is four
#: attempts, each unbounded.
REQUEST_TIMEOUT: tuple[float, float] = (5.0, 15.0)
RETRIES = 1


class KubeNodeApi:
    def __init__(self, core_v1: Any, *, timeout: tuple[float, float] = REQUEST_TIMEOUT
                 ) -> None:
        self.core = core_v1
        self.timeout = timeout

    @classmethod
    def connect(cls, *, kubeconfig: str | None = None, context: str | None = None
                ) -> KubeNodeApi:
        """In a pod: its service account; elsewhere: the kubeconfig (``$KUBECONFIG``)."""
        from kubernetes import client
        from kubernetes import config as kube_config

        config: Any = kube_config  # untyped package
        try:
            if kubeconfig or context:
                config.load_kube_config(config_file=kubeconfig, context=context)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise NodeApiError(f"no Kubernetes configuration: {exc} (give --kubeconfig, or "
                               "run in a pod with a service account)") from None
        cfg = client.Configuration.get_default_copy()  # what load_*_config just set
        cfg.retries = RETRIES
        return cls(client.CoreV1Api(client.ApiClient(cfg)))

    @classmethod
    def from_host(cls, host: str, *, token: str | None = None, verify_ssl: bool = True,
                  timeout: tuple[float, float] = REQUEST_TIMEOUT) -> KubeNodeApi:
        """A client for one API server URL (tests point it at a local recorder)."""
        from kubernetes import client

        cfg = client.Configuration(host=host)
        cfg.verify_ssl = verify_ssl
        cfg.retries = RETRIES
        if token:
            cfg.api_key = {"authorization": token}
            cfg.api_key_prefix = {"authorization": "Bearer"}
        return cls(client.CoreV1Api(client.ApiClient(cfg)), timeout=timeout)

    def _info(self, node: Any) -> NodeInfo:
        return NodeInfo.from_dict(self.core.api_client.sanitize_for_serialization(node))

    def _call(self, what: str, name: str | None, fn: Any, *args: Any,
              _rights: str = "nodes get/list/patch: aegis-flow install",
              _missing: NodeApiError | None = None, **kw: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        kw.setdefault("_request_timeout", self.timeout)
        try:
            return fn(*args, **kw)
        except ApiException as exc:
            if exc.status == 404 and _missing is not None:
                raise _missing from None
            if exc.status == 404 and name is not None:
                raise NodeNotFound(name) from None
            retryable = exc.status is None or exc.status >= 500 or exc.status == 429
            hint = (f" (the service account needs {_rights})" if exc.status in (401, 403) else "")
            raise NodeApiError(f"{what}: HTTP {exc.status} {exc.reason}{hint}",
                               retryable=retryable, status=exc.status) from None
        except OSError as exc:
            raise NodeApiError(f"{what}: {exc}", retryable=True) from None
        except Exception as exc:  # urllib3 errors are not OSErrors in every version
            if type(exc).__module__.startswith("urllib3"):
                raise NodeApiError(f"{what}: {exc}", retryable=True) from None
            raise

    def list_nodes(self, label_selector: str | None = None) -> list[NodeInfo]:
        kw: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        got = self._call("list nodes", None, self.core.list_node, **kw)
        return [self._info(n) for n in got.items]

    def get_node(self, name: str) -> NodeInfo:
        return self._info(self._call(f"get node {name}", name, self.core.read_node, name))

    def patch_node(self, name: str, body: dict[str, Any]) -> NodeInfo:
        return self._info(self._call(f"patch node {name}", name, self.core.patch_node, name,
                                     body, _content_type=MERGE_PATCH))

    def pods_at(self, namespace: str, address: str) -> list[dict[str, Any]]:
        """The running pods of ``namespace`` whose ``status.podIP`` is ``address`` (name,
        node, labels): where a worker that called the master really runs (placement.py)."""
        got = self._call(f"list pods at {address}", None, self.core.list_namespaced_pod,
                         namespace, field_selector=f"status.podIP={address},"
                         "status.phase=Running", _rights=f"pods get/list in {namespace}")
        return [{"name": pod.metadata.name, "node": pod.spec.node_name or "",
                 "labels": dict(pod.metadata.labels or {})} for pod in got.items]

    def secret_keys(self, namespace: str, name: str) -> frozenset[str]:
        got = self._call(f"get secret {namespace}/{name}", name,
                         self.core.read_namespaced_secret, name, namespace,
                         _rights=f"secrets get in {namespace}",
                         _missing=ObjectNotFound("Secret", namespace, name))
        return frozenset((got.data or {}).keys()) | frozenset((got.string_data or {}).keys())

    def create_secret(self, namespace: str, name: str, string_data: Mapping[str, str],
                      owner: Mapping[str, Any] | None = None) -> bool:
        meta: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": {"app.kubernetes.io/managed-by": "aegis-flow"}}
        if owner:
            meta["ownerReferences"] = [dict(owner)]
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
                "stringData": dict(string_data)}
        try:
            self._call(f"create secret {namespace}/{name}", None,
                       self.core.create_namespaced_secret, namespace, body,
                       _rights=f"secrets create in {namespace}: aegis-flow install")
        except NodeApiError as exc:
            if exc.status == 409:  # made by an earlier try of the same step: keep it
                return False
            raise
        return True

    def get_service_account(self, namespace: str, name: str) -> dict[str, Any]:
        got = self._call(f"get serviceaccount {namespace}/{name}", name,
                         self.core.read_namespaced_service_account, name, namespace,
                         _rights=f"serviceaccounts get in {namespace}",
                         _missing=ObjectNotFound("ServiceAccount", namespace, name))
        out: dict[str, Any] = self.core.api_client.sanitize_for_serialization(got)
        return out
