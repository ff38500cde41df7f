"""What the operator's parts share (``controller.Operator`` = ``PodsMixin`` + ``StepsMixin``
+ this): the status being built, and Argo's node bookkeeping (``initializeNode``,
``markNodePhase``, ``addChildNode``, ``NodeStatus.Fulfilled``, ``childrenFulfilled``,
``getWorkflowDeadline``) from ``workflow/controller/operator.go`` and
``pkg/apis/workflow/v1alpha1/workflow_types.go`` (v4.0.5).

PURE: it edits the in-memory status only.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from aegis_flow.argo.rehearse.cluster import NodeStore, Placement
from aegis_flow.argo.rehearse.netns import Network
from aegis_flow.argo.rehearse.pods import PodContext, PodRun
from aegis_flow.argo.rehearse.podspec import node_id

FULFILLED = ("Succeeded", "Failed", "Error", "Skipped", "Omitted")


class NodeErr(Exception):
    """An error that ``executeTemplate`` turns into an Error node (Argo's ``err`` returns)."""


def rfc3339(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class OperatorBase:
    """State and node helpers; ``execute_template`` is ``controller.Operator``'s."""

    wf: dict[str, Any]
    spec: dict[str, Any]
    name: str
    namespace: str
    cluster: NodeStore
    net: Network
    ctx: PodContext
    now: Callable[[], float]
    pod_hook: Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]] | None
    log: Callable[[str], None]
    templates: dict[str, dict[str, Any]]
    nodes: dict[str, dict[str, Any]]
    pods: dict[str, PodRun]
    pod_specs: dict[str, dict[str, Any]]
    used: dict[str, dict[str, int]]
    placements: dict[str, Placement]
    globals: dict[str, str]
    wake: threading.Event
    started: float

    def kill_daemoned_children(self, nid: str) -> None:
        raise NotImplementedError

    def execute_template(self, name: str, holder: Mapping[str, Any], args: Mapping[str, Any],
                         *, boundary: str, on_exit: bool = False,
                         flag: dict[str, bool] | None = None,
                         execution_deadline: float | None = None) -> dict[str, Any] | None:
        raise NotImplementedError

    def by_name(self, name: str) -> dict[str, Any] | None:
        return self.nodes.get(node_id(self.name, name))

    def init_node(self, name: str, typ: str, template: str, boundary: str, phase: str,
                  message: str = "", inputs: dict[str, Any] | None = None,
                  flag: dict[str, bool] | None = None) -> dict[str, Any]:
        """``initializeNode`` (operator.go): ID, display name (name minus the boundary's
        name, minus a leading ``.``), startedAt, and finishedAt for a fulfilled phase."""
        nid = node_id(self.name, name)
        if nid in self.nodes:
            raise RuntimeError(f"node {name} already initialized")
        boundary_node = self.nodes.get(boundary) if boundary else None
        display = name[len(boundary_node["name"]):] if boundary_node and \
            name.startswith(boundary_node["name"]) else name
        display = re.sub(r"^(\[\d+\])?\.", "", display)  # stepsOrDagSeparator
        node: dict[str, Any] = {"id": nid, "name": name, "displayName": display, "type": typ,
                                "templateName": template, "phase": phase,
                                "boundaryID": boundary, "startedAt": rfc3339(self.now())}
        if not boundary:
            node.pop("boundaryID")
        if message:
            node["message"] = message
        if inputs:
            node["inputs"] = inputs
        if flag:
            node["nodeFlag"] = flag
        if phase in FULFILLED:
            node["finishedAt"] = node["startedAt"]
        self.nodes[nid] = node
        return node

    def mark(self, name: str, phase: str, message: str | None = None) -> dict[str, Any]:
        """``markNodePhase``."""
        node = self.nodes[node_id(self.name, name)]
        node["phase"] = phase
        if message is not None:
            if message:
                node["message"] = message
            else:
                node.pop("message", None)
        if self.fulfilled(node) and not node.get("finishedAt"):
            node["finishedAt"] = rfc3339(self.now())
        return node

    def mark_error(self, name: str, err: Exception | str) -> dict[str, Any]:
        return self.mark(name, "Error", str(err))

    def add_child(self, parent: str, child: str) -> None:
        """``addChildNode``: parent and child by name; no duplicates."""
        p = self.nodes[node_id(self.name, parent)]
        cid = node_id(self.name, child)
        kids = p.setdefault("children", [])
        if cid not in kids:
            kids.append(cid)

    @staticmethod
    def fulfilled(node: dict[str, Any]) -> bool:
        """``NodeStatus.Fulfilled``: a fulfilled phase, or daemoned and not Pending."""
        return node["phase"] in FULFILLED or (bool(node.get("daemoned"))
                                               and node["phase"] != "Pending")

    def children_fulfilled(self, node: dict[str, Any]) -> bool:
        """``childrenFulfilled``: every leaf below is fulfilled."""
        kids = node.get("children") or []
        if not kids:
            return self.fulfilled(node)
        return all(self.children_fulfilled(self.nodes[k]) for k in kids if k in self.nodes)

    # ------------------------------------------------------------------ the pass

    def deadline(self) -> float | None:
        """``getWorkflowDeadline``: startedAt (truncated to the second) + activeDeadlineSeconds."""
        ads = self.spec.get("activeDeadlineSeconds")
        return None if ads is None else float(int(self.started)) + float(ads)

    def _in_exit_handler(self, node: dict[str, Any]) -> bool:
        cur: dict[str, Any] | None = node
        while cur is not None:
            if cur["displayName"].endswith(".onExit"):
                return True
            b = cur.get("boundaryID")
            cur = self.nodes.get(b) if b else None
        return False

    def _node_template(self, node: dict[str, Any]) -> dict[str, Any]:
        return node.get("_template") or self.templates[node["templateName"]]

    # ------------------------------------------------------------------ executeTemplate

    def _duration(self, node: dict[str, Any]) -> float:
        def ts(s: str | None) -> float:
            return time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone \
                if s else self.now()
        return float(ts(node.get("finishedAt")) - ts(node.get("startedAt")))

    @staticmethod
    def _ts(s: str) -> float:
        return float(time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone)
