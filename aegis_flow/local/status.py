"""Render a stored status document as a readable table, and read what a run left (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aegis_flow.master.model import Phase, PodInfo
from aegis_flow.master.runtime import summary
from aegis_flow.master.store import decode_doc
from aegis_flow.phases import step_of


def resource_lines(live: dict[str, Any] | None) -> list[str]:
    """What each rank's last heartbeat measured (the master's ``/progress``), one line per
    rank; [] when nothing was measured (pure)."""
    rows = []
    for w in (live or {}).get("workers") or []:
        if not isinstance(w, dict):
            continue
        parts = []
        if isinstance(w.get("cpu"), int | float):
            parts.append(f"cpu {w['cpu']:.0f}%")
        if isinstance(w.get("rss"), int | float):
            parts.append(f"rss {w['rss'] / 2**20:.0f} MiB")
        if isinstance(w.get("gpu_util"), int | float):
            parts.append(f"gpu {w['gpu_util']:.0f}%")
        if isinstance(w.get("net"), int | float):
            parts.append(f"net {w['net'] / 1e6:.1f} MB/s")
        if isinstance(w.get("step_rate"), int | float):
            parts.append(f"{w['step_rate']:.1f} steps/s")
        if w.get("frame"):
            parts.append(f"marked hung, in {w['frame']}")
        if parts:
            rows.append(f"{w.get('rank', '?'):>4}  " + " · ".join(parts))
    return ["", "now (each rank's last heartbeat):", *rows] if rows else []


def render(raw: bytes, live: dict[str, Any] | None = None) -> str:
    """The status table; for a damaged document, what can still be read of it and why.
    ``live``: the master's ``/progress`` snapshot of a running local job (resources)."""
    try:
        status, doc = decode_doc(raw)
    except ValueError as exc:
        return render_damaged(raw, str(exc))
    lines = [
        f"phase        {status.phase.value} (step {step_of(status.phase)} of the phase graph, "
        "as on Argo)",
        f"seq          {status.seq}",
        f"recoverCount {status.recover_count} (max-retry {status.max_retry})",
        f"errorNodes   {', '.join(sorted(status.error_nodes)) or '-'}",
        "",
        f"{'rank':>4}  {'inner phase':<16} {'retries':>7}  {'state':<12} "
        f"{'node':<18} last reason",
    ]
    for pod in status.workers:
        lines.append(
            f"{pod.rank:>4}  {pod.phase.value:<16} {pod.retries:>7}  {rank_state(pod):<12} "
            f"{pod.node or '-':<18} {pod.last_reason or '-'}")
    lines += resource_lines(live)
    if status.recover_count:
        lines.append("(retries: the failures each rank is charged with; a recovery brings every "
                     "rank to recoverCount, so a healthy rank shows it too: docs/recovery.md)")
    events = doc.get("events") or []
    if events:
        lines += ["", "last events:"] + [f"  {e}" for e in events[-10:]]
    if status.failure:
        lines += ["", f"why it failed: {status.failure}"]
    tail = failure_tail(raw)
    if tail:
        lines += tail[:1] + [f"  {t}" for t in tail[1:]]
    stopped = stopped_line(doc, status.phase)
    if stopped:
        lines += ["", stopped]
    lines += ["", summary_of(raw)]
    return "\n".join(lines)


def rank_state(pod: PodInfo) -> str:
    """A rank's flags in words: done with the current phase, being replaced, or at work (slow:
    marked slow, evicted at the next checkpoint)."""
    if pod.restarting:
        return "restarting"
    if pod.finished:
        return "done"
    return "working, slow" if pod.slow else "working"


def stopped_line(doc: dict[str, Any], phase: Phase) -> str:
    """"stopped by …" for a run that ``aegis-flow run`` ended itself (a signal), "" otherwise."""
    by = doc.get("stopped_by")
    if not by:
        return ""
    if phase.terminal:
        return f"stopped by   {by} (after the job had ended)"
    return (f"stopped by   {by} in {phase.value}: the job did not end "
            "(aegis-flow run --resume continues it, --fresh starts over)")


