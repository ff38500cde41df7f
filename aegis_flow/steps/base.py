"""What every check returns, the budgets of DESIGN.md §2, and the budget enforcer.

Side effects: ``run_with_budget`` and ``run_with_budget_async`` start one daemon thread per call
and read the clocks they are given; everything else here is pure. Standard library only.

A check is a *probe* (a blocking function returning an :class:`Outcome`) run under a *budget*.
The budget is part of the fault signature (io that needs 30 s is a storage fault), so an overrun
is a failure with status ``timeout``. Python cannot kill a thread: an overrunning probe is
abandoned as a daemon thread (it dies with the process) and the result says so.

``passed`` is True only for status ``pass``. ``not_applicable`` (no GPU, no RDMA NIC) is never
reported as a pass, and it never fails a verdict either: verdicts look at :attr:`CheckResult.failed`
(status ``fail`` or ``timeout``), see :func:`all_ok`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from aegis_flow.vocab import NODE_LOCAL_PLAN, Check


class CheckStatus(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "not_applicable"
    TIMEOUT = "timeout"


#: every check type, in the order reports list them
CHECK_TYPES: tuple[str, ...] = tuple(c.value for c in (
    Check.ENV, Check.IO, Check.GPU, Check.RUNTIME, Check.RDMA, Check.ALLREDUCE_CONNECTION,
    Check.ALLREDUCE_PERFORMANCE, Check.HANG))
#: the node-local checks of a troubleshoot (cheap, no peers needed)
NODE_LOCAL_CHECKS: tuple[str, ...] = tuple(c.value for c in NODE_LOCAL_PLAN)
#: the collective checks (need every rank)
COLLECTIVE_CHECKS: tuple[str, ...] = ("allreduce_connection", "allreduce_performance")

#: DESIGN.md §2 budgets in seconds ("runtime: ms" → 1 s). ``env`` is our addition: the report
#: imports torch, which a cold interpreter needs a few seconds for. ``hang`` has no budget.
DEFAULT_BUDGETS: Mapping[str, float] = {
    "io": 30.0,
    "gpu": 66.0,
    "runtime": 1.0,
    "rdma": 25.0,
    "allreduce_connection": 122.0,
    "allreduce_performance": 182.0,
    "env": 60.0,
    "health": 122.0,  # bootcheck's collective check: allreduce_connection's budget by default
}
#: env var with budget overrides, e.g. ``AEGIS_CHECK_BUDGETS="io=0.5,gpu=2"``
BUDGETS_ENV = "AEGIS_CHECK_BUDGETS"


@dataclass(frozen=True)
class Outcome:
    """What a probe found; :func:`run_with_budget` adds the timing and makes a CheckResult."""

    status: CheckStatus
    detail: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckResult:
    check_type: str
    passed: bool
    status: CheckStatus
    detail: str
    duration: float
    budget: float | None
    timestamp: float
    data: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.passed != (self.status is CheckStatus.PASS):
            raise ValueError(f"{self.check_type}: passed={self.passed} contradicts status "
                             f"{self.status.value!r} (passed is True exactly for 'pass')")

    @property
    def failed(self) -> bool:
        """Fails a verdict: status fail or timeout (never not_applicable)."""
        return self.status in (CheckStatus.FAIL, CheckStatus.TIMEOUT)

    @classmethod
    def make(cls, check_type: str, status: CheckStatus, detail: str, *, duration: float = 0.0,
             budget: float | None = None, timestamp: float = 0.0,
             data: Mapping[str, Any] | None = None) -> CheckResult:
        return cls(check_type, status is CheckStatus.PASS, status, detail, duration, budget,
                   timestamp, dict(data or {}))

    def to_dict(self) -> dict[str, Any]:
        return {"check_type": self.check_type, "passed": self.passed,
                "status": self.status.value, "detail": self.detail,
                "duration": self.duration, "budget": self.budget,
                "timestamp": self.timestamp, "data": dict(self.data)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CheckResult:
        try:
            status = CheckStatus(raw["status"])
            return cls(str(raw["check_type"]), bool(raw["passed"]), status, str(raw["detail"]),
                       float(raw["duration"]),
                       None if raw.get("budget") is None else float(raw["budget"]),
                       float(raw["timestamp"]), dict(raw.get("data") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a CheckResult: {exc} in {dict(raw)!r}") from exc


def all_ok(results: Iterable[CheckResult]) -> bool:
    """The verdict over a set of results: no check failed or timed out."""
    return not any(r.failed for r in results)


def parse_budget(text: str) -> tuple[str, float]:
    """``'io=0.5'`` → ``('io', 0.5)``; a clear ValueError otherwise."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or name not in DEFAULT_BUDGETS:
        raise ValueError(f"expected CHECK=SECONDS with CHECK one of {', '.join(DEFAULT_BUDGETS)}, "
                         f"got {text!r}")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"budget of {name!r} must be a number of seconds, got {value!r}") from None
    if not seconds > 0:
        raise ValueError(f"budget of {name!r} must be more than 0 seconds, got {seconds}")
    return name, seconds


