"""Run a verification and render its result as text or JSON.

PURE computation: ``verify(config)`` explores and evaluates, ``render_text``/``to_json`` build
strings and plain data. Nothing here prints or writes files; ``verify/cli.py`` does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aegis_flow.master.machine import Event, Status

from .explorer import Config, Exploration, TraceStep, dump_lines, explore
from .properties import (
    INVARIANTS,
    LIVENESS,
    SEQ_INVARIANTS,
    TRANSITION_INVARIANTS,
    Verdict,
    evaluate,
)


@dataclass(frozen=True)
class Report:
    """An exploration and the verdict on every property."""

    exploration: Exploration
    verdicts: list[Verdict]
    evaluate_seconds: float = 0.0  # the liveness checks' wall clock, after the exploration

    @property
    def config(self) -> Config:
        return self.exploration.config

    @property
    def exceeded(self) -> bool:
        return self.exploration.exceeded

    @property
    def violated(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.holds is False]

    @property
    def ok(self) -> bool:
        return not self.exceeded and not self.violated

    def verdict(self, name: str) -> Verdict:
        for v in self.verdicts:
            if v.name == name:
                return v
        raise KeyError(f"no property named {name!r}")

    def exit_code(self) -> int:
        """0: every property holds; 1: a violation; 2: the state limit was hit first."""
        if self.violated:
            return 1
        return 2 if self.exceeded else 0

    def dump(self) -> list[str]:
        return dump_lines(self.exploration)


def verify(config: Config, *, dump: bool = False) -> Report:
    """Explore ``config`` with every property of ``properties.py`` and evaluate them."""
    ex = explore(config, invariants=INVARIANTS, transition_invariants=TRANSITION_INVARIANTS,
                 every_successor=SEQ_INVARIANTS, dump=dump)
    start = time.perf_counter()
    verdicts = evaluate(ex)
    return Report(ex, verdicts, time.perf_counter() - start)


# --------------------------------------------------------------------------- text


def describe_event(event: Event | None) -> str:
    """A short, readable form of an event: ``Finish(w1, seq 3, not ok: hardware)``."""
    if event is None:
        return "(initial)"
    name = type(event).__name__
    parts: list[str] = []
    rank = getattr(event, "rank", None)
    if rank is not None:
        parts.append(f"w{rank}")
    for attr in ("incarnation", "seq"):
        value = getattr(event, attr, None)
        if value is not None:
            parts.append(f"{'inc' if attr == 'incarnation' else 'seq'} {value}")
    code, signature = getattr(event, "code", ""), getattr(event, "signature", "")
    if code or signature:
        parts.append(" ".join(x for x in (code, signature) if x))
    if getattr(event, "waiting", False):
        parts.append("waiting")
    ok = getattr(event, "ok", None)
    if ok is not None:
        fault = getattr(event, "fault", None)
        parts.append("ok" if ok else f"not ok: {fault.value if fault else '?'}")
    reason = getattr(event, "reason", None)
    if reason:
        parts.append(str(reason))
    return f"{name}({', '.join(parts)})"


def _flags(status: Status) -> str:
    marks = []
    for p in status.workers:
        m = "F" if p.finished else ""
        m += "R" if p.restarting else ""
        m += "H" if p.hanging else ""
        marks.append(m or "-")
    return " ".join(marks)


def render_trace(steps: list[TraceStep], *, loop_start: int | None = None) -> str:
    """The counterexample as a table: step, event, phase, retries, recoverCount, seq."""
    header = ("step", "event", "phase", "retries", "recoverCount", "seq", "workers F/R/H")
    rows = [header]
    for st in steps:
        s = st.status
        kind = f" [{st.kind.value}]" if st.kind is not None and st.kind.value != "normal" else ""
        mark = " <- loop" if loop_start is not None and st.index == loop_start else ""
        rows.append((
            str(st.index), describe_event(st.event) + kind, s.phase.value + mark,
            "(" + ":".join(str(r) for r in s.retries) + ")", str(s.recover_count), str(s.seq),
            _flags(s),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_text(report: Report) -> str:
    """The human-readable report: statistics, one line per property, counterexamples."""
    ex, cfg = report.exploration, report.config
    rate = ex.states / ex.seconds if ex.seconds > 0 else 0.0
    bound = f"seq <= {cfg.seq_bound}"
    lines = [
        f"model: workers={cfg.workers} max-retry={cfg.max_retry} flap-limit={cfg.flap_limit} "
        f"message-layer={'on' if cfg.message_layer else 'off'} {bound} "
        f"symmetry={'on' if cfg.symmetry else 'off'} "
        f"exact={'on' if cfg.exact or ex.canonical_states is not None else 'off'}",
        f"distinct states: {ex.states:,}",
        f"transitions:     {ex.transitions:,}",
        f"max depth:       {ex.max_depth}",
        f"cut edges:       {ex.cut_edges:,} (live successors beyond {bound}, not explored)",
        f"time:            {ex.seconds:.2f} s wall, {ex.cpu_seconds:.2f} s CPU "
        f"({rate:,.0f} states/s); liveness checks {report.evaluate_seconds:.2f} s",
    ]
    if report.exceeded:
        lines.append(f"STATE LIMIT: more than {cfg.max_states:,} states; exploration abandoned "
                     "(raise --max-states, lower --seq-bound or use --symmetry)")
    lines.append("")
    width = max(len(v.name) for v in report.verdicts)
    for v in report.verdicts:
        status = {True: "OK", False: "VIOLATED", None: "UNKNOWN"}[v.holds]
        note = f"  ({v.note})" if v.note else ""
        lines.append(f"  {v.name.ljust(width)}  {v.kind.ljust(10)}  {status}{note}")
    for v in report.violated:
        lines += ["", f"Counterexample for {v.name} ({len(v.trace) - 1} steps):",
                  render_trace(v.trace, loop_start=v.loop_start)]
    return "\n".join(lines)


# --------------------------------------------------------------------------- json


def _trace_json(steps: list[TraceStep]) -> list[dict[str, Any]]:
    return [
        {
            "step": st.index,
            "kind": st.kind.value if st.kind is not None else None,
            "event": describe_event(st.event),
            "phase": st.status.phase.value,
            "inner": [p.phase.value for p in st.status.workers],
            "retries": list(st.status.retries),
            "recoverCount": st.status.recover_count,
            "seq": st.status.seq,
        }
        for st in steps
    ]


def to_json(report: Report) -> dict[str, Any]:
    """The report as plain data (what ``--json`` prints)."""
    ex, cfg = report.exploration, report.config
    return {
        "config": {
            "workers": cfg.workers, "max_retry": cfg.max_retry, "flap_limit": cfg.flap_limit,
            "message_layer": cfg.message_layer, "seq_bound": cfg.seq_bound,
            "symmetry": cfg.symmetry, "exact": cfg.exact or ex.canonical_states is not None,
            "max_states": cfg.max_states,
        },
        "states": ex.states,
        "transitions": ex.transitions,
        "max_depth": ex.max_depth,
        "cut_edges": ex.cut_edges,
        "seconds": round(ex.seconds, 3),
        "cpu_seconds": round(ex.cpu_seconds, 3),
        "evaluate_seconds": round(report.evaluate_seconds, 3),
        "states_per_second": round(ex.states / ex.seconds, 1) if ex.seconds > 0 else None,
        "exceeded": ex.exceeded,
        "ok": report.ok,
        "exit_code": report.exit_code(),
        "properties": {
            v.name: {
                "kind": v.kind,
                "holds": v.holds,
                "note": v.note,
                "trace": _trace_json(v.trace) if v.holds is False else None,
                "loop_start": v.loop_start,
            }
            for v in report.verdicts
        },
    }


PROPERTY_NAMES = tuple(
    [n for n, _ in INVARIANTS] + [n for n, _ in TRANSITION_INVARIANTS] + list(LIVENESS))

__all__ = ["PROPERTY_NAMES", "Report", "describe_event", "render_text", "render_trace",
           "to_json", "verify"]