def failure_tail(raw: bytes) -> list[str]:
    """For a failed job: "last output of rank R:" and the last lines the rank that failed it
    printed (from the master's stored document); [] otherwise."""
    try:
        status, doc = decode_doc(raw)
    except ValueError:
        return []
    if status.phase is not Phase.FAILED or not status.failure:
        return []
    culprit = next((r for r in range(len(status.workers))
                    if status.failure.startswith(f"rank {r} ")), None)
    tail = (doc.get("tails") or {}).get(str(culprit)) if culprit is not None else None
    return [f"last output of rank {culprit}:", *map(str, tail)] if tail else []


def render_damaged(raw: bytes, why: str) -> str:
    """What can be shown of a document ``decode_doc`` refused (pure)."""
    import json

    lines = [f"the stored status is damaged: {why}",
             "the master will not resume from it; start the job afresh: aegis-flow run --fresh "
             "archives it (or use a new --job name or state dir)"]
    try:
        doc = json.loads(raw)
    except ValueError:
        return "\n".join([*lines, f"first bytes: {raw[:200]!r}"])
    status = doc.get("status") if isinstance(doc, dict) else None
    if isinstance(status, dict):
        for key in ("phase", "seq", "recover_count", "max_retry", "failure"):
            if key in status:
                lines.append(f"{key:<13}{status[key]}")
    events = doc.get("events") if isinstance(doc, dict) else None
    if isinstance(events, list) and events:
        lines += ["", "last events:"] + [f"  {e}" for e in events[-10:]]
    return "\n".join(lines)


def summary_of(raw: bytes) -> str:
    """The user's summary line of a stored status document (and who stopped it, if someone
    did)."""
    try:
        status, doc = decode_doc(raw)
    except ValueError as exc:
        return f"the stored status is damaged: {exc}"
    by = doc.get("stopped_by")
    return summary(status) + (f"; stopped by {by}" if by else "")


def with_stop_note(raw: bytes, by: str, now: float) -> bytes:
    """The stored document with ``stopped_by``/``stopped_at`` added (a damaged one unchanged):
    the record ``aegis-flow run`` writes when it, not the master, ended the run."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw
    if not isinstance(doc, dict):
        return raw
    return json.dumps({**doc, "stopped_by": by, "stopped_at": now}, sort_keys=True).encode()


@dataclass(frozen=True)
class LastRun:
    """What the last run of a job left: ``none`` (nothing stored), ``ended`` (a terminal
    phase: Succeed, Failed — a stop included —, Independent), ``interrupted`` (a live phase:
    the run was stopped or killed mid-job; it can be resumed), ``damaged`` (a document the
    master cannot resume from) or ``unreadable`` (its store could not be read at all)."""

    kind: str
    phase: str = ""  # the stored phase ("" when none or damaged)
    why: str = ""  # a damaged document's damage, or who stopped the run
    workers: int = 0  # the stored number of workers
    raw: bytes | None = None

    def describe(self) -> str:
        """"ended in Succeed", "was interrupted in Troubleshooting (stopped by SIGTERM …)"."""
        if self.kind == "ended":
            return f"ended ({self.phase})"
        if self.kind == "interrupted":
            how = f"stopped by {self.why}" if self.why else "no final record: killed?"
            return f"was interrupted in {self.phase} ({how})"
        if self.kind == "damaged":
            return f"left a damaged status ({self.why})"
        if self.kind == "unreadable":
            return f"left a store that cannot be read ({self.why})"
        return "left nothing"


def last_run(raw: bytes | None) -> LastRun:
    """Classify a stored status document (None: nothing stored)."""
    if raw is None:
        return LastRun("none")
    try:
        status, doc = decode_doc(raw)
    except ValueError as exc:
        return LastRun("damaged", why=str(exc), raw=raw)
    kind = "ended" if status.phase.terminal else "interrupted"
    return LastRun(kind, phase=status.phase.value, why=str(doc.get("stopped_by") or ""),
                   workers=len(status.workers), raw=raw)
