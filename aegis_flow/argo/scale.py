"""How big a rendered workflow gets on Argo, against the limits that bite at scale (PURE).

Two limits decide whether a job of N ranks runs at all:

- **One string in a container's environment or command line** may not exceed the kernel's
  ``MAX_ARG_STRLEN`` (128 KiB; Argo's ``MaxEnvVarLen``): the container cannot start
  ("argument list too long", review B6). Argo offloads only its own ``ARGO_TEMPLATE``, never a
  user's env var, so nothing we render may grow with the number of ranks.
- **The workflow object** is kept in etcd. Argo's controller (``workflow/packer``) compresses
  the node status (gzip, then base64, into ``status.compressedNodes``) once the workflow's
  JSON exceeds ``MAX_WORKFLOW_SIZE`` (1 MiB by default), and fails the workflow ("workflow is
  longer than maximum allowed size") if it is still larger — unless node status offloading
  (``persistence.nodeStatusOffLoad: true``, which needs a database) is on.

``status_size`` synthesizes the node status Argo keeps for the training workflow after a run
(one Retry and one Pod node per rank and per pod retry, with Argo's field names and values of
realistic length) and measures it both ways. It is an estimate: node names, host names and
timestamps of a real cluster differ in length, not in kind.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aegis_flow.argo.rehearse.podspec import fnv32a, node_id

MAX_ARG_STRLEN = 128 * 1024  # the kernel's limit on one argv/env string
MAX_WORKFLOW_SIZE = 1024 * 1024  # Argo's default MAX_WORKFLOW_SIZE (workflow/packer)


def strings(wf: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Every command, argument and env value of every container: (where, text)."""
    for t in wf["spec"]["templates"]:
        containers = [("container", t.get("container")), ("script", t.get("script"))]
        containers += [(f"initContainers[{c.get('name')}]", c)
                       for c in t.get("initContainers") or []]
        containers += [(f"sidecars[{c.get('name')}]", c) for c in t.get("sidecars") or []]
        for kind, c in containers:
            if not c:
                continue
            where = f"{t['name']}.{kind}"
            for text in [*(c.get("command") or []), *(c.get("args") or [])]:
                yield where, str(text)
            for env in c.get("env") or []:
                yield f"{where}.env.{env['name']}", str(env.get("value", ""))
            if c.get("source"):
                yield f"{where}.source", str(c["source"])


def longest_string(wf: dict[str, Any]) -> tuple[str, int]:
    where, text = max(strings(wf), key=lambda pair: len(pair[1].encode()))
    return where, len(text.encode())


@dataclass(frozen=True)
class StatusSize:
    workers: int
    nodes: int
    raw: int  # the workflow's JSON with its node status, bytes
    packed: int  # ... with the node status compressed as Argo's packer does

    @property
    def compressed_by_argo(self) -> bool:
        return self.raw > MAX_WORKFLOW_SIZE

    @property
    def needs_offloading(self) -> bool:
        return self.packed > MAX_WORKFLOW_SIZE


_STAMP = "2026-12-01T12:34:56Z"


def _stamp(key: str, offset: int = 0) -> str:
    """A timestamp that differs from node to node, as real ones do (they compress less)."""
    t = fnv32a(key) % 86400 + offset
    return f"2026-12-01T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}Z"


def _node(wf: str, name: str, display: str, kind: str, template: str, parent: str,
          **extra: Any) -> dict[str, Any]:
    out = {"id": node_id(wf, name), "name": name, "displayName": display, "type": kind,
           "templateName": template, "templateScope": f"local/{wf}", "phase": "Succeeded",
           "boundaryID": node_id(wf, parent), "startedAt": _stamp(name),
           "finishedAt": _stamp(name, 3600 + fnv32a(name[::-1]) % 7200), "progress": "1/1"}
    out.update(extra)
    return out


