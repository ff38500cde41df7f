"""Argo's ``when`` evaluator: a govaluate work-alike. PURE (no I/O, no clock, no environment).

Argo substitutes ``{{...}}`` tags first (see :mod:`.tmpl`) and hands the resulting text to
``shouldExecute`` (workflow/controller/steps.go, v4.0.5), which parses it twice with
github.com/Knetic/govaluate (commit 7625b7f8c03d, the version pinned by Argo's go.mod):

1. ``NewEvaluableExpression(when)`` - bare words are VARIABLE tokens here; any error reads
   ``Invalid 'when' expression '<when>': <err>`` (plus a quoting hint for "Invalid token");
2. every VARIABLE token is re-kinded to STRING and the token list is parsed again
   (``Failed to parse 'when' expression ...``), so ``foo == foo`` compares two strings;
3. ``Evaluate(nil)`` (``Failed to evaluate 'when' expresion ...`` - Argo's typo), and the result
   must be a bool (``Expected boolean evaluation for '<when>'. Got <v>``).

Values are float64 numbers, strings, bools, lists (from ``,``), compiled patterns and nil.
Same-precedence operators associate to the left (govaluate plans them right-recursively and
then mirrors them, ``reorderStages``), so ``2 ** 3 ** 2`` is 64. Deviations: regular expressions
use Python's ``re`` (RE2 syntax mostly agrees; compile error texts differ after the
``error parsing regexp:`` prefix), and time-looking string literals are read as UTC, where
govaluate uses the controller's local zone (UTC in the stock image).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["WhenError", "evaluate_when", "go_value"]


class WhenError(Exception):
    """A ``when`` expression Argo rejects; ``str(err)`` is Argo's message."""


class _GovalError(Exception):
    """An error as govaluate words it (before Argo wraps it)."""


# token kinds (TokenKind.go)
(PREFIX, NUMERIC, BOOLEAN, STRING, PATTERN, TIME, VARIABLE, SEPARATOR, ACCESSOR, COMPARATOR,
 LOGICALOP, MODIFIER, CLAUSE, CLAUSE_CLOSE, TERNARY, UNKNOWN) = (
    "PREFIX NUMERIC BOOLEAN STRING PATTERN TIME VARIABLE SEPARATOR ACCESSOR COMPARATOR "
    "LOGICALOP MODIFIER CLAUSE CLAUSE_CLOSE TERNARY UNKNOWN").split()


@dataclass(frozen=True)
class _Token:
    kind: str
    value: Any


_OPERAND = frozenset({NUMERIC, BOOLEAN, VARIABLE, PATTERN, STRING, TIME, ACCESSOR})
_AFTER_VALUE = frozenset({MODIFIER, COMPARATOR, LOGICALOP, CLAUSE_CLOSE, TERNARY, SEPARATOR})
# lexerState.go validLexerStates: kind -> (isEOF, valid next kinds)
_STATES: dict[str, tuple[bool, frozenset[str]]] = {
    UNKNOWN: (False, _OPERAND | {PREFIX, "FUNCTION", CLAUSE}),
    CLAUSE: (False, _OPERAND | {PREFIX, "FUNCTION", CLAUSE, CLAUSE_CLOSE}),
    CLAUSE_CLOSE: (True, _OPERAND - {ACCESSOR} | _AFTER_VALUE | {CLAUSE}),
    NUMERIC: (True, _AFTER_VALUE),
    BOOLEAN: (True, _AFTER_VALUE),
    STRING: (True, _AFTER_VALUE),
    TIME: (True, _AFTER_VALUE - {TERNARY}),
    PATTERN: (True, _AFTER_VALUE - {TERNARY}),
    VARIABLE: (True, _AFTER_VALUE),
    MODIFIER: (False, frozenset({PREFIX, NUMERIC, VARIABLE, "FUNCTION", ACCESSOR, STRING,
                                 BOOLEAN, CLAUSE, CLAUSE_CLOSE})),
    COMPARATOR: (False, _OPERAND | {PREFIX, "FUNCTION", CLAUSE, CLAUSE_CLOSE}),
    LOGICALOP: (False, _OPERAND - {PATTERN} | {PREFIX, "FUNCTION", CLAUSE, CLAUSE_CLOSE}),
    PREFIX: (False, frozenset({NUMERIC, BOOLEAN, VARIABLE, "FUNCTION", ACCESSOR, CLAUSE,
                               CLAUSE_CLOSE})),
    TERNARY: (False, _OPERAND - {PATTERN} | {PREFIX, "FUNCTION", CLAUSE, SEPARATOR}),
    ACCESSOR: (True, _AFTER_VALUE | {CLAUSE}),
    SEPARATOR: (False, _OPERAND - {PATTERN} | {PREFIX, "FUNCTION", CLAUSE}),
}

