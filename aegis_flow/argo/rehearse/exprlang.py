"""Argo's expr-lang evaluator (``retryStrategy.expression``, hooks, ``{{=...}}``). PURE.

Argo compiles with ``expr.Compile(input, expr.Env(env))`` (github.com/expr-lang/expr v1.17.7,
util/expr/argoexpr/eval.go EvalBool) and runs the program. Compiling against a *map* env is
strict and typed by the values: an unknown name is a compile error, and since every Argo
variable is a string, ``retries < 3`` is the compile error ``invalid operation: < (mismatched
types string and int)``. Nested maps (``lastRetry``) have untyped fields, so
``lastRetry.exitCode == 1`` compiles and is simply false at run time (``"1"`` is a string);
``asInt(lastRetry.exitCode) == 1`` is what works.

Supported: int/float/string (both quote kinds, Go escapes, backticks)/bool/nil literals, arrays,
``. ?. []`` access, calls, ``not ! - +``, ``** ^ * / % + - .. == != < <= > >= in matches
contains startsWith endsWith`` (and their ``not`` forms), chained comparisons, ``&& and || or``,
``??`` and ``?:``. Builtins: int, float, string, len, lower, upper, trim, abs, type; Argo's env
adds asInt, asFloat, toJson (``jsonpath`` and ``sprig`` raise :class:`ExprError`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .govaluate import go_value

__all__ = ["ExprError", "argo_env", "evaluate", "evaluate_bool", "expand", "retry_scope"]


class ExprError(Exception):
    """A compile or run error, worded as expr words it (``str(err)``)."""


@dataclass(frozen=True)
class _Tok:
    kind: str  # Identifier Number String Operator Bracket EOF
    value: Any
    pos: int

    def __str__(self) -> str:  # lexer/token.go Token.String
        return self.kind if self.value == "" else f"{self.kind}({json.dumps(str(self.value))})"


_WORD_OPS = {"not", "in", "or", "and", "matches", "contains", "startsWith", "endsWith"}
_NEGATABLE = {"contains", "matches", "startsWith", "endsWith", "in"}
_UNARY = {"not": 50, "!": 50, "-": 90, "+": 90}
_BINARY = {"or": 10, "||": 10, "and": 15, "&&": 15, "==": 20, "!=": 20, "<": 20, ">": 20,
           ">=": 20, "<=": 20, "in": 20, "matches": 20, "contains": 20, "startsWith": 20,
           "endsWith": 20, "..": 25, "+": 30, "-": 30, "*": 60, "/": 60, "%": 60, "**": 100,
           "^": 100, "??": 500, "|": 0}
_RIGHT_ASSOC = {"**", "^"}
_TOKEN = re.compile(r"""(?P<ws>\s+)|(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<raw>`[^`]*`)
    |(?P<num>0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+
        |(?:[0-9][0-9_]*(?:\.(?!\.)[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9_]+)?)
    |(?P<word>[\w$]+)|(?P<br>[()\[\]{}])
    |(?P<op>\?\.|\?\?|\?|::|:|\|\||\||&&|&|!=|!|==|=|\*\*|\*|<=|<|>=|>|%|\+|-|\^|,|;|\.\.|\.|/|\#)
    """, re.VERBOSE)
_KINDS = {"str": "String", "raw": "String", "num": "Number", "br": "Bracket", "op": "Operator"}


def _error(msg: str, src: str, pos: int) -> ExprError:
    """file/error.go Error.format: ``msg (line:col)`` plus a caret snippet."""
    start = src.rfind("\n", 0, pos) + 1
    end = src.find("\n", pos)
    line = src[start:end if end >= 0 else len(src)]
    if not line:
        return ExprError(msg)
    where = f"({src.count(chr(10), 0, pos) + 1}:{pos - start + 1})"
    return ExprError(f"{msg} {where}\n | {line.replace(chr(9), ' ')}\n | {'.' * (pos - start)}^")


def _lex(src: str) -> list[_Tok]:
    """parser/lexer/state.go; string escapes are Go's (\\n \\t \\xHH \\uHHHH \\NNN ...)."""
    toks, i = [], 0
    while i < len(src):
        m = _TOKEN.match(src, i)
        if m is None:
            msg = "literal not terminated" if src[i] in "'\"`" else \
                f"unrecognized character: U+{ord(src[i]):04X} '{src[i]}'"
            raise _error(msg, src, i)
        group, text = m.lastgroup or "ws", m.group()
        if group == "str":
            text = text[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        elif group == "raw":
            text = text[1:-1]
        if group == "word":
            toks.append(_Tok("Operator" if text in _WORD_OPS else "Identifier", text, i))
        elif group != "ws":
            toks.append(_Tok(_KINDS[group], text, i))
        i = m.end()
    return [*toks, _Tok("EOF", "", len(src))]


# ------------------------------------------------------------------------- AST and parser


@dataclass(frozen=True)
class _Node:
    kind: str  # lit ident unary binary member index call cond array
    pos: int
    value: Any = None  # literal value / name / operator
    args: tuple[_Node, ...] = ()
    optional: bool = False


class _Parser:  # parser/parser.go
    def __init__(self, src: str) -> None:
        self.src, self.toks, self.i = src, _lex(src), 0

    @property
    def cur(self) -> _Tok:
        return self.toks[self.i]

    def is_(self, kind: str, *values: str) -> bool:
        return self.cur.kind == kind and (not values or self.cur.value in values)

    def fail(self, tok: _Tok | None = None) -> ExprError:
        tok = tok or self.cur
        return _error(f"unexpected token {tok}", self.src, tok.pos)

    def expect(self, kind: str, value: str) -> None:
        if not self.is_(kind, value):
            raise self.fail()
        self.i += 1

    def parse(self) -> _Node:
        node = self.expression(0)
        if not self.is_("EOF"):
            raise self.fail()
        return node

    def expression(self, prec: int) -> _Node:
        left, prev = self.primary(), ""
        while self.is_("Operator"):
            op_tok, negate = self.cur, self.cur.value == "not"
            if negate:
                nxt = self.toks[self.i + 1]
                if nxt.value not in _NEGATABLE:
                    raise self.fail(nxt)
                if _BINARY[nxt.value] < prec:
                    break
                self.i += 1
                op_tok = nxt
            op = op_tok.value
            if op not in _BINARY or _BINARY[op] < prec:
                break
            self.i += 1
            if op == "|":
                raise _error("pipe operator is not supported", self.src, op_tok.pos)
            if prev == "??" and op != "??":
                raise _error(f"Operator ({op}) and coalesce expressions (??) cannot be mixed. "
                             "Wrap either by parentheses.", self.src, op_tok.pos)
            if op in ("<", ">", "<=", ">="):
                left = self.comparison(left, op_tok)
            else:
                right = self.expression(_BINARY[op] + (op not in _RIGHT_ASSOC))
                left = _Node("binary", op_tok.pos, op, (left, right))
            if negate:
                left = _Node("unary", op_tok.pos, "not", (left,))
            prev = op
        if prec == 0:
            while self.is_("Operator", "?"):
                pos = self.cur.pos
                self.i += 1
                if self.is_("Operator", ":"):
                    self.i += 1
                    a, b = left, self.expression(0)
                else:
                    a = self.expression(0)
                    self.expect("Operator", ":")
                    b = self.expression(0)
                left = _Node("cond", pos, None, (left, a, b))
        return left

    def comparison(self, left: _Node, tok: _Tok) -> _Node:
        root: _Node | None = None
        while True:
            right = self.expression(_BINARY[tok.value] + 1)
            cmp = _Node("binary", tok.pos, tok.value, (left, right))
            root = cmp if root is None else _Node("binary", tok.pos, "&&", (root, cmp))
            left, tok = right, self.cur
            if not (tok.kind == "Operator" and tok.value in ("<", ">", "<=", ">=")):
                return root
            self.i += 1

    def primary(self) -> _Node:
        tok = self.cur
        if tok.kind == "Operator" and tok.value in _UNARY:
            self.i += 1
            operand = self.expression(_UNARY[tok.value])
            return self.postfix(_Node("unary", tok.pos, tok.value, (operand,)))
        if self.is_("Bracket", "("):
            self.i += 1
            inner = self.expression(0)
            self.expect("Bracket", ")")
            return self.postfix(inner)
        return self.postfix(self.secondary())

    def secondary(self) -> _Node:
        tok = self.cur
        self.i += 1
        if tok.kind == "Identifier":
            if tok.value in ("true", "false", "nil"):
                return _Node("lit", tok.pos, {"true": True, "false": False}.get(tok.value))
            if self.is_("Bracket", "("):
                return _Node("call", tok.pos, tok.value, self.arguments())
            return _Node("ident", tok.pos, tok.value)
        if tok.kind == "Number":
            return _Node("lit", tok.pos, self.number(tok))
        if tok.kind == "String":
            return _Node("lit", tok.pos, tok.value)
        if tok.kind == "Bracket" and tok.value == "[":
            items: list[_Node] = []
            while not self.is_("Bracket", "]"):
                if items:
                    self.expect("Operator", ",")
                    if self.is_("Bracket", "]"):
                        break
                items.append(self.expression(0))
            self.i += 1
            return _Node("array", tok.pos, None, tuple(items))
        raise self.fail(tok)

    def number(self, tok: _Tok) -> int | float:
        text = tok.value.replace("_", "")
        try:
            if text[:2].lower() in ("0x", "0b", "0o"):
                return int(text, 0)
            if any(ch in text for ch in ".eE"):
                return float(text)
            return int(text, 10)
        except ValueError:
            raise _error(f"invalid number literal: {tok.value}", self.src, tok.pos) from None

    def arguments(self) -> tuple[_Node, ...]:
        self.expect("Bracket", "(")
        args: list[_Node] = []
        while not self.is_("Bracket", ")"):
            if args:
                self.expect("Operator", ",")
            args.append(self.expression(0))
        self.i += 1
        return tuple(args)

    def postfix(self, node: _Node) -> _Node:
        while True:
            tok = self.cur
            if tok.kind == "Operator" and tok.value in (".", "?."):
                self.i += 1
                name = self.cur
                if not str(name.value).isidentifier():
                    raise _error("expected name", self.src, name.pos)
                self.i += 1
                node = _Node("member", name.pos, name.value, (node,), tok.value == "?.")
                if self.is_("Bracket", "("):
                    node = _Node("call", name.pos, None, (node, *self.arguments()))
            elif tok.kind == "Bracket" and tok.value == "[":
                self.i += 1
                index = self.expression(0)
                self.expect("Bracket", "]")
                node = _Node("index", tok.pos, None, (node, index))
            else:
                return node


# -------------------------------------------------------------- checker (checker/checker.go)

INT, FLOAT, STR, BOOL, NIL, UNK = "int", "float64", "string", "bool", "nil", "unknown"
MAP, ARR, FUNC = "map[string]interface {}", "[]interface {}", "func"
_NUMS = (INT, FLOAT)


@dataclass(frozen=True)
class _Func:
    """An env or builtin function: its arity (None: any), result type, and Python body."""

    name: str
    arity: int | None
    result: str
    body: Callable[..., Any]
    builtin: bool = False


_GO_TYPES: tuple[tuple[Any, str], ...] = (
    (bool, BOOL), (int, INT), (float, FLOAT), (str, STR), (Mapping, MAP), ((list, tuple), ARR))


def _go_type(v: Any) -> str:
    """Go's ``%T`` (and reflect type) name of a runtime value."""
    if v is None:
        return "<nil>"
    return next((name for typ, name in _GO_TYPES if isinstance(v, typ)), FUNC)


def _static(v: Any) -> str:
    return NIL if v is None else _go_type(v)


def _maybe(lt: str, rt: str, *ok: str) -> bool:  # nature.go MaybeCompatible
    return (lt == UNK and rt == UNK) or (lt == UNK and rt in ok) or (rt == UNK and lt in ok)


class _Checker:
    def __init__(self, src: str, env: Mapping[str, Any]) -> None:
        self.src, self.env = src, env

    def err(self, node: _Node, msg: str) -> ExprError:
        return _error(msg, self.src, node.pos)

    def visit(self, n: _Node) -> str:
        kind = n.kind
        if kind == "lit":
            return _static(n.value)
        if kind == "ident":
            if n.value not in self.env:
                raise self.err(n, f"unknown name {n.value}")
            return _static(self.env[n.value])
        if kind == "array":
            for item in n.args:
                self.visit(item)
            return ARR
        if kind in ("member", "index"):
            base = self.visit(n.args[0])
            if kind == "index":
                self.visit(n.args[1])
            if base in (UNK, MAP, ARR):
                return UNK
            if base == NIL:
                raise self.err(n, f"type nil has no field {n.value}")
            raise self.err(n, f"type {base} has no field {n.value}")
        if kind == "cond":
            cond, a, b = (self.visit(x) for x in n.args)
            if cond not in (BOOL, UNK):
                raise self.err(n, f"non-bool expression (type {cond}) used as condition")
            return a if a == b else UNK
        if kind == "call":
            return self.call(n)
        if kind == "unary":
            t = self.visit(n.args[0])
            if n.value in ("!", "not") and t in (BOOL, UNK):
                return BOOL
            if n.value in ("-", "+") and t in (*_NUMS, UNK):
                return t
            raise self.err(n, f"invalid operation: {n.value} (mismatched type {t})")
        return self.binary(n)

    def call(self, n: _Node) -> str:
        args = [self.visit(a) for a in (n.args if n.value is not None else n.args[1:])]
        if n.value is None:  # a method call such as sprig.upper(x)
            self.visit(n.args[0])
            return UNK
        fn = self.env.get(n.value)
        if fn is None and n.value in _BUILTINS:
            fn = _BUILTINS[n.value]
        if fn is None:
            raise self.err(n, f"unknown name {n.value}")
        if not isinstance(fn, _Func):
            raise self.err(n, f"{_static(fn)} is not callable")
        if fn.arity is not None and len(args) != fn.arity:
            if fn.builtin:
                raise self.err(n, f"invalid number of arguments (expected {fn.arity}, "
                                  f"got {len(args)})")
            word = "not enough" if len(args) < fn.arity else "too many"
            raise self.err(n, f"{word} arguments to call {fn.name}")
        allowed = {"int": (UNK, *_NUMS, STR), "float": (UNK, *_NUMS, STR),
                   "len": (UNK, ARR, MAP, STR)}.get(fn.name if fn.builtin else "")
        if allowed is not None and args[0] not in allowed:
            raise self.err(n, f"invalid argument for {fn.name} (type {args[0]})")
        return fn.result

    def binary(self, n: _Node) -> str:
        op, lt, rt = n.value, self.visit(n.args[0]), self.visit(n.args[1])
        if op == "in" and rt == MAP and lt not in (UNK, STR):
            raise self.err(n, f"cannot use {lt} as type string in map key")
        pattern = n.args[1]
        if op == "matches" and pattern.kind == "lit" and isinstance(pattern.value, str):
            try:
                re.compile(pattern.value)
            except re.error as exc:
                raise self.err(n, f"error parsing regexp: {exc}") from None
        result = _BINARY_RULES[_ALIAS.get(op, op)](lt, rt)
        if result is None:
            raise self.err(n, f"invalid operation: {op} (mismatched types {lt} and {rt})")
        return result


def _nums(lt: str, rt: str) -> bool:
    return lt in _NUMS and rt in _NUMS


def _promote(lt: str, rt: str) -> str:
    return INT if lt == rt == INT else FLOAT


_ALIAS = {"!=": "==", "or": "&&", "||": "&&", "and": "&&", ">": "<", "<=": "<", ">=": "<",
          "*": "-", "**": "/", "^": "/", "contains": "matches", "startsWith": "matches",
          "endsWith": "matches"}
# checker.go binaryNode: the result type, or None for "mismatched types"
_BINARY_RULES: dict[str, Callable[[str, str], str | None]] = {
    "==": lambda lt, rt: BOOL if UNK in (lt, rt) or NIL in (lt, rt) or _nums(lt, rt)
    or lt == rt else None,
    "&&": lambda lt, rt: BOOL if lt == rt == BOOL or _maybe(lt, rt, BOOL) else None,
    "<": lambda lt, rt: BOOL if _nums(lt, rt) or lt == rt == STR
    or _maybe(lt, rt, *_NUMS, STR) else None,
    "-": lambda lt, rt: _promote(lt, rt) if _nums(lt, rt) else UNK if _maybe(lt, rt, *_NUMS)
    else None,
    "/": lambda lt, rt: FLOAT if _nums(lt, rt) or _maybe(lt, rt, *_NUMS) else None,
    "%": lambda lt, rt: INT if lt == rt == INT or _maybe(lt, rt, INT) else None,
    "+": lambda lt, rt: _promote(lt, rt) if _nums(lt, rt) else STR if lt == rt == STR
    else UNK if _maybe(lt, rt, *_NUMS, STR) else None,
    "in": lambda lt, rt: BOOL if rt in (MAP, ARR, UNK) or (lt == UNK and rt == STR) else None,
    "matches": lambda lt, rt: BOOL if lt == rt == STR or _maybe(lt, rt, STR) else None,
    "..": lambda lt, rt: ARR if lt == rt == INT or _maybe(lt, rt, INT) else None,
    "??": lambda lt, rt: rt if lt == NIL else lt if rt in (NIL, lt) else UNK,
}


# ------------------------------------------------------------------ run time (vm/runtime)


class _RunError(Exception):
    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.pos: int | None = None


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _RunError(f"interface conversion: interface {{}} is {_go_type(v)}, not bool")
    return v


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _equal(a: Any, b: Any) -> bool:  # runtime.Equal
    if _is_num(a) and _is_num(b):
        return bool(a == b)
    if a is None or b is None:
        return a is None and b is None
    if _go_type(a) != _go_type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _arith(op: str, a: Any, b: Any) -> Any:
    if not (_is_num(a) and _is_num(b)):
        if op == "+" and isinstance(a, str) and isinstance(b, str):
            return a + b
        if op in ("<", ">", "<=", ">=") and isinstance(a, str) and isinstance(b, str):
            return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
        raise _RunError(f"invalid operation: {_go_type(a)} {op} {_go_type(b)}")
    if op in ("<", ">", "<=", ">="):
        return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
    if op == "%":
        if not (isinstance(a, int) and isinstance(b, int)):
            raise _RunError(f"invalid operation: {_go_type(a)} % {_go_type(b)}")
        if b == 0:
            raise _RunError("runtime error: integer divide by zero")
        r = abs(a) % abs(b)
        return -r if a < 0 else r
    if op == "/":
        if b == 0:
            return math.nan if a == 0 else math.copysign(math.inf, a)
        return float(a) / float(b)
    if op in ("**", "^"):
        try:
            return math.pow(float(a), float(b))
        except (OverflowError, ValueError):
            return math.inf
    return {"+": a + b, "-": a - b, "*": a * b}[op]


class _Runner:
    def __init__(self, env: Mapping[str, Any]) -> None:
        self.env = env

    def run(self, n: _Node) -> Any:
        try:
            return self.step(n)
        except _RunError as exc:
            if exc.pos is None:
                exc.pos = n.pos
            raise

    def step(self, n: _Node) -> Any:
        kind = n.kind
        if kind == "lit":
            return n.value
        if kind == "ident":
            return self.env[n.value]
        if kind == "array":
            return [self.run(x) for x in n.args]
        if kind == "member":
            base = self.run(n.args[0])
            if base is None and n.optional:
                return None
            if isinstance(base, Mapping):
                return base.get(n.value)
            raise _RunError(f"cannot fetch {n.value} from {_go_type(base)}")
        if kind == "index":
            base, key = self.run(n.args[0]), self.run(n.args[1])
            if isinstance(base, Mapping):
                return base.get(key)
            if isinstance(base, list | str) and isinstance(key, int):
                idx = key + len(base) if key < 0 else key
                if not 0 <= idx < len(base):
                    raise _RunError(f"index out of range: {key} (array length is {len(base)})")
                return base[idx]
            raise _RunError(f"cannot fetch {go_value(key)} from {_go_type(base)}")
        if kind == "cond":
            cond = _bool(self.run(n.args[0]))
            return self.run(n.args[1] if cond else n.args[2])
        if kind == "call":
            if n.value is None:
                raise _RunError("method calls (e.g. sprig.*) are not supported by rehearse")
            fn = self.env.get(n.value) or _BUILTINS[n.value]
            assert isinstance(fn, _Func)
            return fn.body(*(self.run(a) for a in n.args))
        if kind == "unary":
            v = self.run(n.args[0])
            if n.value in ("!", "not"):
                return not _bool(v)
            if not _is_num(v):
                raise _RunError(f"invalid operation: {n.value}{_go_type(v)}")
            return -v if n.value == "-" else v
        return self.binary(n)

    def binary(self, n: _Node) -> Any:
        op = n.value
        left = self.run(n.args[0])
        if op in ("&&", "and"):
            return self.run(n.args[1]) if _bool(left) else False
        if op in ("||", "or"):
            return True if _bool(left) else self.run(n.args[1])
        if op == "??":
            return left if left is not None else self.run(n.args[1])
        right = self.run(n.args[1])
        if op in ("==", "!="):
            return _equal(left, right) == (op == "==")
        if op == "in":
            if isinstance(right, Mapping):
                return left in right
            if isinstance(right, list | tuple):
                return any(_equal(left, item) for item in right)
            raise _RunError(f'operator "in" not defined on {_go_type(right)}')
        if op in ("matches", "contains", "startsWith", "endsWith"):
            if not (isinstance(left, str) and isinstance(right, str)):
                bad = right if isinstance(left, str) else left
                raise _RunError(f"interface conversion: interface {{}} is {_go_type(bad)}, "
                                "not string")
            if op == "matches":
                try:
                    return re.search(right, left) is not None
                except re.error as exc:
                    raise _RunError(f"error parsing regexp: {exc}") from None
            return {"contains": right in left, "startsWith": left.startswith(right),
                    "endsWith": left.endswith(right)}[op]
        if op == "..":
            if not (isinstance(left, int) and isinstance(right, int)):
                raise _RunError(f"invalid operation: {_go_type(left)} .. {_go_type(right)}")
            return list(range(left, right + 1))
        return _arith(op, left, right)


# ------------------------------------------------------- builtins (builtin/lib.go) and env

_ATOI = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
                    re.IGNORECASE)


