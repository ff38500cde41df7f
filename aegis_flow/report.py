"""The timeline picture: each worker's phases over time, faults and recoveries marked.

The only module that imports matplotlib (the ``report`` extra), with the Agg backend: no
display needed. :func:`timeline` turns fault log records into bars and marks (pure);
:func:`draw_timeline` draws them (side effect: writes the picture file).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402 - after choosing the backend
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from aegis_flow.master.faultlog import parse_timestamp  # noqa: E402

COLORS = {
    "Pending": "#c7c7c7", "BootChecking": "#9ecae1", "RunCommand": "#74c476",
    "Troubleshooting": "#fd8d3c", "Restarting": "#fdd0a2", "Succeed": "#31a354",
    "Failed": "#de2d26", "Independent": "#756bb1",
}
JOB_ROW = "job"


@dataclass(frozen=True)
class Bar:
    row: str
    start: float
    end: float
    phase: str


@dataclass(frozen=True)
class Mark:
    row: str
    at: float
    kind: str  # fault | quarantine | replaced | recovered | evidence
    text: str


@dataclass(frozen=True)
class Timeline:
    rows: tuple[str, ...]
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    end: float
    summary: str = ""
    origin: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)


def _row(rec: Mapping[str, Any]) -> str:
    rank = rec.get("rank")
    return JOB_ROW if rank is None else f"rank {rank}"


#: fault-log causes that are evidence, not faults: drawn as a diamond, never a recovery's start
EVIDENCE_CAUSES = ("anomaly_", "hang_mark", "slow")


def timeline(records: Iterable[Mapping[str, Any]]) -> Timeline:
    """Bars from phase starts (each lasts until the row's next start), marks from reports."""
    recs = [(parse_timestamp(r["TimeStamp"]), r) for r in records]
    if not recs:
        raise ValueError("no fault log records to draw")
    origin = min(t for t, _ in recs)
    end = max(t for t, _ in recs) - origin
    open_bars: dict[str, tuple[float, str]] = {}
    bars: list[Bar] = []
    marks: list[Mark] = []
    rows: list[str] = []
    summary = ""
    for t, r in recs:
        at, row, kind = t - origin, _row(r), r.get("kind")
        if row not in rows:
            rows.append(row)
        if kind == "phase_start":
            if row in open_bars:
                start, phase = open_bars[row]
                bars.append(Bar(row, start, at, phase))
            open_bars[row] = (at, str(r["Phase"]))
        elif kind == "report" and str(r.get("cause", "")).startswith(EVIDENCE_CAUSES):
            # early evidence (an anomaly rule; where a rank was when the job was marked hung;
            # a slow mark, whose eviction is drawn as the replacement it is):
            # drawn, but not a fault a recovery answers
            marks.append(Mark(row, at, "evidence", str(r["cause"])))
        elif kind == "report" and r.get("cause"):
            marks.append(Mark(row, at, "fault", f"{r['cause']}"))
        elif kind == "quarantine":
            marks.append(Mark(row, at, "quarantine", str(r.get("NodeName") or "node")))
        elif kind == "connected" and r.get("cause"):
            marks.append(Mark(row, at, "replaced", "new incarnation"))
        elif kind == "recovered":
            marks.append(Mark(JOB_ROW, at, "recovered", str(r.get("level") or "")))
        elif kind == "summary":
            summary = str(r["Message"])
    for row, (start, phase) in open_bars.items():
        bars.append(Bar(row, start, max(end, start), phase))
    ordered = [JOB_ROW] if JOB_ROW in rows else []
    ordered += sorted((x for x in rows if x != JOB_ROW), key=lambda x: int(x.split()[-1]))
    return Timeline(tuple(ordered), tuple(bars), tuple(marks), end, summary, origin)


def recovery_window(tl: Timeline) -> tuple[float, float] | None:
    """The first recovery's span, padded: from just before the first fault to just after the
    first recovery that follows it (pure). None when the job had no recovery."""
    faults = sorted(mk.at for mk in tl.marks if mk.kind in ("fault", "replaced", "quarantine"))
    if not faults:
        return None
    healed = sorted(mk.at for mk in tl.marks if mk.kind == "recovered" and mk.at >= faults[0])
    if not healed:
        return None
    span = max(healed[0] - faults[0], 0.05)
    return max(0.0, faults[0] - 0.25 * span), min(tl.end, healed[0] + 0.5 * span)


_STYLES = {"fault": ("X", "#b30000", 90), "quarantine": ("s", "black", 70),
           "replaced": ("^", "#e6550d", 70), "evidence": ("d", "#6a51a3", 50)}


def _draw(ax: Any, tl: Timeline, lo: float, hi: float) -> None:
    """Bars and marks of ``tl`` between ``lo`` and ``hi`` seconds on ``ax``."""
    y = {row: i for i, row in enumerate(reversed(tl.rows))}
    width = max(hi - lo, 1e-3)
    for b in tl.bars:
        if b.end < lo or b.start > hi:
            continue
        ax.barh(y[b.row], max(b.end - b.start, width / 400), left=b.start, height=0.6,
                color=COLORS.get(b.phase, "#999999"), edgecolor="white", linewidth=0.5)
    for mk in tl.marks:
        if not lo <= mk.at <= hi:
            continue
        if mk.kind == "recovered":
            ax.axvline(mk.at, color="#006d2c", linestyle="--", linewidth=1.2)
            ax.annotate(f" recovered {mk.text}".rstrip(), (mk.at, -0.65), fontsize=7,
                        color="#006d2c", ha="left", va="bottom", annotation_clip=False)
            continue
        marker, color, size = _STYLES[mk.kind]
        ax.scatter([mk.at], [y[mk.row]], marker=marker, color=color, s=size, zorder=3)
        ax.annotate(mk.text, (mk.at, y[mk.row] + 0.32), fontsize=7, color=color, ha="center")
    ax.set_yticks(range(len(tl.rows)), list(reversed(tl.rows)))
    ax.set_ylim(-0.7, len(tl.rows) - 0.2)
    ax.set_xlim(lo, lo + width * 1.02)
    ax.grid(axis="x", alpha=0.3)


def draw_timeline(records: Iterable[Mapping[str, Any]], output: str | Path, *,
                  title: str = "aegis-flow job") -> Path:
    """Write the picture (PNG, or what the suffix says) and return its path. A job that
    recovered gets a second panel that zooms into the first recovery, which is a sliver of
    the whole job (a second out of minutes) in the first panel."""
    tl = timeline(records)
    zoom = recovery_window(tl)
    rows_height = 0.45 * len(tl.rows)
    height = 1.6 + rows_height + (1.2 + rows_height if zoom else 0.0)
    fig = Figure(figsize=(11, height), dpi=110, layout="constrained")
    if zoom:
        ax, zax = fig.subplots(2, 1)
    else:
        ax, zax = fig.add_subplot(1, 1, 1), None
    _draw(ax, tl, 0.0, max(tl.end, 1e-3))
    ax.set_xlabel("seconds since the job started")
    ax.set_title(title + (f"\n{tl.summary}" if tl.summary else ""), fontsize=10)
    if zoom and zax is not None:
        lo, hi = zoom
        ax.axvspan(lo, hi, color="#006d2c", alpha=0.08, linewidth=0)
        _draw(zax, tl, lo, hi)
        faults = [mk.at for mk in tl.marks if mk.kind != "recovered" and mk.at >= lo]
        healed = [mk.at for mk in tl.marks if mk.kind == "recovered" and mk.at >= lo]
        took = min(healed) - min(faults)
        zax.set_title(f"zoom on the first recovery: {took:.2f} s from the fault until the job "
                      "runs again", fontsize=9)
        zax.set_xlabel("seconds since the job started")
    seen = [ph for ph in COLORS if any(b.phase == ph for b in tl.bars)]
    handles: list[Any] = [Patch(color=COLORS[ph], label=ph) for ph in seen]
    kinds = {mk.kind for mk in tl.marks}
    for kind, label in (("fault", "fault"), ("quarantine", "node quarantined"),
                        ("replaced", "worker replaced")):
        if kind in kinds:
            marker, color, _ = _STYLES[kind]
            handles.append(Line2D([], [], marker=marker, color=color, linestyle="",
                                  label=label))
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7,
              frameon=False)
    out = Path(output)
    fig.savefig(out)
    return out
