"""The workflow operator: Argo's controller rules, reconciled in a loop, over local pods.

Each :meth:`Operator.operate` is one pass of ``workflow/controller/operator.go`` ``operate``
(v4.0.5): pod reconciliation (``podReconciliation`` / ``assessNodeStatus`` /
``inferFailedReason``), then ``executeTemplate`` from the entrypoint, which re-walks the node
tree and advances whatever can advance, then the exit handler and the workflow's phase. The
functions keep Argo's names and each cites the Go function it follows, so a difference can be
found by reading the two side by side. Node names, IDs, display names, phases and messages are
Argo's own (see ``docs/argo.md`` for the list of rules and what is refused).

Side effects: pods (``pods.PodRun``: processes, namespaces) are created and deleted from here;
everything else is the in-memory status.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aegis_flow.argo.rehearse import exprlang, govaluate, tmpl
from aegis_flow.argo.rehearse.cluster import NodeStore, Placement, schedule
from aegis_flow.argo.rehearse.netns import Network
from aegis_flow.argo.rehearse.pods import PodContext, PodRun, PodSpecError
from aegis_flow.argo.rehearse.podspec import PatchError, build_pod_spec, node_id, pod_name
from aegis_flow.argo.rehearse.spec import Unsupported, check_template

MAX_STACK_DEPTH = 100  # workflow/controller/controller.go maxAllowedStackDepth
ERR_MAX_DEPTH = ("Maximum recursion depth exceeded. See "
                 "https://argo-workflows.readthedocs.io/en/latest/scaling/#maximum-recursion-depth")
FULFILLED = ("Succeeded", "Failed", "Error", "Skipped", "Omitted")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


class NodeErr(Exception):
    """An error that ``executeTemplate`` turns into an Error node (Argo's ``err`` returns)."""


class _Requeue(Exception):
    """A reference is not resolvable yet (``ErrRequeue``)."""


def parse_duration(text: str | int) -> float:
    """``wfv1.ParseStringToDuration``: a bare number is seconds, else a Go duration."""
    s = str(text).strip()
    if re.fullmatch(r"\d+", s):
        return float(s)
    total, pos = 0.0, 0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1,
                                      "m": 60, "h": 3600}[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise NodeErr(f'time: invalid duration "{s}"')
    return total


def rfc3339(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def humanize(seconds: float) -> str:
    """``humanize.Duration`` as Argo's backoff message prints it (e.g. ``10 seconds``)."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} seconds" if s != 1 else "1 second"
    m = s // 60
    return f"{m} minutes" if m != 1 else "1 minute"


@dataclass
class Scope:
    """``wfScope``: parameters visible to the steps of one steps template."""

    params: dict[str, str] = field(default_factory=dict)


class Operator:
    """One workflow's controller. ``run()`` drives it to the end and returns the status."""

    def __init__(self, wf: dict[str, Any], *, name: str, namespace: str, cluster: NodeStore,
                 net: Network, ctx: PodContext, now: Callable[[], float] = time.time,
                 pod_hook: Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]] |
                 None = None, log: Callable[[str], None] = lambda s: None) -> None:
        self.wf, self.spec = wf, wf["spec"]
        self.name, self.namespace = name, namespace
        self.cluster, self.net, self.ctx, self.now = cluster, net, ctx, now
        self.pod_hook = pod_hook  # scenario: may change a pod's containers
        self.log = log
        self.templates = {t["name"]: t for t in self.spec.get("templates") or []}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, PodRun] = {}  # node id -> pod
        self.pod_specs: dict[str, dict[str, Any]] = {}
        self.used: dict[str, dict[str, int]] = {}
        self.placements: dict[str, Placement] = {}  # node id -> where its pod runs (held)
        self.status: dict[str, Any] = {"phase": "Running", "startedAt": None, "nodes": self.nodes}
        self.started = self.now()
        self.status["startedAt"] = rfc3339(self.started)
        self.globals: dict[str, str] = {}
        self.wake = threading.Event()
        self.depth = 0
        self._set_globals()

    # ------------------------------------------------------------------ globals
    def _set_globals(self) -> None:
        """``setGlobalParameters`` (operator.go)."""
        g = self.globals
        meta = self.wf.get("metadata") or {}
        g["workflow.name"] = self.name
        g["workflow.namespace"] = self.namespace
        g["workflow.mainEntrypoint"] = self.spec.get("entrypoint", "")
        g["workflow.serviceAccountName"] = self.spec.get("serviceAccountName", "")
        g["workflow.uid"] = meta.get("uid", "")
        g["workflow.creationTimestamp"] = rfc3339(self.started) or ""
        g["workflow.priority"] = str(self.spec.get("priority", 0))
        g["workflow.duration"] = "0"
        for k, v in (meta.get("labels") or {}).items():
            g[f"workflow.labels.{k}"] = str(v)
        for k, v in (meta.get("annotations") or {}).items():
            g[f"workflow.annotations.{k}"] = str(v)
        params = []
        for p in (self.spec.get("arguments") or {}).get("parameters") or []:
            value = p.get("value", p.get("default"))
            if value is None:
                raise Unsupported(f"spec.arguments.parameters.{p['name']}.value is required")
            g[f"workflow.parameters.{p['name']}"] = str(value)
            params.append({"name": p["name"], "value": str(value)})
        g["workflow.parameters"] = json.dumps(params, separators=(",", ":"))
        self.globals = {k: tmpl.substitute(v, g, allow_unresolved=True) for k, v in g.items()}

    # ------------------------------------------------------------------ node helpers
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

    def operate(self) -> bool:
        """One ``operate`` pass; True when the workflow has completed."""
        self.pod_reconciliation()
        self.fail_nodes_after_deadline()
        entry = {"template": self.spec["entrypoint"]}
        try:
            node = self.execute_template(self.name, entry, self.spec.get("arguments") or {},
                                         boundary="")
        except NodeErr as exc:
            self.finish("Error", f"error in entry template execution: {exc}")
            return True
        if node is None:
            return False
        wf_phase = {"Pending": "Pending", "Running": "Running", "Succeeded": "Succeeded",
                    "Skipped": "Succeeded", "Failed": "Failed", "Error": "Error",
                    "Omitted": "Succeeded"}[node["phase"]]
        self.globals["workflow.status"] = wf_phase
        failures = [{"displayName": n["displayName"], "message": n.get("message", ""),
                     "templateName": n.get("templateName", ""), "phase": n["phase"],
                     "podName": pod_name(self.name, n["name"], n.get("templateName", "")),
                     "finishedAt": n.get("finishedAt")}
                    for n in self.nodes.values() if n["phase"] in ("Failed", "Error")]
        self.globals["workflow.failures"] = json.dumps(
            json.dumps(failures or None, separators=(",", ":")))[1:-1]
        self.globals["workflow.duration"] = f"{self.now() - self.started:.6f}"
        if not self.fulfilled(node):
            return False
        on_exit = None
        exit_hook = self.spec.get("onExit") or \
            ((self.spec.get("hooks") or {}).get("exit") or {}).get("template")
        if exit_hook:  # WorkflowSpec.GetExitHook: onExit, else hooks.exit
            exit_name = f"{self.name}.onExit"
            try:
                on_exit = self.execute_template(exit_name, {"template": exit_hook},
                                                {}, boundary="", on_exit=True,
                                                flag={"hooked": True})
            except NodeErr as exc:
                self.finish("Error", f"error in exit template execution : {exc}")
                return True
            if on_exit is None or not self.fulfilled(on_exit):
                return False
        message = node.get("message", "")
        if wf_phase == "Succeeded":
            if on_exit is not None and on_exit["phase"] in ("Failed", "Error"):
                self.finish(on_exit["phase"], on_exit.get("message", ""))
            else:
                self.finish("Succeeded", "")
        else:
            self.finish(wf_phase, message)
        return True

    def finish(self, phase: str, message: str) -> None:
        """``markWorkflowPhase``: phase, message, finishedAt, and the pods' progress."""
        self.status["phase"] = phase
        if message:
            self.status["message"] = message
        self.status["finishedAt"] = rfc3339(self.now())
        for _nid, pod in list(self.pods.items()):
            if not pod.done:
                pod.kill("workflow completed")
        self.status["progress"] = self.progress()

    def progress(self) -> str:
        """``progress.UpdateProgress`` (workflow/progress/updater.go): every Pod node is
        ``0/1`` until Succeeded (``1/1``); the workflow sums them; every other node sums the
        Pod nodes reachable through its children (each counted once)."""
        total_n = total_m = 0
        for n in self.nodes.values():
            if n["type"] != "Pod":
                continue
            n["progress"] = "1/1" if n["phase"] in ("Succeeded", "Skipped", "Omitted") else "0/1"
            total_n, total_m = total_n + int(n["progress"][0]), total_m + 1
        for n in self.nodes.values():
            if n["type"] == "Pod":
                continue
            visited: set[str] = set()
            pn = pm = 0
            todo = list(n.get("children") or [])
            while todo:
                kid = todo.pop()
                if kid in visited or kid not in self.nodes:
                    continue
                visited.add(kid)
                child = self.nodes[kid]
                if child["type"] == "Pod":
                    pn, pm = pn + int(child["progress"][0]), pm + 1
                todo.extend(child.get("children") or [])
            if pm > 0:
                n["progress"] = f"{pn}/{pm}"
        return f"{total_n}/{total_m}"

    def fail_nodes_after_deadline(self) -> None:
        """``failNodesWithoutCreatedPodsAfterDeadlineOrShutdown``."""
        dl = self.deadline()
        if dl is None or self.now() <= dl:
            return
        for node in self.nodes.values():
            if not self.fulfilled(node) and node["phase"] == "Pending" and \
                    not self._in_exit_handler(node):
                self.mark(node["name"], "Failed", "Step exceeded its deadline")

    def _in_exit_handler(self, node: dict[str, Any]) -> bool:
        cur: dict[str, Any] | None = node
        while cur is not None:
            if cur["displayName"].endswith(".onExit"):
                return True
            b = cur.get("boundaryID")
            cur = self.nodes.get(b) if b else None
        return False

    # ------------------------------------------------------------------ pods -> nodes
    def pod_reconciliation(self) -> None:
        """``podReconciliation`` + ``assessNodeStatus`` + ``inferFailedReason``; past the
        workflow deadline ``applyExecutionControl`` (exec_control.go) stops running pods and
        fails their nodes "Step exceeded its deadline" (exit-handler pods exempt)."""
        dl = self.deadline()
        for nid, pod in list(self.pods.items()):
            if pod.done and nid in self.placements:  # its resources are free again
                held = self.placements.pop(nid)
                for res, qty in held.requests.items():
                    self.used[held.node][res] -= int(qty)
            node = self.nodes[nid]
            if node["phase"] in FULFILLED:
                continue
            if dl is not None and self.now() > dl and not self._in_exit_handler(node):
                pod.kill("Killed")
                self.mark(node["name"], "Failed", "Step exceeded its deadline")
                node.pop("daemoned", None)
                continue
            v = pod.view
            tmpl_ = self.templates.get(node.get("templateName", ""), {})
            daemon = bool(tmpl_.get("daemon"))
            if v.node:
                node["hostNodeName"] = v.node
            if v.phase == "Pending":
                node["phase"] = "Pending"
                msg = f"{v.reason}: {v.message}" if v.message else v.reason
                if msg:
                    node["message"] = msg
                node.pop("daemoned", None)
            elif v.phase == "Running":
                if daemon:
                    if v.ready and not self.fulfilled(node):
                        node["phase"] = "Running"
                        node["daemoned"] = True
                        node["podIP"] = v.pod_ip
                else:
                    node["phase"] = "Running"
                if node.get("message") and node["message"].startswith(
                        ("ContainerCreating", "Unschedulable")):
                    node.pop("message", None)
            else:
                node.pop("daemoned", None)
                self._assess_finished(node, pod, daemon)

    def _assess_finished(self, node: dict[str, Any], pod: PodRun, daemon: bool) -> None:
        v = pod.view
        main = v.containers.get("main")
        code = main.exit_code if main is not None else None
        if code is not None:
            node.setdefault("outputs", {})["exitCode"] = str(code)
        if v.phase == "Succeeded":
            phase, msg = ("Failed" if daemon else "Succeeded"), ""
        else:
            phase, msg = self._infer_failed_reason(pod)
        if phase == "Succeeded":
            try:
                self._collect_outputs(node, pod)
            except NodeErr as exc:
                phase, msg = "Error", str(exc)
        node["phase"] = phase
        if msg:
            node["message"] = msg
        elif node.get("message", "").startswith(("ContainerCreating", "Unschedulable")):
            node.pop("message")
        node["finishedAt"] = rfc3339(v.finished_at or self.now())
        node.pop("podIP", None) if not daemon else None

    @staticmethod
    def _infer_failed_reason(pod: PodRun) -> tuple[str, str]:
        """``inferFailedReason`` (operator.go): the pod's own message first (kubelet deadline),
        then init containers, then main, then the others (sidecars killed by 137/143 aside)."""
        v = pod.view
        if v.reason == "DeadlineExceeded":
            return "Failed", "Pod was active on the node longer than the specified deadline"
        if v.reason == "ExecutorDeadline":
            return "Failed", "Step exceeded its deadline"
        if v.reason in ("Unsupported", "RehearsalError"):
            return "Error", v.message
        if v.reason in ("Killed", "workflow completed") and not any(
                c.exit_code is not None for c in v.containers.values()):
            return "Error", "pod deleted"
        order = {"init": 0, "main": 1, "wait": 2, "sidecar": 3}
        main_ok = False
        for c in sorted(v.containers.values(), key=lambda c: order[c.kind]):
            if not c.started and c.kind != "init":
                reason = "PodInitializing"
                return "Error", (f"Pod failed before {c.name} container starts due to "
                                 f"{reason}: ")
            if c.exit_code is None:
                continue
            if c.exit_code == 0:
                main_ok = main_ok or c.kind == "main"
                continue
            reason = "StartError" if c.exit_code == 128 and _start_error(pod, c.name) else "Error"
            msg = f"{c.name}: {reason} (exit code {c.exit_code})"
            if reason == "StartError":
                msg += ": " + _start_error(pod, c.name)
            if c.kind in ("init", "main"):
                return "Failed", msg
            if c.exit_code not in (137, 143):
                return "Failed", msg
        if main_ok:
            return "Succeeded", ""
        return "Failed", "pod failed: main container did not complete successfully"

    def _collect_outputs(self, node: dict[str, Any], pod: PodRun) -> None:
        """The executor's ``SaveParameters`` / script result (workflow/executor/executor.go)."""
        t = self._node_template(node)
        outs = t.get("outputs") or {}
        params = []
        for p in outs.get("parameters") or []:
            vf = p.get("valueFrom") or {}
            if "path" in vf:
                try:
                    value = pod.read_output(vf["path"])
                except PodSpecError as exc:
                    raise NodeErr(str(exc)) from None
                if value is None:
                    if "default" not in vf:
                        raise NodeErr(f"wait: Error (exit code 1): open {vf['path']}: "
                                      "no such file or directory")
                    value = str(vf["default"])
                params.append({"name": p["name"],
                               "value": value[:-1] if value.endswith("\n") else value})
            elif "value" in p:
                params.append({"name": p["name"], "value": str(p["value"])})
            elif vf:
                raise NodeErr(f"output parameter {p['name']}: valueFrom "
                              f"{sorted(vf)} is not supported (path is)")
        if params:
            node.setdefault("outputs", {})["parameters"] = params
        if self._include_script_output(node):
            out = pod.stdout()
            node.setdefault("outputs", {})["result"] = out[:-1] if out.endswith("\n") else out

    def _include_script_output(self, node: dict[str, Any]) -> bool:
        """``includeScriptOutput`` / ``hasOutputResultRef``: stdout becomes
        ``outputs.result`` only when the enclosing steps template mentions
        ``steps.<step>.outputs.result``."""
        boundary = self.nodes.get(node.get("boundaryID") or "")
        if boundary is None:
            return False
        parent = json.dumps(self._node_template(boundary))
        name = _step_name(node["name"])
        return re.search(rf"steps\.{re.escape(name)}\.outputs\.result", parent) is not None or \
            re.search(rf"steps\[['\"]{re.escape(name)}['\"]\]\.outputs.result", parent) is not None

    def _node_template(self, node: dict[str, Any]) -> dict[str, Any]:
        return node.get("_template") or self.templates[node["templateName"]]

    # ------------------------------------------------------------------ executeTemplate
    def execute_template(self, name: str, holder: Mapping[str, Any], args: Mapping[str, Any],
                         *, boundary: str, on_exit: bool = False,
                         flag: dict[str, bool] | None = None,
                         execution_deadline: float | None = None) -> dict[str, Any] | None:
        """``executeTemplate`` (operator.go)."""
        node = self.by_name(name)
        self.depth += 1
        try:
            if self.depth >= MAX_STACK_DEPTH:
                return self._init_or_error(node, name, holder, boundary, ERR_MAX_DEPTH)
            tname = holder.get("template")
            if holder.get("templateRef") or holder.get("inline"):
                raise Unsupported("templateRef and inline templates are not supported")
            if tname not in self.templates:
                return self._init_or_error(node, name, holder, boundary,
                                           f"template {tname} not found")
            org = self.templates[tname]
            try:
                processed, inputs = self.process_args(org, args, name)
            except NodeErr as exc:
                return self._init_or_error(node, name, holder, boundary, str(exc))
            if node is not None and node["phase"] in FULFILLED:
                return node  # handleNodeFulfilled
            retry = processed.get("retryStrategy")
            retry_name = ""
            opts_deadline = execution_deadline
            if retry is not None:
                retry_name = name
                rnode = node or self.init_node(name, "Retry", tname, boundary, "Running",
                                               inputs=inputs, flag=flag)
                flag = {**(flag or {}), "retried": True}
                rnode, cont, dl = self.process_node_retries(rnode, retry)
                if dl is not None:
                    opts_deadline = dl
                if not cont:
                    return rnode
                kids = rnode.get("children") or []
                last = self.nodes[kids[-1]] if kids else None
                if rnode["phase"] in FULFILLED or (self.fulfilled(rnode) and (
                        self.children_fulfilled(rnode) or (
                            rnode.get("daemoned") and rnode["phase"] in ("Failed", "Error")))):
                    if last is not None and "outputs" in last:
                        rnode["outputs"] = json.loads(json.dumps(last["outputs"]))
                    return rnode
                if last is not None and last["phase"] not in FULFILLED:
                    name, node, retry_num = last["name"], last, len(kids) - 1
                else:
                    retry_num = len(kids)
                    name = f"{retry_name}({retry_num})"
                    self.add_child(retry_name, name)
                    node = None
                local = {"retries": str(retry_num), "pod.name": pod_name(self.name, name, tname),
                         "lastRetry.exitCode": "0", "lastRetry.duration": "0",
                         "lastRetry.status": "", "lastRetry.message": ""}
                if last is not None:
                    local.update({
                        "lastRetry.exitCode": (last.get("outputs") or {}).get("exitCode", "0"),
                        "lastRetry.status": last["phase"],
                        "lastRetry.message": last.get("message", ""),
                        "lastRetry.duration": str(self._duration(last))})
                processed = tmpl.substitute_json(processed, {**self.globals, **local},
                                                 allow_unresolved=True)
            try:
                if "container" in processed or "script" in processed:
                    node = self.execute_pod(name, processed, tname, boundary, inputs, flag,
                                            on_exit=on_exit, execution_deadline=opts_deadline)
                elif "steps" in processed:
                    node = self.execute_steps(name, processed, tname, boundary, inputs, flag,
                                              on_exit=on_exit)
                else:
                    return self._init_or_error(
                        node, name, holder, boundary,
                        f"Template '{tname}' missing specification")
            except NodeErr as exc:
                if self.by_name(name) is None:
                    self.init_node(name, "Skipped", tname, boundary, "Error", str(exc))
                node = self.mark_error(name, exc)
            if retry_name:
                rnode = self.by_name(retry_name)
                assert rnode is not None
                if rnode["phase"] not in FULFILLED and node is not None and \
                        node["phase"] in FULFILLED:
                    rnode = self.execute_template(retry_name, holder, args, boundary=boundary,
                                                  on_exit=on_exit, flag=flag,
                                                  execution_deadline=execution_deadline)
                    assert rnode is not None
                if node is not None and node["phase"] not in FULFILLED and node.get("daemoned"):
                    rnode["phase"] = node["phase"]
                    rnode["daemoned"] = True
                node = rnode
            return node
        finally:
            self.depth -= 1

    def _duration(self, node: dict[str, Any]) -> float:
        def ts(s: str | None) -> float:
            return time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone \
                if s else self.now()
        return float(ts(node.get("finishedAt")) - ts(node.get("startedAt")))

    def _init_or_error(self, node: dict[str, Any] | None, name: str, holder: Mapping[str, Any],
                       boundary: str, message: str) -> dict[str, Any]:
        """``initializeNodeOrMarkError``."""
        if node is not None:
            return self.mark_error(name, message)
        return self.init_node(name, "Skipped", str(holder.get("template", "")), boundary,
                              "Error", message)

    def process_args(self, org: dict[str, Any], args: Mapping[str, Any], node_name: str
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``common.ProcessArgs`` / ``substituteInputs``: input values from the arguments or
        their defaults, then every ``{{inputs.parameters.X}}`` and global in the template."""
        check_template(org)
        given = {p["name"]: p for p in (args.get("parameters") or [])}
        inputs = []
        local: dict[str, str] = {"node.name": node_name}
        for p in (org.get("inputs") or {}).get("parameters") or []:
            if p["name"] in given and ("value" in given[p["name"]] or
                                       "valueFrom" in given[p["name"]]):
                value = given[p["name"]].get("value")
            elif "value" in p:
                value = p["value"]
            elif "default" in p:
                value = p["default"]
            else:
                raise NodeErr(f"inputs.parameters.{p['name']} was not supplied")
            value = "" if value is None else str(value)
            inputs.append({**{k: v for k, v in p.items() if k in ("name", "default")},
                           "value": value})
            local[f"inputs.parameters.{p['name']}"] = value
        if inputs:
            local["inputs.parameters"] = json.dumps(inputs, separators=(",", ":"))
        try:
            processed = tmpl.substitute_json(org, {**self.globals, **local},
                                             allow_unresolved=True)
        except tmpl.TemplateError as exc:
            raise NodeErr(str(exc)) from None
        return processed, ({"parameters": inputs} if inputs else {})

    # ------------------------------------------------------------------ retries
    def process_node_retries(self, node: dict[str, Any], rs: dict[str, Any]
                             ) -> tuple[dict[str, Any], bool, float | None]:
        """``processNodeRetries`` (operator.go), check for check in Argo's order. Returns the
        node, whether to continue, and the execution deadline from ``backoff.maxDuration``."""
        if node["phase"] in FULFILLED:
            return node, True, None
        kids = node.get("children") or []
        if not kids:
            return node, True, None
        last = self.nodes[kids[-1]]
        if last.get("daemoned"):
            node["daemoned"] = True
        if last["phase"] not in FULFILLED:
            if not last.get("daemoned"):
                return node, True, None
            self.mark(node["name"], last["phase"])
            node["daemoned"] = True
            return node, True, None
        if last["phase"] not in ("Failed", "Error"):
            if "outputs" in last:
                node["outputs"] = json.loads(json.dumps(last["outputs"]))
            return self.mark(node["name"], "Succeeded"), True, None
        dl = self.deadline()
        if dl is not None and self.now() > dl:
            return self.mark(node["name"], last["phase"],
                             f"retry exceeded workflow deadline {rfc3339(dl)}"), True, None
        execution_deadline: float | None = None
        backoff = rs.get("backoff")
        if backoff is not None:
            max_dl: float | None = None
            if backoff.get("maxDuration"):
                first = self.nodes[kids[0]]
                max_dl = self._ts(first["startedAt"]) + parse_duration(backoff["maxDuration"])
                if self.now() > max_dl:
                    return self.mark(node["name"], last["phase"],
                                     "Max duration limit exceeded"), True, None
            if not backoff.get("duration"):
                raise NodeErr("no base duration specified for retryStrategy")
            wait = parse_duration(backoff["duration"])
            factor = backoff.get("factor")
            if factor is not None and int(str(factor)) > 0:
                wait = wait * float(int(str(factor)) ** (len(kids) - 1))
            if backoff.get("cap"):
                wait = min(wait, parse_duration(backoff["cap"]))
            waiting = self._ts(last["finishedAt"]) + wait
            if max_dl is not None and waiting > max_dl:
                return self.mark(node["name"], last["phase"],
                                 "Backoff would exceed max duration limit"), True, None
            limit = rs.get("limit")
            if self.now() < waiting and limit is not None and len(kids) <= int(str(limit)):
                return self.mark(node["name"], node["phase"],
                                 f"Backoff for {humanize(wait)}"), False, None
            execution_deadline = max_dl
            self.mark(node["name"], node["phase"], "")
        policy = rs.get("retryPolicy") or ("OnFailure" if not rs.get("expression") else "Always")
        on_failed, on_error = {"Always": (True, True), "OnError": (False, True),
                               "OnFailure": (True, False),
                               "OnTransientError": (False, False)}.get(policy, (None, None))
        if on_failed is None:
            raise NodeErr(f"{policy} is not a valid RetryPolicy")
        if (last["phase"] == "Failed" and not on_failed) or \
                (last["phase"] == "Error" and not on_error):
            return self.mark(node["name"], last["phase"], last.get("message", "")), True, None
        limit = rs.get("limit")
        if limit is not None and len(kids) > int(str(limit)):
            return self.mark(node["name"], last["phase"], "No more retries left"), True, None
        if rs.get("expression"):
            scope = exprlang.argo_env(exprlang.retry_scope(
                attempts=len(kids), exit_code=(last.get("outputs") or {}).get("exitCode"),
                phase=last["phase"], duration_s=self._duration(last),
                message=last.get("message", "")))
            try:
                ok = exprlang.evaluate_bool(rs["expression"], scope)
            except exprlang.ExprError as exc:
                raise NodeErr(str(exc)) from None
            if not ok:
                return self.mark(node["name"], last["phase"],
                                 "retryStrategy.expression evaluated to false"), True, None
        return node, True, execution_deadline

    @staticmethod
    def _ts(s: str) -> float:
        return float(time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone)

    # ------------------------------------------------------------------ steps
    def execute_steps(self, name: str, t: dict[str, Any], tname: str, boundary: str,
                      inputs: dict[str, Any], flag: dict[str, bool] | None, *,
                      on_exit: bool = False) -> dict[str, Any]:
        """``executeSteps`` (steps.go); ``on_exit`` is ``stepsContext.onExitTemplate``."""
        node = self.by_name(name) or self.init_node(name, "Steps", tname, boundary, "Running",
                                                    inputs=inputs, flag=flag)
        try:
            return self._steps(name, node, t, on_exit)
        finally:
            if self.fulfilled(self.nodes[node["id"]]):
                self.kill_daemoned_children(node["id"])

    def _steps(self, name: str, node: dict[str, Any], t: dict[str, Any], on_exit: bool
               ) -> dict[str, Any]:
        scope = Scope()
        for i, group in enumerate(t["steps"]):
            sg_name = f"{name}[{i}]"
            sg = self.by_name(sg_name)
            if sg is None:
                self.init_node(sg_name, "StepGroup", "", node["id"], "Running")
            elif not self.fulfilled(sg):
                self.mark(sg_name, "Running")
            if i == 0:
                self.add_child(name, sg_name)
            else:
                prev = self.by_name(f"{name}[{i - 1}]")
                assert prev is not None
                if not prev.get("children"):
                    self.add_child(prev["name"], sg_name)
                for kid in prev.get("children") or []:
                    for out in self.outbound(kid):
                        self.add_child(self.nodes[out]["name"], sg_name)
            sg = self.execute_step_group(group, sg_name, scope, node["id"], on_exit)
            if not self.fulfilled(sg):
                return node
            if sg["phase"] in ("Failed", "Error"):
                self.update_outbound(name, t)
                return self.mark(name, "Failed", sg.get("message", ""))
            for step in group:
                child_name = f"{sg_name}.{step['name']}"
                child = self.by_name(child_name)
                prefix = f"steps.{step['name']}"
                if child is None:
                    kids = [n for n in self.nodes.values()
                            if n.get("boundaryID") == node["id"]
                            and n["name"].startswith(child_name + "(")
                            and n["type"] != "Skipped"]
                    self.aggregate_outputs(scope, prefix, kids)
                    self.local_scope(scope, prefix, sg)
                else:
                    self.local_scope(scope, prefix, child)
        self.update_outbound(name, t)
        outputs = self.outputs_from_scope(t, scope)
        if outputs:
            node["outputs"] = outputs
        return self.mark(name, "Succeeded")

    def outbound(self, nid: str) -> list[str]:
        """``getOutboundNodes``."""
        node = self.nodes[nid]
        if node["type"] in ("Skipped", "Suspend", "Pod"):
            return [nid]
        if node["type"] == "Retry":
            kids = node.get("children") or []
            if kids:
                return [kids[-1]]
        out: list[str] = []
        for o in node.get("outboundNodes") or []:
            out.extend(self.outbound(o))
        return out

    def update_outbound(self, name: str, t: dict[str, Any]) -> None:
        """``updateOutboundNodes``: the outbound nodes of the last initialised step group."""
        for i in range(len(t["steps"]) - 1, -1, -1):
            sg = self.by_name(f"{name}[{i}]")
            if sg is not None:
                out: list[str] = []
                for kid in sg.get("children") or []:
                    out.extend(self.outbound(kid))
                self.nodes[node_id(self.name, name)]["outboundNodes"] = out
                return

    def local_scope(self, scope: Scope, prefix: str, node: dict[str, Any]) -> None:
        """``buildLocalScope``: id, startedAt, finishedAt, ip, status, hostNodeName, outputs
        (of a Retry node's last child)."""
        if node["type"] == "Retry" and node.get("children"):
            node = self.nodes[node["children"][-1]]
        p = scope.params
        p[f"{prefix}.id"] = node["id"]
        if node.get("startedAt"):
            p[f"{prefix}.startedAt"] = node["startedAt"]
        if node.get("finishedAt"):
            p[f"{prefix}.finishedAt"] = node["finishedAt"]
        if node.get("podIP"):
            p[f"{prefix}.ip"] = node["podIP"]
        p[f"{prefix}.status"] = node["phase"]
        if node.get("hostNodeName"):
            p[f"{prefix}.hostNodeName"] = node["hostNodeName"]
        self.outputs_to_scope(scope, prefix, node.get("outputs"))

    @staticmethod
    def outputs_to_scope(scope: Scope, prefix: str, outputs: dict[str, Any] | None) -> None:
        """``addOutputsToLocalScope``."""
        if not outputs:
            return
        p = scope.params
        if "result" in outputs:
            p[f"{prefix}.outputs.result"] = outputs["result"]
        if "exitCode" in outputs:
            p[f"{prefix}.exitCode"] = outputs["exitCode"]
        for param in outputs.get("parameters") or []:
            p[f"{prefix}.outputs.parameters.{param['name']}"] = param.get("value", "")

    @staticmethod
    def aggregate_outputs(scope: Scope, prefix: str, kids: list[dict[str, Any]]) -> None:
        """``processAggregateNodeOutputs``: only Succeeded children with outputs count (a
        failed rank adds nothing), children flagged retried/hooked are left out, ordered by the
        loop index in their names."""
        if not kids:
            return
        kids = [k for k in kids if not (k.get("nodeFlag") or {}).get("hooked")
                and not (k.get("nodeFlag") or {}).get("retried")]

        def index(n: dict[str, Any]) -> int:
            m = re.search(r"\((\d+):", n["name"])
            return int(m.group(1)) if m else 0
        kids.sort(key=index)
        plist: list[dict[str, str]] = []
        values: dict[str, list[str]] = {}
        results: list[Any] = []
        for k in kids:
            outs = k.get("outputs")
            if not outs or k["phase"] != "Succeeded":
                continue
            if outs.get("parameters"):
                one = {}
                for prm in outs["parameters"]:
                    one[prm["name"]] = prm.get("value", "")
                    values.setdefault(prm["name"], []).append(prm.get("value", ""))
                plist.append(one)
            if "result" in outs:
                try:
                    results.append(json.loads(outs["result"]))
                except ValueError:
                    raise NodeErr(_go_json_error(outs["result"])) from None
        scope.params[f"{prefix}.outputs.result"] = json.dumps(results, separators=(",", ":"))
        scope.params[f"{prefix}.outputs.parameters"] = json.dumps(
            [dict(sorted(d.items())) for d in plist], separators=(",", ":"))
        for pname, vals in values.items():
            parsed: list[Any] = []
            for v in vals:
                try:
                    x = json.loads(v)
                except ValueError:
                    parsed = []
                    break
                if not isinstance(x, (list, dict)):
                    parsed = []
                    break
                parsed.append(x)
            lst: list[Any] = parsed if len(parsed) == len(vals) else vals
            scope.params[f"{prefix}.outputs.parameters.{pname}"] = json.dumps(
                lst, separators=(",", ":"))

    def outputs_from_scope(self, t: dict[str, Any], scope: Scope) -> dict[str, Any] | None:
        """``getTemplateOutputsFromScope``: ``valueFrom.parameter`` / ``expression``."""
        params = []
        for p in (t.get("outputs") or {}).get("parameters") or []:
            vf = p.get("valueFrom") or {}
            if "parameter" in vf:
                value = tmpl.substitute(vf["parameter"], {**self.globals, **scope.params},
                                        allow_unresolved=False)
            elif "default" in vf:
                value = str(vf["default"])
            else:
                raise NodeErr(f"output parameter {p['name']}: steps templates support "
                              "valueFrom.parameter")
            params.append({"name": p["name"], "value": value})
        return {"parameters": params} if params else None

    def execute_step_group(self, group: list[dict[str, Any]], sg_name: str, scope: Scope,
                           boundary: str, on_exit: bool = False) -> dict[str, Any]:
        """``executeStepGroup`` (steps.go)."""
        node = self.by_name(sg_name)
        assert node is not None
        if self.fulfilled(node) and self.children_fulfilled(node):
            return node
        try:
            resolved = self.resolve_references(group, scope)
        except _Requeue:
            return node
        except NodeErr as exc:
            return self.mark_error(sg_name, f"failed to resolve references: {exc}")
        try:
            steps = self.expand_step_group(sg_name, resolved, scope, boundary)
        except NodeErr as exc:
            return self.mark_error(sg_name, exc)
        node_steps: dict[str, dict[str, Any]] = {}
        for step in steps:
            child_name = f"{sg_name}.{step['name']}"
            try:
                proceed = govaluate.evaluate_when(step.get("when", ""))
            except govaluate.WhenError as exc:
                if self.by_name(child_name) is None:
                    self.init_node(child_name, "Skipped", step.get("template", ""), boundary,
                                   "Error", str(exc))
                self.add_child(sg_name, child_name)
                self.mark_error(child_name, exc)
                return self.mark_error(sg_name, exc)
            if not proceed:
                if self.by_name(child_name) is None:
                    self.init_node(child_name, "Skipped", step.get("template", ""), boundary,
                                   "Skipped", f"when '{step['when']}' evaluated false")
                    self.add_child(sg_name, child_name)
                continue
            child = self.execute_template(child_name, step, step.get("arguments") or {},
                                          boundary=boundary, on_exit=on_exit)
            if child is not None:
                node_steps[child_name] = step
                self.add_child(sg_name, child_name)
        node = self.by_name(sg_name)
        assert node is not None
        for kid in node.get("children") or []:
            if not self.fulfilled(self.nodes[kid]):
                if self.fulfilled(node):
                    return self.mark(sg_name, "Running")
                return node
        for kid in node.get("children") or []:
            child = self.nodes[kid]
            step = node_steps.get(child["name"], {})
            cont = step.get("continueOn") or {}
            if child["phase"] in ("Failed", "Error") and not (
                    (cont.get("failed") and child["phase"] == "Failed")
                    or (cont.get("error") and child["phase"] == "Error")):
                return self.mark(sg_name, "Failed", f"child '{kid}' failed")
        return self.mark(sg_name, "Succeeded")

    def resolve_references(self, group: list[dict[str, Any]], scope: Scope
                           ) -> list[dict[str, Any]]:
        """``resolveReferences`` (steps.go, v4.0.5): ``when`` is resolved (strictly for
        ``steps.``/``tasks.``) and evaluated first; a step it skips is not resolved further."""
        merged = {**self.globals, **scope.params}
        out = []
        for step in group:
            step = dict(step)
            if step.get("when"):
                try:
                    when = tmpl.substitute(step["when"], merged, allow_unresolved=False,
                                           strict_prefixes=("steps", "tasks"))
                except tmpl.TemplateError as exc:
                    if tmpl.is_missing_variable(exc):
                        raise _Requeue() from None
                    raise NodeErr(str(exc)) from None
                try:
                    proceed = govaluate.evaluate_when(when)
                except govaluate.WhenError as exc:
                    if not _should_expand(step):
                        raise NodeErr(str(exc)) from None
                    proceed = True
                if not proceed:
                    step["when"] = when
                    out.append(step)
                    continue
            try:
                step = tmpl.substitute_json(step, merged, allow_unresolved=False,
                                            strict_prefixes=("steps", "tasks"))
            except tmpl.TemplateError as exc:
                if tmpl.is_missing_variable(exc):
                    raise _Requeue() from None
                raise NodeErr(str(exc)) from None
            out.append(step)
        return out

    def expand_step_group(self, sg_name: str, group: list[dict[str, Any]], scope: Scope,
                          boundary: str) -> list[dict[str, Any]]:
        """``expandStepGroup`` / ``expandStep`` / ``processItem`` (steps.go, operator.go)."""
        out: list[dict[str, Any]] = []
        for step in group:
            if not _should_expand(step):
                out.append(step)
                continue
            items = self._items(step)
            if not items:
                child_name = f"{sg_name}.{step['name']}"
                if self.by_name(child_name) is None:
                    self.init_node(child_name, "Skipped", step.get("template", ""), boundary,
                                   "Skipped", "Skipped, empty params")
                    self.add_child(sg_name, child_name)
            base = {k: v for k, v in step.items()
                    if k not in ("withItems", "withParam", "withSequence")}
            for i, item in enumerate(items):
                out.append(self._process_item(base, i, item, scope))
        return out

    def _items(self, step: dict[str, Any]) -> list[Any]:
        if step.get("withItems"):
            return list(step["withItems"])
        if step.get("withParam"):
            try:
                items = json.loads(step["withParam"])
                if not isinstance(items, list):
                    raise ValueError("json: cannot unmarshal object into Go value of type "
                                     "[]v1alpha1.Item")
                return items
            except ValueError as exc:
                if _when_or_true(step.get("when", "")):
                    raise NodeErr(f"withParam value could not be parsed as a JSON list: "
                                  f"{str(step['withParam']).strip()}: {exc}") from None
                return []
        seq = step["withSequence"]
        try:
            start = int(str(seq.get("start", 0)))
            if "end" in seq:
                end = int(str(seq["end"]))
            elif "count" in seq:
                count = int(str(seq["count"]))
                if count == 0:
                    return []
                end = start + count - 1
            else:
                raise NodeErr("neither end nor count was specified in withSequence")
        except ValueError as exc:
            if _when_or_true(step.get("when", "")):
                raise NodeErr(f'strconv.Atoi: parsing: {exc}') from None
            return []
        fmt = seq.get("format", "%d")
        rng = range(start, end + 1) if start <= end else range(start, end - 1, -1)
        return [_go_sprintf(fmt, i) for i in rng]

    def _process_item(self, step: dict[str, Any], index: int, item: Any, scope: Scope
                      ) -> dict[str, Any]:
        """``processItem``: ``{{item}}``/``{{item.key}}`` substituted; name ``name(i:desc)``."""
        rep = {**self.globals, **scope.params}
        if isinstance(item, bool):
            rep["item"] = "true" if item else "false"
            desc = rep["item"]
        elif isinstance(item, (int, float)):
            rep["item"] = _go_number(item)
            desc = rep["item"]
        elif isinstance(item, str):
            rep["item"] = item
            desc = item
        elif isinstance(item, dict):
            vals = []
            for k, v in item.items():
                rep[f"item.{k}"] = _go_value(v)
                vals.append(f"{k}:{_go_value(v)}")
            rep["item"] = json.dumps(item, separators=(",", ":"), sort_keys=True)
            desc = ",".join(sorted(vals))
        elif isinstance(item, list):
            rep["item"] = json.dumps(item, separators=(",", ":"))
            desc = "[" + " ".join(_go_value(v) for v in item) + "]"
        else:
            raise NodeErr(f"withItems[{index}] expected string, number, list, or map. "
                          f"received: {item}")
        when = step.get("when", "")
        allow = not _when_or_true(when)
        try:
            new = tmpl.substitute_json(step, rep, allow_unresolved=allow)
        except tmpl.TemplateError as exc:
            raise NodeErr(str(exc)) from None
        clean = desc.replace("(", "").replace(")", "")
        new["name"] = f"{step['name']}({index}:{clean})"
        new["template"] = step.get("template")
        return new

    # ------------------------------------------------------------------ pods
    def execute_pod(self, name: str, t: dict[str, Any], tname: str, boundary: str,
                    inputs: dict[str, Any], flag: dict[str, bool] | None, *, on_exit: bool,
                    execution_deadline: float | None) -> dict[str, Any]:
        """``executeContainer`` / ``executeScript`` + ``createWorkflowPod``."""
        node = self.by_name(name)
        if node is None:
            node = self.init_node(name, "Pod", tname, boundary, "Pending", inputs=inputs,
                                  flag=flag)
            node["_template"] = t
        if node["id"] in self.pods or node["phase"] in FULFILLED:
            return node
        leftover = [x for x in tmpl.unresolved(json.dumps(t))
                    if not x.startswith(("=", "steps.", "tasks."))]
        if leftover:  # validate.VerifyResolvedVariables before the pod is created
            raise NodeErr(f"failed to resolve {{{{{leftover[0]}}}}}")
        active = None if t.get("activeDeadlineSeconds") is None \
            else int(str(t["activeDeadlineSeconds"]))
        wf_dl = self.deadline()
        if wf_dl is not None and not on_exit:
            left = int(wf_dl - self.now())
            if left <= 0:
                return node
            active = left if active is None or left < active else active
        failed_hosts = self._fail_hosts(node)
        try:
            spec = build_pod_spec(t, self.spec, script="script" in t, active_deadline=active,
                                  failed_hosts=failed_hosts)
        except PatchError as exc:
            raise NodeErr(str(exc)) from None
        if self.pod_hook is not None:
            spec = self.pod_hook(name, node, spec)
        pname = pod_name(self.name, name, tname)
        placement = schedule(spec, self.cluster.list(), self.used)
        if not isinstance(placement, Placement):
            msg = f"Unschedulable: {placement.condition_message}"
            if node.get("message") != msg:
                node["message"] = msg
            return node  # stays Pending; the next pass tries again
        for res, qty in placement.requests.items():
            self.used.setdefault(placement.node, {}).setdefault(res, 0)
            self.used[placement.node][res] += int(qty)
        self.placements[node["id"]] = placement
        labels = {"workflows.argoproj.io/workflow": self.name,
                  **((t.get("metadata") or {}).get("labels") or {})}
        annotations = {"workflows.argoproj.io/node-name": name,
                       "workflows.argoproj.io/node-id": node["id"],
                       **((t.get("metadata") or {}).get("annotations") or {})}
        dl = min(x for x in (execution_deadline, None if on_exit else wf_dl) if x is not None) \
            if (execution_deadline is not None or (wf_dl is not None and not on_exit)) else None
        pod = PodRun(pname, spec, node=placement.node, labels=labels, annotations=annotations,
                     ctx=self.ctx, net=self.net, deadline=dl,
                     script=t["script"].get("source", "") if "script" in t else None,
                     on_change=self.wake.set)
        self.pods[node["id"]] = pod
        self.pod_specs[node["id"]] = spec
        node["hostNodeName"] = placement.node
        node.pop("message", None)
        self.log(f"pod {pname} ({name}) on {placement.node}")
        pod.start()
        return node

    def _fail_hosts(self, node: dict[str, Any]) -> list[str]:
        """``scheduleOnDifferentHost`` + ``GetFailHosts``: hosts of failed Pod attempts under
        the retry node, when its strategy asks for ``affinity.nodeAntiAffinity``."""
        retry = next((n for n in self.nodes.values() if n["type"] == "Retry"
                      and node["id"] in (n.get("children") or [])), None)
        if retry is None:
            return []
        rs = self._node_template(retry).get("retryStrategy") or {}
        if (rs.get("affinity") or {}).get("nodeAntiAffinity") is None:
            return []
        hosts: list[str] = []
        todo = [retry["id"]]
        while todo:
            x = self.nodes.get(todo.pop())
            if x is None:
                continue
            if x["phase"] in ("Failed", "Error") and x["type"] == "Pod" and \
                    x.get("hostNodeName"):
                hosts.append(x["hostNodeName"])
            todo.extend(x.get("children") or [])
        return list(dict.fromkeys(hosts))

    def kill_daemoned_children(self, nid: str) -> None:
        """``killDaemonedChildren`` (exec_control.go): daemoned nodes bound to this steps node
        are terminated and marked Succeeded."""
        for child in self.nodes.values():
            if child.get("boundaryID") != nid or not child.get("daemoned"):
                continue
            child["phase"] = "Succeeded"
            child.pop("daemoned", None)
            child.setdefault("finishedAt", rfc3339(self.now()))
            for kid in [child["id"], *(child.get("children") or [])]:
                pod = self.pods.get(kid)
                if pod is not None and not pod.done:
                    pod.kill("daemon scope ended")
                k = self.nodes.get(kid)
                if k is not None and k["phase"] not in FULFILLED:
                    k["phase"] = "Succeeded"
                    k.pop("daemoned", None)
                    k["finishedAt"] = rfc3339(self.now())

    # ------------------------------------------------------------------ driver
    def run(self, *, timeout: float | None = None, tick: float = 0.2,
            progress: Callable[[Operator], None] | None = None) -> dict[str, Any]:
        """Operate until the workflow completes (or ``timeout``), then wait for its pods."""
        end = None if timeout is None else self.now() + timeout
        while True:
            self.wake.clear()
            if self.operate():
                break
            if progress is not None:
                progress(self)
            if end is not None and self.now() > end:
                self.finish("Error", f"rehearse: the workflow did not end within {timeout:g} s")
                break
            self.wake.wait(tick)
        for pod in self.pods.values():
            pod.join(60)
        return self.public_status()

    def public_status(self) -> dict[str, Any]:
        """The status as ``argo get -o json`` shows it (internal keys dropped)."""
        nodes = {nid: {k: v for k, v in n.items() if not k.startswith("_")}
                 for nid, n in self.nodes.items()}
        out = {k: v for k, v in self.status.items() if k != "nodes"}
        out["nodes"] = nodes
        out.setdefault("progress", self.progress())
        return out


def _step_name(node_name: str) -> str:
    """``getStepOrDAGTaskName``: trailing ``(...)``/``[...]`` groups dropped, then the part
    after the last dot."""
    opener = ""
    for i in range(len(node_name) - 1, -1, -1):
        ch = node_name[i]
        if ch == opener:
            opener = ""
        elif opener:
            continue
        elif ch == ")":
            opener = "("
        elif ch == "]":
            opener = "["
        else:
            node_name = node_name[:i + 1]
            break
    return node_name.rsplit(".", 1)[-1]


def _should_expand(step: Mapping[str, Any]) -> bool:
    return bool(step.get("withItems") or step.get("withParam") or step.get("withSequence"))


def _when_or_true(when: str) -> bool:
    """``shouldExecute`` where an error counts as "must execute" (expandStep's check)."""
    try:
        return govaluate.evaluate_when(when)
    except govaluate.WhenError:
        return True


def _start_error(pod: PodRun, name: str) -> str:
    err = pod.stderr(name)
    line = next((ln for ln in err.splitlines() if ln.startswith("exec: ")), "")
    return line


def _go_json_error(text: str) -> str:
    """encoding/json's message for text that is not JSON (the common cases)."""
    stripped = text.lstrip(" \t\r\n")
    if not stripped:
        return "unexpected end of JSON input"
    return f"invalid character {stripped[0]!r} looking for beginning of value"


def _go_number(x: int | float) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _go_value(v: Any) -> str:
    """``fmt.Sprintf("%v", v)`` for JSON values."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _go_number(v)
    if isinstance(v, str):
        return v
    if v is None:
        return "<nil>"
    if isinstance(v, list):
        return "[" + " ".join(_go_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_value(v[k])}" for k in sorted(v)) + "]"
    return str(v)


def _go_sprintf(fmt: str, i: int) -> str:
    """``fmt.Sprintf(format, i)`` for the verbs withSequence formats use (``%d``, ``%02d``,
    ``%x``, ``%o``)."""
    try:
        return fmt.replace("%d", "%d") % i if "%" in fmt else fmt
    except (TypeError, ValueError):
        return f"%!(EXTRA int={i})"
