"""Do the TLA+ spec and the Python machine reach the same states?

For one ``Config`` both sides enumerate their reachable states, projected onto the variables
they share — phase, shouldQuit, recoverCount, the master's seq, per worker the inner phase,
finished, retries and seq, and the recovery policy's variables: per worker its failures, the
kind of its open cause and whether its last failure had a signature, and the suspect (blame)
and culprit (``explorer.canonical``): the code by ``explore(dump=True)``
over the real ``machine.step``, the spec by TLC's ``-dump``. Equal sets: conformance. On a
difference, ``first_difference`` finds the shallowest differing state and a shortest trace to
it: on the code side by a breadth-first replay of ``step``, on the spec side by asking TLC for
a counterexample to "this state is never reached".

Side effects: ``spec_states`` and ``spec_trace`` run TLC (``tlc.run_tlc``: a temporary directory
and a ``java`` subprocess). The rest is pure computation.
"""

from __future__ import annotations

import re
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from aegis_flow.master import machine
from aegis_flow.master.machine import Event, Status

from .environment import events
from .explorer import Config, Encoder, canonical, dump_lines, explore
from .report import describe_event
from .tlc import (
    POD_FIELDS,
    SPEC_DIR,
    SPEC_NAME,
    TlcFailed,
    TlcResult,
    has_symmetry,
    project,
    read_constants,
    render_cfg,
    run_tlc,
)
from .tlc import dump_lines as tlc_dump_lines

#: What TLC checks while it enumerates the states for a comparison.
CONFORMANCE_INVARIANTS = ("ValidPhase", "ValidInnerPhase", "RecoverCountBound", "RetriesBound",
                          "PhaseConsistency", "WorkerSeqNumBound", "BlameConsistency",
                          "SymptomChargesNobody")


@dataclass(frozen=True)
class TraceRow:
    """One step of a trace: the event that led here (None at the start) and the state's line."""

    event: str
    line: str


@dataclass(frozen=True)
class Difference:
    """The first differing state: which side has it, and a shortest trace to it there."""

    side: str  # "spec" or "code": the side that reaches ``line``
    line: str
    trace: list[TraceRow]


@dataclass
class Comparison:
    """The two projected state sets and, when they differ, the first difference."""

    config: Config
    spec_lines: list[str]
    code_lines: list[str]
    spec_result: TlcResult | None = None
    differences: list[Difference] = field(default_factory=list)

    @property
    def only_in_spec(self) -> list[str]:
        return sorted(set(self.spec_lines) - set(self.code_lines))

    @property
    def only_in_code(self) -> list[str]:
        return sorted(set(self.code_lines) - set(self.spec_lines))

    @property
    def equal(self) -> bool:
        return set(self.spec_lines) == set(self.code_lines)


# --------------------------------------------------------------------------- the two sides


def code_states(config: Config) -> list[str]:
    """The sorted canonical lines of every state the Python checker reaches."""
    if config.symmetry:
        raise ValueError("a comparison needs every concrete state: turn symmetry off")
    return dump_lines(explore(config, dump=True))


def config_from_cfg(cfg_text: str) -> Config:
    """The Python checker's ``Config`` for the constants of a TLC configuration of the spec."""
    consts = read_constants(cfg_text)
    try:
        workers = consts["Workers"].strip("{} ").split(",")
        return Config(workers=len([w for w in workers if w.strip()]),
                      max_retry=int(consts["MaxRetry"]), flap_limit=int(consts["FlapLimit"]),
                      message_layer=consts["MessageLayer"] == "TRUE",
                      seq_bound=int(consts["SeqBound"]), symmetry=False,
                      l2_after=int(consts["L2After"]), l3_after=int(consts["L3After"]),
                      give_up_on_repeat=consts["GiveUpOnRepeat"] == "TRUE",
                      resume=consts.get("Resumes", "TRUE") == "TRUE")
    except (KeyError, ValueError) as exc:
        raise ValueError(f"not a configuration of {SPEC_NAME}: {exc}") from exc


def spec_cfg(config: Config, *, liveness: bool = False) -> str:
    """The TLC configuration of ``spec/AegisFlow.tla`` with the constants of ``config``.

    ``liveness`` checks under ``FairSpec`` and adds NoDeadlock and Termination (slower). The
    policy's settings go along, but ``collective_after``: it only shapes an order's plan, which
    the spec does not model."""
    invariants = CONFORMANCE_INVARIANTS + (("NoDeadlock",) if liveness else ())
    return render_cfg(workers=config.workers, max_retry=config.max_retry,
                      flap_limit=config.flap_limit, message_layer=config.message_layer,
                      seq_bound=config.seq_bound, invariants=invariants,
                      properties=("MasterSeqNumMonotonic", "Termination") if liveness else (),
                      specification="FairSpec" if liveness else "Spec",
                      l2_after=config.l2_after, l3_after=config.l3_after,
                      give_up_on_repeat=config.give_up_on_repeat, resumes=config.resume)


