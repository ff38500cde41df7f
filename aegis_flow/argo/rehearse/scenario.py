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
    rbac:                       # service account -> verbs on nodes (default: aegis-flow may
      aegis-flow: [get, list, patch]    #   get/list/patch, as `aegis-flow install` grants)
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
DEFAULT_RBAC = {"aegis-flow": ("get", "list", "patch")}
_TOP = {"nodes", "secrets", "parameters", "rbac", "timeout", "pods", "description", "include",
        "images"}
_POD = {"match", "template", "containers", "env"}


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class PodRule:
    match: str = "*"
    template: str | None = None
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def matches(self, node_name: str, template: str) -> bool:
        if self.template is not None and self.template != template:
            return False
        pattern = "^" + ".*".join(re.escape(p) for p in self.match.split("*")) + "$"
        return re.match(pattern, node_name) is not None

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


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[dict[str, Any], ...] = DEFAULT_NODES
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    rbac: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_RBAC))
    timeout: float = 600.0
    pods: tuple[PodRule, ...] = ()
    description: str = ""
    images: dict[str, dict[str, str]] = field(default_factory=dict)

    def rule_for(self, node_name: str, template: str) -> PodRule | None:
        return next((r for r in self.pods if r.matches(node_name, template)), None)


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
                             env={str(k): str(v) for k, v in (r.get("env") or {}).items()}))
    nodes = tuple(doc["nodes"]) if doc.get("nodes") else DEFAULT_NODES
    for n in nodes:
        if not isinstance(n, dict) or "name" not in n:
            raise ScenarioError(f"{where}: every node needs a name")
    secrets = {str(k): {str(kk): str(vv) for kk, vv in (v or {}).items()}
               for k, v in (doc.get("secrets") or {}).items()}
    rbac = {str(k): tuple(str(x) for x in v) for k, v in (doc.get("rbac") or DEFAULT_RBAC).items()}
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
    return Scenario(nodes=nodes, secrets=secrets, images=images,
                    parameters={str(k): str(v) for k, v in (doc.get("parameters") or {}).items()},
                    rbac=rbac, timeout=timeout, pods=tuple(rules),
                    description=str(doc.get("description", "")))


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
