"""The supervisor's side of bootcheck and troubleshoot: run the planned checks, diagnose.

Side effects: runs ``aegis-flow check PLAN --out FILE`` as a child process — forked from the
pre-warmed interpreter when there is one (so the runtime check sees a warm torch and the fast
path stays fast), else started cold with this interpreter — and reads its results file.
The diagnosis itself is pure (``steps.diagnose``). Standard library and light modules only.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aegis_flow.steps.base import CheckResult
from aegis_flow.steps.diagnose import checks_verdict
from aegis_flow.supervisor import child as childmod
from aegis_flow.supervisor.waiting import wait_or_cancel
from aegis_flow.vocab import BOOTCHECK_PLAN, NODE_LOCAL_PLAN, Order, needs_rendezvous, passes

Starter = Callable[[list[str], dict[str, str]], Awaitable[childmod.Child]]


def check_argv(python: str, plan: list[str], out: str, work_dir: str, rank: int,
               world_size: int, rendezvous: Mapping[str, Any] | None, *,
               io_size_mib: float = 8.0) -> list[str]:
    argv = [python, "-m", "aegis_flow.steps.cli", "check", ",".join(plan), "--out", out,
            "--dir", work_dir, "--io-size-mib", str(io_size_mib), "--brief"]
    if rendezvous:
        argv += ["--rank", str(rank), "--world-size", str(world_size), "--rendezvous",
                 f"tcp://{rendezvous['addr']}:{rendezvous['port']}"]
    return argv


async def run_plan(argv: list[str], env: dict[str, str], out: str, timeout: float,
                   starters: list[Starter]) -> tuple[list[CheckResult], str]:
    """Run the check CLI with the first starter that produces results; ([], why) if none."""
    why = "no way to start the checks"
    for start in starters:
        try:
            proc = await start(argv, env)
        except OSError as exc:
            why = f"cannot start the checks: {exc}"
            continue
        try:
            await wait_or_cancel(proc.wait(), timeout)
        except asyncio.TimeoutError:
            await proc.stop(1.0)
            return [], f"the checks did not finish within {timeout:.0f} s"
        except asyncio.CancelledError:  # a newer order came: the check process goes too
            await asyncio.shield(proc.stop(1.0))
            raise
        try:
            with open(out) as fh:
                return [CheckResult.from_dict(r) for r in json.load(fh)], ""
        except (OSError, ValueError) as exc:
            status = proc.status
            why = (f"the checks produced no results ({exc}); "
                   f"{status.cause if status else ''}: {' | '.join(status.tail) if status else ''}")
    return [], why


async def bootcheck_or_troubleshoot(
        order: Order, data: Mapping[str, Any], *, rank: int, world_size: int, work_dir: str,
        env: dict[str, str], starters: list[Starter], timeout: float = 600.0,
) -> tuple[bool, str | None, str, dict[str, Any]]:
    """Run the order's plan (the master's, ``policy.plan``) and report what this rank's checks
    say: (ok, fault class, detail, data). The master judges it with the rank's failure history
    (``policy.judge``); the worker never decides its own escalation."""
    default = BOOTCHECK_PLAN if order is Order.BOOTCHECK else NODE_LOCAL_PLAN
    plan = [str(c) for c in data.get("checks") or default]
    rendezvous = data.get("rendezvous") if needs_rendezvous(plan) else None
    if rendezvous is None:
        plan = [c for c in plan if not needs_rendezvous([c])]
    # the results travel through the system's temp dir, not the work dir: a full work disk is
    # what the io check should report, not a reason for the report to be lost
    fd, out = tempfile.mkstemp(prefix=".aegis-checks-", suffix=".json")
    os.close(fd)
    os.unlink(out)
    try:
        # troubleshoot is on the recovery's critical path: a smaller io probe (every rank of
        # the node runs it at once); bootcheck measures the storage properly
        argv = check_argv(sys.executable, plan, out, work_dir, rank, world_size, rendezvous,
                          io_size_mib=8.0 if order is Order.BOOTCHECK else 1.0)
        results, why = await run_plan(argv, env, out, timeout, starters)
    finally:
        if os.path.exists(out):
            os.unlink(out)
    if not results:
        return False, "container", f"{order.value}: {why}", {}
    diag = checks_verdict(results)
    ok = passes(diag.fault, troubleshooting=True)
    fault = diag.fault.value if diag.fault is not None else None
    report: dict[str, Any] = {"results": [r.to_dict() for r in results],
                              "diagnosis": diag.to_dict()}
    shared = shared_fault(results)
    if shared and not ok:  # the storage's own words: the master may end the job with them (T3j)
        report["shared"] = shared
        return ok, fault, next(r.detail for r in results if r.failed)[:1500], report
    return ok, fault, diag.reason[:1500], report


def shared_fault(results: list[Any]) -> str:
    """``"io <fstype> <source> <mount point> <errno>"`` when the io check failed with an
    errno on a known filesystem and no other check failed: a fault every rank on that storage
    may share (the master's T3j); "" otherwise."""
    failed = [r for r in results if r.failed]
    if len(failed) != 1 or failed[0].check_type != "io":
        return ""
    data = failed[0].data
    fs, code = data.get("fs"), data.get("errno")
    return f"io {fs} {code}" if fs and code else ""