def _to_int(x: Any) -> int:
    if isinstance(x, str):
        if not _ATOI.fullmatch(x):
            raise _RunError(f"invalid operation: int({x})")
        return int(x)
    if _is_num(x) and not (isinstance(x, float) and not math.isfinite(x)):
        return int(x)
    raise _RunError(f"invalid operation: int({_go_type(x)})")


def _to_float(x: Any) -> float:
    if isinstance(x, str):
        if not _FLOAT.fullmatch(x):
            raise _RunError(f"invalid operation: float({x})")
        return float(x)
    if _is_num(x):
        return float(x)
    raise _RunError(f"invalid operation: float({_go_type(x)})")


def _to_string(x: Any) -> str:  # fmt.Sprintf("%v", x)
    if isinstance(x, Mapping):
        return "map[" + " ".join(f"{k}:{_to_string(x[k])}" for k in sorted(x)) + "]"
    if isinstance(x, list | tuple):
        return "[" + " ".join(_to_string(v) for v in x) + "]"
    return go_value(x)


def _length(x: Any) -> int:
    if isinstance(x, str | list | tuple | Mapping):
        return len(x)
    raise _RunError(f"invalid argument for len (type {_go_type(x)})")


def _json_value(x: Any) -> Any:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e21:
        return int(x)
    if isinstance(x, Mapping):
        return {k: _json_value(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_value(v) for v in x]
    if isinstance(x, _Func):
        raise _RunError(f"json: unsupported type: {_go_type(x)}")
    return x


def go_json(x: Any) -> str:
    """encoding/json Marshal: compact, map keys sorted, ``<>&`` and U+2028/9 escaped."""
    text = json.dumps(_json_value(x), separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _unsupported(name: str) -> Callable[..., Any]:
    def body(*_: Any) -> Any:
        raise _RunError(f"{name} is not supported by rehearse")
    return body


def _builtin(name: str, arity: int | None, result: str, body: Callable[..., Any]) -> _Func:
    return _Func(name, arity, result, body, builtin=True)


_BUILTINS: dict[str, _Func] = {
    "int": _builtin("int", 1, INT, _to_int),
    "float": _builtin("float", 1, FLOAT, _to_float),
    "string": _builtin("string", 1, STR, _to_string),
    "len": _builtin("len", 1, INT, _length),
    "lower": _builtin("lower", 1, STR, lambda s: str(s).lower()),
    "upper": _builtin("upper", 1, STR, lambda s: str(s).upper()),
    "trim": _builtin("trim", 1, STR, lambda s: str(s).strip()),
    "abs": _builtin("abs", 1, UNK, lambda v: abs(v) if _is_num(v) else _to_int(v)),
    "type": _builtin("type", 1, STR, lambda v: "nil" if v is None else _go_type(v).split("[")[0]),
}


def expand(scope: Mapping[str, Any]) -> dict[str, Any]:
    """util/expand/expand.go Expand: drop a key when the next sorted key extends it with a
    dot (removeConflicts - adjacent keys only), then nest dotted keys (bellows.Expand)."""
    keys = sorted(scope)
    kept = [k for i, k in enumerate(keys) if not (i + 1 < len(keys)
                                                  and keys[i + 1].startswith(k + "."))]
    out: dict[str, Any] = {}
    for key in kept:
        node, parts = out, key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        if not isinstance(node.get(parts[-1]), dict):
            node[parts[-1]] = scope[key]
    return out


def argo_env(scope: Mapping[str, str]) -> dict[str, Any]:
    """The expression env Argo builds from a flat scope; follows util/expr/env/env.go
    GetFuncMap (v4.0.5): expanded scope plus asInt, asFloat, toJson, jsonpath and sprig."""
    env = expand(scope)
    env["asInt"] = _Func("asInt", 1, UNK, _to_int)
    env["asFloat"] = _Func("asFloat", 1, UNK, _to_float)
    env["toJson"] = _Func("toJson", 1, STR, go_json)
    env["jsonpath"] = _Func("jsonpath", 2, UNK, _unsupported("jsonpath"))
    env["sprig"] = {}
    return env


def retry_scope(*, attempts: int, exit_code: str | None, phase: str, duration_s: float,
                message: str) -> dict[str, str]:
    """The retry variables; follows workflow/controller/operator.go
    buildRetryStrategyLocalScope (v4.0.5). ``attempts`` counts the child nodes so far;
    every value is a string (``retries`` too) and a missing exit code reads ``"-1"``."""
    return {"retries": str(attempts - 1), "lastRetry.exitCode": exit_code or "-1",
            "lastRetry.status": phase, "lastRetry.duration": go_value(float(duration_s)),
            "lastRetry.message": message}


def _compile(expr: str, env: Mapping[str, Any]) -> _Node:
    tree = _Parser(expr).parse()
    _Checker(expr, env).visit(tree)
    return tree


def _run(expr: str, tree: _Node, env: Mapping[str, Any]) -> Any:
    try:
        return _Runner(env).run(tree)
    except _RunError as exc:
        raise _error(str(exc), expr, exc.pos or 0) from None


def evaluate(expr: str, env: Mapping[str, Any]) -> Any:
    """Compile against ``env`` (strict, typed by its values) and run; follows expr.go Compile
    and Run (expr v1.17.7). Ints stay ``int``; ``/`` and ``**`` give ``float``."""
    return _run(expr, _compile(expr, env), env)


def _go_s(v: Any) -> str:  # fmt %s of an arbitrary value
    if isinstance(v, str):
        return v
    if v is None:
        return "%!s(<nil>)"
    if isinstance(v, list | tuple):
        return "[" + " ".join(_go_s(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "map[" + " ".join(f"{k}:{_go_s(v[k])}" for k in sorted(v)) + "]"
    return f"%!s({_go_type(v)}={go_value(v)})"


def evaluate_bool(expr: str, env: Mapping[str, Any]) -> bool:
    """Follows util/expr/argoexpr/eval.go EvalBool (v4.0.5): a compile error is raised as is,
    a run error as ``unable to evaluate expression '<expr>': <err>``, a non-bool result as
    ``unable to cast expression result '<%s>' to bool``. Argo then errors the node."""
    tree = _compile(expr, env)
    try:
        result = _run(expr, tree, env)
    except ExprError as exc:
        raise ExprError(f"unable to evaluate expression '{expr}': {exc}") from None
    if not isinstance(result, bool):
        raise ExprError(f"unable to cast expression result '{_go_s(result)}' to bool")
    return result
