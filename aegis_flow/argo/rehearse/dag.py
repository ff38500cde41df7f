"""DAG templates: Argo's ``workflow/controller/dag.go`` (v4.0.5), as a mixin of the operator
(``controller.Operator``): the dependency graph (``dependencies`` and the ``depends``
expression, ``workflow/common/ancestry.go``), ``executeDAG`` / ``executeDAGTask`` (tasks run
once their dependencies are fulfilled; ``Omitted`` when ``depends`` says no), ``when``,
``withItems``/``withParam``/``withSequence`` on tasks (``TaskGroup`` nodes; the expansion is
``steps.py``'s, which Argo shares: ``processItem``, ``expandSequence``), ``continueOn``,
``{{tasks.X.*}}`` (``buildLocalScopeFromTask``: ancestors only, empty outputs for a Skipped or
Omitted one), target tasks and ``failFast``, and the DAG's own phase (``assessDAGPhase``).
Each method cites the Go function it follows.

Not modelled: task ``hooks``/``onExit`` (refused by ``spec.py``), memoization, metrics,
synchronization, the operation deadline (``ErrDeadlineExceeded``).

PURE apart from the node status it edits (through the operator) and the pods that
``execute_template`` starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from aegis_flow.argo.rehearse import exprlang, govaluate
from aegis_flow.argo.rehearse.base import NodeErr
from aegis_flow.argo.rehearse.podspec import node_id
from aegis_flow.argo.rehearse.steps import Requeue, Scope, StepsMixin, _should_expand

# ancestry.go taskNameRegex: "name.Result" or a bare task name (Go RE2, leftmost-first)
_TASK_NAME = re.compile(r"([a-zA-Z0-9][-a-zA-Z0-9]*?\.[A-Z][a-zA-Z]+)|([a-zA-Z0-9][-a-zA-Z0-9]*)")
_ITEMS_RESULTS = ("AnySucceeded", "AllFailed")  # DependencyTypeItems
_COMPLETED = ("Succeeded", "Failed", "Error")  # NodePhase.Completed


@dataclass
class DagContext:
    """``dagContext``: one DAG template's tasks under its boundary node, for one pass."""

    boundary_name: str
    boundary_id: str
    tmpl: dict[str, Any]
    on_exit: bool = False
    visited: set[str] = field(default_factory=set)
    dependencies: dict[str, list[str]] = field(default_factory=dict)
    depends_logic: dict[str, str] = field(default_factory=dict)

    @property
    def tasks(self) -> list[dict[str, Any]]:
        return list(self.tmpl["dag"]["tasks"])

    def task(self, name: str) -> dict[str, Any]:
        """``GetTask`` (Argo panics on an unknown name; validation refuses it first)."""
        for t in self.tasks:
            if t["name"] == name:
                return t
        raise NodeErr(f"target {name} does not exist")

    def task_node_name(self, name: str) -> str:
        """``taskNodeName``: ``<boundary>.<task>``."""
        return f"{self.boundary_name}.{name}"


def expand_dependency(dep: str, dep_task: dict[str, Any]) -> str:
    """``expandDependency`` (ancestry.go): a bare ``A`` is ``(A.Succeeded || A.Skipped ||
    A.Daemoned)``, plus ``A.Errored``/``A.Failed`` where A has ``continueOn`` for them."""
    results = ["Succeeded", "Skipped", "Daemoned"]
    cont = dep_task.get("continueOn") or {}
    if cont.get("error"):
        results.append("Errored")
    if cont.get("failed"):
        results.append("Failed")
    return "(" + " || ".join(f"{dep}.{r}" for r in results) + ")"


def task_depends_logic(task: dict[str, Any], d: DagContext) -> str:
    """``getTaskDependsLogic``: ``depends`` as written, else ``dependencies: [A, B]`` as
    ``expand(A) && expand(B)``."""
    if task.get("depends"):
        return str(task["depends"])
    return " && ".join(expand_dependency(dep, d.task(dep))
                       for dep in task.get("dependencies") or [])


