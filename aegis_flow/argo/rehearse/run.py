"""``rehearse()``: run one Argo Workflow document on this machine, pods in namespaces.

Sets up what the controller needs around it — the private network (``netns.Network``), the
fake nodes (``cluster.NodeStore``), the namespace's Secrets (files under the work directory),
service-account tokens and the nodes API stand-in (``kubeapi.NodesApiServer`` on the cluster
network at 198.18.0.1:6443, what ``kubernetes.default.svc`` would be), and the aegis image
stand-in (``/opt/aegis/aegis-supervisor.pyz`` built from this checkout when a template names
it) — then runs ``controller.Operator`` to the end and tears everything down (every process
in the rehearsal's namespaces is killed, every namespace deleted).

Side effects: all of the above; the work directory is removed unless ``keep`` is set.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import string
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from aegis_flow.argo.rehearse import netns
from aegis_flow.argo.rehearse.cluster import NodeStore
from aegis_flow.argo.rehearse.controller import Operator
from aegis_flow.argo.rehearse.pods import PodContext
from aegis_flow.argo.rehearse.scenario import Scenario
from aegis_flow.argo.rehearse.spec import Unsupported, check_workflow

API_PORT = 6443


class RehearseError(Exception):
    """The rehearsal could not run (bad input, no namespaces): one line for the user."""


@dataclass
class Result:
    name: str
    status: dict[str, Any]
    workdir: Path | None
    api_calls: list[Any]
    nodes_after: list[dict[str, Any]]
    pod_specs: dict[str, dict[str, Any]]  # node id -> the pod spec it ran with

    @property
    def phase(self) -> str:
        return str(self.status.get("phase"))

    def node(self, display: str) -> dict[str, Any]:
        """The first node (in creation order) with this display name."""
        for n in self.status["nodes"].values():
            if n["displayName"] == display:
                return dict(n)
        raise KeyError(f"no node {display!r}; nodes: "
                       f"{sorted(n['displayName'] for n in self.status['nodes'].values())}")

    def nodes_named(self, prefix: str) -> list[dict[str, Any]]:
        return [n for n in self.status["nodes"].values() if n["displayName"].startswith(prefix)]


def load_workflow(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RehearseError(f"cannot read {path}: {exc.strerror}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise RehearseError(f"{path} is not YAML: {exc}") from None
    if len(docs) != 1:
        raise RehearseError(f"{path}: expected one Workflow document, found {len(docs)}")
    wf = docs[0]
    try:
        check_workflow(wf)
    except Unsupported as exc:
        raise RehearseError(f"{path}: {exc}") from None
    return dict(wf)


def apply_parameters(wf: dict[str, Any], params: Mapping[str, str]) -> dict[str, Any]:
    """``argo submit -p name=value``: override declared workflow parameters."""
    wf = json.loads(json.dumps(wf))
    declared = (wf["spec"].setdefault("arguments", {})).setdefault("parameters", [])
    names = {p["name"]: p for p in declared}
    for k, v in params.items():
        if k not in names:
            raise RehearseError(f"-p {k}: the workflow declares no parameter {k!r} "
                                f"(it has: {', '.join(sorted(names)) or 'none'})")
        names[k]["value"] = v
    return wf


def workflow_name(wf: Mapping[str, Any]) -> str:
    meta = wf.get("metadata") or {}
    if meta.get("name"):
        return str(meta["name"])
    prefix = str(meta.get("generateName") or "")
    if not prefix:
        raise RehearseError("metadata.name or metadata.generateName is required")
    return prefix + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


def _write_secrets(root: Path, secrets: Mapping[str, Mapping[str, str]], extra: Path | None
                   ) -> Path:
    """The scenario's Secrets, then ``--secrets DIR`` over them (the explicit one wins)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, keys in secrets.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for key, value in keys.items():
            (root / name / key).write_text(value)
    if extra is not None:
        if not extra.is_dir():
            raise RehearseError(f"--secrets {extra}: not a directory (one subdirectory per "
                                "Secret, one file per key)")
        for sub in extra.iterdir():
            if sub.is_dir():
                shutil.rmtree(root / sub.name, ignore_errors=True)
                shutil.copytree(sub, root / sub.name)
    return root


@contextlib.contextmanager
def _api_server(net: netns.Network, store: NodeStore, workdir: Path,
                tokens: Mapping[str, set[str]]) -> Iterator[Any]:
    from aegis_flow.argo.rehearse.kubeapi import NodesApiServer

    server = NodesApiServer(store, host=netns.HUB_ADDR, port=API_PORT, tokens=dict(tokens),
                            cert_dir=workdir / "api")
    netns.in_netns(net.hub, server.start)
    try:
        yield server
    finally:
        server.stop()