_PREFIX_SYMS = frozenset({"-", "!", "~"})
_MODIFIER_SYMS = frozenset({"+", "-", "*", "/", "%", "**", "&", "|", "^", ">>", "<<"})
_LOGICAL_SYMS = frozenset({"&&", "||"})
_COMPARATOR_SYMS = frozenset({"==", "!=", ">", ">=", "<", "<=", "=~", "!~", "in"})
_TERNARY_SYMS = frozenset({"?", ":", "??"})

# planner levels, loosest first (stagePlanner.go init): token kind, symbols, type-error format
_LOGICAL_FMT = "Value '%s' cannot be used with the logical operator '%s', it is not a bool"
_MODIFIER_FMT = "Value '%s' cannot be used with the modifier '%s', it is not a number"
_COMPARATOR_FMT = "Value '%s' cannot be used with the comparator '%s', it is not a number"
_TERNARY_FMT = "Value '%s' cannot be used with the ternary operator '%s', it is not a bool"
_PREFIX_FMT = "Value '%s' cannot be used with the prefix '%s'"
_LEVELS: tuple[tuple[str, frozenset[str], str], ...] = (
    (SEPARATOR, frozenset({","}), ""),
    (TERNARY, _TERNARY_SYMS, _TERNARY_FMT),
    (LOGICALOP, frozenset({"||"}), _LOGICAL_FMT),
    (LOGICALOP, frozenset({"&&"}), _LOGICAL_FMT),
    (COMPARATOR, _COMPARATOR_SYMS, _COMPARATOR_FMT),
    (MODIFIER, frozenset({"^", "&", "|"}), _MODIFIER_FMT),
    (MODIFIER, frozenset({">>", "<<"}), _MODIFIER_FMT),
    (MODIFIER, frozenset({"+", "-"}), _MODIFIER_FMT),
    (MODIFIER, frozenset({"*", "/", "%"}), _MODIFIER_FMT),
    (MODIFIER, frozenset({"**"}), _MODIFIER_FMT),
)


