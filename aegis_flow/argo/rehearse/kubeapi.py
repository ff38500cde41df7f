"""A small HTTPS stand-in for the Kubernetes nodes API, over a ``cluster.NodeStore``.

Enough for the official ``kubernetes`` client: ``CoreV1Api.list_node`` (``labelSelector``,
``fieldSelector`` on ``metadata.name``), ``read_node`` and ``patch_node`` with merge, strategic
merge and JSON patches; ``v1.Status`` bodies for 400/401/403/404/405/409/415/422; ``/version``,
``/api``, ``/api/v1`` and ``/apis`` for discovery. Bearer tokens map to a ``Grant`` (a user and
the verbs it may use on nodes): an unknown or missing token is 401, a verb outside the grant 403.

Side effects, all in ``NodesApiServer``: ``start()`` generates a throwaway CA and a server
certificate (``cryptography``; the SAN has the listen host and the in-cluster service names),
writes ``ca.crt`` to ``cert_dir`` (the key goes to a private temporary file, read and deleted),
listens on ``host:port`` and serves from a background thread; every request is appended to
``calls``. ``json_patch`` (RFC 6902) and ``kubeconfig`` are pure.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import ipaddress
import json
import os
import re
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from aegis_flow.argo.rehearse.cluster import JSON_PATCH, ApiError, NodeStore
from aegis_flow.argo.rehearse.objects import KINDS, ObjectStore

VERBS = frozenset({"get", "list", "patch"})
_NAMESPACED = re.compile(r"/api/v1/namespaces/([^/]+)/(services|secrets|configmaps)(?:/([^/]+))?")
IN_CLUSTER_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local", "localhost")
VERSION = {"major": "1", "minor": "34", "gitVersion": "v1.34.0-aegis-rehearse",
           "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
           "buildDate": "1970-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
           "platform": "linux/amd64"}


@dataclass(frozen=True)
class Grant:
    """Who a token is, what it may do to nodes (a subset of ``VERBS``), and to namespaced
    resources (``resources``: (resource, verb) pairs, e.g. ``("services", "create")``)."""

    user: str
    verbs: frozenset[str] = VERBS
    resources: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # with the query string
    identity: str | None  # the grant's user; None when the token was refused
    status: int


def status_body(err: ApiError) -> dict[str, Any]:
    """The ``v1.Status`` the apiserver sends with an error."""
    out: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Failure", "message": err.message, "reason": err.reason,
                           "code": err.code}
    if err.name is not None:
        out["details"] = {"name": err.name, "kind": getattr(err, "kind", "nodes")}
    return out


def _pointer(ptr: str) -> list[str]:
    if ptr and not ptr.startswith("/"):
        raise ValueError(f"JSON pointer must start with '/': {ptr!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in ptr.split("/")[1:]]


def _parent(doc: Any, parts: list[str]) -> Any:
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc


def _get(doc: Any, parts: list[str]) -> Any:
    return _parent(doc, [*parts, ""])


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test) on a copy of ``target``; a failed
    operation is the apiserver's 422 Invalid, a body that is not a list its 400."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type "
                       "jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in ops:
        try:
            kind, parts = op["op"], _pointer(op["path"])
            if kind in ("move", "copy"):
                value = copy.deepcopy(_get(doc, _pointer(op["from"])))
                if kind == "move":
                    doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
                doc = json_patch(doc, [{"op": "add", "path": op["path"], "value": value}])
            elif kind == "test":
                if _get(doc, parts) != op["value"]:
                    raise ApiError(422, "Invalid", f"the server rejected our request due to an "
                                   f"error in our request: test failed at {op['path']}")
            elif not parts:
                doc = None if kind == "remove" else copy.deepcopy(op["value"])
            elif kind in ("add", "remove", "replace"):
                parent, last = _parent(doc, parts), parts[-1]
                if isinstance(parent, list):
                    i = len(parent) if last == "-" and kind == "add" else int(last)
                    if not 0 <= i < len(parent) + (kind == "add"):
                        raise IndexError(last)
                    if kind != "add":
                        del parent[i]
                    if kind != "remove":
                        parent.insert(i, copy.deepcopy(op["value"]))
                else:
                    if kind != "add" and last not in parent:
                        raise KeyError(last)
                    if kind == "remove":
                        del parent[last]
                    else:
                        parent[last] = copy.deepcopy(op["value"])
            else:
                raise ValueError(f"unknown operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in "
                           f"our request: {op!r}: {exc!r}") from None
    return doc


def _certificates(names: Iterable[str]) -> tuple[bytes, bytes, bytes]:
    """(CA cert, server cert, server key) as PEM; the server cert's SAN lists ``names``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aegis-rehearse-ca")])
    usage = dict.fromkeys(("content_commitment", "key_encipherment", "data_encipherment",
                           "key_agreement", "encipher_only", "decipher_only"), False)

    def builder(subject: x509.Name, public: Any) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                .public_key(public).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=7))
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    ca_key.public_key()), critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public),
                               critical=False))

    ca = (builder(ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       **usage), critical=True)
          .sign(ca_key, hashes.SHA256()))
    alt: list[x509.GeneralName] = []
    for n in dict.fromkeys(names):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    cert = (builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
                    key.public_key())
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False,
                                         crl_sign=False, **usage), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def kubeconfig(url: str, ca_path: str | Path, token: str, *, name: str = "rehearse"
               ) -> dict[str, Any]:
    """A kubeconfig (write it as JSON: it is YAML too) for ``url`` with a bearer token."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
            "clusters": [{"name": name, "cluster": {"server": url,
                                                    "certificate-authority": str(ca_path)}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}


class _TLSServer(ThreadingHTTPServer):
    """TLS per connection, in the connection's own thread (a stalled handshake blocks no
    one)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 context: ssl.SSLContext, api: NodesApiServer) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.context, self.api = context, api
        super().__init__(address, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(30)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)  # type: ignore[arg-type]
        finally:
            tls.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _TLSServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # the API keeps ``calls``; nothing goes to stderr

    def do_GET(self) -> None:
        self.server.api._handle(self)

    do_PATCH = do_POST = do_PUT = do_DELETE = do_GET

    def reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class NodesApiServer:
    """The nodes API over ``store`` at ``https://host:port`` (``port=0``: any free port).

    ``tokens``: bearer token -> ``Grant``, or -> the verbs (the user is then named after the
    token's hash). ``cert_dir``: where ``ca.crt`` goes (mount it as the service account's
    ``ca.crt``); ``san``: more names or IPs for the server certificate."""

    def __init__(self, store: NodeStore, *, host: str, port: int = 0,
                 tokens: Mapping[str, Grant | Iterable[str]], cert_dir: str | Path,
                 san: Iterable[str] = (), namespaced: ObjectStore | None = None) -> None:
        self.store, self.host, self.port = store, host, port
        self.namespaced = namespaced  # Services, Secrets, ConfigMaps (create/get/list/delete)
        self.cert_dir = Path(cert_dir)
        self.san = tuple(san)
        self.grants = {tok: g if isinstance(g, Grant) else Grant(
            "system:serviceaccount:rehearse:" + hashlib.sha256(tok.encode()).hexdigest()[:8],
            frozenset(g)) for tok, g in tokens.items()}
        self.calls: list[Call] = []
        # ServiceAccounts, GET only: ("serviceaccounts", namespace, name) -> object
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._server: _TLSServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def ca_path(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    def kubeconfig(self, token: str) -> dict[str, Any]:
        return kubeconfig(self.url, self.ca_path, token)

    def start(self) -> None:
        ca, cert, key = _certificates([self.host, *self.san, *IN_CLUSTER_NAMES, "127.0.0.1"])
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        self.ca_path.write_bytes(ca)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "server.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(cert + key)
            context.load_cert_chain(path)
        self._server = _TLSServer((self.host, self.port), _Handler, context, self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="rehearse-kubeapi", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> NodesApiServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------ requests

    def _handle(self, h: _Handler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        identity: str | None = None
        try:
            grant = self._authenticate(h.headers.get("Authorization") or "", h.path)
            identity = grant.user if grant else None
            status, payload = self._route(h.command, h.path, grant, body,
                                          (h.headers.get("Content-Type") or "").split(";")[0])
        except ApiError as err:
            status, payload = err.code, status_body(err)
        with self._lock:
            self.calls.append(Call(h.command, h.path, identity, status))
        h.reply(status, payload)

    def _authenticate(self, header: str, path: str) -> Grant | None:
        scheme, _, token = header.partition(" ")
        grant = self.grants.get(token.strip()) if scheme.lower() == "bearer" else None
        if grant is None and urlsplit(path).path.rstrip("/") != "/version":
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return grant

    def _route(self, method: str, target: str, grant: Grant | None, body: bytes,
               content_type: str) -> tuple[int, Any]:
        parts = urlsplit(target)
        path, query = parts.path.rstrip("/"), parse_qs(parts.query)
        if method == "GET" and path in ("/version", "/api", "/api/v1", "/apis"):
            return 200, self._discovery(path)
        if path == "/api/v1/nodes" or path.startswith("/api/v1/nodes/"):
            name = path[len("/api/v1/nodes/"):] or None
            allowed = {"GET": "get" if name else "list", "PATCH": "patch" if name else ""}
            verb = allowed.get(method, "")
            if not verb or (name and "/" in name):
                raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method "
                               f"on the requested resource ({method} {path})")
            if grant is None or verb not in grant.verbs:
                who = grant.user if grant else "system:anonymous"
                subject = f'nodes "{name}"' if name else "nodes"
                raise ApiError(403, "Forbidden", f'{subject} is forbidden: User "{who}" cannot '
                               f'{verb} resource "nodes" in API group "" at the cluster scope',
                               name)
            if verb == "list":
                return 200, self._list(query)
            assert name is not None
            if verb == "get":
                return 200, self.store.get(name)
            try:
                patch = json.loads(body or b"null")
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"error decoding patch: {exc}") from None
            if content_type == JSON_PATCH:
                return 200, self.store.update(name, lambda node: json_patch(node, patch))
            return 200, self.store.patch(name, patch, content_type)
        if method == "GET" and path.startswith("/api/v1/namespaces/"):
            namespace, _, rest = path[len("/api/v1/namespaces/"):].partition("/")
            resource, _, name = rest.partition("/")
            if resource == "serviceaccounts" and name and "/" not in name:
                if grant is None or (resource, "get") not in grant.resources:
                    who = grant.user if grant else "system:anonymous"
                    raise ApiError(403, "Forbidden", f'{resource} "{name}" is forbidden: User '
                                   f'"{who}" cannot get resource "{resource}" in API group "" '
                                   f'in the namespace "{namespace}"', name)
                found = self.objects.get((resource, namespace, name))
                if found is None:
                    raise ApiError(404, "NotFound", f'{resource} "{name}" not found', name)
                return 200, copy.deepcopy(found)
        m = _NAMESPACED.fullmatch(path)
        if m and self.namespaced is not None:
            return self._namespaced(method, m.group(1), m.group(2), m.group(3), grant, body)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _namespaced(self, method: str, namespace: str, resource: str, name: str | None,
                    grant: Grant | None, body: bytes) -> tuple[int, Any]:
        """Services, Secrets, ConfigMaps: create, get, list, delete (RBAC per resource)."""
        assert self.namespaced is not None
        verb = {("POST", False): "create", ("GET", True): "get", ("GET", False): "list",
                ("DELETE", True): "delete"}.get((method, name is not None), "")
        if not verb:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on "
                           f"the requested resource ({method} {resource})")
        if grant is None or (resource, verb) not in grant.resources:
            who = grant.user if grant else "system:anonymous"
            subject = f'{resource} "{name}"' if name else resource
            err = ApiError(403, "Forbidden", f'{subject} is forbidden: User "{who}" cannot '
                           f'{verb} resource "{resource}" in API group "" in the namespace '
                           f'"{namespace}"', name)
            err.kind = resource  # type: ignore[attr-defined]
            raise err
        if verb == "create":
            try:
                obj = json.loads(body or b"null")
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"error decoding body: {exc}") from None
            return 201, self.namespaced.create(resource, namespace, obj)
        if verb == "get":
            assert name is not None
            return 200, self.namespaced.get(resource, namespace, name)
        if verb == "delete":
            assert name is not None
            return 200, self.namespaced.delete(resource, namespace, name)
        kind = {"services": "ServiceList", "secrets": "SecretList",
                "configmaps": "ConfigMapList"}[resource]
        return 200, {"kind": kind, "apiVersion": "v1", "metadata": {},
                     "items": self.namespaced.items(resource, namespace)}

    def _list(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        try:
            items = self.store.list((query.get("labelSelector") or [""])[0])
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {exc}") from None
        for sel in filter(None, (query.get("fieldSelector") or [""])[0].split(",")):
            key, op, value = sel.partition("!=") if "!=" in sel else sel.partition("=")
            if key.strip() != "metadata.name":
                raise ApiError(400, "BadRequest", f'field label not supported: "{key.strip()}"')
            items = [n for n in items
                     if (n["metadata"]["name"] == value.lstrip("=").strip()) == (op != "!=")]
        for n in items:  # list items carry no kind/apiVersion
            n.pop("kind", None)
            n.pop("apiVersion", None)
        return {"kind": "NodeList", "apiVersion": "v1",
                "metadata": {"resourceVersion": self.store.resource_version}, "items": items}

    def _discovery(self, path: str) -> dict[str, Any]:
        if path == "/version":
            return dict(VERSION)
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]}
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
                "resources": [{"name": "nodes", "singularName": "node", "namespaced": False,
                               "kind": "Node", "verbs": sorted(VERBS), "shortNames": ["no"]},
                              *({"name": r, "singularName": k.lower(), "namespaced": True,
                                 "kind": k, "verbs": ["create", "delete", "get", "list"]}
                                for r, k in KINDS.items() if self.namespaced is not None)]}
