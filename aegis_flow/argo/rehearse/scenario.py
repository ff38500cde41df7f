"""Scenario files for ``aegis-flow rehearse --scenario FILE`` (PURE: parsing and matching).

A scenario is the cluster and the faults around one run of a workflow::

    nodes:                      # the fake cluster (default: node-0..node-3, 64 CPUs, 512Gi)
      - name: gpu-0
        labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
        taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
        allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8"}
    secrets:                    # the namespace's Secrets (name -> key -> value)
      aegis-bootstrap: {token: s3cret}
    parameters: {max-retry: "1"}        # like -p name=value (-p wins)
    rbac:                       # service account -> verbs on nodes (a list), or resource ->
      aegis-flow: [get, list, patch]   # verbs (default: these two, as aegis-flow install)
      aegis-flow-setup: {services: [create, get, delete], secrets: [create]}
    timeout: 300                # seconds before the rehearsal gives up (default 600)
    include: cluster.yaml       # another scenario beneath this one (relative path; this
                                #   file's keys win, its pods rules come first)
    images:                     # stand-ins for images: the working directory a container of
      registry.example.com/team/train:1.0: {workingDir: train-image}  # it starts in (the
                                #   image's WORKDIR; relative to this file) when it sets none
    pods:                       # change what some containers do: first match wins
      - match: "*.run(1:1)(*"   # glob on the node name (only * is special)
        template: worker        # and/or the template name
        containers:
          main: {command: [sh, -c, "exit 70"], args: []}  # replaces what is given
        env: {EXTRA: "1"}       # added to every container of the pod
        host: gpu-*             # only when the pod was scheduled on a matching node
    objects:                    # what exists in the cluster before the workflow starts (Pods
      - {apiVersion: v1, kind: Pod, metadata: {name: nats, namespace: aegis-flow,
         labels: {app: nats}}, spec: {containers: [{name: nats, image: nats,
         command: [nats-server, -p, "4222"]}]}}
      - {apiVersion: v1, kind: Service, metadata: {name: aegis-nats, namespace: aegis-flow},
         spec: {selector: {app: nats}, ports: [{port: 4222}]}}   # and Services)
    faults:                     # each fires at most once, on the first pod that matches
      - match: "*.worker"       # glob on the node name, as pods rules (and/or template:)
        after: 5                # seconds after its main container started (default 0)
        when-log: "epoch 2"     # and/or once main's stdout/stderr contains this
        action: delete-pod      # or kill (SIGKILL main's processes: exit 137), or exec:
        command: [aegis-flow, stop, "{workflow}", --nats-url, "nats://{svc:aegis-nats.default}:4222"]
                                #   an operator's command, run from the cluster network (the
                                #   pod is only the trigger); {workflow}, {namespace},
                                #   {secrets} (the Secrets' directory: one per Secret) and
                                #   {svc:NAME.NAMESPACE} (a Service's ClusterIP) are filled in
    controller-env:             # the Argo controller's progress ticks (default 1m and 3s)
      {ARGO_PROGRESS_PATCH_TICK_DURATION: 2s, ARGO_PROGRESS_FILE_TICK_DURATION: 1s}
    workflowTemplates:          # the namespace's WorkflowTemplates (what templateRef names):
      - ../workflows/aegis_checks.yaml  # files (relative to this file, several documents
      - {kind: WorkflowTemplate, metadata: {name: t}, spec: {templates: []}}  # each) or
                                #   inline manifests; `--templates FILE` adds more

Unknown keys are refused (``ScenarioError``) so a typo never silently does nothing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

DEFAULT_NODES = tuple(
    {"name": f"node-{i}", "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}
    for i in range(4))
DEFAULT_RBAC: dict[str, dict[str, tuple[str, ...]]] = {
    "aegis-flow": {"nodes": ("get", "list", "patch")},
    "aegis-flow-setup": {"services": ("create", "get", "delete"), "secrets": ("create",)}}
_TOP = {"nodes", "secrets", "parameters", "rbac", "timeout", "pods", "description", "include",
        "images", "objects", "faults", "controller-env", "workflowTemplates"}
_POD = {"match", "template", "containers", "env", "host"}
_FAULT = {"match", "template", "after", "when-log", "action", "command"}
FAULT_ACTIONS = ("delete-pod", "kill", "exec")
CONTROLLER_ENV = {"ARGO_PROGRESS_PATCH_TICK_DURATION": 60.0,
                  "ARGO_PROGRESS_FILE_TICK_DURATION": 3.0}


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class PodRule:
    match: str = "*"
    template: str | None = None
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    host: str | None = None

    def matches(self, node_name: str, template: str, host: str | None = None) -> bool:
        if self.template is not None and self.template != template:
            return False
        if self.host is not None and (host is None or not glob(self.host, host)):
            return False
        return glob(self.match, node_name)

    def apply(self, spec: dict[str, Any]) -> dict[str, Any]:
        out = dict(spec)
        groups = ("initContainers", "containers")
        for g in groups:
            new = []
            for c in out.get(g) or []:
                c = dict(c)
                repl = self.containers.get(c["name"])
                if repl is not None:  # each of command and args replaced only when given
                    for key in ("command", "args"):
                        if key in repl:
                            c[key] = [str(a) for a in repl[key] or []]
                if self.env:
                    c["env"] = [*(c.get("env") or []),
                                *({"name": k, "value": str(v)} for k, v in self.env.items())]
                new.append(c)
            if g in out:
                out[g] = new
        return out


def glob(pattern: str, text: str) -> bool:
    """Only ``*`` is special."""
    regex = "^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$"
    return re.match(regex, text, re.DOTALL) is not None


@dataclass(frozen=True)
class Fault:
    """Something done to one pod while it runs (``faults:``)."""

    action: str
    match: str = "*"
    template: str | None = None
    after: float = 0.0
    when_log: str | None = None
    command: tuple[str, ...] = ()  # exec: what the operator runs

    def matches(self, node_name: str, template: str) -> bool:
        if self.template is not None and self.template != template:
            return False
        return glob(self.match, node_name)


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[dict[str, Any], ...] = DEFAULT_NODES
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    # service account -> resource -> verbs
    rbac: dict[str, dict[str, tuple[str, ...]]] = field(
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_RBAC.items()})
    timeout: float = 600.0
    pods: tuple[PodRule, ...] = ()
    description: str = ""
    images: dict[str, dict[str, str]] = field(default_factory=dict)
    objects: tuple[dict[str, Any], ...] = ()
    faults: tuple[Fault, ...] = ()
    # (ARGO_PROGRESS_PATCH_TICK_DURATION, ARGO_PROGRESS_FILE_TICK_DURATION) in seconds; None:
    # one of them 0, progress monitoring disabled
    progress_ticks: tuple[float, float] | None = (60.0, 3.0)
    workflow_templates: tuple[dict[str, Any], ...] = ()  # manifests, for templateRef

    def rule_for(self, node_name: str, template: str, host: str | None = None
                 ) -> PodRule | None:
        return next((r for r in self.pods if r.matches(node_name, template, host)), None)


def parse(doc: Any, where: str = "scenario", base_dir: str = ".") -> Scenario:
    if doc is None:
        return Scenario()
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: expected a mapping at the top")
    extra = sorted(set(doc) - _TOP)
    if extra:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(extra)} "
                            f"(known: {', '.join(sorted(_TOP))})")
    rules = []
    for i, r in enumerate(doc.get("pods") or []):
        if not isinstance(r, dict) or set(r) - _POD:
            raise ScenarioError(f"{where}: pods[{i}] has unknown keys "
                                f"{sorted(set(r) - _POD) if isinstance(r, dict) else r!r}")
        for cname, c in (r.get("containers") or {}).items():
            if not isinstance(c, dict) or set(c) - {"command", "args"}:
                raise ScenarioError(f"{where}: pods[{i}].containers.{cname} may set only "
                                    "command and args")
        rules.append(PodRule(match=str(r.get("match", "*")), template=r.get("template"),
                             containers=dict(r.get("containers") or {}),
                             env={str(k): str(v) for k, v in (r.get("env") or {}).items()},
                             host=None if r.get("host") is None else str(r["host"])))
    nodes = tuple(doc["nodes"]) if doc.get("nodes") else DEFAULT_NODES
    for n in nodes:
        if not isinstance(n, dict) or "name" not in n:
            raise ScenarioError(f"{where}: every node needs a name")
    secrets = {str(k): {str(kk): str(vv) for kk, vv in (v or {}).items()}
               for k, v in (doc.get("secrets") or {}).items()}
    rbac = _rbac(doc.get("rbac") or DEFAULT_RBAC, where)
    objects = _objects(doc.get("objects") or [], where)
    faults = _faults(doc.get("faults") or [], where)
    ticks = _controller_env(doc.get("controller-env") or {}, where)
    try:
        timeout = float(doc.get("timeout", 600))
    except (TypeError, ValueError):
        raise ScenarioError(f"{where}: timeout must be a number of seconds") from None
    images: dict[str, dict[str, str]] = {}
    for image, conf in (doc.get("images") or {}).items():
        if not isinstance(conf, dict) or set(conf) - {"workingDir"}:
            raise ScenarioError(f"{where}: images.{image} may set only workingDir")
        wd = str(conf["workingDir"])
        images[str(image)] = {"workingDir": os.path.normpath(os.path.join(base_dir, wd))}
    wts: list[dict[str, Any]] = []
    for i, entry in enumerate(doc.get("workflowTemplates") or []):
        if isinstance(entry, dict):
            wts.append(entry)
        elif isinstance(entry, str):
            wts.extend(load_manifests(os.path.join(base_dir, entry),
                                      f"{where}: workflowTemplates[{i}]: "))
        else:
            raise ScenarioError(f"{where}: workflowTemplates[{i}] must be a file path or a "
                                "WorkflowTemplate manifest")
    return Scenario(nodes=nodes, secrets=secrets, images=images, workflow_templates=tuple(wts),
                    parameters={str(k): str(v) for k, v in (doc.get("parameters") or {}).items()},
                    rbac=rbac, timeout=timeout, pods=tuple(rules),
                    description=str(doc.get("description", "")), objects=objects,
                    faults=faults, progress_ticks=ticks)


def _rbac(doc: Any, where: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """``sa: [verbs]`` (verbs on nodes) or ``sa: {resource: [verbs]}``."""
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: rbac maps service accounts to verbs")
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for sa, v in doc.items():
        if isinstance(v, dict):
            out[str(sa)] = {str(r): tuple(str(x) for x in (verbs or [])) for r, verbs in v.items()}
        elif isinstance(v, (list, tuple)):
            out[str(sa)] = {"nodes": tuple(str(x) for x in v)}
        else:
            raise ScenarioError(f"{where}: rbac.{sa}: a list of verbs on nodes, or a mapping "
                                "resource -> verbs")
    return out


def _objects(doc: Any, where: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(doc, list):
        raise ScenarioError(f"{where}: objects is a list of Kubernetes manifests")
    out = []
    for i, o in enumerate(doc):
        if not isinstance(o, dict) or (o.get("apiVersion"), o.get("kind")) not in (
                ("v1", "Pod"), ("v1", "Service")):
            kind = f"{o.get('apiVersion')} {o.get('kind')}" if isinstance(o, dict) else o
            raise ScenarioError(f"{where}: objects[{i}]: {kind} is not supported (v1 Pod and v1 "
                                "Service are)")
        if not (o.get("metadata") or {}).get("name"):
            raise ScenarioError(f"{where}: objects[{i}]: metadata.name is required")
        if o["kind"] == "Pod" and not (o.get("spec") or {}).get("containers"):
            raise ScenarioError(f"{where}: objects[{i}]: spec.containers is required")
        out.append(o)
    return tuple(out)


def _faults(doc: Any, where: str) -> tuple[Fault, ...]:
    if not isinstance(doc, list):
        raise ScenarioError(f"{where}: faults is a list")
    out = []
    for i, f in enumerate(doc):
        if not isinstance(f, dict) or set(f) - _FAULT:
            raise ScenarioError(f"{where}: faults[{i}] has unknown keys "
                                f"{sorted(set(f) - _FAULT) if isinstance(f, dict) else f!r}")
        if f.get("action") not in FAULT_ACTIONS:
            raise ScenarioError(f"{where}: faults[{i}].action must be one of "
                                f"{', '.join(FAULT_ACTIONS)}")
        try:
            after = float(f.get("after", 0))
        except (TypeError, ValueError):
            raise ScenarioError(f"{where}: faults[{i}].after must be seconds") from None
        command = f.get("command") or []
        if (f["action"] == "exec") != bool(command) or not isinstance(command, list):
            raise ScenarioError(f"{where}: faults[{i}]: command (a list) goes with, and only "
                                "with, action exec")
        out.append(Fault(action=str(f["action"]), match=str(f.get("match", "*")),
                         template=None if f.get("template") is None else str(f["template"]),
                         after=after, when_log=None if f.get("when-log") is None
                         else str(f["when-log"]), command=tuple(str(c) for c in command)))
    return tuple(out)


def _controller_env(doc: Any, where: str) -> tuple[float, float] | None:
    if not isinstance(doc, dict) or set(doc) - set(CONTROLLER_ENV):
        raise ScenarioError(f"{where}: controller-env may set only "
                            f"{', '.join(sorted(CONTROLLER_ENV))}")
    from aegis_flow.argo.rehearse.base import NodeErr
    from aegis_flow.argo.rehearse.controller import parse_duration

    try:
        patch, file = (parse_duration(str(doc[k])) if k in doc else CONTROLLER_ENV[k]
                       for k in ("ARGO_PROGRESS_PATCH_TICK_DURATION",
                                 "ARGO_PROGRESS_FILE_TICK_DURATION"))
    except NodeErr as exc:
        raise ScenarioError(f"{where}: controller-env: {exc}") from None
    return None if patch == 0 or file == 0 else (patch, file)


def load_manifests(path: str, where: str = "") -> list[dict[str, Any]]:
    """The documents of a (multi-document) YAML file, each a mapping."""
    try:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except OSError as exc:
        raise ScenarioError(f"{where}cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{where}{path} is not YAML: {exc}") from None
    if not all(isinstance(d, dict) for d in docs):
        raise ScenarioError(f"{where}{path}: every document must be a mapping")
    return docs


def _read(path: str, depth: int = 0) -> Any:
    """The document at ``path`` with its includes merged; image paths made absolute."""
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario {path} is not YAML: {exc}") from None
    if isinstance(doc, dict) and isinstance(doc.get("images"), dict):
        here = os.path.dirname(os.path.abspath(path))
        doc["images"] = {k: ({**v, "workingDir": os.path.join(here, str(v["workingDir"]))}
                             if isinstance(v, dict) and "workingDir" in v else v)
                         for k, v in doc["images"].items()}
    if isinstance(doc, dict) and isinstance(doc.get("workflowTemplates"), list):
        here = os.path.dirname(os.path.abspath(path))  # paths stay this file's under include
        doc["workflowTemplates"] = [os.path.join(here, x) if isinstance(x, str) else x
                                    for x in doc["workflowTemplates"]]
    if isinstance(doc, dict) and doc.get("include"):
        if depth > 8:
            raise ScenarioError(f"{path}: include nests too deep")
        base = _read(os.path.join(os.path.dirname(path), str(doc["include"])), depth + 1)
        if not isinstance(base, dict):
            raise ScenarioError(f"{path}: the included scenario is not a mapping")
        merged = {**base, **{k: v for k, v in doc.items() if k != "include"}}
        merged["pods"] = [*(doc.get("pods") or []), *(base.get("pods") or [])]
        merged.pop("include", None)
        return merged
    return doc


def load(path: str) -> Scenario:
    return parse(_read(path), path, os.path.dirname(os.path.abspath(path)))
