"""The recovery policy: who is to blame, at which level a rank recovers, which checks a round
runs, where each epoch meets, and what exactly an order says. PURE.

``machine.step`` calls these functions; every input they read is a field of the persisted
``Status`` or of the event being stepped, so a restarted master decides exactly as the first
one did and re-sends an order byte for byte (``order_data``). No I/O, no clock (time arrives
as ``now`` in ``step``).

The rules, written down once (``aegis-flow explain`` prints them, ``docs/recovery.md`` explains
them):

Blame by evidence, not by arrival order.
  B1 A failure report whose cause is a peer symptom (``vocab.PEER_SYMPTOM_CAUSES``: connection
     reset, NCCL/socket timeout or error) or a hang report of a process that sleeps (waiting,
     e.g. in a collective) charges nobody: every rank is stopped, the troubleshoot runs with the
     collective checks, and the reporter becomes the *suspect*. (Only while another rank is
     still running: with no live peer the report is the rank's own failure, B4.)
  B2 While a suspect is pending, the first evidence names the failed rank and is charged: a
     failure report of the last run (same seq) that is not a symptom, a hang report of a process
     that does not sleep, a rank lost or replaced, or a rank whose checks fail.
  B3 A round of checks that passes with the blame still pending charges the suspect: only
     symptoms were seen, and the first rank to see one is the best evidence there is.
  B4 A report with a real cause (a signal, an exception, a hardware or container line) is
     charged to its sender at once.
  B5 A hang report (HangWithQuit) carries every rank's progress counts (optimizer steps and
     forwards, counted in the training process with no change to the script): the one rank
     strictly behind all its peers stopped first (they went on and wait on it in the next
     collective) and is charged, whichever rank's watchdog fired first. Equal counts name
     nobody: B1–B4 decide.

Level (the judge of one rank's round of checks, ``verdict``).
  V1 The checks' own verdict decides when it is container or hardware (D1–D5).
  V2 Otherwise the rank's open failure decides: a hardware cause → L3 (D6); a container cause
     → L2 (D7); a hang → slow, a mark (D8); a user cause → L1 (D9); a transient or unknown cause
     → L1, escalated to L2 from ``l2_after`` and to L3 from ``l3_after`` failures on its node
     (D10). No open failure: the checks' verdict.
  V3 A failure is answered once: a rank that comes back as a new container has no open failure
     any more, unless its cause was hardware (a container restart cannot cure a node); a rank
     moved to a new node starts with a clean history (``failures`` 0).

Repeats.
  R1 The same exception at the same step on the same rank twice in a row (equal non-empty
     signatures) is a deterministic user error: with ``give_up_on_repeat`` the job fails (T16)
     without burning the rest of its retries.
"""

from __future__ import annotations

from typing import Any

from aegis_flow.master.model import RDZV_RANK0, RDZV_SPAN, PodInfo, Status, evolve
from aegis_flow.vocab import (
    BOOTCHECK_PLAN,
    PEER_SYMPTOM_CAUSES,
    CauseClass,
    FaultClass,
    Order,
    Phase,
    needs_rendezvous,
    troubleshoot_plan,
)

HANG_CAUSE = "hang"


def stopped_first(activity: tuple[tuple[int, int, int], ...]) -> int | None:
    """The rank that stopped first in a hang, from each rank's (rank, optimizer steps,
    forwards) counts: synchronous training keeps every rank at the same counts, so when one
    stops for good its peers go on to the next forward and block in its collective, one ahead
    of it. The one rank strictly behind every peer is named; None without counts of at least
    two ranks, or when two or more are equally behind (a fault of the network or of all: the
    collective checks decide, B1). Pure; no clock (counts, not timestamps, so clock skew
    between nodes cannot mislead it)."""
    counts = {rank: (steps, forwards) for rank, steps, forwards in activity}
    if len(counts) < 2:
        return None
    least = min(counts.values())
    behind = [rank for rank, c in counts.items() if c == least]
    return behind[0] if len(behind) == 1 else None


