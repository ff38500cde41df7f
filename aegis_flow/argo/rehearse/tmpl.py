"""Argo's ``{{...}}`` template substitution (util/template, v4.0.5). PURE.

Argo never substitutes into bare strings: it JSON-marshals the object (a template, a step, a
``when`` string), runs fasttemplate over that JSON text with ``{{``/``}}`` tags, checks that the
result is still valid JSON and unmarshals it. A simple tag's key is the tag text trimmed of
whitespace; its value is written ``strconv.Quote``-escaped (without the outer quotes), which
is what keeps a value with ``"`` or a newline inside its JSON string. Go-only escapes (``\\a``,
``\\x01``, ``\\U0001F600`` for unprintables) make the result invalid JSON, and Argo then fails.
Since ``json.Marshal`` writes ``<``, ``>`` and ``&`` as ``\\u003c``..., a tag containing them
never matches a key (expression tags undo that, util/json Fix).

Three modes, as the controller uses them:

* ``allow_unresolved=True`` - ``template.Replace(..., true)``: common.SubstituteParams (inputs
  and globals into a template), pod specs, volumes, exit handlers. Unknown tags stay verbatim;
  an expression that cannot be evaluated yet stays verbatim.
* ``allow_unresolved=False`` - ``template.Replace(..., false)``: custom metrics. Any unknown
  tag fails with ``failed to resolve {{tag}}``.
* ``strict_prefixes=("steps", "tasks")`` - ``template.ReplaceStrict``: a step's or task's
  ``when`` and body (steps.go resolveReferences, dag.go). Only tags under those prefixes must
  resolve (``.outputs.artifacts.`` ones excepted); Argo requeues on such a "missing variable"
  error (see :func:`is_missing_variable`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .exprlang import ExprError, _Node, _Parser, argo_env, evaluate, go_json

__all__ = ["TemplateError", "is_missing_variable", "replace_json_text", "substitute",
           "substitute_json", "unresolved"]

_PLACEHOLDER = "__argo__internal__placeholder-"
_CHECKED_VARS = ("item", "retries", "lastRetry.exitCode", "lastRetry.status",
                 "lastRetry.duration", "lastRetry.message", "workflow.status", "workflow.failures")


class TemplateError(Exception):
    """A substitution Argo refuses; ``str(err)`` is Argo's message."""


@dataclass(frozen=True)
class _Mode:
    strict: re.Pattern[str] | None
    artifacts_may_dangle: bool


def _mode(allow_unresolved: bool, strict_prefixes: Sequence[str]) -> _Mode:
    if strict_prefixes:  # template.go getStrictRegex / ReplaceStrict
        alts = "|".join(re.escape(p) for p in strict_prefixes)
        return _Mode(re.compile(rf"^(({alts}))(\.|$)"), True)
    return _Mode(None if allow_unresolved else re.compile(".*"), allow_unresolved)


def go_quote(s: str) -> str:
    """strconv.Quote."""
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch in "\"\\":
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append("\\" + "abfnrtv"["\a\b\f\n\r\t\v".index(ch)])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code < 0xE000:
            out.append("\\ufffd")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out) + '"'


def _inner_quote(s: str) -> str:
    return go_quote(s)[1:-1]


def _json_valid(text: str) -> bool:
    def reject(_: str) -> None:
        raise ValueError("not JSON")
    try:
        json.loads(text, parse_constant=reject)
    except ValueError:
        return False
    return True


def _tags(text: str) -> list[tuple[str, str]]:
    """fasttemplate Template.Reset (v1.2.2): [(text before, tag)] + a final (rest, "")."""
    parts: list[tuple[str, str]] = []
    rest = text
    while True:
        start = rest.find("{{")
        if start < 0:
            return [*parts, (rest, "")]
        end = rest.find("}}", start + 2)
        if end < 0:
            raise TemplateError(f"Cannot find end tag={go_quote('}}')} in the template="
                                f"{go_quote(text)} starting from {go_quote(rest[start + 2:])}")
        parts.append((rest[:start], rest[start + 2:end]))
        rest = rest[end + 2:]


def _simple(tag: str, scope: Mapping[str, Any], mode: _Mode) -> str:
    """simple_template.go simpleReplaceStrict."""
    key = tag.strip()
    if key not in scope:
        index = tag.rfind("{{")
        if index > 0 and isinstance(scope.get(tag[index + 2:]), str):
            return "{{" + tag[:index] + _inner_quote(scope[tag[index + 2:]])
        strict = mode.strict is not None and mode.strict.search(key) is not None
        if strict and (not mode.artifacts_may_dangle or ".outputs.artifacts." not in key):
            raise TemplateError(f"failed to resolve {{{{{tag}}}}}")
        return "{{" + tag + "}}"
    value = scope[key]
    if not isinstance(value, str):
        raise TemplateError(f"failed to resolve {{{{{tag}}}}} to string")
    return _inner_quote(value)


def _identifiers(tree: _Node) -> list[str]:
    """expression_template.go getIdentifiers: names and a.b.c member paths."""
    found: list[str] = []

    def path(n: _Node) -> str | None:
        if n.kind == "ident":
            return str(n.value)
        key = n.value if n.kind == "member" else (
            n.args[1].value if n.kind == "index" and n.args[1].kind == "lit" else None)
        if not isinstance(key, str):
            return None
        base = path(n.args[0])
        return None if base is None else f"{base}.{key}"

    def add(name: str | None) -> None:
        if name is not None and name not in found:
            found.append(name)

    def walk(n: _Node) -> None:  # ast.Walk: children first (a call's callee first)
        if n.kind == "call" and n.value is not None:
            add(n.value)
        for child in n.args:
            walk(child)
        if n.kind in ("ident", "member", "index"):
            add(path(n))
    walk(tree)
    return found