def resolve_budgets(overrides: Mapping[str, float] | None = None, *,
                    environ: Mapping[str, str] | None = None) -> dict[str, float]:
    """Defaults, then ``$AEGIS_CHECK_BUDGETS`` (comma-separated CHECK=SECONDS), then overrides.
    ``health`` not given takes ``allreduce_connection``'s budget (both wait for every rank to
    join a collective)."""
    env = os.environ if environ is None else environ
    given: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in env.get(BUDGETS_ENV, "").split(","))):
        name, seconds = parse_budget(item)
        given[name] = seconds
    given.update(overrides or {})
    budgets = {**DEFAULT_BUDGETS, **given}
    if "health" not in given:  # bootcheck's collective check waits as allreduce_connection does
        budgets["health"] = budgets["allreduce_connection"]
    return budgets


def _failure(exc: BaseException) -> Outcome:
    return Outcome(CheckStatus.FAIL, f"the probe raised {type(exc).__name__}: {exc}",
                   {"exception": type(exc).__name__})


def _timeout(check_type: str, budget: float) -> Outcome:
    return Outcome(CheckStatus.TIMEOUT,
                   f"{check_type} did not finish within its budget of {budget:g} s; the probe "
                   "thread was abandoned (daemon) and may still be running",
                   {"abandoned_thread": True})


def _result(check_type: str, outcome: Outcome, *, started: float, duration: float,
            budget: float | None) -> CheckResult:
    return CheckResult.make(check_type, outcome.status, outcome.detail, duration=duration,
                            budget=budget, timestamp=started, data=outcome.data)


def run_with_budget(check_type: str, fn: Callable[[], Outcome], budget: float | None,
                    now: Callable[[], float] = time.time, *,
                    clock: Callable[[], float] = time.perf_counter) -> CheckResult:
    """Run the blocking probe ``fn`` in a daemon thread for at most ``budget`` seconds.

    ``budget=None`` runs it inline, unbounded. A probe that raises is a ``fail`` with the
    exception in the detail; one that overruns is a ``timeout``. ``now`` stamps the result,
    ``clock`` measures its duration.
    """
    started, t0 = now(), clock()
    if budget is None:
        try:
            outcome = fn()
        except Exception as exc:  # a probe crash is a failed check, reported, never raised
            outcome = _failure(exc)
        return _result(check_type, outcome, started=started, duration=clock() - t0, budget=None)
    box: list[Outcome] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: B036 - reported as the check's failure
            box.append(_failure(exc))

    worker = threading.Thread(target=target, name=f"aegis-check-{check_type}", daemon=True)
    worker.start()
    worker.join(budget)
    outcome = box[0] if box else _timeout(check_type, budget)
    return _result(check_type, outcome, started=started, duration=clock() - t0, budget=budget)


async def run_with_budget_async(check_type: str, fn: Callable[[], Outcome], budget: float | None,
                                now: Callable[[], float] = time.time, *,
                                clock: Callable[[], float] = time.perf_counter) -> CheckResult:
    """:func:`run_with_budget` for an event loop: the probe runs in a daemon thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Outcome] = loop.create_future()
    started, t0 = now(), clock()

    def settle(outcome: Outcome) -> None:
        if not future.done():
            future.set_result(outcome)

    def target() -> None:
        try:
            outcome = fn()
        except BaseException as exc:  # noqa: B036 - reported as the check's failure
            outcome = _failure(exc)
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop closed while an abandoned probe ran on
            pass

    threading.Thread(target=target, name=f"aegis-check-{check_type}", daemon=True).start()
    try:
        outcome = await asyncio.wait_for(asyncio.shield(future), budget)
    except asyncio.TimeoutError:
        outcome = _timeout(check_type, budget if budget is not None else 0.0)
    return _result(check_type, outcome, started=started, duration=clock() - t0, budget=budget)


def not_applicable(check_type: str, detail: str, *, now: Callable[[], float] = time.time,
                   budget: float | None = None,
                   data: Mapping[str, Any] | None = None) -> CheckResult:
    """A result for a check that cannot run here (said honestly, never a silent pass)."""
    return CheckResult.make(check_type, CheckStatus.NOT_APPLICABLE, detail, budget=budget,
                            timestamp=now(), data=data)
