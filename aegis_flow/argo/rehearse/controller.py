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
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from aegis_flow.argo.rehearse import exprlang, tmpl
from aegis_flow.argo.rehearse.base import FULFILLED, NodeErr, OperatorBase, rfc3339
from aegis_flow.argo.rehearse.cluster import NodeStore, Placement
from aegis_flow.argo.rehearse.dag import DAGMixin
from aegis_flow.argo.rehearse.netns import Network
from aegis_flow.argo.rehearse.podnodes import PodsMixin
from aegis_flow.argo.rehearse.pods import PodContext, PodRun, valid_progress
from aegis_flow.argo.rehearse.podspec import pod_name
from aegis_flow.argo.rehearse.spec import Unsupported, check_template
from aegis_flow.argo.rehearse.steps import StepsMixin

MAX_STACK_DEPTH = 100  # workflow/controller/controller.go maxAllowedStackDepth
ERR_MAX_DEPTH = ("Maximum recursion depth exceeded. See "
                 "https://argo-workflows.readthedocs.io/en/latest/scaling/#maximum-recursion-depth")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


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




def humanize(seconds: float) -> str:
    """``humanize.Duration`` as Argo's backoff message prints it (e.g. ``10 seconds``)."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} seconds" if s != 1 else "1 second"
    m = s // 60
    return f"{m} minutes" if m != 1 else "1 minute"


class Operator(PodsMixin, DAGMixin, StepsMixin, OperatorBase):
    """One workflow's controller. ``run()`` drives it to the end and returns the status."""

    def __init__(self, wf: dict[str, Any], *, name: str, namespace: str, cluster: NodeStore,
                 net: Network, ctx: PodContext, now: Callable[[], float] = time.time,
                 pod_hook: Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]] |
                 None = None, log: Callable[[str], None] = lambda s: None,
                 workflow_templates: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.wf, self.spec = wf, wf["spec"]
        self.name, self.namespace = name, namespace
        self.cluster, self.net, self.ctx, self.now = cluster, net, ctx, now
        self.pod_hook = pod_hook  # scenario: may change a pod's containers
        self.log = log
        claims = self.spec.get("volumeClaimTemplates") or []
        if claims:  # createPVCs (operator.go): claim <workflow>-<name>, a workflow volume
            self.spec = {**self.spec, "volumes": [*(self.spec.get("volumes") or []), *(
                {"name": c["metadata"]["name"], "persistentVolumeClaim": {
                    "claimName": f"{name}-{c['metadata']['name']}"}} for c in claims)]}
        self.templates = {t["name"]: t for t in self.spec.get("templates") or []}
        # templateRef: WorkflowTemplate name -> its manifest (the namespace's, as listed)
        self.workflow_templates = dict(workflow_templates or {})
        self.tmpl_base = ""  # TemplateContext.tmplBase: "" the workflow, else a WorkflowTemplate
        self.exec_errors: dict[str, str] = {}  # node name -> the err executeTemplate returned
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, PodRun] = {}  # node id -> pod
        self.pod_specs: dict[str, dict[str, Any]] = {}
        self.used: dict[str, dict[str, int]] = {}
        self.placements: dict[str, Placement] = {}  # node id -> where its pod runs (held)
        self.status: dict[str, Any] = {"phase": "Running", "startedAt": None, "nodes": self.nodes}
        if claims:
            self.status["persistentVolumeClaims"] = self.spec["volumes"][-len(claims):]
        self.started = self.now()
        self.status["startedAt"] = rfc3339(self.started)
        self.globals: dict[str, str] = {}
        self.wake = threading.Event()
        self.depth = 0
        self.uid = str((wf.get("metadata") or {}).get("uid") or uuid.uuid4())
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
        g["workflow.uid"] = self.uid
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
        """``progress.UpdateProgress`` (workflow/progress/updater.go): every Pod node has its
        self-reported progress (``ARGO_PROGRESS_FILE``, see ``pods._ProgressMonitor``) or
        ``0/1``, completed (``M/M``) when Succeeded; the workflow sums them; every other node
        sums the Pod nodes reachable through its children (each counted once)."""
        total_n = total_m = 0
        for n in self.nodes.values():
            if n["type"] != "Pod":
                continue
            if not valid_progress(str(n.get("progress") or "")):
                n["progress"] = "0/1"  # ProgressDefault
            if n["phase"] in ("Succeeded", "Skipped", "Omitted"):  # Progress.Complete
                m = n["progress"].split("/", 1)[1]
                n["progress"] = f"{int(m)}/{int(m)}"
            pn, pm = (int(x) for x in n["progress"].split("/", 1))
            total_n, total_m = total_n + pn, total_m + pm
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
                    cn, cm = (int(x) for x in child["progress"].split("/", 1))
                    pn, pm = pn + cn, pm + cm
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

    def execute_template(self, name: str, holder: Mapping[str, Any], args: Mapping[str, Any],
                         *, boundary: str, on_exit: bool = False,
                         flag: dict[str, bool] | None = None,
                         execution_deadline: float | None = None) -> dict[str, Any] | None:
        """``executeTemplate`` (operator.go). The template is resolved in the current template
        context (``self.tmpl_base``, ``TemplateContext.ResolveTemplate``): a ``templateRef``
        switches it to that WorkflowTemplate for everything the template calls."""
        node = self.by_name(name)
        self.exec_errors.pop(name, None)
        self.depth += 1
        try:
            if self.depth >= MAX_STACK_DEPTH:
                return self._init_or_error(node, name, holder, boundary, ERR_MAX_DEPTH)
            if holder.get("inline"):
                raise Unsupported("inline templates are not supported")
            try:
                org, base = self.resolve_template(holder)
            except NodeErr as exc:
                self.exec_errors[name] = str(exc)
                return self._init_or_error(node, name, holder, boundary, str(exc))
            tname = org["name"]
            try:
                processed, inputs = self.process_args(org, args, name)
            except NodeErr as exc:
                self.exec_errors[name] = str(exc)
                return self._init_or_error(node, name, holder, boundary, str(exc))
            if node is not None and node["phase"] in FULFILLED:
                return node  # handleNodeFulfilled
            retry = processed.get("retryStrategy")
            retry_name = ""
            opts_deadline = execution_deadline
            if retry is not None:
                retry_name = name
                rnode = node or self._from_holder(self.init_node(
                    name, "Retry", tname, boundary, "Running", inputs=inputs, flag=flag),
                    holder, org, base)
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
            caller_base, self.tmpl_base = self.tmpl_base, base
            try:
                if "container" in processed or "script" in processed or \
                        "resource" in processed:  # executeResource: a pod too
                    node = self.execute_pod(name, processed, tname, boundary, inputs, flag,
                                            on_exit=on_exit, execution_deadline=opts_deadline)
                elif "steps" in processed:
                    node = self.execute_steps(name, processed, tname, boundary, inputs, flag,
                                              on_exit=on_exit)
                elif "dag" in processed:
                    node = self.execute_dag(name, processed, tname, boundary, inputs, flag,
                                            on_exit=on_exit)
                else:
                    return self._init_or_error(
                        node, name, holder, boundary,
                        f"Template '{tname}' missing specification")
            except NodeErr as exc:
                if self.by_name(name) is None:
                    self.init_node(name, "Skipped", tname, boundary, "Error", str(exc))
                node = self.mark_error(name, exc)
                self.exec_errors[name] = str(exc)
            finally:
                self.tmpl_base = caller_base
            if node is not None:
                self._from_holder(node, holder, org, base)
            if retry_name:
                found = self.by_name(retry_name)
                assert found is not None
                rnode = found
                if rnode["phase"] not in FULFILLED and node is not None and \
                        node["phase"] in FULFILLED:
                    again = self.execute_template(retry_name, holder, args, boundary=boundary,
                                                  on_exit=on_exit, flag=flag,
                                                  execution_deadline=execution_deadline)
                    assert again is not None
                    rnode = again
                    assert rnode is not None
                if node is not None and node["phase"] not in FULFILLED and node.get("daemoned"):
                    rnode["phase"] = node["phase"]
                    rnode["daemoned"] = True
                node = rnode
            return node
        finally:
            self.depth -= 1

    def resolve_template(self, holder: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """``TemplateContext.ResolveTemplate`` (workflow/templateresolution/context.go): the
        template a holder names and the template base it runs in (``""``: the workflow)."""
        ref = holder.get("templateRef")
        if ref:
            if ref.get("clusterScope"):
                raise Unsupported("templateRef.clusterScope (ClusterWorkflowTemplates) is not "
                                  "supported by rehearse")
            wt = self.workflow_templates.get(str(ref.get("name")))
            if wt is None:  # GetTemplateFromRef, on a NotFound from the lister
                raise NodeErr(f"workflow template {ref.get('name')} not found")
            org = next((t for t in wt["spec"].get("templates") or []
                        if t.get("name") == ref.get("template")), None)
            if org is None:
                raise NodeErr(f"template {ref.get('template')} not found in workflow template "
                              f"{ref.get('name')}")
            meta = wt["spec"].get("podMetadata") or {}
            if meta:  # addPodMetadata: the WorkflowTemplate's podMetadata onto the template
                org = json.loads(json.dumps(org))
                tm = org.setdefault("metadata", {})
                for key in ("annotations", "labels"):
                    if meta.get(key):
                        tm[key] = {**(tm.get(key) or {}), **meta[key]}
            return org, str(ref["name"])
        tname = holder.get("template")
        if self.tmpl_base:
            found = next((t for t in self.workflow_templates[self.tmpl_base]["spec"].get(
                "templates") or [] if t.get("name") == tname), None)
        else:
            found = self.templates.get(str(tname))
        if found is None:  # GetTemplateByName
            raise NodeErr(f"template {tname} not found")
        return found, self.tmpl_base

    def _from_holder(self, node: dict[str, Any], holder: Mapping[str, Any],
                     org: dict[str, Any], base: str) -> dict[str, Any]:
        """``initializeExecutableNode``'s ``templateRef``/``templateScope`` for a node from a
        WorkflowTemplate (Argo leaves ``templateName`` empty for a ``templateRef`` holder);
        the template is kept on the node, since the workflow's own list does not have it."""
        if not base:
            return node
        node.setdefault("_template", org)
        ref = holder.get("templateRef")
        if ref and "templateRef" not in node:
            node["templateRef"] = {k: ref[k] for k in ("name", "template") if k in ref}
            node.pop("templateName", None)
        if not ref:
            node.setdefault("templateScope", f"namespaced/{base}")
        return node

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

    def run(self, *, timeout: float | None = None, tick: float = 0.2,
            progress: Callable[[Operator], None] | None = None,
            until: Callable[[], str | None] | None = None) -> dict[str, Any]:
        """Operate until the workflow completes, ``timeout`` passes or ``until()`` gives a
        reason to stop (the phase is then Error with that reason), then wait for its pods."""
        end = None if timeout is None else self.now() + timeout
        while True:
            self.wake.clear()
            if self.operate():
                break
            if progress is not None:
                progress(self)
            reason = until() if until is not None else None
            if reason:
                self.finish("Error", f"rehearse: stopped: {reason}")
                break
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