def _has_var(env: Mapping[str, Any], name: str) -> bool:
    """expression_template.go hasVarInEnv (over the expanded env)."""
    if name in env or name.startswith("sprig."):  # env["sprig"] is sprig's whole func map
        return True
    node: Any = env
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _mentions(expression: str, variable: str) -> bool:
    """expression_template.go hasVariableInExpression: a token-sequence search."""
    if variable not in expression:
        return False
    try:
        hay = [(t.kind, t.value) for t in _Parser(expression).toks]
    except ExprError:
        return False
    needle = [(t.kind, t.value) for t in _Parser(variable).toks if t.kind != "EOF"]
    return any(hay[i:i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))


def _has_placeholder(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_has_placeholder(v) for v in value.values())
    return isinstance(value, str) and value.startswith(_PLACEHOLDER)


def _expression(raw: str, env: Mapping[str, Any], mode: _Mode) -> str:
    """expression_template.go expressionReplaceStrict + expressionReplaceCore."""
    verbatim = "{{=" + raw + "}}"
    try:
        source = json.loads(f'"{raw}"')
        ids = _identifiers(_Parser(source).parse())
        missing = [i for i in ids if not _has_var(env, i)]
        allow = bool(missing) or mode.strict is None
        for name in missing:
            if mode.strict is not None and mode.strict.search(name):
                raise TemplateError(f"failed to evaluate expression: {name} is missing")
    except (ValueError, ExprError):
        allow = False
    may_fail = _has_placeholder(env)
    try:
        source = json.loads(f'"{raw}"')
    except ValueError as exc:
        if allow:
            return verbatim
        raise TemplateError(f"failed to unmarshall JSON expression: {exc}") from None
    if allow and any(_mentions(source, v) and not _has_var(env, v) for v in _CHECKED_VARS):
        return verbatim
    try:
        result = evaluate(source, env)
    except ExprError as exc:
        if allow or may_fail:
            return verbatim
        raise TemplateError(f"failed to evaluate expression: {exc}") from None
    if result is None:
        if allow or may_fail:
            return verbatim
        raise TemplateError(f"failed to evaluate expression {go_quote(raw)}")
    marshaled = go_json(result)
    if len(marshaled) > 1 and marshaled[0] == '"' and marshaled[-1] == '"':
        return marshaled[1:-1]
    return _inner_quote(marshaled)


def replace_json_text(text: str, scope: Mapping[str, Any], *, allow_unresolved: bool,
                      strict_prefixes: Sequence[str] = ()) -> str:
    """Substitute into JSON text; follows util/template/replace.go Replace and ReplaceStrict
    (template.go impl.replace, v4.0.5)."""
    if not _json_valid(text):
        raise TemplateError("cannot do template replacements with invalid JSON")
    mode = _mode(allow_unresolved, strict_prefixes)
    parts = _tags(text)
    env: Mapping[str, Any] | None = None
    out: list[str] = []
    for before, tag in parts[:-1]:
        out.append(before)
        if tag.startswith("="):  # kind.go parseTag + util/json Fix
            raw = tag[1:].replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&")
            env = env if env is not None else argo_env(scope)
            out.append(_expression(raw, env, mode))
        else:
            out.append(_simple(tag, scope, mode))
    out.append(parts[-1][0])
    result = "".join(out)
    if not _json_valid(result):
        raise TemplateError("cannot finish template replacement because the result was invalid "
                            "JSON")
    return result


def substitute_json(obj: Any, scope: Mapping[str, Any], *, allow_unresolved: bool,
                    strict_prefixes: Sequence[str] = ()) -> Any:
    """Marshal ``obj``, substitute, unmarshal - as common.SubstituteParams and steps.go
    resolveReferences do (workflow/common/util.go SubstituteParams, v4.0.5)."""
    text = replace_json_text(go_json(obj), scope, allow_unresolved=allow_unresolved,
                             strict_prefixes=strict_prefixes)
    return json.loads(text)


def substitute(text: str, scope: Mapping[str, Any], *, allow_unresolved: bool,
               strict_prefixes: Sequence[str] = ()) -> str:
    """Substitute into one string field, i.e. :func:`substitute_json` of a JSON string; this
    is exactly how steps.go resolveReferences resolves a ``when`` (v4.0.5)."""
    result = substitute_json(text, scope, allow_unresolved=allow_unresolved,
                             strict_prefixes=strict_prefixes)
    assert isinstance(result, str)
    return result


def unresolved(text: str) -> list[str]:
    """The trimmed tags left in ``text`` (``=...`` for expression tags), first-seen order;
    fasttemplate's tag split (an unclosed ``{{`` raises :class:`TemplateError`)."""
    seen: list[str] = []
    for _, tag in _tags(text)[:-1]:
        key = tag if tag.startswith("=") else tag.strip()
        if key not in seen:
            seen.append(key)
    return seen


def is_missing_variable(err: Exception) -> bool:
    """util/template/replace.go IsMissingVariableErr: the errors on which Argo requeues."""
    msg = str(err)
    return "failed to resolve {{" in msg or " is missing" in msg or "variable not in env" in msg
