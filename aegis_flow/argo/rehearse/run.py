"""``rehearse()``: run one Argo Workflow document on this machine, pods in namespaces.

Sets up what the controller needs around it — the private network (``netns.Network``), the
fake nodes (``cluster.NodeStore``), the namespace's Secrets (files under the work directory),
service-account tokens and the nodes API stand-in (``kubeapi.NodesApiServer`` on the cluster
network at 198.18.0.1:6443, what ``kubernetes.default.svc`` would be), and the aegis image
stand-in (``/opt/aegis/aegis-supervisor.pyz`` built from this checkout when a template names
it), the namespaced objects (``objects.ObjectStore``: Services with a working ClusterIP,
served by the same API stand-in) and the scenario's own objects and faults (``scene``) — then
runs ``controller.Operator`` to the end and tears everything down (every Service, proxy thread
and address removed, every process in the rehearsal's namespaces killed, every namespace
deleted).

Side effects: all of the above; the work directory is removed unless ``keep`` is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import string
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aegis_flow.argo.rehearse import netns
from aegis_flow.argo.rehearse.cluster import NodeStore
from aegis_flow.argo.rehearse.controller import Operator
from aegis_flow.argo.rehearse.kubeapi import Grant
from aegis_flow.argo.rehearse.objects import ObjectStore
from aegis_flow.argo.rehearse.pods import PodContext
from aegis_flow.argo.rehearse.scenario import Scenario
from aegis_flow.argo.rehearse.scene import Faults, ObjectError, ObjectPods
from aegis_flow.argo.rehearse.spec import Unsupported, check_workflow, check_workflow_template

API_PORT = 6443
OBJECTS_READY_TIMEOUT = 120.0  # seconds the scenario's object Pods have to become ready


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
    faults: list[dict[str, Any]] = field(default_factory=list)  # the scenario faults fired
    services: list[dict[str, Any]] = field(default_factory=list)  # Services at the end

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


def load_templates(path: str) -> list[dict[str, Any]]:
    """``--templates FILE``: the WorkflowTemplates in a (multi-document) YAML file."""
    from aegis_flow.argo.rehearse.scenario import ScenarioError, load_manifests

    try:
        docs = load_manifests(path)
    except ScenarioError as exc:
        raise RehearseError(str(exc)) from None
    if not docs:
        raise RehearseError(f"{path}: no WorkflowTemplate in it")
    return docs


def workflow_templates(manifests: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Name -> manifest, each checked like a Workflow's templates (a later one of the same
    name replaces an earlier one, as ``kubectl apply`` would)."""
    out: dict[str, dict[str, Any]] = {}
    for i, wt in enumerate(manifests):
        try:
            name = check_workflow_template(wt, f"WorkflowTemplate #{i + 1}")
        except Unsupported as exc:
            raise RehearseError(str(exc)) from None
        out[name] = json.loads(json.dumps(wt))
    return out


