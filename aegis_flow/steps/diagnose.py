"""The diagnosis: check results + the log's cause → the recovery class and level. Pure.

No side effects, no I/O, no clock: a table of rows, read top to bottom, the first row that holds
decides the base class; then the escalation of a rank that keeps failing. ``explain_table``
renders the same rows for ``aegis-flow explain``. A check "failed" when its status is ``fail`` or
``timeout``; ``not_applicable`` and a check that was not run never decide anything.

Storage: an io failure is a *hardware* fault (L3). The io check runs in the node's work or
checkpoint directory; a node-local disk that is full, read-only or slow beyond its budget follows
the node, so the node is quarantined. (When every rank fails io at once the storage is shared and
the fault is the job's, not a node's: that is the master's call, above this per-rank table.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aegis_flow.master import policy
from aegis_flow.master.model import PodInfo
from aegis_flow.vocab import (
    COLLECTIVE_PLAN,
    ESCALATION,
    LEVEL_OF,
    NODE_LOCAL_PLAN,
    PEER_SYMPTOM_CAUSES,
    CauseClass,
    FaultClass,
    troubleshoot_plan,
)
from aegis_flow.vocab import RECOVERY as _RECOVERY

if TYPE_CHECKING:
    from aegis_flow.steps.base import CheckResult
    from aegis_flow.steps.classify import Cause

FAULT_CLASSES = tuple(f.value for f in FaultClass)
LEVEL_NAMES = {f.value: lv.value for f, lv in LEVEL_OF.items()}
RECOVERY = {lv.value: what for lv, what in _RECOVERY.items()}
#: causes that point at the network between ranks: they earn the collective checks
COMMUNICATION_CAUSES = PEER_SYMPTOM_CAUSES
DEFAULT_L2_AFTER, DEFAULT_L3_AFTER, DEFAULT_COLLECTIVE_AFTER = 2, 3, 2


@dataclass(frozen=True)
class Facts:
    """What the table reads: the failed check types, the cause's class hint, a hang."""

    failed: frozenset[str]
    cause_class: str | None
    hang: bool


@dataclass(frozen=True)
class Row:
    """One row. ``holds`` None: the row reads the rank's failure history, which only the master
    has — ``policy.judge`` decides it (the worker's checks never do)."""

    id: str
    when: str
    fault_class: str
    holds: Callable[[Facts], bool] | None
    escalates: bool  # a rank that keeps failing moves up from here


def _failed(*checks: str) -> Callable[[Facts], bool]:
    return lambda f: any(c in f.failed for c in checks)


TABLE: tuple[Row, ...] = (
    Row("D1", "gpu or rdma failed", "hardware", _failed("gpu", "rdma"), False),
    Row("D2", "io failed (node-local storage fault; every rank failing it the same way on one "
        "filesystem is the job's storage: the job fails, nothing quarantined, T3j)", "hardware",
        _failed("io"), False),
    Row("D3", "allreduce_connection failed (this rank cannot join a collective)", "hardware",
        _failed("allreduce_connection"), False),
    Row("D4", "runtime failed (CUDA/driver/torch unusable)", "container", _failed("runtime"),
        True),
    Row("D5", "env failed (environment damaged)", "container", _failed("env"), True),
    Row("D6", "the log shows a hardware cause (ECC error, GPU lost)", "hardware", None, False),
    Row("D7", "the log shows a container cause (CUDA error, segfault, import error)",
        "container", None, True),
    Row("D8", "allreduce_performance failed, or the process hung", "slow",
        _failed("allreduce_performance", "hang"), False),
    Row("D9", "the log shows a user cause (OOM, file not found): the node is fine",
        "transient", None, False),
    Row("D10", "io/gpu/runtime/rdma pass (or do not apply), process exited; a peer symptom "
        "(connection reset, NCCL timeout) never escalates", "transient", lambda f: True, True),
)
ROWS = {r.id: r for r in TABLE}


@dataclass(frozen=True)
class Diagnosis:
    fault_class: str  # transient | container | hardware | slow
    level: str  # L1 | L2 | L3 | mark
    reason: str
    rule: str  # the table row that decided (D1..D10)
    escalated: bool = False
    failed_checks: tuple[str, ...] = ()

    @property
    def node_ok(self) -> bool:
        """True when the worker can report Finish(ok): L1 restart or a slow mark."""
        return self.level in ("L1", "mark")

    @property
    def fault(self) -> FaultClass | None:
        """The class a worker reports in its Finish (None: nothing failed)."""
        return None if self.fault_class == "transient" else FaultClass(self.fault_class)

    def to_dict(self) -> dict[str, Any]:
        return {"fault_class": self.fault_class, "level": self.level, "reason": self.reason,
                "rule": self.rule, "escalated": self.escalated,
                "failed_checks": list(self.failed_checks)}


def _check_thresholds(l2_after: int, l3_after: int) -> None:
    if not 1 <= l2_after <= l3_after:
        raise ValueError(f"escalation thresholds must satisfy 1 <= l2_after <= l3_after, got "
                         f"l2_after={l2_after}, l3_after={l3_after}")


def checks_verdict(results: Sequence[CheckResult]) -> Diagnosis:
    """What one rank's own check results say (rows D1–D5 and D8; else D10 without escalation).
    This is what a worker reports in its Finish; the master judges it with the rank's failure
    history (``master/policy.judge``: rows D6, D7, D9 and the escalation)."""
    failed = frozenset(r.check_type for r in results if r.failed)
    facts = Facts(failed, None, False)
    row = next(r for r in TABLE if r.holds is not None and r.holds(facts))
    names = tuple(sorted(failed))
    why = row.when
    if failed:
        details = "; ".join(r.detail for r in results if r.failed)
        why += f"; failed: {', '.join(names)}: {details}"
    level = LEVEL_NAMES[row.fault_class]
    return Diagnosis(row.fault_class, level, f"{level} ({RECOVERY[level]}): {why}", row.id,
                     False, names)