def spec_states(config: Config, *, cfg_text: str | None = None, liveness: bool = False,
                spec: Path | None = None, tlc_workers: int = 1,
                timeout: float = 600.0) -> tuple[list[str], TlcResult]:
    """The sorted canonical lines of every state of the spec (TLC ``-dump``), and TLC's report.

    ``cfg_text`` (a configuration without SYMMETRY, e.g. spec/P1.cfg) replaces the one made
    from ``config``. Raises ``TlcFailed`` unless TLC finished without error (the lines would
    be partial)."""
    spec = spec if spec is not None else SPEC_DIR / f"{SPEC_NAME}.tla"
    cfg = cfg_text if cfg_text is not None else spec_cfg(config, liveness=liveness)
    if has_symmetry(cfg):
        raise ValueError("a comparison needs every concrete state: this configuration "
                         "declares SYMMETRY")
    with tempfile.TemporaryDirectory(prefix="aegis-conformance-") as tmp:
        dump = Path(tmp) / "states.dump"
        result = run_tlc(spec, cfg, workers=tlc_workers, dump=dump, timeout=timeout)
        if not result.ok or not dump.is_file():
            raise TlcFailed(f"TLC did not check the spec cleanly (exit {result.exit_code}: "
                            f"{result.error or 'no dump'}):\n{result.output[-3000:]}")
        lines = tlc_dump_lines(dump.read_text(encoding="utf-8"))
    return lines, result


# --------------------------------------------------------------------------- traces


def code_trace(config: Config, targets: set[str]) -> Difference | None:
    """A shortest trace of ``machine.step`` to a state whose line is in ``targets``.

    Breadth-first over concrete statuses (keyed as the explorer keys them), with the
    explorer's seq bound; None if no such state is reachable."""
    enc = Encoder(symmetry=False)
    start = config.initial()
    if canonical(start) in targets:
        return Difference("code", canonical(start), [TraceRow("(initial)", canonical(start))])
    parent: dict[int, tuple[int, Event] | None] = {enc.encode(start): None}
    queue: deque[tuple[Status, int]] = deque([(start, enc.encode(start))])
    lines: dict[int, str] = {enc.encode(start): canonical(start)}
    while queue:
        status, key = queue.popleft()
        if status.phase.terminal:
            continue
        for _, event in events(status, message_layer=config.message_layer, resume=config.resume):
            new, _ = machine.step(status, event)
            if new is status or (not new.phase.terminal and new.seq > config.seq_bound):
                continue
            nkey = enc.encode(new)
            if nkey in parent:
                continue
            parent[nkey] = (key, event)
            line = lines[nkey] = canonical(new)
            if line in targets:
                return Difference("code", line, _rows(parent, lines, nkey))
            queue.append((new, nkey))
    return None


def _rows(parent: dict[int, tuple[int, Event] | None], lines: dict[int, str],
          key: int) -> list[TraceRow]:
    rows: list[TraceRow] = []
    cur: int | None = key
    while cur is not None:
        link = parent[cur]
        rows.append(TraceRow("(initial)" if link is None else describe_event(link[1]),
                             lines[cur]))
        cur = None if link is None else link[0]
    return rows[::-1]


_FIELD = re.compile(r"(\w+)=(<<[^>]*>>|\S+)")


def _tla_atom(text: str) -> str:
    if text in ("TRUE", "FALSE") or text.lstrip("-").isdigit():
        return text
    return f'"{text}"'


def line_to_tla(line: str) -> str:
    """A canonical line as a TLA+ tuple, comparable with ``Line(st)`` of the probe module."""
    parts = []
    for _name, value in _FIELD.findall(line):
        if value.startswith("<<"):
            items = [v for v in value[2:-2].split(",") if v]
            parts.append("<<" + ", ".join(_tla_atom(v) for v in items) + ">>")
        else:
            parts.append(_tla_atom(value))
    return "<<" + ", ".join(parts) + ">>"


def _probe_module(workers: int, targets: list[str]) -> str:
    names = [f"w{i + 1}" for i in range(workers)]
    order = ", ".join(names)
    n = len(names)
    cols = ", ".join(f"[i \\in 1..{n} |-> s.w[Order[i]].{f}]" for _, f, _ in POD_FIELDS)
    target_set = ",\n    ".join(line_to_tla(t) for t in targets)
    return (f"---- MODULE {SPEC_NAME}Probe ----\nEXTENDS {SPEC_NAME}\n"
            f"CONSTANTS {order}\nOrder == <<{order}>>\n"
            f"RankOf(x) == IF x = \"none\" THEN -1 ELSE CHOOSE i \\in 0..{n - 1} : "
            f"Order[i + 1] = x\n"
            f"Line(s) == <<s.phase, s.shouldQuit, s.recoverCount, s.seq, {cols}, "
            f"RankOf(s.blame), RankOf(s.culprit)>>\n"
            f"Targets == {{\n    {target_set}}}\n"
            f"NotReached == Line(st) \\notin Targets\n====\n")


