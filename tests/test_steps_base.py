"""CheckResult, budgets and the budget enforcer (DESIGN.md §2: an overrun is a timeout)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aegis_flow.steps.base import (
    CHECK_TYPES,
    DEFAULT_BUDGETS,
    CheckResult,
    CheckStatus,
    Outcome,
    all_ok,
    not_applicable,
    parse_budget,
    resolve_budgets,
    run_with_budget,
    run_with_budget_async,
)


def ok() -> Outcome:
    return Outcome(CheckStatus.PASS, "fine", {"x": 1})


def test_default_budgets_are_the_design_table() -> None:
    assert {k: v for k, v in DEFAULT_BUDGETS.items() if k not in ("env", "health")} == {
        "io": 30.0, "gpu": 66.0, "runtime": 1.0, "rdma": 25.0,
        "allreduce_connection": 122.0, "allreduce_performance": 182.0}
    # the health check (ours) is budgeted like the connection check, and can be set on its own
    assert DEFAULT_BUDGETS["health"] == DEFAULT_BUDGETS["allreduce_connection"]
    assert resolve_budgets(environ={"AEGIS_CHECK_BUDGETS": "health=10"})["health"] == 10.0
    # ... and follows allreduce_connection's when only that one is set (docs/checks.md; the B2
    # rehearsal set allreduce_connection=10 and waited the full 122 s in the health check)
    b = resolve_budgets(environ={"AEGIS_CHECK_BUDGETS": "allreduce_connection=10"})
    assert (b["allreduce_connection"], b["health"]) == (10.0, 10.0)
    assert resolve_budgets({"allreduce_connection": 7.0})["health"] == 7.0
    b = resolve_budgets({"health": 5.0}, environ={"AEGIS_CHECK_BUDGETS": "allreduce_connection=9"})
    assert (b["allreduce_connection"], b["health"]) == (9.0, 5.0)
    assert len([c for c in CHECK_TYPES if c != "env"]) == 7


def test_result_round_trips_through_a_dict() -> None:
    r = CheckResult.make("io", CheckStatus.FAIL, "ENOSPC", duration=0.5, budget=30.0,
                         timestamp=12.0, data={"errno": "ENOSPC"})
    assert r.to_dict()["status"] == "fail"
    assert CheckResult.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match="not a CheckResult"):
        CheckResult.from_dict({"check_type": "io"})


def test_passed_is_true_exactly_for_pass() -> None:
    assert CheckResult.make("gpu", CheckStatus.PASS, "").passed
    for status in (CheckStatus.FAIL, CheckStatus.NOT_APPLICABLE, CheckStatus.TIMEOUT):
        assert not CheckResult.make("gpu", status, "").passed
    with pytest.raises(ValueError, match="contradicts"):
        CheckResult("gpu", True, CheckStatus.NOT_APPLICABLE, "", 0.0, None, 0.0, {})


def test_not_applicable_never_fails_a_verdict_and_is_never_a_pass() -> None:
    na = not_applicable("gpu", "no GPUs here", now=lambda: 5.0)
    assert not na.passed and not na.failed and na.timestamp == 5.0
    assert all_ok([na, CheckResult.make("io", CheckStatus.PASS, "")])
    assert not all_ok([na, CheckResult.make("io", CheckStatus.TIMEOUT, "")])


def test_a_probe_within_budget_passes_with_its_timing() -> None:
    r = run_with_budget("io", ok, 5.0, now=lambda: 100.0)
    assert (r.status, r.passed, r.budget, r.timestamp, r.data) == (
        CheckStatus.PASS, True, 5.0, 100.0, {"x": 1})
    assert 0 <= r.duration < 5.0


def test_an_overrun_is_a_timeout_and_the_thread_is_abandoned() -> None:
    release = threading.Event()

    def slow() -> Outcome:
        release.wait(10)
        return ok()

    t0 = time.perf_counter()
    r = run_with_budget("gpu", slow, 0.05)
    release.set()
    assert time.perf_counter() - t0 < 2
    assert r.status is CheckStatus.TIMEOUT and r.failed and not r.passed
    assert "budget of 0.05 s" in r.detail and "abandoned" in r.detail
    assert r.data["abandoned_thread"] is True


def test_a_probe_that_raises_is_a_failure_not_a_crash() -> None:
    def boom() -> Outcome:
        raise RuntimeError("driver exploded")

    for budget in (None, 1.0):
        r = run_with_budget("runtime", boom, budget)
        assert r.status is CheckStatus.FAIL and "RuntimeError: driver exploded" in r.detail


def test_no_budget_runs_inline() -> None:
    seen: list[str] = []

    def probe() -> Outcome:
        seen.append(threading.current_thread().name)
        return ok()

    assert run_with_budget("hang", probe, None).budget is None
    assert seen == [threading.current_thread().name]


def test_async_variant_times_out_without_blocking_the_loop() -> None:
    release = threading.Event()

    async def main() -> tuple[CheckResult, CheckResult]:
        slow = run_with_budget_async("io", lambda: (release.wait(10), ok())[1], 0.05)
        fast = run_with_budget_async("rdma", ok, 5.0)
        a, b = await asyncio.gather(slow, fast)
        return a, b

    slow_r, fast_r = asyncio.run(main())
    release.set()
    assert slow_r.status is CheckStatus.TIMEOUT and fast_r.status is CheckStatus.PASS


def test_budgets_are_configurable_by_env_and_overrides() -> None:
    b = resolve_budgets({"gpu": 2.0}, environ={"AEGIS_CHECK_BUDGETS": "io=0.5, rdma=1"})
    assert (b["io"], b["rdma"], b["gpu"], b["runtime"]) == (0.5, 1.0, 2.0, 1.0)
    assert parse_budget("allreduce_connection=3") == ("allreduce_connection", 3.0)
    for bad, msg in [("io", "CHECK=SECONDS"), ("disk=1", "CHECK=SECONDS"),
                     ("io=fast", "number of seconds"), ("io=0", "more than 0")]:
        with pytest.raises(ValueError, match=msg):
            parse_budget(bad)
