"""The runtime invariant monitor: the model checker's invariants on every live transition.

PURE. ``violations(before, event, after, effects)`` names every invariant of
``aegis_flow.verify.properties`` that the transition breaks: the state invariants on the new
status (ValidPhase … WorkerSeqNumBound) and the transition invariants that read no more than
the runtime knows (MasterSeqNumMonotonic, OrdersAreStable, OutageCountsNothing,
ResumeCountsNothing, StorageFaultIsTheJobs). The environment's ``Kind`` of an event — which
the model knows because it made the event — is rebuilt from what the runtime observed
(``kind_of``). The master's runtime (``runtime.Master.apply``) calls it after each ``step``
and reports a violation as an error log line, the ``aegis_invariant_violations_total``
counter and a fault-log record; it never changes a decision.
"""

from __future__ import annotations

from aegis_flow.master import machine as m
from aegis_flow.verify.environment import Kind, live_ranks
from aegis_flow.verify.properties import (
    INVARIANTS,
    master_seq_monotonic,
    orders_are_stable,
    outage_counts_nothing,
    resume_counts_nothing,
    storage_fault_is_the_jobs,
)

EDGE_CHECKS = (
    ("MasterSeqNumMonotonic", master_seq_monotonic),
    ("OrdersAreStable", orders_are_stable),
    ("OutageCountsNothing", outage_counts_nothing),
    ("ResumeCountsNothing", resume_counts_nothing),
    ("StorageFaultIsTheJobs", storage_fault_is_the_jobs),
)

#: every name the monitor can report
NAMES = tuple(n for n, _ in INVARIANTS) + tuple(n for n, _ in EDGE_CHECKS)


def kind_of(before: m.Status, event: m.Event) -> Kind:
    """What the world did, as the model checker's environment would label it."""
    if isinstance(event, m.Stop):
        return Kind.STOP
    if isinstance(event, m.Resume):
        return Kind.RESUME
    if isinstance(event, m.ControlPlaneBack):
        return Kind.COOPERATIVE
    if isinstance(event, m.Lost) and not before.outage and not before.phase.terminal \
            and before.phase is not m.Phase.PENDING and not (event.outlasted and event.nats_ok):
        live = live_ranks(before)
        if not event.nats_ok or (len(live) >= 2 and set(live) <= (event.silent | {event.rank})):
            return Kind.OUTAGE
    return Kind.NORMAL


def violations(before: m.Status, event: m.Event, after: m.Status,
               effects: list[m.Effect]) -> list[str]:
    """The invariants this live transition breaks (empty: none)."""
    bad = [name for name, inv in INVARIANTS if not inv(after)]
    kind = kind_of(before, event)
    bad += [name for name, check in EDGE_CHECKS
            if not check(kind, event, before, after, effects)]
    return bad