def spec_trace(config: Config, targets: list[str], *, spec: Path | None = None,
               timeout: float = 600.0, limit: int = 200) -> Difference | None:
    """A shortest spec trace (TLC's breadth-first counterexample to "never reached") to one
    of the first ``limit`` of ``targets``; None if TLC reaches none of them."""
    spec = spec if spec is not None else SPEC_DIR / f"{SPEC_NAME}.tla"
    chosen = sorted(targets)[:limit]
    with tempfile.TemporaryDirectory(prefix="aegis-probe-") as tmp:
        probe = Path(tmp) / f"{SPEC_NAME}Probe.tla"
        probe.write_text(_probe_module(config.workers, chosen), encoding="utf-8")
        names = [f"w{i + 1}" for i in range(config.workers)]
        cfg = render_cfg(workers=config.workers, max_retry=config.max_retry,
                         flap_limit=config.flap_limit, message_layer=config.message_layer,
                         seq_bound=config.seq_bound, invariants=("NotReached",),
                         extra_constants=[f"{w} = {w}" for w in names],
                         l2_after=config.l2_after, l3_after=config.l3_after,
                         give_up_on_repeat=config.give_up_on_repeat, resumes=config.resume)
        result = run_tlc(probe, cfg, timeout=timeout, extra_modules=[spec])
    if result.violated_invariant != "NotReached" or not result.trace:
        return None
    rows = [TraceRow("(initial)" if i == 0 else "(spec step)", project(s))
            for i, s in enumerate(result.trace)]
    return Difference("spec", rows[-1].line, rows)


# --------------------------------------------------------------------------- comparing


def compare(config: Config, *, cfg_text: str | None = None, liveness: bool = False,
            spec: Path | None = None, tlc_workers: int = 1,
            timeout: float = 600.0) -> Comparison:
    """Enumerate both sides for ``config``; on a difference find the first one on each side.

    ``cfg_text``/``liveness``: as for ``spec_states``."""
    spec_lines, result = spec_states(config, cfg_text=cfg_text, liveness=liveness, spec=spec,
                                     tlc_workers=tlc_workers, timeout=timeout)
    cmp = Comparison(config, spec_lines, code_states(config), result)
    if not cmp.equal:
        only_code, only_spec = cmp.only_in_code, cmp.only_in_spec
        if only_code:
            hit = code_trace(config, set(only_code))
            if hit is not None:
                cmp.differences.append(hit)
        if only_spec:
            found = spec_trace(config, only_spec, spec=spec, timeout=timeout)
            if found is not None:
                cmp.differences.append(found)
        cmp.differences.sort(key=lambda d: len(d.trace))
    return cmp


def render_comparison(cmp: Comparison) -> str:
    """A report: the counts, and for a difference the first differing state and its trace."""
    cfg = cmp.config
    head = (f"workers={cfg.workers} max-retry={cfg.max_retry} flap-limit={cfg.flap_limit} "
            f"message-layer={'on' if cfg.message_layer else 'off'} seq <= {cfg.seq_bound}: "
            f"spec {len(cmp.spec_lines):,} projected states, code {len(cmp.code_lines):,}")
    if cmp.equal:
        return head + "; the sets are equal"
    lines = [head, f"DIFFERENT: {len(cmp.only_in_spec):,} only in the spec, "
                   f"{len(cmp.only_in_code):,} only in the code"]
    for d in cmp.differences:
        other = "code" if d.side == "spec" else "spec"
        lines += ["", f"first differing state (reached by the {d.side}, not by the {other}; "
                      f"{len(d.trace) - 1} steps):", f"  {d.line}",
                  f"shortest trace in the {d.side}:"]
        width = max(len(r.event) for r in d.trace)
        lines += [f"  {i:>3}  {r.event.ljust(width)}  {r.line}" for i, r in enumerate(d.trace)]
    if not cmp.differences:
        sample = (cmp.only_in_code or cmp.only_in_spec)[0]
        lines.append(f"first differing line: {sample}")
    return "\n".join(lines)


__all__ = ["CONFORMANCE_INVARIANTS", "Comparison", "Difference", "TraceRow", "code_states",
           "code_trace", "compare", "config_from_cfg", "line_to_tla", "render_comparison",
           "spec_cfg", "spec_states", "spec_trace"]