def _template_refs(docs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The WorkflowTemplate names the steps and tasks of these documents refer to."""
    out: set[str] = set()
    for doc in docs:
        for t in (doc.get("spec") or {}).get("templates") or []:
            calls = [s for group in t.get("steps") or [] for s in group or []]
            calls += list((t.get("dag") or {}).get("tasks") or [])
            out.update(str(c["templateRef"].get("name")) for c in calls
                       if isinstance(c, dict) and c.get("templateRef"))
    return out


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
                tokens: Mapping[str, Any], objects: ObjectStore | None = None
                ) -> Iterator[Any]:
    from aegis_flow.argo.rehearse.kubeapi import NodesApiServer

    server = NodesApiServer(store, host=netns.HUB_ADDR, port=API_PORT, tokens=dict(tokens),
                            cert_dir=workdir / "api", namespaced=objects)
    netns.in_netns(net.hub, server.start)
    try:
        yield server
    finally:
        server.stop()


def run_operator(command: tuple[str, ...], *, hub: str, fill: dict[str, str],
                 cluster_ip: Callable[[str, str], str], path: str,
                 timeout: float = 60.0) -> dict[str, Any]:
    """Run ``command`` in the hub namespace (the cluster network, as an operator with
    ``kubectl port-forward`` would), its ``{…}`` fields filled in; the exit code and the tail
    of its output."""
    def one(arg: str) -> str:
        def svc(m: re.Match[str]) -> str:
            name, _, ns = m.group(1).partition(".")
            return cluster_ip(ns or fill["namespace"], name)

        arg = re.sub(r"\{svc:([a-z0-9.-]+)\}", svc, arg)
        for key, value in fill.items():
            arg = arg.replace("{" + key + "}", value)
        return arg

    try:
        argv = [one(a) for a in command]
    except Exception as exc:  # noqa: BLE001 - an unknown Service: said in the record
        return {"rc": None, "output": f"cannot fill in {list(command)}: {exc}"}
    try:
        done = subprocess.run(["ip", "netns", "exec", hub, *argv], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, "PATH": path})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": None, "output": str(exc), "argv": argv}
    return {"rc": done.returncode, "output": (done.stdout + done.stderr)[-2000:], "argv": argv}


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
             until: Callable[[], str | None] | None = None,
             templates: Sequence[Mapping[str, Any]] = ()) -> Result:
    """Run ``wf`` to the end (or until ``until()`` returns a reason to stop: a caller that has
    seen what it waited for); the returned status has Argo's field names. ``templates`` are
    WorkflowTemplates for ``templateRef`` (after the scenario's; the same name replaces)."""
    sc = scenario or Scenario()
    wts = workflow_templates([*sc.workflow_templates, *templates])
    missing = sorted(_template_refs([wf, *wts.values()]) - set(wts))
    if missing:  # Argo's validation refuses the workflow at submission
        raise RehearseError(f"templateRef names WorkflowTemplate {', '.join(missing)}, which "
                            "was not given (--templates FILE, or the scenario's "
                            "workflowTemplates)")
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
    objects = ObjectStore(hub=net.hub, in_netns=netns.in_netns)
    objects.log = on_event
    scene: ObjectPods | None = None
    try:
        net.create()
        secrets = _write_secrets(workdir / "secrets", sc.secrets, secrets_dir)

        def secret_sink(_ns: str, secret: str, files: dict[str, bytes]) -> None:
            (secrets / secret).mkdir(parents=True, exist_ok=True)
            for key, value in files.items():
                (secrets / secret / key).write_bytes(value)

        objects.secret_sink = secret_sink
        tokens: dict[str, Grant] = {}
        sa_dirs: dict[str, Path] = {}
        for sa in {*sc.rbac, str(wf["spec"].get("serviceAccountName") or "default"),
                   *(str(t.get("serviceAccountName")) for t in wf["spec"]["templates"]
                     if t.get("serviceAccountName")),
                   *(str((o.get("spec") or {}).get("serviceAccountName") or "default")
                     for o in sc.objects if o.get("kind") == "Pod")}:
            token = f"sa-{sa}-" + "".join(random.choices(string.ascii_letters, k=24))
            rules = sc.rbac.get(sa, {})
            tokens[token] = Grant(f"system:serviceaccount:{namespace}:{sa}",
                                  frozenset(rules.get("nodes", ())),
                                  frozenset((r, v) for r, verbs in rules.items()
                                            if r != "nodes" for v in verbs))
            sa_dirs[sa] = workdir / "sa" / sa
            sa_dirs[sa].mkdir(parents=True, exist_ok=True)
            (sa_dirs[sa] / "token").write_text(token)
            (sa_dirs[sa] / "namespace").write_text(namespace)
        with _api_server(net, store, workdir, tokens, objects) as api:
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
                image_workdirs={k: v["workingDir"] for k, v in sc.images.items()},
                service_hosts=objects.hosts_lines, progress_ticks=sc.progress_ticks)

            def hook(node_name: str, node: dict[str, Any], spec: dict[str, Any]
                     ) -> dict[str, Any]:
                rule = sc.rule_for(node_name, node.get("templateName", ""),
                                   node.get("hostNodeName"))
                return rule.apply(spec) if rule is not None else spec

            op = Operator(wf, name=name, namespace=namespace, cluster=store, net=net, ctx=ctx,
                          pod_hook=hook, log=on_event, workflow_templates=wts)
            objects.pod_sources.append(lambda: list(op.pods.values()))
            if sc.objects:
                scene = ObjectPods(sc.objects, store=objects, nodes=store.list, used=op.used,
                                   ctx=ctx, net=net, log=on_event)
                objects.pod_sources.append(scene.sources)
                try:
                    scene.start()
                    scene.wait_ready(min(OBJECTS_READY_TIMEOUT, sc.timeout))
                except ObjectError as exc:
                    raise RehearseError(str(exc)) from None
            def operator(command: tuple[str, ...]) -> dict[str, Any]:
                """An operator's command (``exec`` faults), from the cluster network."""
                return run_operator(command, hub=net.hub, fill={
                    "workflow": name, "namespace": namespace, "secrets": str(secrets)},
                    cluster_ip=lambda ns, svc: objects.get("services", ns, svc)["spec"][
                        "clusterIP"], path=ctx.base_path)

            faults = Faults(sc.faults, on_event, operator=operator)
            seen: dict[str, tuple[str, str]] = {}

            def progress(o: Operator) -> None:
                if faults.pending:
                    faults.check(o.pods, o.nodes, o.wake.set)
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
            faults.join()
            calls = list(getattr(api, "calls", []))
            services = objects.items_all("services")
        for key in objects.owned_by(op.uid):  # the workflow goes: garbage collection
            with contextlib.suppress(Exception):
                objects.delete(*key)
        return Result(name=name, status=status, workdir=None if made_tmp else workdir,
                      api_calls=calls, nodes_after=store.list(), pod_specs=dict(op.pod_specs),
                      faults=list(faults.fired), services=services)
    finally:
        if scene is not None:
            scene.stop()
        objects.close()
        net.destroy()
        if made_tmp:
            shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["RehearseError", "Result", "apply_parameters", "load_templates", "load_workflow",
           "rehearse", "workflow_name", "workflow_templates"]