def is_symptom(code: str) -> bool:
    """B1: a cause code that a surviving rank prints when a peer fails."""
    return code in PEER_SYMPTOM_CAUSES


def plan(status: Status, phase: Phase) -> tuple[str, ...]:
    """The checks of the round that ``status`` is about to broadcast for ``phase``.

    Bootcheck: every check. Troubleshoot: the node-local checks (cheapest first); bootcheck's
    ``env`` first and its collective ``health`` check after them once a worker was replaced (a
    job never trains on a node that skipped them, DESIGN T8); the collective checks when the
    failure points at the network: a pending suspect (only symptoms seen), a communication
    cause, a hang, or a rank with ``collective_after`` failures.
    """
    if phase is Phase.BOOTCHECKING:
        return tuple(c.value for c in BOOTCHECK_PLAN)
    if phase is not Phase.TROUBLESHOOTING:
        return ()
    culprit = status.workers[status.culprit] if status.culprit >= 0 else None
    network = status.blame >= 0 or needs_collectives(culprit, status.collective_after)
    return tuple(c.value for c in troubleshoot_plan(replaced=status.replaced,
                                                    collectives=network))


def needs_collectives(culprit: PodInfo | None, collective_after: int) -> bool:
    """The failure points at the network: a communication cause, a hang, or a rank that
    failed ``collective_after`` times on its node."""
    return culprit is not None and (is_symptom(culprit.cause) or culprit.cause == HANG_CAUSE
                                    or culprit.failures >= collective_after)


def rendezvous_port(status: Status, seq: int) -> int:
    """The port of the rendezvous of order ``seq``: a fresh one for every epoch (DESIGN §4),
    the same one for every re-send of that order (0: the job has no port window)."""
    return status.rdzv_base + seq % RDZV_SPAN if status.rdzv_base else 0


def order_data(status: Status, order: Order, seq: int) -> dict[str, Any]:
    """The payload of order ``seq``: a function of the persisted status alone (OrdersAreStable).

    ``restart_count`` is the epoch (recoverCount when the order was made); check rounds carry
    their plan; every order whose work meets at a rendezvous (run, and rounds with collective
    checks) carries its address and port."""
    data: dict[str, Any] = {"restart_count": status.epoch}
    rendezvous = order in (Order.RUN, Order.RUN_INDEPENDENT)
    if order in (Order.BOOTCHECK, Order.TROUBLESHOOT):
        data["checks"] = list(status.plan)
        rendezvous = needs_rendezvous(status.plan)
    if rendezvous:
        data["rendezvous"] = {"addr": rendezvous_addr(status),
                              "port": rendezvous_port(status, seq)}
    return data


#: heartbeats per second the master is sized for: 0.5 s beats up to 1,000 workers
#: (docs/benchmarks.md, "Control plane at scale")
BEAT_BUDGET = 2000.0
#: the workers' own default interval (settings.WORKER.heartbeat_interval)
BEAT_DEFAULT = 0.5


def beat_floor(workers: int, lost_timeout: float) -> float | None:
    """The shortest heartbeat interval the workers of a large job may use, told with every
    order: the master's budget spread over the workers, and never more than a third of the
    lost timeout (a rank is then judged on three beats at least). None when the workers' own
    interval stands (up to ``BEAT_BUDGET`` × 0.5 s = 1,000 workers)."""
    floor = min(workers / BEAT_BUDGET, lost_timeout / 3)
    return round(floor, 3) if floor > BEAT_DEFAULT else None


#: full heartbeats per second the master is sized for when keep-alives carry the rest
FULL_BEAT_BUDGET = 500.0


def keepalive_every(workers: int) -> float:
    """The longest a worker may go without a full heartbeat (the resource sample, its node,
    addresses and activity), told with every order: keep-alives fill the beats in between.
    5 s up to 2,500 workers, then the budget spread over the workers, at most 15 s (the
    anomaly rules' shortest window, 30 s, still sees two samples)."""
    return round(min(15.0, max(5.0, workers / FULL_BEAT_BUDGET)), 3)


