"""Semantic lint of Argo manifests: what the JSON schema cannot see.

PURE: functions over plain dicts (parsed YAML); no I/O. Rules (each finding names one):

- ``entrypoint``: ``spec.entrypoint`` and ``spec.onExit`` name a template of the manifest;
- ``template-ref``: every step/task ``template`` resolves locally, every ``templateRef`` to a
  WorkflowTemplate linted alongside (or passed in ``known``) and a template in it;
- ``input-param``: every ``{{inputs.parameters.X}}`` is declared in that template's inputs;
- ``workflow-param``: every ``{{workflow.parameters.X}}`` is declared in ``spec.arguments``;
- ``step-ref``: every ``{{steps.X…}}`` / ``{{tasks.X…}}`` (and DAG ``dependencies``) names a
  step/task of the same template; ``output-param``: ``…outputs.parameters.Y`` is declared by
  the template that step calls;
- ``loop-item``: ``{{item}}`` only in a step/task that loops (withItems/withParam/withSequence);
- ``name`` / ``unique``: template, step, task and parameter names are valid and unique;
- ``recursion``: a step/task that calls back into its own cycle of templates has a ``when``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_TAG = re.compile(r"\{\{\s*(=?)\s*(.*?)\s*\}\}", re.S)
_PLAIN_REF = re.compile(r"^(inputs|workflow)\.parameters\.([^\s.}]+)$|"
                        r"^(steps|tasks)\.([^.\s}]+)(?:\.(.*))?$")
_EXPR_REF = re.compile(r"\b(inputs|workflow)\.parameters"
                       r"(?:\.([A-Za-z0-9_]+)|\[['\"]([^'\"]+)['\"]\])"
                       r"|\b(steps|tasks)(?:\.([A-Za-z0-9_]+)|\[['\"]([^'\"]+)['\"]\])")
_NAME = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]{0,127}$")
_PARAM_NAME = re.compile(r"^[-a-zA-Z0-9_]+$")
_LOOPS = ("withItems", "withParam", "withSequence")
WORKFLOW_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate")


@dataclass(frozen=True)
class Finding:
    """One lint error: the rule, where it is, and what to do."""

    rule: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: [{self.rule}] {self.message}"


def _names(items: Any) -> list[str]:
    return [str(p.get("name", "")) for p in items or [] if isinstance(p, dict)]


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def references(text: str) -> Iterator[tuple[str, str, str]]:
    """(scope, name, rest) for each reference in ``text``: scope is ``inputs``, ``workflow``,
    ``steps`` or ``tasks``; rest is what follows ``steps.X.`` (empty otherwise)."""
    for expr, body in _TAG.findall(text):
        if expr:
            for m in _EXPR_REF.finditer(body):
                if m.group(1):
                    yield m.group(1), m.group(2) or m.group(3), ""
                else:
                    yield m.group(4), m.group(5) or m.group(6), ""
            continue
        plain = _PLAIN_REF.match(body)
        if plain and plain.group(1):
            yield plain.group(1), plain.group(2), ""
        elif plain:
            yield plain.group(3), plain.group(4), plain.group(5) or ""


def _calls(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path suffix, step-or-task) for every step and task of a template."""
    for gi, group in enumerate(template.get("steps") or []):
        for si, step in enumerate(group if isinstance(group, list) else [group]):
            if isinstance(step, dict):
                yield f"steps[{gi}][{si}]", step
    for ti, task in enumerate((template.get("dag") or {}).get("tasks") or []):
        if isinstance(task, dict):
            yield f"dag.tasks[{ti}]", task


