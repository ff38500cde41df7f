"""Render a stored status document as a readable table (pure)."""

from __future__ import annotations

from aegis_flow.master.runtime import summary
from aegis_flow.master.store import decode_doc
from aegis_flow.phases import step_of


def render(raw: bytes) -> str:
    status, doc = decode_doc(raw)
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
    lines += ["", summary(status)]
    return "\n".join(lines)


def summary_of(raw: bytes) -> str:
    """The user's summary line of a stored status document."""
    status, _ = decode_doc(raw)
    return summary(status)
