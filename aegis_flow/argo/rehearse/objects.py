"""Namespaced objects of the rehearsal's cluster: Services with a ClusterIP that works, and
Secrets (stored, and their keys written where pods mount Secrets from) and ConfigMaps
(stored only).

A Service created through the API stand-in (``kubeapi``: a resource template's executor, or a
scenario's ``objects:``) gets a ClusterIP from 198.18.240.0/20, inside the cluster network's
/16, as the apiserver's ipallocator would give one from ``--service-cluster-ip-range``. The
address is added to the hub's ``br0`` and a userspace proxy (kube-proxy's old ``userspace``
mode, in threads) listens on it for each service port: every accepted connection goes to one
*ready* endpoint, picked at random as iptables kube-proxy does: a running pod of this
rehearsal in the Service's namespace whose labels match ``spec.selector`` and whose containers
are all ready (what the EndpointSlice controller publishes), at ``targetPort`` (a number, or a
container port's name looked up in that pod's spec). Endpoints are resolved per connection,
so a selected pod replaced by a new one (new IP) is reached through the same ClusterIP. No
ready endpoint: the connection is reset at once (kube-proxy installs a REJECT rule).

:meth:`ObjectStore.hosts_lines` gives the ``/etc/hosts`` lines that stand in for cluster DNS
(``NAME.NS.svc.cluster.local NAME.NS.svc NAME.NS``, and ``NAME`` in the same namespace).

Side effects: addresses on the hub's ``br0``, listening sockets and threads in the hub
namespace; :meth:`ObjectStore.close` removes every one of them.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import ipaddress
import random
import select
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from aegis_flow.argo.rehearse.cluster import ApiError

SERVICE_CIDR = ipaddress.ip_network("198.18.240.0/20")
KINDS = {"services": "Service", "secrets": "Secret", "configmaps": "ConfigMap"}
RESOURCES = {v: k for k, v in KINDS.items()}


class Endpoint(Protocol):
    """What the proxy reads of a pod (``pods.PodRun`` has all of it)."""

    labels: dict[str, str]
    spec: dict[str, Any]

    @property
    def namespace(self) -> str: ...

    @property
    def serving(self) -> bool: ...

    @property
    def address(self) -> str: ...


def _err(code: int, reason: str, message: str, resource: str, name: str | None) -> ApiError:
    err = ApiError(code, reason, message, name)
    err.kind = resource  # type: ignore[attr-defined]  # for the Status's details
    return err


def target_port(pod: Endpoint, target: int | str) -> int | None:
    """``targetPort`` on this pod: a number, or the name of one of its containers' ports."""
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for c in pod.spec.get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target:
                return int(p["containerPort"])
    return None