#: seconds between two looks of the anomaly rules (anomaly.py) at the ranks' resource
#: samples: their windows are 30 s (gpu_idle), 60 s (net_low) and 300 s (rss_growth), and a
#: rank's sample is new once per full heartbeat (keepalive_every: 5-15 s)
ANOMALY_EVERY = 5.0


def observe_every(workers: int, lost_timeout: float) -> float:
    """Seconds between two looks at every rank's latest forward time (the slow-rank rule,
    whose window is a minute by default): the heartbeat interval, as a rank's numbers are new
    once per beat, and never more often than once a second."""
    return max(1.0, beat_floor(workers, lost_timeout) or BEAT_DEFAULT)


def rendezvous_addr(status: Status) -> str:
    """Where every rank meets: the job's fixed address, or (``RDZV_RANK0``, pods) the address
    rank 0's pod reported when it acked - its current one, so a rank 0 moved to another pod
    is met at its new address (127.0.0.1 until rank 0 has acked: a run order never goes out
    before every rank acked)."""
    if status.rdzv_addr != RDZV_RANK0:
        return status.rdzv_addr
    rank0 = next((p for p in status.workers if p.rank == 0), None)
    return rank0.pod_ip if rank0 is not None and rank0.pod_ip else "127.0.0.1"


def verdict(status: Status, pod: PodInfo, checks: FaultClass | None) -> FaultClass | None:
    """V1–V2: the recovery class of ``pod`` after its round of checks (None = healthy).

    ``checks``: the class the rank's own check results give (``steps.diagnose.checks_verdict``:
    None, transient (nothing failed), container, hardware or slow)."""
    return judge(pod, checks, l2_after=status.l2_after, l3_after=status.l3_after)[0]


def judge(pod: PodInfo, checks: FaultClass | None, *, l2_after: int,
          l3_after: int) -> tuple[FaultClass | None, str]:
    """``verdict`` with the row of the diagnosis table (DESIGN §2, ``steps/diagnose.py``) that
    decided: "checks" when the checks' own verdict stands, else D6–D10."""
    escalated = (FaultClass.HARDWARE if pod.failures >= l3_after else
                 FaultClass.CONTAINER if pod.failures >= l2_after else None)
    if checks is FaultClass.HARDWARE:
        return checks, "checks"
    if checks is FaultClass.CONTAINER:  # a broken runtime on a node that keeps failing: L3
        return (escalated if escalated is FaultClass.HARDWARE else checks), "checks"
    base = None if checks is FaultClass.TRANSIENT else checks
    if not pod.cause:  # no open failure: the checks decide
        return base, "checks"
    klass = pod.cause_class
    if klass is CauseClass.HARDWARE:
        return FaultClass.HARDWARE, "D6"
    if klass is CauseClass.CONTAINER:
        return (escalated if escalated is FaultClass.HARDWARE else FaultClass.CONTAINER), "D7"
    if pod.cause == HANG_CAUSE or base is FaultClass.SLOW:
        return FaultClass.SLOW, "D8"
    if klass is CauseClass.USER:
        return base, "D9"
    if is_symptom(pod.cause):  # B1: a symptom is never grounds to escalate
        return base, "D10"
    return escalated or base, "D10"


def answered(pod: PodInfo, *, new_node: bool) -> PodInfo:
    """V3: what a rank that comes back as a new container (or on a new node) keeps."""
    if new_node:
        return evolve(pod, failures=0, cause="", cause_class=None)
    if pod.cause and pod.cause_class is not CauseClass.HARDWARE:
        return evolve(pod, cause="", cause_class=None)
    return pod


def explain() -> str:
    """The policy's rules as text (this module's docstring, from "Blame" on)."""
    doc = __doc__ or ""
    return doc[doc.index("Blame by evidence"):].rstrip()


__all__ = ["HANG_CAUSE", "answered", "explain", "is_symptom", "judge", "needs_collectives",
           "order_data", "plan", "rendezvous_addr", "rendezvous_port", "verdict"]
