"""Steps templates: Argo's ``workflow/controller/steps.go`` (v4.0.5), as a mixin of the
operator (``controller.Operator``): step groups and the graph edges between them, ``when``,
``withItems``/``withParam``/``withSequence`` expansion, ``continueOn``, the scope of step
outputs (``buildLocalScope``) and their aggregation over loops (``processAggregateNodeOutputs``).
Each method cites the Go function it follows.

PURE apart from the node status it edits (through the operator) and the pods that
``execute_template`` starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aegis_flow.argo.rehearse import govaluate, tmpl
from aegis_flow.argo.rehearse.base import NodeErr, OperatorBase
from aegis_flow.argo.rehearse.podspec import node_id


class Requeue(Exception):
    """A reference is not resolvable yet (``ErrRequeue``)."""


@dataclass
class Scope:
    """``wfScope``: parameters visible to the steps of one steps template."""

    params: dict[str, str] = field(default_factory=dict)


class StepsMixin(OperatorBase):
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
        if node["type"] == "TaskGroup":
            if not node.get("children"):
                return [nid]
            group: list[str] = []
            for kid in node["children"]:
                group.extend(self.outbound(kid))
            return group
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
        except Requeue:
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
                        raise Requeue() from None
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
                    raise Requeue() from None
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
        if "template" in step:
            new["template"] = step["template"]
        return dict(new)

    # ------------------------------------------------------------------ pods


def _should_expand(step: Mapping[str, Any]) -> bool:
    return bool(step.get("withItems") or step.get("withParam") or step.get("withSequence"))


def _when_or_true(when: str) -> bool:
    """``shouldExecute`` where an error counts as "must execute" (expandStep's check)."""
    try:
        return govaluate.evaluate_when(when)
    except govaluate.WhenError:
        return True


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
