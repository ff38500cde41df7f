"""Pod nodes: creating each node's pod and reading its fate back, as Argo's controller does
(a mixin of ``controller.Operator``): ``executeContainer``/``executeScript`` +
``createWorkflowPod`` (the pod spec, scheduling onto the fake nodes, the deadlines),
``podReconciliation``/``assessNodeStatus``/``inferFailedReason`` (phases, messages, exit
codes, daemons becoming ready), the executor's output parameters and ``outputs.result``
(``includeScriptOutput``), ``GetFailHosts`` for ``nodeAntiAffinity`` and
``killDaemonedChildren``. Each method cites the Go function it follows.

Side effects: pods (``pods.PodRun``: processes, namespaces) are started and killed here.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aegis_flow.argo.rehearse import tmpl
from aegis_flow.argo.rehearse.base import FULFILLED, NodeErr, OperatorBase, rfc3339
from aegis_flow.argo.rehearse.cluster import Placement, schedule
from aegis_flow.argo.rehearse.pods import PodRun, PodSpecError, valid_progress
from aegis_flow.argo.rehearse.podspec import PatchError, build_pod_spec, pod_name

RECENTLY_STARTED_POD_DURATION = 10.0  # operator.go recentlyStarted's default


class PodsMixin(OperatorBase):
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
            if pod.progress is not None and valid_progress(pod.progress):
                node["progress"] = pod.progress  # taskresult.go: the executor's report
            if node["phase"] in FULFILLED:
                continue
            if pod.gone:
                self._pod_missing(nid, node)
                continue
            if dl is not None and self.now() > dl and not self._in_exit_handler(node):
                pod.kill("Killed")
                self.mark(node["name"], "Failed", "Step exceeded its deadline")
                node.pop("daemoned", None)
                continue
            v = pod.view
            tmpl_ = node.get("_template") or self.templates.get(node.get("templateName", ""), {})
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

    def _pod_missing(self, nid: str, node: dict[str, Any]) -> None:
        """``podReconciliation``'s deleted-pod pass (operator.go): a Pod node whose pod is no
        longer seen: still Pending, the pod is created again by the next ``executeTemplate``;
        started within ``RECENTLY_STARTED_POD_DURATION`` (10 s, ``recentlyStarted``), the
        workflow is requeued (looked at again); otherwise the node is marked Error ``pod
        deleted`` (``markNodeError``) and no longer daemoned."""
        if node["phase"] == "Pending":
            self.pods.pop(nid, None)
            return
        if self.now() - self._ts(node["startedAt"]) <= RECENTLY_STARTED_POD_DURATION:
            return
        node.pop("daemoned", None)
        self.mark(node["name"], "Error", "pod deleted")

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
            elif c.message:  # the container's termination message (t.Message)
                msg += ": " + c.message
            elif c.exit_code == 128 and (own := _shim_error(pod, c.name)):
                msg += ": " + own  # the rehearsal's own fault, not Argo's: say which
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
        """``includeScriptOutput`` / ``hasOutputResultRef`` / ``generateOutputResultRegex``:
        stdout becomes ``outputs.result`` only when the enclosing template mentions
        ``steps.<step>.outputs.result`` (``tasks.<task>.outputs.result`` in a DAG)."""
        boundary = self.nodes.get(node.get("boundaryID") or "")
        if boundary is None:
            return False
        parent_t = self._node_template(boundary)
        parent = json.dumps(parent_t)
        name = _step_name(node["name"])
        kind = "tasks" if "dag" in parent_t else "steps"
        return re.search(rf"{kind}\.{re.escape(name)}\.outputs\.result", parent) is not None or \
            re.search(rf"{kind}\[['\"]{re.escape(name)}['\"]\]\.outputs.result", parent) is not None

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
        if (t.get("resource") or {}).get("setOwnerReference"):
            t = self._set_owner_reference(t)
        try:
            spec = build_pod_spec(t, self.spec, script="script" in t, active_deadline=active,
                                  failed_hosts=failed_hosts)
        except PatchError as exc:
            raise NodeErr(str(exc)) from None
        pname = pod_name(self.name, name, tname)
        placement = schedule(spec, self.cluster.list(), self.used)
        if not isinstance(placement, Placement):
            msg = f"Unschedulable: {placement.condition_message}"
            if node.get("message") != msg:
                node["message"] = msg
            return node  # stays Pending; the next pass tries again
        if self.pod_hook is not None:  # scenario rules (may match the node it was placed on)
            node["hostNodeName"] = placement.node
            spec = self.pod_hook(name, node, spec)
        for res, qty in placement.requests.items():
            self.used.setdefault(placement.node, {}).setdefault(res, 0)
            self.used[placement.node][res] += int(qty)
        self.placements[node["id"]] = placement
        # createWorkflowPod: the workflow and completed labels, then addMetadata (template's)
        labels = {"workflows.argoproj.io/workflow": self.name,
                  "workflows.argoproj.io/completed": "false",
                  **{str(k): str(v) for k, v in
                     ((t.get("metadata") or {}).get("labels") or {}).items()}}
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

    def _set_owner_reference(self, t: dict[str, Any]) -> dict[str, Any]:
        """``executeResource``: the workflow appended to the manifest's ownerReferences as
        its controller (``metav1.NewControllerRef``)."""
        import yaml

        try:
            obj = yaml.safe_load(t["resource"]["manifest"])
        except yaml.YAMLError as exc:
            raise NodeErr(str(exc)) from None
        if not isinstance(obj, dict):
            raise NodeErr("resource.manifest is not an object")
        meta = obj.setdefault("metadata", {})
        meta["ownerReferences"] = [*(meta.get("ownerReferences") or []), {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": self.name,
            "uid": getattr(self, "uid", ""), "controller": True, "blockOwnerDeletion": True}]
        return {**t, "resource": {**t["resource"],
                                  "manifest": yaml.safe_dump(obj, sort_keys=True)}}

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


def _start_error(pod: PodRun, name: str) -> str:
    err = pod.stderr(name)
    line = next((ln for ln in err.splitlines() if ln.startswith("exec: ")), "")
    return line


def _shim_error(pod: PodRun, name: str) -> str:
    """The line shim.py writes when it cannot set up the container's filesystem."""
    err = pod.stderr(name)
    return next((ln for ln in err.splitlines() if ln.startswith("rehearse: ")), "")


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
