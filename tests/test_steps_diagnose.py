"""The diagnosis table, exhaustively, against a reference written independently of the code.

The reference below restates docs/checks.md's rules as plain if/elif, and a handful of golden rows
spell out the levels literally; neither calls the function under test.
"""

from __future__ import annotations

import itertools

import pytest

from aegis_flow.steps.base import CheckResult, CheckStatus
from aegis_flow.steps.classify import Cause, default_table
from aegis_flow.steps.diagnose import diagnose, explain_table, plan_checks

S = CheckStatus
NODE_LOCAL = ("io", "gpu", "runtime", "rdma")
CAUSES: dict[str | None, Cause | None] = {
    None: None,
    "transient": Cause("illegal_memory_access", "transient", "an illegal memory access"),
    "symptom": Cause("nccl_timeout", "transient", "Watchdog caught collective operation ..."),
    "container": Cause("segfault", "container", "Segmentation fault"),
    "hardware": Cause("ecc_error", "hardware", "uncorrectable ECC error encountered"),
    "user": Cause("file_not_found", "user", "FileNotFoundError: data.bin"),
}
FAILURES = (0, 1, 2, 3, 4)
LEVEL = {"transient": "L1", "container": "L2", "hardware": "L3", "slow": "mark"}
RESULTS = {(c, s): CheckResult.make(c, s, f"{c} {s.value}") for c in
           (*NODE_LOCAL, "env", "allreduce_connection", "allreduce_performance") for s in S}


def reference(statuses: dict[str, CheckStatus], cause_class: str | None, failures: int,
              hang: bool) -> str:
    """The documented rule, restated: returns the fault class."""
    bad = {c for c, s in statuses.items() if s in (S.FAIL, S.TIMEOUT)}
    can_escalate = False
    if bad & {"gpu", "rdma", "io", "allreduce_connection"}:
        base = "hardware"
    elif bad & {"runtime", "env"}:
        base, can_escalate = "container", True
    elif cause_class == "hardware":
        base = "hardware"
    elif cause_class == "container":
        base, can_escalate = "container", True
    elif hang or "allreduce_performance" in bad:
        base = "slow"
    elif cause_class == "user":
        base = "transient"  # the command is wrong, the node is fine: never escalated
    elif cause_class == "symptom":
        base = "transient"  # a peer's failure seen from here: never grounds to escalate
    else:
        base, can_escalate = "transient", True
    if can_escalate and failures >= 3:
        return "hardware"
    if can_escalate and failures >= 2 and base == "transient":
        return "container"
    return base


def run(statuses: dict[str, CheckStatus], cause_class: str | None, failures: int,
        hang: bool) -> tuple[str, str]:
    results = [RESULTS[(c, s)] for c, s in statuses.items()]
    d = diagnose(results, CAUSES[cause_class], failures_of_rank=failures, hang=hang)
    assert d.level == LEVEL[d.fault_class]
    assert d.reason.startswith(d.level)
    assert set(d.failed_checks) == {c for c, s in statuses.items() if s in (S.FAIL, S.TIMEOUT)}
    return d.fault_class, d.level


def test_every_node_local_combination_x_cause_x_failures_x_hang() -> None:
    checked = 0
    for combo in itertools.product(S, repeat=len(NODE_LOCAL)):
        statuses = dict(zip(NODE_LOCAL, combo, strict=True))
        for cause, failures, hang in itertools.product(CAUSES, FAILURES, (False, True)):
            want = reference(statuses, cause, failures, hang)
            assert run(statuses, cause, failures, hang) == (want, LEVEL[want]), (
                statuses, cause, failures, hang)
            checked += 1
    assert checked == 4**4 * len(CAUSES) * 5 * 2


def test_every_env_and_collective_combination() -> None:
    extra = ("env", "allreduce_connection", "allreduce_performance")
    for combo in itertools.product(S, repeat=3):
        for healthy in (S.PASS, S.NOT_APPLICABLE):
            statuses = {**dict.fromkeys(NODE_LOCAL, healthy), **dict(zip(extra, combo,
                                                                         strict=True))}
            for cause, failures, hang in itertools.product(CAUSES, FAILURES, (False, True)):
                want = reference(statuses, cause, failures, hang)
                assert run(statuses, cause, failures, hang)[0] == want, (statuses, cause,
                                                                         failures, hang)