def task_dependencies(task: dict[str, Any], d: DagContext) -> tuple[list[str], str]:
    """``GetTaskDependencies`` (ancestry.go): the tasks named in the logic (in the order they
    appear; Go's is a map's), and the logic with every bare name expanded."""
    depends = task_depends_logic(task, d)
    deps: dict[str, str] = {}
    bare: list[tuple[int, int, str]] = []
    for m in _TASK_NAME.finditer(depends):
        if m.group(1) is not None:
            name, result = m.group(1).split(".", 1)
            if result in _ITEMS_RESULTS:
                deps[name] = "items"
            elif name not in deps:
                deps[name] = "task"
        else:
            deps[m.group(2)] = "task"
            bare.append((m.start(2), m.end(2), m.group(2)))
    for start, end, name in sorted(bare, reverse=True):
        depends = depends[:start] + expand_dependency(name, d.task(name)) + depends[end:]
    return list(deps), depends


class DAGMixin(StepsMixin):
    exec_errors: dict[str, str]  # node name -> the error executeTemplate returned for it

    # ------------------------------------------------------------------ the graph
    def _deps(self, d: DagContext, name: str) -> list[str]:
        """``GetTaskDependencies`` (cached per pass, as ``dagContext`` does)."""
        if name not in d.dependencies:
            d.dependencies[name], d.depends_logic[name] = task_dependencies(d.task(name), d)
        return d.dependencies[name]

    def _logic(self, d: DagContext, name: str) -> str:
        """``GetTaskDependsLogic``."""
        self._deps(d, name)
        return d.depends_logic[name]

    def task_node(self, d: DagContext, name: str) -> dict[str, Any] | None:
        """``getTaskNode``."""
        return self.by_name(d.task_node_name(name))

    def find_leaf_task_names(self, d: DagContext) -> list[str]:
        """``findLeafTaskNames``: the tasks no task depends on, sorted."""
        leaf: dict[str, bool] = {}
        for t in d.tasks:
            leaf.setdefault(t["name"], True)
            for dep in self._deps(d, t["name"]):
                leaf[dep] = False
        return sorted(n for n, is_leaf in leaf.items() if is_leaf)

    def task_ancestry(self, d: DagContext, name: str) -> list[str]:
        """``GetTaskAncestry`` (ancestry.go): every task above ``name``, ordered by the time it
        finished (or started)."""
        seen: dict[str, str] = {}

        def walk(cur: str) -> None:
            if cur in seen:
                return
            for dep in self._deps(d, cur):
                walk(dep)
            if cur != name and cur not in seen:
                node = self.task_node(d, cur)
                seen[cur] = (node.get("finishedAt") or node.get("startedAt") or "") \
                    if node is not None else ""
        walk(name)
        return sorted(seen, key=lambda k: seen[k])

    # ------------------------------------------------------------------ executeDAG
    def execute_dag(self, name: str, t: dict[str, Any], tname: str, boundary: str,
                    inputs: dict[str, Any], flag: dict[str, bool] | None, *,
                    on_exit: bool = False) -> dict[str, Any]:
        """``executeDAG`` (dag.go)."""
        node = self.by_name(name) or self.init_node(name, "DAG", tname, boundary, "Running",
                                                    inputs=inputs, flag=flag)
        try:
            return self._dag(name, node, t, on_exit)
        finally:
            if self.fulfilled(self.nodes[node["id"]]):
                self.kill_daemoned_children(node["id"])

    def _dag(self, name: str, node: dict[str, Any], t: dict[str, Any], on_exit: bool
             ) -> dict[str, Any]:
        d = DagContext(boundary_name=name, boundary_id=node["id"], tmpl=t, on_exit=on_exit)
        target = t["dag"].get("target")
        targets = str(target).split(" ") if target else self.find_leaf_task_names(d)
        for task in d.tasks:  # pre-execute daemoned tasks
            tn = self.task_node(d, task["name"])
            if tn is not None and tn.get("daemoned"):
                self.execute_dag_task(d, task["name"])
        for task_name in targets:
            self.execute_dag_task(d, task_name)
        phase = self.assess_dag_phase(d, targets)
        if phase == "Running":
            return node
        if phase in ("Failed", "Error"):
            self.update_outbound_for_targets(d, targets, name)
            return self.mark(name, phase)
        scope = Scope()
        for task in d.tasks:  # outputs: every task's scope, for a DAG template's outputs
            tn = self.task_node(d, task["name"])
            if tn is None:
                continue
            prefix = f"tasks.{task['name']}"
            if tn["type"] == "TaskGroup":
                self.aggregate_outputs(scope, prefix, [self.nodes[k] for k in
                                                       tn.get("children") or []])
            self.local_scope(scope, prefix, tn)
        outputs = self.outputs_from_scope(t, scope)
        if outputs:
            node["outputs"] = outputs
        self.update_outbound_for_targets(d, targets, name)
        return self.mark(name, "Succeeded")

    def update_outbound_for_targets(self, d: DagContext, targets: list[str], name: str
                                    ) -> None:
        """``updateOutboundNodesForTargetTasks``: the target tasks' outbound nodes."""
        out: list[str] = []
        for dep in targets:
            tn = self.task_node(d, dep)
            if tn is not None:
                out.extend(self.outbound(tn["id"]))
        found = self.by_name(name)
        assert found is not None
        found["outboundNodes"] = out

    def assess_dag_phase(self, d: DagContext, targets: list[str]) -> str:
        """``assessDAGPhase``: a breadth-first walk from the DAG's children carrying each
        branch's last completed phase (an Omitted target inherits its branch's phase, Failed or
        Error preferred); Running until every target is reached; with ``failFast`` (default)
        the first failed target decides, unless that task ``continueOn``s its phase."""
        target_phases = {self.nodes_id(d.task_node_name(x)): "" for x in targets}
        boundary = self.nodes[d.boundary_id]
        queue: list[tuple[str, str]] = []
        seen: set[tuple[str, str]] = set()

        def add(ids: list[str], phase: str) -> None:  # uniquePhaseNodeQueue
            for i in ids:
                if (i, phase) not in seen:
                    seen.add((i, phase))
                    queue.append((i, phase))
        add(list(boundary.get("children") or []), "Succeeded")
        while queue:
            nid, branch = queue.pop(0)
            n = self.nodes.get(nid)
            if n is None or not self.fulfilled(n):
                return "Running"
            if n["phase"] in _COMPLETED:
                branch = n["phase"]
            if nid in target_phases and target_phases[nid] not in ("Failed", "Error"):
                target_phases[nid] = branch
            if n["type"] == "Retry":
                add(self._retry_children_ids(n), branch)
            else:
                add(list(n.get("children") or []), branch)
        fail_fast = d.tmpl["dag"].get("failFast") is not False
        result = "Succeeded"
        for dep in targets:
            branch = target_phases[self.nodes_id(d.task_node_name(dep))]
            if branch == "":
                result = "Running"
                if not fail_fast:
                    break
            elif branch in ("Failed", "Error"):
                cont = d.task(dep).get("continueOn") or {}
                if (branch == "Failed" and cont.get("failed")) or \
                        (branch == "Error" and cont.get("error")):
                    continue
                result = branch
                if fail_fast:
                    break
        return result

    def nodes_id(self, name: str) -> str:
        return node_id(self.name, name)

    def _retry_children_ids(self, node: dict[str, Any]) -> list[str]:
        """``getRetryNodeChildrenIds`` (operator.go): from the last attempt back, a hooked
        attempt itself, else each attempt's children."""
        out: list[str] = []
        for kid in reversed(node.get("children") or []):
            k = self.nodes.get(kid)
            if k is None:
                continue
            if (k.get("nodeFlag") or {}).get("hooked"):
                out.append(kid)
            elif k.get("children"):
                out.extend(k["children"])
        return out

    # ------------------------------------------------------------------ executeDAGTask
    def execute_dag_task(self, d: DagContext, task_name: str) -> None:
        """``executeDAGTask`` (dag.go): run a task's dependencies first (recursively), then the
        task when ``depends`` holds (else Omitted), resolved against its ancestors' outputs,
        expanded over its items, under its ``when``."""
        if task_name in d.visited:
            return
        d.visited.add(task_name)
        node = self.task_node(d, task_name)
        task = d.task(task_name)
        if node is not None and node["phase"] in ("Succeeded", "Failed", "Error", "Skipped",
                                                  "Omitted"):
            return  # NodePhase.Fulfilled: nothing left to do (no onExit hooks here)
        node_name = d.task_node_name(task_name)
        deps = self._deps(d, task_name)
        group = self.by_name(node_name)
        if group is not None and group["type"] != "TaskGroup":
            group = None

        def connect(child: str) -> None:  # connectDependencies
            if not deps or group is not None:
                self.add_child(d.boundary_name if group is None else group["name"], child)
                return
            for dep in deps:
                dn = self.task_node(d, dep)
                assert dn is not None
                for out in self.outbound(dn["id"]):
                    self.add_child(self.nodes[out]["name"], child)

        def error_node(message: str) -> None:
            if self.by_name(node_name) is None:
                self.init_node(node_name, "Skipped", task.get("template", ""), d.boundary_id,
                               "Error", message, flag={})
            connect(node_name)

        if self._logic(d, task_name) != "":
            for dep in deps:
                self.execute_dag_task(d, dep)
            try:
                execute, proceed = self.evaluate_depends_logic(d, task_name)
            except exprlang.ExprError as exc:
                error_node(f"unable to evaluate expression "
                           f"'{self._logic(d, task_name).replace('-', '_')}': {exc}")
                return
            if not proceed:
                return
            if not execute:
                if self.by_name(node_name) is None:
                    self.init_node(node_name, "Skipped", task.get("template", ""),
                                   d.boundary_id, "Omitted",
                                   "omitted: depends condition not met", flag={})
                connect(node_name)
                return
        try:
            new_task = self.resolve_dependency_references(d, task)
        except Requeue:
            return
        except NodeErr as exc:
            error_node(str(exc))
            return
        try:
            scope = self.local_scope_from_task(d, new_task)
            expanded = self.expand_task(new_task, scope)
        except NodeErr as exc:
            error_node(str(exc))
            return
        if _should_expand(task):
            if not expanded:
                if self.by_name(node_name) is None:
                    self.init_node(node_name, "Skipped", task.get("template", ""),
                                   d.boundary_id, "Skipped", "Skipped, empty params", flag={})
                connect(node_name)
            elif group is None:
                connect(node_name)
                group = self.init_node(node_name, "TaskGroup", task.get("template", ""),
                                       d.boundary_id, "Running", flag={})
        for t in expanded:
            tn_name = d.task_node_name(t["name"])
            tn = self.task_node(d, t["name"])
            if tn is None:
                connect(tn_name)
                try:
                    proceed = govaluate.evaluate_when(t.get("when", ""))
                except govaluate.WhenError as exc:
                    self.init_node(tn_name, "Skipped", task.get("template", ""),
                                   d.boundary_id, "Error", str(exc), flag={})
                    continue
                if not proceed:
                    self.init_node(tn_name, "Skipped", task.get("template", ""),
                                   d.boundary_id, "Skipped", f"when '{t['when']}' evaluated false",
                                   flag={})
                    continue
            tn = self.execute_template(tn_name, t, t.get("arguments") or {},
                                       boundary=d.boundary_id, on_exit=d.on_exit)
            err = self.exec_errors.pop(tn_name, None)
            if err is not None:
                self.mark_error(tn_name, f"task '{tn_name}' errored: {err}")
                return
            if tn is None:
                return
        if group is not None:
            phase = "Succeeded"
            for t in expanded:
                tn = self.task_node(d, t["name"])
                if tn is None or not self.fulfilled(tn):
                    return
                if tn["phase"] in ("Failed", "Error"):
                    phase = tn["phase"]
            self.mark(group["name"], phase)

    def evaluate_depends_logic(self, d: DagContext, task_name: str) -> tuple[bool, bool]:
        """``evaluateDependsLogic``: (execute, proceed). Proceed once every dependency is
        fulfilled; then the logic is evaluated (expr) over each dependency's TaskResults, task
        names with ``-`` read as ``_``."""
        if self.task_node(d, task_name) is not None:
            return True, True
        env: dict[str, Any] = {}
        for dep in self._deps(d, task_name):
            dn = self.task_node(d, dep)
            if dn is None or not self.fulfilled(dn):
                return False, False
            key = dep.replace("-", "_")
            if key in env:
                continue
            any_ok = all_failed = False
            if dn["type"] == "TaskGroup":
                kids = dn.get("children") or []
                all_failed = len(kids) > 0
                for kid in kids:
                    k = self.nodes.get(kid)
                    if k is None:
                        all_failed = False
                        continue
                    any_ok = any_ok or k["phase"] == "Succeeded"
                    all_failed = all_failed and k["phase"] == "Failed"
            env[key] = {"Succeeded": dn["phase"] == "Succeeded", "Failed": dn["phase"] == "Failed",
                        "Errored": dn["phase"] == "Error", "Skipped": dn["phase"] == "Skipped",
                        "Omitted": dn["phase"] == "Omitted",
                        "Daemoned": bool(dn.get("daemoned")) and dn["phase"] != "Pending",
                        "AnySucceeded": any_ok, "AllFailed": all_failed}
        logic = self._logic(d, task_name).replace("-", "_")
        return exprlang.evaluate_bool(logic, env), True

    # ------------------------------------------------------------------ scope
    def local_scope_from_task(self, d: DagContext, task: dict[str, Any]) -> Scope:
        """``buildLocalScopeFromTask``: each ancestor's ``tasks.X.*`` (a TaskGroup's outputs
        aggregated over its children); a Skipped/Omitted ancestor without outputs gives its
        template's declared outputs as empty strings."""
        scope = Scope()
        for anc in self.task_ancestry(d, task["name"]):
            an = self.task_node(d, anc)
            if an is None:
                raise NodeErr(f"Ancestor task node {anc} not found")
            prefix = f"tasks.{anc}"
            if an["type"] == "TaskGroup":
                kids = [n for n in self.nodes.values() if n.get("boundaryID") == d.boundary_id
                        and n["name"].startswith(an["name"] + "(")]
                self.aggregate_outputs(scope, prefix, kids)
            self.local_scope(scope, prefix, an)
            if an["phase"] in ("Skipped", "Omitted") and an.get("outputs") is None:
                try:
                    tmpl, _ = self.resolve_template(d.task(anc))
                except NodeErr:
                    continue
                outs = tmpl.get("outputs") or {}
                for p in outs.get("parameters") or []:
                    scope.params[f"{prefix}.outputs.parameters.{p['name']}"] = ""
                if outs.get("result") is not None:
                    scope.params[f"{prefix}.outputs.result"] = ""
        return scope

    def resolve_template(self, holder: Any) -> tuple[dict[str, Any], str]:
        raise NotImplementedError

    def resolve_dependency_references(self, d: DagContext, task: dict[str, Any]
                                      ) -> dict[str, Any]:
        """``resolveDependencyReferences``: ``when`` first (strict for ``tasks.``/``steps.``;
        a task it skips is not resolved further), then the whole task; an unresolved
        ``tasks.`` reference requeues. The same rules as ``steps.resolveReferences``."""
        return self.resolve_references([task], self.local_scope_from_task(d, task))[0]

    def expand_task(self, task: dict[str, Any], scope: Scope) -> list[dict[str, Any]]:
        """``expandTask``: the task itself, or one task per item, named ``name(i:item)``."""
        if not _should_expand(task):
            return [task]
        items = self._items(task)
        base = {k: v for k, v in task.items() if k not in ("withItems", "withParam",
                                                            "withSequence")}
        return [self._process_item(base, i, item, scope) for i, item in enumerate(items)]