def _rank_nodes(wf: str, rank: int, pods: int, gpus: int) -> list[dict[str, Any]]:
    host = f"ip-10-{rank // 250 % 250}-{rank % 250}-{7 + rank % 200}.ec2.internal"
    retry_name = f"{wf}[1].run({rank}:{rank})"
    params = {"parameters": [{"name": "rank", "value": str(rank)}]}
    outs = {"parameters": [
        {"name": "outcome", "value": "succeeded",
         "valueFrom": {"path": "/tmp/aegis/outcome", "default": "unknown"}},
        {"name": "node", "value": host, "valueFrom": {"path": "/tmp/aegis/node",
                                                      "default": ""}}],
        "exitCode": "0"}
    seed = fnv32a(retry_name)
    used = {"cpu": 40000 + seed % 9000, "memory": 9000000 + seed % 900000,
            **({"nvidia.com/gpu": 320000 + seed % 70000} if gpus else {})}
    children = []
    out = []
    for i in range(pods):
        name = f"{retry_name}({i})"
        children.append(node_id(wf, name))
        out.append(_node(wf, name, f"run({rank}:{rank})({i})", "Pod", "worker", wf,
                         inputs=params, outputs=outs, hostNodeName=host,
                         resourcesDuration=used, nodeFlag={"retried": True}))
    out.append(_node(wf, retry_name, f"run({rank}:{rank})", "Retry", "worker", wf,
                     inputs=params, outputs=outs, children=children,
                     resourcesDuration=used))
    return out


def status_size(wf: dict[str, Any], workers: int, *, pods_per_rank: int = 1,
                workflow_name: str = "") -> StatusSize:
    """The size of ``wf`` (a rendered training workflow) with the node status a run of
    ``workers`` ranks leaves, each rank having had ``pods_per_rank`` pods."""
    name = workflow_name or (str(wf["metadata"].get("generateName", "job-")) + "x7k2p")
    gpus = any("nvidia.com/gpu" in json.dumps(t.get("container", {}).get("resources", {}))
               for t in wf["spec"]["templates"])
    nodes: dict[str, dict[str, Any]] = {}
    for n in [_node(name, name, name, "Steps", "main", name),
              *[_node(name, f"{name}[{g}]", f"[{g}]", "StepGroup", "", name)
                for g in range(4)],
              _node(name, f"{name}[0].master-service", "master-service", "Pod",
                    "master-service", name),
              _node(name, f"{name}[1].master", "master", "Retry", "master", name),
              _node(name, f"{name}[1].master(0)", "master(0)", "Pod", "master", name,
                    outputs={"parameters": [{"name": "verdict", "value": "succeeded"}]}),
              *[n for r in range(workers) for n in _rank_nodes(name, r, pods_per_rank, gpus)],
              _node(name, f"{name}[2].quarantine", "quarantine", "Skipped", "quarantine",
                    name, message="Skipped, empty params"),
              _node(name, f"{name}[3].give-up", "give-up", "Skipped", "give-up", name,
                    message="when 'Succeeded' != 'Succeeded' evaluated false"),
              _node(name, f"{name}.onExit", f"{name}.onExit", "Pod", "report", name)]:
        nodes[n["id"]] = n
    doc = {**wf, "metadata": {**wf["metadata"], "name": name},
           "status": {"phase": "Succeeded", "startedAt": _STAMP, "finishedAt": _STAMP,
                      "progress": f"{len(nodes)}/{len(nodes)}", "nodes": nodes}}
    raw = len(json.dumps(doc, separators=(",", ":")))
    packed_nodes = base64.b64encode(gzip.compress(
        json.dumps(nodes, separators=(",", ":")).encode())).decode()
    doc["status"] = {**doc["status"], "nodes": None, "compressedNodes": packed_nodes}
    packed = len(json.dumps(doc, separators=(",", ":")))
    return StatusSize(workers=workers, nodes=len(nodes), raw=raw, packed=packed)


def warnings(wf: dict[str, Any], workers: int) -> list[str]:
    """What a user rendering this many ranks should know (empty when nothing applies)."""
    out = []
    where, longest = longest_string(wf)
    if longest > MAX_ARG_STRLEN:
        out.append(f"{where} is {longest} bytes, over the kernel's {MAX_ARG_STRLEN}-byte limit "
                   "on one argument or environment value: that container cannot start")
    size = status_size(wf, workers, pods_per_rank=2)
    if size.needs_offloading:
        out.append(f"{workers} ranks leave about {size.packed / 2**20:.1f} MiB of workflow "
                   "status even compressed (estimate, two pods per rank): over Argo's "
                   f"{MAX_WORKFLOW_SIZE // 2**20} MiB limit, the workflow fails unless the "
                   "controller offloads node status to a database "
                   "(persistence.nodeStatusOffLoad: true)")
    elif size.compressed_by_argo:
        out.append(f"{workers} ranks leave about {size.raw / 2**20:.1f} MiB of node status "
                   f"(estimate, two pods per rank): Argo will keep it compressed "
                   f"({size.packed // 1024} KiB); `argo get` and the UI still show it")
    return out