def _known_templates(manifests: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    known: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in manifests:
        if doc.get("kind") in ("WorkflowTemplate", "ClusterWorkflowTemplate"):
            name = str((doc.get("metadata") or {}).get("name", ""))
            known[name] = {str(t.get("name")): t for t in (doc.get("spec") or {}).get(
                "templates") or [] if isinstance(t, dict)}
    return known


def lint(manifests: list[dict[str, Any]],
         known: dict[str, dict[str, dict[str, Any]]] | None = None) -> list[Finding]:
    """Lint manifests together (templateRefs may point from one to another).

    ``known`` adds WorkflowTemplates that live elsewhere: name → {template name → template}.
    """
    refs = {**(known or {}), **_known_templates(manifests)}
    out: list[Finding] = []
    for doc in manifests:
        if doc.get("kind") in WORKFLOW_KINDS:
            out += lint_one(doc, refs)
    return out


def lint_one(doc: dict[str, Any],
             refs: dict[str, dict[str, dict[str, Any]]]) -> list[Finding]:
    meta = doc.get("metadata") or {}
    label = f"{doc.get('kind')} {meta.get('name') or meta.get('generateName') or '?'}"
    spec = doc.get("spec") or {}
    templates = [t for t in spec.get("templates") or [] if isinstance(t, dict)]
    by_name = {str(t.get("name")): t for t in templates}
    wf_params = set(_names((spec.get("arguments") or {}).get("parameters")))
    out: list[Finding] = []

    def add(rule: str, where: str, message: str) -> None:
        out.append(Finding(rule, f"{label}: {where}", message))

    # entrypoint / onExit
    for key in ("entrypoint", "onExit"):
        target = spec.get(key)
        if target is None:
            if key == "entrypoint" and doc.get("kind") == "Workflow" \
                    and not spec.get("workflowTemplateRef"):
                add("entrypoint", "spec", "no entrypoint: set spec.entrypoint to a template")
        elif target not in by_name:
            add("entrypoint", f"spec.{key}", f"{target!r} is not a template here "
                f"(templates: {', '.join(sorted(by_name))})")

    # names and uniqueness
    _check_names(add, "spec.templates", _names(templates), _NAME, "template")
    _check_names(add, "spec.arguments.parameters",
                 _names((spec.get("arguments") or {}).get("parameters")), _PARAM_NAME, "parameter")

    for tmpl in templates:
        tname = str(tmpl.get("name"))
        where = f"templates/{tname}"
        inputs = set(_names((tmpl.get("inputs") or {}).get("parameters")))
        for part in ("inputs", "outputs"):
            _check_names(add, f"{where}.{part}", _names((tmpl.get(part) or {}).get("parameters")),
                         _PARAM_NAME, "parameter")
        calls = list(_calls(tmpl))
        _check_names(add, where, [str(s.get("name", "")) for _, s in calls], _NAME,
                     "task" if "dag" in tmpl else "step")
        siblings = {str(s.get("name")): s for _, s in calls}
        scope = "tasks" if "dag" in tmpl else "steps"

        for text in _strings({k: v for k, v in tmpl.items() if k != "name"}):
            for kind, name, rest in references(text):
                if kind == "inputs" and name not in inputs:
                    add("input-param", where, f"{{{{inputs.parameters.{name}}}}} is not declared: "
                        f"add it to inputs.parameters (declared: {sorted(inputs) or 'none'})")
                elif kind == "workflow" and name not in wf_params:
                    add("workflow-param", where, f"{{{{workflow.parameters.{name}}}}} is not "
                        f"declared: add it to spec.arguments.parameters")
                elif kind in ("steps", "tasks"):
                    if kind != scope or name not in siblings:
                        add("step-ref", where, f"{{{{{kind}.{name}…}}}} names no {kind[:-1]} of "
                            f"this template ({scope}: {', '.join(sorted(siblings)) or 'none'})")
                        continue
                    _check_output(add, where, name, rest, siblings[name], by_name, refs)

        for suffix, step in calls:
            spath = f"{where}.{suffix}({step.get('name')})"
            for dep in step.get("dependencies") or []:
                if dep not in siblings:
                    add("step-ref", spath, f"dependency {dep!r} is not a task of this DAG")
            if not any(k in step for k in _LOOPS) and any(
                    "{{item" in s for s in _strings(step.get("arguments"))):
                add("loop-item", spath, "uses {{item}} but does not loop: add withItems, "
                    "withParam or withSequence")
            if "template" in step and step["template"] not in by_name:
                add("template-ref", spath, f"template {step['template']!r} does not exist here")
            ref = step.get("templateRef")
            if isinstance(ref, dict):
                target = refs.get(str(ref.get("name")))
                if target is None:
                    add("template-ref", spath, f"templateRef to WorkflowTemplate "
                        f"{ref.get('name')!r}, which is not among the linted files: lint it too")
                elif ref.get("template") not in target:
                    add("template-ref", spath, f"WorkflowTemplate {ref.get('name')!r} has no "
                        f"template {ref.get('template')!r} (it has: {', '.join(sorted(target))})")
    out += _recursion(label, by_name)
    return out


def _check_names(add: Any, where: str, names: list[str], pattern: re.Pattern[str],
                 what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if not pattern.match(n):
            add("name", where, f"{what} name {n!r} is invalid: use letters, digits and '-'"
                + (" ('_' allowed)" if what == "parameter" else "") + ", starting with a letter "
                "or digit")
        if n in seen:
            add("unique", where, f"{what} name {n!r} is used twice: rename one")
        seen.add(n)


def _check_output(add: Any, where: str, step_name: str, rest: str, step: dict[str, Any],
                  by_name: dict[str, dict[str, Any]],
                  refs: dict[str, dict[str, dict[str, Any]]]) -> None:
    m = re.match(r"^outputs\.parameters\.([^.\s]+)$", rest)
    if not m:
        return
    ref = step.get("templateRef")
    if isinstance(ref, dict):
        callee = refs.get(str(ref.get("name")), {}).get(str(ref.get("template")))
    else:
        callee = by_name.get(str(step.get("template")))
    if callee is None:
        return  # reported by template-ref
    declared = _names((callee.get("outputs") or {}).get("parameters"))
    if m.group(1) not in declared:
        add("output-param", where, f"step {step_name!r} has no output parameter "
            f"{m.group(1)!r} (its template declares: {declared or 'none'})")


def _recursion(label: str, by_name: dict[str, dict[str, Any]]) -> list[Finding]:
    edges = {t: {str(s.get("template")) for _, s in _calls(tm) if s.get("template") in by_name}
             for t, tm in by_name.items()}

    def reaches(src: str, dst: str) -> bool:
        seen, todo = set(), [src]
        while todo:
            cur = todo.pop()
            if cur == dst:
                return True
            if cur not in seen:
                seen.add(cur)
                todo += edges.get(cur, ())
        return False

    out = []
    for tname, tmpl in by_name.items():
        for suffix, step in _calls(tmpl):
            callee = str(step.get("template"))
            if callee in by_name and reaches(callee, tname) and not step.get("when"):
                out.append(Finding("recursion", f"{label}: templates/{tname}.{suffix}"
                                   f"({step.get('name')})", f"calls {callee!r}, which leads "
                                   f"back to {tname!r}, with no 'when': guard the recursion "
                                   "(e.g. when: {{inputs.parameters.attempt}} < "
                                   "{{workflow.parameters.max-retry}})"))
    return out