def _image_mounts(wf: Mapping[str, Any], workdir: Path) -> tuple[tuple[str, str], ...]:
    if "/opt/aegis/" not in json.dumps(wf):
        return ()
    from aegis_flow.bundle.build import build

    where = workdir / "image" / "opt-aegis"
    where.mkdir(parents=True, exist_ok=True)
    build(where / "aegis-supervisor.pyz")
    return (("/opt/aegis", str(where)),)


def rehearse(wf: dict[str, Any], *, scenario: Scenario | None = None,
             params: Mapping[str, str] | None = None, secrets_dir: Path | None = None,
             keep: Path | None = None, timeout: float | None = None,
             on_event: Callable[[str], None] = lambda s: None,
             grace_cap: float | None = 10.0,
             until: Callable[[], str | None] | None = None) -> Result:
    """Run ``wf`` to the end (or until ``until()`` returns a reason to stop: a caller that has
    seen what it waited for); the returned status has Argo's field names."""
    sc = scenario or Scenario()
    why = netns.why_unavailable()
    if why is not None:
        raise RehearseError(f"cannot rehearse here: {why}")
    wf = apply_parameters(wf, {**sc.parameters, **(params or {})})
    name = workflow_name(wf)
    namespace = str((wf.get("metadata") or {}).get("namespace") or "default")
    made_tmp = keep is None
    workdir = Path(tempfile.mkdtemp(prefix="aegis-rehearse-")) if keep is None else keep
    workdir.mkdir(parents=True, exist_ok=True)
    netns.remove_stale()
    net = netns.Network()
    store = NodeStore.from_specs(sc.nodes)
    try:
        net.create()
        secrets = _write_secrets(workdir / "secrets", sc.secrets, secrets_dir)
        tokens: dict[str, set[str]] = {}
        sa_dirs: dict[str, Path] = {}
        for sa in {*sc.rbac, str(wf["spec"].get("serviceAccountName") or "default"),
                   *(str(t.get("serviceAccountName")) for t in wf["spec"]["templates"]
                     if t.get("serviceAccountName"))}:
            token = f"sa-{sa}-" + "".join(random.choices(string.ascii_letters, k=24))
            tokens[token] = set(sc.rbac.get(sa, ()))
            sa_dirs[sa] = workdir / "sa" / sa
            sa_dirs[sa].mkdir(parents=True, exist_ok=True)
            (sa_dirs[sa] / "token").write_text(token)
            (sa_dirs[sa] / "namespace").write_text(namespace)
        with _api_server(net, store, workdir, tokens) as api:
            for d in sa_dirs.values():
                shutil.copy(workdir / "api" / "ca.crt", d / "ca.crt")
            venv_bin = str(Path(sys.executable).parent)
            ctx = PodContext(
                namespace=namespace, workflow=name, secrets_dir=secrets, workdir=workdir,
                base_path=f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                          "/sbin:/bin",
                api_env={"KUBERNETES_SERVICE_HOST": netns.HUB_ADDR,
                         "KUBERNETES_SERVICE_PORT": str(API_PORT)},
                image_mounts=_image_mounts(wf, workdir), grace_cap=grace_cap,
                sa_dirs={k: str(v) for k, v in sa_dirs.items()},
                image_workdirs={k: v["workingDir"] for k, v in sc.images.items()})

            def hook(node_name: str, node: dict[str, Any], spec: dict[str, Any]
                     ) -> dict[str, Any]:
                rule = sc.rule_for(node_name, node.get("templateName", ""))
                return rule.apply(spec) if rule is not None else spec

            op = Operator(wf, name=name, namespace=namespace, cluster=store, net=net, ctx=ctx,
                          pod_hook=hook, log=on_event)
            seen: dict[str, tuple[str, str]] = {}

            def progress(o: Operator) -> None:
                for n in list(o.nodes.values()):
                    if n["type"] in ("StepGroup",):
                        continue
                    key = (n["phase"], n.get("message", ""))
                    if seen.get(n["id"]) != key:
                        seen[n["id"]] = key
                        msg = f" ({key[1]})" if key[1] else ""
                        on_event(f"{n['displayName']}: {key[0]}{msg}")

            status = op.run(timeout=timeout if timeout is not None else sc.timeout,
                            progress=progress, until=until)
            calls = list(getattr(api, "calls", []))
        return Result(name=name, status=status, workdir=None if made_tmp else workdir,
                      api_calls=calls, nodes_after=store.list(), pod_specs=dict(op.pod_specs))
    finally:
        net.destroy()
        if made_tmp:
            shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["RehearseError", "Result", "apply_parameters", "load_workflow", "rehearse",
           "workflow_name"]