def go_value(value: Any) -> str:
    """Format ``value`` as Go's ``fmt`` ``%v`` does for govaluate values (float64 shortest, %g)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, list):
        return "[" + " ".join(go_value(v) for v in value) + "]"
    if isinstance(value, re.Pattern):
        return str(value.pattern)
    return str(value)


def _go_float(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign, digit_tuple, exponent = Decimal(repr(v)).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    point = len(digits) + exponent  # decimal point position relative to the first digit
    neg = "-" if sign else ""
    exp10 = point - 1
    if exp10 < -4 or exp10 >= 6:  # strconv 'g' with shortest precision uses eprec = 6
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{neg}{mant}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if point <= 0:
        return f"{neg}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return neg + digits + "0" * (point - len(digits))
    return f"{neg}{digits[:point]}.{digits[point:]}"


# ---------------------------------------------------------------- lexer (parsing.go readToken)


def _is_digit(c: str) -> bool:
    return unicodedata.category(c) == "Nd"


def _is_numeric(c: str) -> bool:
    return _is_digit(c) or c == "."


def _is_variable_char(c: str) -> bool:
    return c.isalpha() or _is_digit(c) or c in "_."


def _is_symbol_char(c: str) -> bool:  # parsing.go isNotAlphanumeric
    return not (_is_digit(c) or c.isalpha() or c in "()[]'\"")


class _Lexer:
    def __init__(self, text: str) -> None:
        self.src, self.pos = text, 0

    def read_until(self, cond: Any, *, keep_ws: bool, break_ws: bool) -> tuple[str, bool]:
        """parsing.go readUntilFalse (escaping always allowed): (text, terminated)."""
        buf: list[str] = []
        while self.pos < len(self.src):
            c = self.src[self.pos]
            self.pos += 1
            if c == "\\":
                if self.pos >= len(self.src):
                    return "".join(buf), False
                buf.append(self.src[self.pos])
                self.pos += 1
                continue
            if c.isspace():
                if break_ws and buf:
                    return "".join(buf), True
                if not keep_ws:
                    continue
            if cond(c):
                buf.append(c)
            else:
                self.pos -= 1
                return "".join(buf), True
        return "".join(buf), False

    def token(self, state: str) -> _Token | None:
        src = self.src
        while self.pos < len(src):
            c = src[self.pos]
            self.pos += 1
            if c.isspace():
                continue
            if _is_numeric(c):
                if c == "0" and self.pos + 1 < len(src) and src[self.pos] == "x":
                    self.pos += 1
                    text, _ = self.read_until(lambda ch: ch in "0123456789abcdefABCDEF",
                                              keep_ws=False, break_ws=True)
                    if not text or int(text, 16) >= 1 << 64:
                        raise _GovalError(f"Unable to parse hex value '{text}' to uint64\n")
                    return _Token(NUMERIC, float(int(text, 16)))
                self.pos -= 1
                text, _ = self.read_until(_is_numeric, keep_ws=False, break_ws=True)
                return _Token(NUMERIC, _parse_float(text))
            if c == ",":
                return _Token(SEPARATOR, ",")
            if c == "[":
                text, done = self.read_until(lambda ch: ch != "]", keep_ws=True, break_ws=False)
                if not done:
                    raise _GovalError("Unclosed parameter bracket")
                self.pos += 1
                return _Token(VARIABLE, text)
            if c.isalpha():
                self.pos -= 1
                word, _ = self.read_until(_is_variable_char, keep_ws=False, break_ws=True)
                return _word_token(word)
            if c in "'\"":
                text, done = self.read_until(lambda ch: ch not in "'\"", keep_ws=True,
                                             break_ws=False)
                if not done:
                    raise _GovalError("Unclosed string literal")
                self.pos += 1
                when = _parse_time(text)
                return _Token(STRING, text) if when is None else _Token(TIME, when)
            if c == "(":
                return _Token(CLAUSE, 40)  # Go stores the rune; %v prints its code
            if c == ")":
                return _Token(CLAUSE_CLOSE, 41)
            self.pos -= 1
            sym, _ = self.read_until(_is_symbol_char, keep_ws=False, break_ws=True)
            if PREFIX in _STATES[state][1] and sym in _PREFIX_SYMS:
                return _Token(PREFIX, sym)
            for kind, table in ((MODIFIER, _MODIFIER_SYMS), (LOGICALOP, _LOGICAL_SYMS),
                                (COMPARATOR, _COMPARATOR_SYMS), (TERNARY, _TERNARY_SYMS)):
                if sym in table:
                    return _Token(kind, sym)
            raise _GovalError(f"Invalid token: '{sym}'")
        return None


def _parse_float(text: str) -> float:
    ok = bool(re.fullmatch(r"[0-9]*\.?[0-9]*", text)) and text not in ("", ".")
    value = float(text) if ok else math.inf
    if math.isinf(value):
        raise _GovalError(f"Unable to parse numeric value '{text}' to float64\n")
    return value


def _word_token(word: str) -> _Token:
    if word in ("true", "false"):
        return _Token(BOOLEAN, word == "true")
    if word in ("in", "IN"):
        return _Token(COMPARATOR, "in")
    if word.find(".") > 0:
        if word.endswith("."):
            raise _GovalError(f"Hanging accessor on token '{word}'")
        parts = word.split(".")
        for part in parts[1:]:
            if part and part[0].upper() != part[0]:
                raise _GovalError(f"Unable to access unexported field '{part}' in token '{word}'")
        return _Token(ACCESSOR, parts)
    return _Token(VARIABLE, word)


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_MON = "(?P<mon>" + "|".join(_MONTHS) + ")"
_HMS = r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.\d+)?"
_YMD = r"(?P<y>\d{4})-(?P<m>\d\d)-(?P<d>\d\d)"
_TIME_FORMATS = tuple(re.compile(p) for p in (
    rf"{_DAY} {_MON} (?: ?(?P<d>\d\d?)) {_HMS} (?P<y>\d{{4}})",  # ANSIC
    rf"{_DAY} {_MON} (?: ?(?P<d>\d\d?)) {_HMS} [A-Z]{{3,5}} (?P<y>\d{{4}})",  # UnixDate
    rf"{_DAY} {_MON} (?P<d>\d\d) {_HMS} (?P<z>[+-]\d{{4}}) (?P<y>\d{{4}})",  # RubyDate
    r"(?P<h>\d\d?):(?P<mi>\d\d)(?P<ampm>AM|PM)",  # Kitchen
    rf"{_YMD}T{_HMS}(?P<z>Z|[+-]\d\d:\d\d)",  # RFC3339(Nano)
    _YMD,
    rf"{_YMD} (?P<h>\d\d):(?P<mi>\d\d)",
    rf"{_YMD} {_HMS}",
    rf"{_YMD} {_HMS}(?P<z>[+-]\d\d:\d\d)",
    rf"{_YMD}T(?P<h>\d\d)(?P<z>Z|[+-]\d{{4}})",  # ISO8601 variants
    rf"{_YMD}T(?P<h>\d\d):(?P<mi>\d\d)(?P<z>Z|[+-]\d{{4}})",
    rf"{_YMD}T{_HMS}(?P<z>Z|[+-]\d{{4}})",
))


def _parse_time(text: str) -> float | None:
    """parsing.go tryParseTime: the Unix seconds of a time-looking literal, else None."""
    for fmt in _TIME_FORMATS:
        m = fmt.fullmatch(text)
        if m is None:
            continue
        g = m.groupdict()
        year = int(g.get("y") or 0)
        month = _MONTHS.index(g["mon"]) + 1 if g.get("mon") else int(g.get("m") or 1)
        day, hour = int(g.get("d") or 1), int(g.get("h") or 0)
        minute, sec = int(g.get("mi") or 0), int(g.get("s") or 0)
        if g.get("ampm"):
            if not 0 <= hour <= 12:
                continue
            hour = hour % 12 + (12 if g["ampm"] == "PM" else 0)
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        mdays = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
        if not (1 <= month <= 12 and 1 <= day <= mdays[month - 1] and hour < 24
                and minute < 60 and sec < 60):
            continue
        zone = (g.get("z") or "Z").replace(":", "")
        offset = 0 if zone == "Z" else (1 if zone[0] == "+" else -1) * (
            int(zone[1:3]) * 3600 + int(zone[3:5]) * 60)
        return float(_days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60
                     + sec - offset)
    return None


def _days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _tokenize(text: str) -> list[_Token]:
    """parsing.go parseTokens + checkBalance."""
    lexer, state, tokens = _Lexer(text), UNKNOWN, []
    while lexer.pos < len(text):
        tok = lexer.token(state)
        if tok is None:
            break
        state = tok.kind
        tokens.append(tok)
    return tokens


def _check(tokens: list[_Token]) -> list[_Token]:
    """checkBalance, lexerState.go checkExpressionSyntax and parsing.go optimizeTokens."""
    depth = sum(1 if t.kind == CLAUSE else -1 if t.kind == CLAUSE_CLOSE else 0 for t in tokens)
    if depth:
        raise _GovalError("Unbalanced parenthesis")
    state, last = UNKNOWN, _Token(UNKNOWN, None)
    for tok in tokens:
        if tok.kind not in _STATES[state][1]:
            if last.kind == VARIABLE and tok.kind == CLAUSE:
                raise _GovalError(f"Undefined function {last.value}")
            raise _GovalError(f"Cannot transition token types from {state} [{go_value(last.value)}]"
                              f" to {tok.kind} [{go_value(tok.value)}]")
        state, last = tok.kind, tok
    if not _STATES[state][0]:
        raise _GovalError("Unexpected end of expression")
    out = list(tokens)
    for i, tok in enumerate(out[:-1]):
        if tok.kind == COMPARATOR and tok.value in ("=~", "!~") and out[i + 1].kind == STRING:
            out[i + 1] = _Token(PATTERN, _compile(out[i + 1].value, runtime=False))
    return out


def _compile(pattern: str, *, runtime: bool) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        msg = f"error parsing regexp: {err}: `{pattern}`"
        if runtime:
            msg = f"Unable to compile regexp pattern '{pattern}': {msg}"
        raise _GovalError(msg) from None


# ------------------------------------------------------ planner (stagePlanner.go planStages)


@dataclass(frozen=True)
class _Stage:
    symbol: str  # an operator, or LITERAL / NOOP / ACCESS / NEGATE
    left: _Stage | None = None
    right: _Stage | None = None
    fmt: str = ""
    value: Any = None


class _Planner:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens, self.i = tokens, 0

    def next(self) -> _Token | None:
        tok = self.tokens[self.i] if self.i < len(self.tokens) else None
        self.i += 1
        return tok

    def level(self, n: int) -> _Stage | None:
        """planPrecedenceLevel; the right-recursion + reorderStages mirror == left-assoc."""
        if n == len(_LEVELS):
            return self.accessor()
        kind, symbols, fmt = _LEVELS[n]
        left = self.level(n + 1)
        while self.i < len(self.tokens):
            tok = self.tokens[self.i]
            if tok.kind != kind or tok.value not in symbols:
                break
            self.i += 1
            left = _Stage(tok.value, left, self.level(n + 1), fmt)
        return left

    def accessor(self) -> _Stage | None:
        """planFunction (no functions are registered) and planAccessor."""
        if self.i >= len(self.tokens) or self.tokens[self.i].kind != ACCESSOR:
            return self.value()
        parts = self.tokens[self.i].value
        self.i += 1
        args = None
        if self.i < len(self.tokens) and self.tokens[self.i].kind == CLAUSE:
            args = self.level(0)  # a method call: planTokens swallows the rest
        return _Stage("ACCESS", None, args, value=parts)

    def value(self) -> _Stage | None:
        """planValue."""
        tok = self.next()
        if tok is None:
            return None
        if tok.kind == CLAUSE:
            inner = self.level(0)
            self.i += 1  # "we know that it's a CLAUSE_CLOSE"
            return _Stage("NOOP", None, inner)
        if tok.kind == CLAUSE_CLOSE:
            self.i -= 1
            return None
        if tok.kind in (NUMERIC, STRING, PATTERN, BOOLEAN, TIME):
            return _Stage("LITERAL", value=tok.value)
        if tok.kind == VARIABLE:
            return _Stage("VALUE", value=tok.value)
        if tok.kind == PREFIX:
            symbol = "NEGATE" if tok.value == "-" else tok.value
            return _Stage(symbol, None, self.accessor(), _PREFIX_FMT)
        raise _GovalError(
            f"Unable to plan token kind: '{tok.kind}', value: '{go_value(tok.value)}'")


def _plan(tokens: list[_Token]) -> _Stage | None:
    return _Planner(tokens).level(0) if tokens else None


# ------------------------------------------------ evaluation (EvaluableExpression.go, stages)

_HOLD = object()  # shortCircuitHolder


def _is_num(v: Any) -> bool:
    return isinstance(v, float)


def _both(check: Any) -> Any:
    return lambda left, right: check(left) and check(right)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


# stagePlanner.go findTypeChecks: symbol -> (left check, right check, combined check)
_CHECKS: dict[str, tuple[Any, Any, Any]] = {
    **{s: (None, None, lambda a, b: _both(_is_num)(a, b) or _both(_is_str)(a, b))
       for s in (">", "<", ">=", "<=")},
    "=~": (_is_str, lambda v: isinstance(v, str | re.Pattern), None),
    "!~": (_is_str, lambda v: isinstance(v, str | re.Pattern), None),
    "&&": (_is_bool, _is_bool, None), "||": (_is_bool, _is_bool, None),
    "in": (None, lambda v: isinstance(v, list), None),
    **{s: (_is_num, _is_num, None) for s in ("<<", ">>", "|", "&", "^", "-", "*", "/", "%", "**")},
    "+": (None, None, lambda a, b: _both(_is_num)(a, b) or _is_str(a) or _is_str(b)),
    "NEGATE": (None, _is_num, None), "!": (None, _is_bool, None), "~": (None, _is_num, None),
    "?": (_is_bool, None, None),
}
_SYMBOL_NAME = {"NEGATE": "-"}


def _evaluate(stage: _Stage) -> Any:
    """EvaluableExpression.go evaluateStage, with Argo's nil parameters."""
    sym = stage.symbol
    if sym == "LITERAL":
        return stage.value
    if sym == "VALUE":
        raise _GovalError(f"No parameter '{stage.value}' found.")
    left = _evaluate(stage.left) if stage.left is not None else None
    if sym == "&&" and left is False:
        return False
    if sym == "||" and left is True:
        return True
    if sym == "??" and left is not None:
        return left
    right: Any = None
    if (sym == "?" and left is False) or (sym == ":" and left is not None):
        right = _HOLD
    if right is not _HOLD and stage.right is not None:
        right = _evaluate(stage.right)
    lcheck, rcheck, both = _CHECKS.get(sym, (None, None, None))
    name = _SYMBOL_NAME.get(sym, sym)
    if both is not None and not both(left, right):
        raise _GovalError(stage.fmt % (go_value(left), name))
    for check, val in ((lcheck, left), (rcheck, right)):
        if check is not None and not check(val):
            raise _GovalError(stage.fmt % (go_value(val), name))
    return _operate(stage, left, right)