GOLDEN = [
    # (failed checks, cause class, failures of the rank, hang) -> level
    ((), None, 1, False, "L1"),             # checks pass, process exited: restart in place
    ((), "transient", 2, False, "L2"),      # the same rank keeps failing: restart the container
    ((), "transient", 3, False, "L3"),      # ... and again: quarantine the node
    ((), "symptom", 3, False, "L1"),        # a connection reset seen from a peer: never
    ((), None, 2, False, "L2"),             # a crash without a known cause escalates too
    ((), "user", 5, False, "L1"),           # a wrong command never quarantines a good node
    (("runtime",), None, 1, False, "L2"),   # runtime broken: container
    (("runtime",), None, 3, False, "L3"),
    (("gpu",), None, 1, False, "L3"),       # GPU failed: hardware
    (("rdma",), "user", 1, False, "L3"),
    (("io",), None, 1, False, "L3"),        # node-local storage fault: hardware
    ((), "hardware", 1, False, "L3"),       # ECC in the log
    ((), "container", 1, False, "L2"),      # segfault in the log
    ((), None, 1, True, "mark"),            # hang: slow node, mark only
    (("allreduce_performance",), None, 4, False, "mark"),
    (("allreduce_connection",), None, 1, False, "L3"),
    (("gpu", "allreduce_performance"), None, 1, True, "L3"),
]


@pytest.mark.parametrize(("failed", "cause", "failures", "hang", "level"), GOLDEN)
def test_golden_rows(failed: tuple[str, ...], cause: str | None, failures: int, hang: bool,
                     level: str) -> None:
    results = [RESULTS[(c, S.FAIL if c in failed else S.PASS)]
               for c in (*NODE_LOCAL, "allreduce_performance", "allreduce_connection")]
    assert diagnose(results, CAUSES[cause], failures_of_rank=failures, hang=hang).level == level


def test_escalation_thresholds_are_configurable() -> None:
    d = diagnose([], None, failures_of_rank=2, l2_after=3, l3_after=5)
    assert d.level == "L1" and not d.escalated
    d = diagnose([], None, failures_of_rank=5, l2_after=3, l3_after=5)
    assert d.level == "L3" and d.escalated and "escalated from L1 to L3" in d.reason
    with pytest.raises(ValueError, match="l2_after <= l3_after"):
        diagnose([], None, l2_after=4, l3_after=3)
    with pytest.raises(ValueError, match="0 or more"):
        diagnose([], None, failures_of_rank=-1)


def test_reason_names_the_cause_and_the_failed_checks() -> None:
    d = diagnose([RESULTS[("io", S.TIMEOUT)]], CAUSES["symptom"])
    assert d.rule == "D2" and "io timeout" in d.reason and "nccl_timeout" in d.reason
    assert not d.node_ok and d.to_dict()["failed_checks"] == ["io"]


COMMUNICATION = {"nccl_timeout", "nccl_error", "socket_timeout", "connection_reset"}


def test_plan_checks_every_cause_failures_hang_and_replacement() -> None:
    codes = [None, "unknown", *(r.code for r in default_table().rules)]
    for code, failures, hang, replaced in itertools.product(codes, FAILURES, (False, True),
                                                             (False, True)):
        cause = None if code is None else Cause(code, "transient")
        plan = plan_checks(cause, failures, hang, after_replacement=replaced)
        want = ["env"] if replaced else []
        want += ["runtime", "gpu", "io", "rdma"]
        want += ["health"] if replaced else []  # a replacement passes bootcheck's health
        if hang or failures >= 2 or code in COMMUNICATION:
            want += ["allreduce_connection", "allreduce_performance"]
        assert plan == want, (code, failures, hang, replaced)


def test_explain_lists_every_row_and_the_policies() -> None:
    text = explain_table(causes=[("oom", "user", "out of memory")])
    for needle in ("D1", "D10", "L3", "mark", "Escalation", "Troubleshoot plan", "oom"):
        assert needle in text