def diagnose(results: Sequence[CheckResult], cause: Cause | None = None, *,
             failures_of_rank: int = 1, hang: bool = False,
             l2_after: int = DEFAULT_L2_AFTER, l3_after: int = DEFAULT_L3_AFTER) -> Diagnosis:
    """The whole table for one rank, as the master applies it: the rank's checks
    (``checks_verdict``), then its failure history (``policy.judge``). ``failures_of_rank``
    counts this rank's failures on its node, the current one included (1 = first failure);
    ``hang`` says the watchdog fired."""
    if failures_of_rank < 0:
        raise ValueError(f"failures_of_rank must be 0 or more, got {failures_of_rank}")
    _check_thresholds(l2_after, l3_after)
    own = checks_verdict(results)
    klass = CauseClass(cause.klass) if cause is not None else None
    code = cause.code if cause is not None else "exited"
    if hang and klass not in (CauseClass.HARDWARE, CauseClass.CONTAINER):
        code, klass = policy.HANG_CAUSE, None
    pod = PodInfo(rank=0, failures=failures_of_rank, cause=code, cause_class=klass)
    fault, rule = policy.judge(pod, own.fault if own.fault_class != "transient"
                               else FaultClass.TRANSIENT, l2_after=l2_after, l3_after=l3_after)
    fault_class = fault.value if fault is not None else "transient"
    row = ROWS[own.rule if rule == "checks" else rule]
    why = row.when
    if cause is not None and cause.known:
        why += f"; cause {cause.code} ({cause.klass})"
    if own.failed_checks:
        details = "; ".join(r.detail for r in results if r.failed)
        why += f"; failed: {', '.join(own.failed_checks)}: {details}"
    base = row.fault_class
    escalated = ESCALATION.index(FaultClass(fault_class)) > ESCALATION.index(
        FaultClass(base)) if fault_class != "slow" and base != "slow" else False
    if escalated:
        why += (f"; rank failed {failures_of_rank} times (L2 from {l2_after}, L3 from "
                f"{l3_after}): escalated from {LEVEL_NAMES[base]} to {LEVEL_NAMES[fault_class]}")
    level = LEVEL_NAMES[fault_class]
    return Diagnosis(fault_class, level, f"{level} ({RECOVERY[level]}): {why}", row.id,
                     escalated, own.failed_checks)


def plan_checks(cause: Cause | None, failures_of_rank: int, hang: bool, *,
                collective_after: int = DEFAULT_COLLECTIVE_AFTER,
                after_replacement: bool = False) -> list[str]:
    """Which checks a troubleshoot runs, in order. Node-local checks always (cheapest first);
    the collective checks only for a repeated failure of this rank, a communication-class cause
    or a hang; ``env`` first after a replacement (a new pod must pass bootcheck's checks)."""
    if hang:
        code, klass = policy.HANG_CAUSE, None
    else:
        code = cause.code if cause is not None else ""
        klass = CauseClass(cause.klass) if cause is not None else None
    culprit = PodInfo(rank=0, failures=failures_of_rank, cause=code, cause_class=klass)
    return [c.value for c in troubleshoot_plan(
        replaced=after_replacement,
        collectives=policy.needs_collectives(culprit, collective_after))]


def explain_table(*, l2_after: int = DEFAULT_L2_AFTER, l3_after: int = DEFAULT_L3_AFTER,
                  collective_after: int = DEFAULT_COLLECTIVE_AFTER,
                  causes: Sequence[tuple[str, str, str]] = ()) -> str:
    """The decision table, the escalation and the check plan as text (``causes``: code, class,
    description rows to list as well)."""
    _check_thresholds(l2_after, l3_after)
    width = max(len(r.when) for r in TABLE)
    lines = ["Diagnosis (first row that holds decides; 'failed' = status fail or timeout; the "
             "worker's checks decide D1-D5 and D8, the master adds the rank's history: D6, D7, "
             "D9 and the escalation):", "",
             f"  {'row':<4} {'when':<{width}}  class      level", f"  {'-' * (width + 23)}"]
    for r in TABLE:
        lines.append(f"  {r.id:<4} {r.when:<{width}}  {r.fault_class:<10} "
                     f"{LEVEL_NAMES[r.fault_class]}{'  (escalates)' if r.escalates else ''}")
    lines += ["", "Levels:"] + [f"  {lv:<4} {what}" for lv, what in RECOVERY.items()]
    lines += ["", f"Escalation: from a row marked (escalates), a rank with {l2_after} or more "
              f"failures moves to L2 (container), with {l3_after} or more to L3 (hardware).",
              "", "Troubleshoot plan: " + ", ".join(NODE_LOCAL_PLAN) + " always (node-local, "
              "cheapest first); then " + ", ".join(COLLECTIVE_PLAN) + f" only when the rank "
              f"failed {collective_after} or more times, the cause is a communication cause "
              f"({', '.join(sorted(COMMUNICATION_CAUSES))}), the process hung, or only a peer "
              "symptom was reported; after a replacement env first and health after the "
              "node-local checks.", "", "Blame and repeats (the master's policy):", "",
              *("  " + line for line in policy.explain().splitlines())]
    if causes:
        lines += ["", "Causes (log classifier):"]
        cw = max(len(c[0]) for c in causes)
        lines += [f"  {code:<{cw}}  {klass:<9}  {desc}" for code, klass, desc in causes]
    return "\n".join(lines)