def _operate(stage: _Stage, left: Any, right: Any) -> Any:
    sym = stage.symbol
    if sym == "NOOP":
        return right
    if sym == "ACCESS":
        raise _GovalError(f"No parameter '{stage.value[0]}' found.")
    if sym in ("==", "!="):
        return _deep_equal(left, right) == (sym == "==")
    if sym in ("<", "<=", ">", ">="):
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[sym]
    if sym in ("=~", "!~"):
        pattern = right if isinstance(right, re.Pattern) else _compile(right, runtime=True)
        return (pattern.search(left) is not None) == (sym == "=~")
    if sym in ("&&", "||"):
        return left and right if sym == "&&" else left or right
    if sym == "in":
        return any(_iface_equal(left, item) for item in right)
    if sym == "+":
        return go_value(left) + go_value(right) if _is_str(left) or _is_str(right) else left + right
    if sym in ("-", "*", "/", "%", "**"):
        return _arith(sym, left, right)
    if sym in ("&", "|", "^", "<<", ">>"):
        a, b = _int64(left), _int64(right)
        mask = (1 << 64) - 1
        if sym == "<<":
            return float(((a & mask) << (b & mask)) & mask if (b & mask) < 64 else 0)
        if sym == ">>":
            return float((a & mask) >> (b & mask) if (b & mask) < 64 else 0)
        return float({"&": a & b, "|": a | b, "^": a ^ b}[sym])
    if sym == "NEGATE":
        return -right
    if sym == "!":
        return not right
    if sym == "~":
        return float(~_int64(right))
    if sym == "?":
        return right if left else None
    if sym in (":", "??"):
        return left if left is not None else right
    return left + [right] if isinstance(left, list) else [left, right]  # ","


