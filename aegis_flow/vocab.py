"""The one vocabulary of aegis-flow: phases, orders, checks and plans, fault and cause classes,
recovery levels, the pass rule and the worker exit codes.

PURE, standard library only: the master's core, its runtime, the supervisor (PID 1 in the user's
image), the diagnosis, the observer and the templates all import these names from here, so a
check name, a plan or a level is written down once.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    """Global phase of the job, also used as each worker's inner phase."""

    PENDING = "Pending"
    BOOTCHECKING = "BootChecking"
    RUNCOMMAND = "RunCommand"
    RESTARTING = "Restarting"
    TROUBLESHOOTING = "Troubleshooting"
    SUCCEED = "Succeed"
    FAILED = "Failed"
    INDEPENDENT = "Independent"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_PHASES


TERMINAL_PHASES = frozenset({Phase.SUCCEED, Phase.FAILED, Phase.INDEPENDENT})
LIVE_PHASES = frozenset(set(Phase) - TERMINAL_PHASES)


class Order(enum.Enum):
    """What the master tells workers to do. Each phase has exactly one current order."""

    BOOTCHECK = "bootcheck"
    RUN = "run"
    TROUBLESHOOT = "troubleshoot"
    HOLD = "hold"  # stop training (if any) and wait
    QUIT = "quit"
    RUN_INDEPENDENT = "run-independent"
    EXIT = "exit"  # leave with an exit code (node fault / container restart); per worker only


#: the phase a worker is in while it carries out an order
PHASE_OF_ORDER = {
    Order.BOOTCHECK: Phase.BOOTCHECKING, Order.RUN: Phase.RUNCOMMAND,
    Order.TROUBLESHOOT: Phase.TROUBLESHOOTING, Order.HOLD: Phase.RESTARTING,
    Order.RUN_INDEPENDENT: Phase.INDEPENDENT,
}


class Outcome(enum.Enum):
    SUCCESS = "success"
    FAILED = "failed"
    STOPPED = "stopped"


class ExitCode(enum.IntEnum):
    """Worker exit codes: the contract between supervisor and workflow (range 70–79)."""

    NODE_FAULT = 70  # retry this pod elsewhere
    CONTAINER_RESTART = 71  # retry here
    SLOW_NODE_EVICTED = 72
    JOB_FAILED = 73  # retries exhausted: never retried
    STOPPED = 74  # stopped by an operator


# --------------------------------------------------------------------------- diagnosis


class FaultClass(enum.Enum):
    """The verdict on one rank after a round of checks (DESIGN.md §2, decision table)."""

    TRANSIENT = "transient"  # L1: restart the process in place
    CONTAINER = "container"  # L2: restart the container
    HARDWARE = "hardware"  # L3: quarantine the node, reschedule
    SLOW = "slow"  # a check's mark only (eviction is the training-time detector's: T13s/T13e)


#: escalation order of the fault classes (slow is a mark, never escalated to)
ESCALATION = (FaultClass.TRANSIENT, FaultClass.CONTAINER, FaultClass.HARDWARE)


class CauseClass(enum.Enum):
    """The log classifier's hint about a failed process (``steps/classify.py``)."""

    TRANSIENT = "transient"
    CONTAINER = "container"
    HARDWARE = "hardware"
    USER = "user"  # the user's program or data (OOM, a missing file): the node is fine


class Level(enum.Enum):
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    MARK = "mark"


LEVEL_OF = {FaultClass.TRANSIENT: Level.L1, FaultClass.CONTAINER: Level.L2,
            FaultClass.HARDWARE: Level.L3, FaultClass.SLOW: Level.MARK}
RECOVERY = {Level.L1: "restart the process in place", Level.L2: "restart the container (worker)",
            Level.L3: "quarantine the node, reschedule elsewhere",
            Level.MARK: "mark the rank slow (logged and counted; the job runs on: a check's "
                        "mark evicts nothing, a rank slow in training for slow_window is "
                        "evicted after the next checkpoint)"}


def passes(fault: FaultClass | None, *, troubleshooting: bool) -> bool:
    """The pass rule: a check round passes with no fault, a slow mark, or — in troubleshooting —
    a transient verdict (the L1 answer is "restart in place", which the next run order does)."""
    return fault is None or fault is FaultClass.SLOW or (
        troubleshooting and fault is FaultClass.TRANSIENT)


#: log causes that a *surviving* rank prints when a peer dies or stalls: evidence that some
#: rank failed, never that this one did (a symptom, not a cause)
PEER_SYMPTOM_CAUSES = frozenset({"nccl_timeout", "nccl_error", "socket_timeout",
                                 "connection_reset"})


# --------------------------------------------------------------------------- checks


class Check(str, enum.Enum):
    """Check names as they appear in plans, results and on the command line."""

    RUNTIME = "runtime"
    ENV = "env"
    IO = "io"
    GPU = "gpu"
    RDMA = "rdma"
    HEALTH = "health"
    ALLREDUCE = "allreduce"  # both allreduce checks (command-line shorthand)
    ALLREDUCE_CONNECTION = "allreduce_connection"
    ALLREDUCE_PERFORMANCE = "allreduce_performance"
    HANG = "hang"

    __hash__ = str.__hash__  # "health" and Check.HEALTH are one key in a set or a dict

    def __str__(self) -> str:
        return str(self.value)


BOOTCHECK_PLAN: tuple[Check, ...] = (Check.RUNTIME, Check.ENV, Check.IO, Check.GPU, Check.RDMA,
                                     Check.HEALTH)
NODE_LOCAL_PLAN: tuple[Check, ...] = (Check.RUNTIME, Check.GPU, Check.IO, Check.RDMA)
COLLECTIVE_PLAN: tuple[Check, ...] = (Check.ALLREDUCE_CONNECTION, Check.ALLREDUCE_PERFORMANCE)
#: checks that need every rank at one rendezvous
COLLECTIVE_CHECKS = frozenset({Check.HEALTH, Check.ALLREDUCE, Check.ALLREDUCE_CONNECTION,
                               Check.ALLREDUCE_PERFORMANCE})


def troubleshoot_plan(*, replaced: bool, collectives: bool) -> tuple[Check, ...]:
    """A troubleshoot's checks: node-local always (cheapest first); bootcheck's ``env`` first
    and its collective ``health`` check after them once a worker was replaced; the collective
    checks last when the failure points at the network."""
    plan = ((Check.ENV,) if replaced else ()) + NODE_LOCAL_PLAN
    plan += (Check.HEALTH,) if replaced else ()
    return plan + (COLLECTIVE_PLAN if collectives else ())


def needs_rendezvous(plan: tuple[str, ...] | list[str]) -> bool:
    return any(c in COLLECTIVE_CHECKS for c in plan)


__all__ = [
    "BOOTCHECK_PLAN", "COLLECTIVE_CHECKS", "COLLECTIVE_PLAN", "ESCALATION", "LEVEL_OF",
    "LIVE_PHASES", "NODE_LOCAL_PLAN", "PEER_SYMPTOM_CAUSES", "PHASE_OF_ORDER", "RECOVERY",
    "TERMINAL_PHASES", "CauseClass", "Check", "ExitCode", "FaultClass", "Level", "Order",
    "Outcome", "Phase", "needs_rendezvous", "passes", "troubleshoot_plan",
]
