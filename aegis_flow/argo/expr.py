"""A tiny evaluator for the Argo expressions we generate (``when`` guards, retry
``expression``s), so tests can check which branch each outcome takes without a cluster.

PURE. It accepts only what we emit: string/number literals, ``== != < <= > >=``, ``&& || !``,
parentheses, ``asInt(x)`` and dotted names looked up in ``variables``; anything else raises
``ValueError`` (it is translated to a Python expression and checked node by node before
``eval``, with no builtins).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

_TAG = re.compile(r"\{\{\s*([^=][^}]*?)\s*\}\}")
_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Compare,
            ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Constant, ast.Name,
            ast.Load, ast.Attribute, ast.Call)


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace ``{{name}}`` tags; an unknown name raises KeyError (a test bug, not a skip)."""
    return _TAG.sub(lambda m: values[m.group(1)], text)


class _Obj:
    def __init__(self, attrs: Mapping[str, Any]) -> None:
        self.__dict__.update(attrs)


def evaluate(expression: str, variables: Mapping[str, Mapping[str, Any]] | None = None) -> bool:
    """Evaluate a substituted guard; ``variables`` maps e.g. ``lastRetry`` to its fields."""
    py = expression.replace("&&", " and ").replace("||", " or ")
    py = re.sub(r"!(?!=)", " not ", py)
    tree = ast.parse(py.strip(), mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(f"unsupported syntax {type(node).__name__} in {expression!r}")
        if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id == "asInt"):
            raise ValueError(f"only asInt() may be called, in {expression!r}")
    scope: dict[str, Any] = {k: _Obj(v) for k, v in (variables or {}).items()}
    scope["asInt"] = int
    return bool(eval(compile(tree, "<argo-expr>", "eval"), {"__builtins__": {}}, scope))  # noqa: S307