def _arith(sym: str, a: float, b: float) -> float:
    """IEEE-754 float64 arithmetic as Go does it (no exceptions on /0 or overflow)."""
    try:
        if sym == "-":
            return a - b
        if sym == "*":
            return a * b
        if sym == "/":
            return a / b
        if sym == "%":
            return math.fmod(a, b)
        return math.pow(a, b)
    except ZeroDivisionError:
        if math.isnan(a) or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


def _int64(v: float) -> int:
    if math.isnan(v) or math.isinf(v) or abs(v) >= 2.0**63:
        return -(1 << 63)  # what amd64's float->int64 conversion yields
    return int(v)


def _deep_equal(a: Any, b: Any) -> bool:
    """reflect.DeepEqual over govaluate values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, re.Pattern):
        return bool(a.pattern == b.pattern)
    return bool(a == b)


def _iface_equal(a: Any, b: Any) -> bool:
    """Go's ``==`` on two interface{} values (inStage)."""
    if isinstance(a, list) and isinstance(b, list):
        raise _GovalError("runtime error: comparing uncomparable type []interface {}")
    return type(a) is type(b) and bool(a == b)


def _parse(tokens: list[_Token]) -> _Stage | None:
    return _plan(_check(tokens))


def evaluate_when(when: str) -> bool:
    """Decide a substituted ``when``; follows workflow/controller/steps.go shouldExecute (v4.0.5).

    ``""`` is true. Raises :class:`WhenError` worded as Argo words it (the step or task then
    errors; Argo marks the skipped child node Error with this message).
    """
    if when == "":
        return True
    try:
        tokens = _tokenize(when)
        _parse(tokens)
    except _GovalError as err:
        msg = f"Invalid 'when' expression '{when}': {err}"
        if "Invalid token" in str(err):
            msg += ' (hint: try wrapping the affected expression in quotes ("))'
        raise WhenError(msg) from None
    # bare words (VARIABLE) become STRING: "foo != bar" needs no quotes
    tokens = [_Token(STRING, t.value) if t.kind == VARIABLE else t for t in tokens]
    try:
        stage = _parse(tokens)
    except _GovalError as err:
        raise WhenError(f"Failed to parse 'when' expression '{when}': {err}") from None
    try:
        result = _evaluate(stage) if stage is not None else None
    except _GovalError as err:
        raise WhenError(f"Failed to evaluate 'when' expresion '{when}': {err}") from None
    if not isinstance(result, bool):
        raise WhenError(f"Expected boolean evaluation for '{when}'. Got {go_value(result)}")
    return result