class _Proxy:
    """One service port: listens on ``ip:port`` in the hub namespace, forwards each
    connection to one ready endpoint."""

    def __init__(self, ip: str, port: int, resolve: Callable[[], list[tuple[str, int]]]) -> None:
        self.ip, self.port, self.resolve = ip, port, resolve
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        """Call on a thread inside the hub namespace: the socket and every thread started
        from here (the accept loop, one per connection) stay in it."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.ip, self.port))
        s.listen(128)
        s.settimeout(0.2)
        self._sock = s
        t = threading.Thread(target=self._accept, name=f"svc-{self.ip}:{self.port}", daemon=True)
        self.threads.append(t)
        t.start()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                 name=f"svc-conn-{self.ip}:{self.port}")
            with self._lock:
                self.threads = [x for x in self.threads if x.is_alive()]
                self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        targets = self.resolve()
        if not targets:  # no ready endpoint: REJECT (a reset, the handshake being done)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return
        host, port = random.choice(targets)
        try:
            up = socket.create_connection((host, port), timeout=3)
        except OSError:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return
        with self._lock:
            self._conns.update((conn, up))
        try:
            _pipe(conn, up, self._stop)
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._conns.discard(up)
            conn.close()
            up.close()

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        with self._lock:
            conns = list(self._conns)
            threads = list(self.threads)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        for t in threads:
            t.join(5)


def _pipe(a: socket.socket, b: socket.socket, stop: threading.Event) -> None:
    """Copy both ways until both sides have closed (half-closes passed on)."""
    a.settimeout(None)
    b.settimeout(None)
    open_dirs = {a: b, b: a}
    while open_dirs and not stop.is_set():
        ready, _, _ = select.select(list(open_dirs), [], [], 0.2)
        for src in ready:
            try:
                data = src.recv(65536)
            except OSError:
                return
            dst = open_dirs[src]
            if data:
                try:
                    dst.sendall(data)
                except OSError:
                    return
            else:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                del open_dirs[src]


class ObjectStore:
    """Services, Secrets and ConfigMaps by (resource, namespace, name).

    ``hub``: the namespace holding ``br0`` (None: Services get an address but no proxy, for
    pure tests); ``in_netns``: ``netns.in_netns``; endpoints come from ``pod_sources``."""

    def __init__(self, hub: str | None = None,
                 in_netns: Callable[[str, Callable[[], Any]], Any] | None = None) -> None:
        self.hub, self._in_netns = hub, in_netns
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pod_sources: list[Callable[[], Iterable[Endpoint]]] = []
        self._proxies: dict[tuple[str, str], list[_Proxy]] = {}
        self._lock = threading.Lock()
        self._hosts = iter(SERVICE_CIDR.hosts())
        self._version = 0
        self.log: Callable[[str], None] = lambda s: None
        # a created Secret's keys -> files pods can mount (the rehearsal's Secrets directory)
        self.secret_sink: Callable[[str, str, dict[str, bytes]], None] | None = None

    # ------------------------------------------------------------ API verbs
    def create(self, resource: str, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        kind = KINDS.get(resource)
        if kind is None:
            raise _err(404, "NotFound", "the server could not find the requested resource",
                       resource, None)
        if not isinstance(obj, Mapping) or obj.get("kind") != kind or \
                obj.get("apiVersion") != "v1":
            raise _err(400, "BadRequest", f"the body of the request was not a v1 {kind}",
                       resource, None)
        meta = dict(obj.get("metadata") or {})
        name = str(meta.get("name") or "")
        if not name:
            raise _err(422, "Invalid", f'{kind} "" is invalid: metadata.name: Required value: '
                       "name or generateName is required", resource, None)
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise _err(400, "BadRequest", "the namespace of the provided object does not match "
                       "the namespace sent on the request", resource, name)
        out: dict[str, Any] = {k: v for k, v in obj.items() if k != "status"}
        with self._lock:
            if (resource, namespace, name) in self.objects:
                raise _err(409, "AlreadyExists", f'{resource} "{name}" already exists',
                           resource, name)
            self._version += 1
            meta.update(namespace=namespace, uid=str(uuid.uuid4()),
                        resourceVersion=str(self._version),
                        creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            out["metadata"] = meta
            if kind == "Service":
                out["spec"] = self._service_spec(dict(out.get("spec") or {}), name)
                out["status"] = {"loadBalancer": {}}
            self.objects[(resource, namespace, name)] = out
        if kind == "Service":
            try:
                self._serve(namespace, name, out)
            except BaseException:
                self.delete(resource, namespace, name)
                raise
            self.log(f"service {namespace}/{name} at {out['spec']['clusterIP']}")
        if kind == "Secret" and self.secret_sink is not None:
            files = {str(k): base64.b64decode(str(v)) for k, v in (out.get("data") or {}).items()}
            files.update({str(k): str(v).encode() for k, v in
                          (out.get("stringData") or {}).items()})
            self.secret_sink(namespace, name, files)
            self.log(f"secret {namespace}/{name} ({', '.join(sorted(files))})")
        return _copy(out)

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self.objects.get((resource, namespace, name))
        if obj is None:
            raise _err(404, "NotFound", f'{resource} "{name}" not found', resource, name)
        return _copy(obj)

    def items(self, resource: str, namespace: str) -> list[dict[str, Any]]:
        with self._lock:
            return [_copy(o) for (r, ns, _), o in sorted(self.objects.items())
                    if r == resource and ns == namespace]

    def items_all(self, resource: str) -> list[dict[str, Any]]:
        with self._lock:
            return [_copy(o) for (r, _, _), o in sorted(self.objects.items()) if r == resource]

    def delete(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self.objects.pop((resource, namespace, name), None)
            proxies = self._proxies.pop((namespace, name), []) if resource == "services" \
                else []
        if obj is None:
            raise _err(404, "NotFound", f'{resource} "{name}" not found', resource, name)
        for p in proxies:
            p.stop()
        ip = (obj.get("spec") or {}).get("clusterIP")
        if resource == "services" and self.hub is not None and ip:
            subprocess.run(["ip", "-n", self.hub, "addr", "del", f"{ip}/32", "dev", "br0"],
                           capture_output=True, timeout=30, check=False)
        return _copy(obj)

    def close(self) -> None:
        """Delete everything (the end of the rehearsal: owner references or not, the cluster
        goes away): every proxy thread stopped, every address removed."""
        for resource, ns, name in list(self.objects):
            with contextlib.suppress(ApiError):
                self.delete(resource, ns, name)

    def owned_by(self, uid: str) -> list[tuple[str, str, str]]:
        return [k for k, o in self.objects.items()
                if any(r.get("uid") == uid for r in
                       (o.get("metadata") or {}).get("ownerReferences") or [])]

    def threads(self) -> list[threading.Thread]:
        with self._lock:
            return [t for ps in self._proxies.values() for p in ps for t in p.threads
                    if t.is_alive()]

    # ------------------------------------------------------------ Services
    def _service_spec(self, spec: dict[str, Any], name: str) -> dict[str, Any]:
        typ = spec.get("type", "ClusterIP")
        if typ != "ClusterIP" or spec.get("clusterIP") not in (None, ""):
            raise _err(422, "Invalid", f'Service "{name}" is invalid: rehearse models '
                       "ClusterIP Services with an allocated address only (no type "
                       f"{typ}, no clusterIP given, no headless)", "services", name)
        ip = str(next(self._hosts))
        ports = []
        for i, p in enumerate(spec.get("ports") or []):
            if "port" not in p:
                raise _err(422, "Invalid", f'Service "{name}" is invalid: spec.ports[{i}].port: '
                           "Invalid value: 0: must be between 1 and 65535, inclusive",
                           "services", name)
            proto = p.get("protocol", "TCP")
            if proto != "TCP":
                raise _err(422, "Invalid", f'Service "{name}" is invalid: rehearse proxies '
                           f"TCP only (spec.ports[{i}].protocol {proto})", "services", name)
            ports.append({**p, "protocol": "TCP", "targetPort": p.get("targetPort", p["port"])})
        if not ports:
            raise _err(422, "Invalid", f'Service "{name}" is invalid: spec.ports: Required value',
                       "services", name)
        return {**spec, "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                "ports": ports, "sessionAffinity": spec.get("sessionAffinity", "None"),
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}

    def endpoints(self, namespace: str, selector: Mapping[str, str] | None,
                  target: int | str) -> list[tuple[str, int]]:
        """Ready pods of this namespace whose labels match ``selector``, at ``target``."""
        if not selector:
            return []  # selector-less Services (manual Endpoints) are not modelled
        out = []
        for source in list(self.pod_sources):
            for pod in list(source()):
                if pod.namespace != namespace or not pod.serving:
                    continue
                if any(pod.labels.get(k) != str(v) for k, v in selector.items()):
                    continue
                port = target_port(pod, target)
                if port is not None:
                    out.append((pod.address, port))
        return out

    def _serve(self, namespace: str, name: str, svc: Mapping[str, Any]) -> None:
        if self.hub is None or self._in_netns is None:
            return
        ip = svc["spec"]["clusterIP"]
        subprocess.run(["ip", "-n", self.hub, "addr", "add", f"{ip}/32", "dev", "br0"],
                       capture_output=True, timeout=30, check=True)
        selector = dict(svc["spec"].get("selector") or {})
        proxies = []
        for p in svc["spec"]["ports"]:
            target = p["targetPort"]
            proxy = _Proxy(ip, int(p["port"]),
                           functools.partial(self.endpoints, namespace, selector, target))
            proxies.append(proxy)
            with self._lock:
                self._proxies.setdefault((namespace, name), []).append(proxy)
            self._in_netns(self.hub, proxy.start)

    def hosts_lines(self, namespace: str) -> list[str]:
        """``/etc/hosts`` lines for the Services that exist now (cluster DNS stand-in)."""
        with self._lock:
            svcs = [(ns, name, o["spec"]["clusterIP"]) for (r, ns, name), o in
                    sorted(self.objects.items()) if r == "services"]
        lines = []
        for ns, name, ip in svcs:
            names = [f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}.svc", f"{name}.{ns}"]
            if ns == namespace:
                names.append(name)
            lines.append(f"{ip}\t{' '.join(names)}")
        return lines


def _copy(obj: Mapping[str, Any]) -> dict[str, Any]:
    import json

    return dict(json.loads(json.dumps(obj)))
