"""The log classifier: the training process's output lines → a cause code with a class hint.

Side effects: :func:`load_table` reads the packaged default table
(``aegis_flow/data/causes.toml``) and an optional user file; :func:`classify` is pure.
Standard library only (``tomllib``; ``tomli`` on Python 3.10).

Which match wins: the rule with the highest ``priority`` that matches any line; among rules of
equal priority, the last matching line (the most recent message). So an ECC error (100) beats
the generic CUDA error (50) printed after it, and a NCCL timeout (70) beats the "Connection reset
by peer" (55) that the dying process group prints next. Lines longer than 4096 characters are
truncated before matching.

User files have the default table's format. A rule whose ``code`` exists replaces that default
rule (patterns, class, priority); a new code is added; ``replace_defaults = true`` at the top
drops every default rule first.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

CAUSE_CLASSES: tuple[str, ...] = ("transient", "container", "hardware", "user")
UNKNOWN = "unknown"
MAX_LINE = 4096


class CauseTableError(ValueError):
    """A cause table (default or user file) is malformed; the message names the rule and fix."""


@dataclass(frozen=True)
class Rule:
    code: str
    klass: str
    priority: int
    patterns: tuple[str, ...]
    description: str = ""
    ignore_case: bool = True
    # a line matching it is reported the moment it is printed, while the process still runs
    # (the supervisor's live trigger): the process is doomed even if it has not died yet
    live: bool = False

    def compiled(self) -> re.Pattern[str]:
        flags = re.IGNORECASE if self.ignore_case else 0
        return re.compile("|".join(f"(?:{p})" for p in self.patterns), flags)


@dataclass(frozen=True)
class Cause:
    """A classified failure. ``line`` is the matching output line (None for unknown)."""

    code: str
    klass: str
    line: str | None = None
    line_no: int | None = None
    description: str = ""

    @property
    def known(self) -> bool:
        return self.code != UNKNOWN

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "class": self.klass, "line": self.line,
                "line_no": self.line_no, "description": self.description}


UNKNOWN_CAUSE = Cause(UNKNOWN, "transient", description="no rule matched the output")


@dataclass(frozen=True)
class CauseTable:
    rules: tuple[Rule, ...]
    patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "patterns", tuple(r.compiled() for r in self.rules))

    def match_live(self, line: str) -> Rule | None:
        """The rule a line is classified as, when that rule is *live* (the live trigger's
        question): "CUDA error: out of memory" is an oom (not live), not a cuda_error."""
        rule = self.match(line)
        return rule if rule is not None and rule.live else None

    def match(self, line: str) -> Rule | None:
        """The highest-priority rule matching one line."""
        best: Rule | None = None
        text = line[:MAX_LINE]
        for rule, regex in zip(self.rules, self.patterns, strict=True):
            if (best is None or rule.priority > best.priority) and regex.search(text):
                best = rule
        return best

    def by_code(self) -> dict[str, Rule]:
        return {r.code: r for r in self.rules}


def _toml(text: str, source: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as toml
        except ImportError:
            raise CauseTableError(f"{source}: reading TOML on Python 3.10 needs the 'tomli' "
                                  "package (pip install tomli)") from None
    try:
        parsed: dict[str, Any] = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise CauseTableError(f"{source}: not valid TOML: {exc}") from None
    return parsed


def _rule(raw: Mapping[str, Any], source: str, index: int) -> Rule:
    where = f"{source}: rule #{index + 1}"
    code = raw.get("code")
    if not isinstance(code, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", code):
        raise CauseTableError(f"{where}: 'code' must be a lower_snake_case name, got {code!r}")
    klass = raw.get("class")
    if klass not in CAUSE_CLASSES:
        raise CauseTableError(f"{where} ({code}): 'class' must be one of "
                              f"{', '.join(CAUSE_CLASSES)}, got {klass!r}")
    priority = raw.get("priority", 50)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise CauseTableError(f"{where} ({code}): 'priority' must be an integer, got {priority!r}")
    patterns = raw.get("patterns")
    if (not isinstance(patterns, list) or not patterns
            or not all(isinstance(p, str) for p in patterns)):
        raise CauseTableError(f"{where} ({code}): 'patterns' must be a non-empty list of regex "
                              "strings")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise CauseTableError(f"{where} ({code}): bad regex {pattern!r}: {exc}") from None
    live = raw.get("live", False)
    if not isinstance(live, bool):
        raise CauseTableError(f"{where} ({code}): 'live' must be true or false, got {live!r}")
    return Rule(code, str(klass), priority, tuple(patterns), str(raw.get("description", "")),
                bool(raw.get("ignore_case", True)), live)


def parse_table(text: str, source: str = "<cause table>") -> tuple[list[Rule], bool]:
    """Rules of one TOML document, and whether it asks to replace the defaults."""
    doc = _toml(text, source)
    raw_rules = doc.get("rule", [])
    if not isinstance(raw_rules, list):
        raise CauseTableError(f"{source}: rules must be written as [[rule]] tables")
    return [_rule(r, source, i) for i, r in enumerate(raw_rules)], bool(
        doc.get("replace_defaults", False))


def default_rules() -> list[Rule]:
    text = resources.files("aegis_flow").joinpath("data/causes.toml").read_text("utf-8")
    return parse_table(text, "aegis_flow/data/causes.toml")[0]


def merge(defaults: Sequence[Rule], extra: Sequence[Rule], *,
          replace_defaults: bool = False) -> CauseTable:
    """User rules override default rules of the same code; new codes are appended."""
    merged = {} if replace_defaults else {r.code: r for r in defaults}
    for rule in extra:
        merged[rule.code] = rule
    return CauseTable(tuple(merged.values()))


def load_table(user_file: str | Path | None = None) -> CauseTable:
    """The default table, extended/overridden by ``user_file`` when given."""
    if user_file is None:
        return merge(default_rules(), [])
    path = Path(user_file)
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise CauseTableError(
            f"cannot read the cause table {path}: {exc.strerror or exc}") from None
    extra, replace = parse_table(text, str(path))
    return merge([] if replace else default_rules(), extra, replace_defaults=replace)


_DEFAULT: CauseTable | None = None


def default_table() -> CauseTable:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_table()
    return _DEFAULT


def classify(lines: Iterable[str], table: CauseTable | None = None) -> Cause:
    """The cause of a failure from the process's output. Pure over ``table``."""
    rules = default_table() if table is None else table
    best: Rule | None = None
    best_line: tuple[int, str] | None = None
    for no, line in enumerate(lines):
        rule = rules.match(line)
        if rule is not None and (best is None or rule.priority >= best.priority):
            best, best_line = rule, (no, line.rstrip("\r\n")[:MAX_LINE])
    if best is None or best_line is None:
        return UNKNOWN_CAUSE
    return Cause(best.code, best.klass, best_line[1], best_line[0], best.description)


_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+), in (.+)$')


def exception_of(lines: Sequence[str]) -> tuple[str, str] | None:
    """The last Python exception in a process's output: (``"KeyError: 'x'"``, ``"train.py:40
    in main"``) — the exception line and its innermost frame — or None when there is none.
    Pure. A traceback ends at its first unindented line after the frames."""
    found: tuple[str, str] | None = None
    where = ""
    in_tb = False
    for raw in lines:
        line = raw[:MAX_LINE].rstrip()
        if line.startswith("Traceback (most recent call last):"):
            in_tb, where = True, ""
            continue
        if not in_tb:
            continue
        frame = _FRAME.match(line)
        if frame:
            where = f"{Path(frame.group(1)).name}:{frame.group(2)} in {frame.group(3)}"
        elif line and not line[0].isspace():
            if line.startswith(("During handling", "The above exception")):
                continue
            found, in_tb = (line[:200], where), False
    return found

