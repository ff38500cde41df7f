"""Render a stored status document as a readable table (pure)."""

from __future__ import annotations

from aegis_flow.master.runtime import summary
from aegis_flow.master.model import Phase
from aegis_flow.master.store import decode_doc
from aegis_flow.phases import step_of


def render(raw: bytes) -> str:
    """The status table; for a damaged document, what can still be read of it and why."""
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
        f"{'rank':>4}  {'inner phase':<16} {'retries':>7}  {'finished':<8} {'restarting':<10} "
        f"{'node':<18} last reason",
    ]
    for pod in status.workers:
        lines.append(
            f"{pod.rank:>4}  {pod.phase.value:<16} {pod.retries:>7}  {str(pod.finished):<8} "
            f"{str(pod.restarting):<10} {pod.node or '-':<18} {pod.last_reason or '-'}")
    events = doc.get("events") or []
    if events:
        lines += ["", "last events:"] + [f"  {e}" for e in events[-10:]]
    if status.failure:
        lines += ["", f"why it failed: {status.failure}"]
    tail = failure_tail(raw)
    if tail:
        lines += tail[:1] + [f"  {t}" for t in tail[1:]]
    lines += ["", summary(status)]
    return "\n".join(lines)


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
             "the master will not resume from it; start the job afresh (a new --job name or "
             "state dir)"]
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
    """The user's summary line of a stored status document."""
    try:
        status, _ = decode_doc(raw)
    except ValueError as exc:
        return f"the stored status is damaged: {exc}"
    return summary(status)
