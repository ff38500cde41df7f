#!/usr/bin/env python3
"""Troubleshooting time: the checks from the pre-warmed interpreter next to cold check processes.

What a troubleshoot costs on the recovery's critical path, measured with the supervisor's own
code (``aegis_flow.supervisor.checks.bootcheck_or_troubleshoot``: start the planned checks, read
their results, diagnose), for ``--workers`` ranks at once, as in a job where every rank
troubleshoots together. Two plans:

- **transient**: the node-local checks only (runtime, gpu, io, rdma) — what a first failure of a
  rank with no communication cause gets (DESIGN.md: together under 1 s on a healthy node);
- **full**: the node-local checks plus allreduce connection and performance among every rank
  over a fresh rendezvous — a repeated failure, a communication cause or a hang.

Two ways to start them, side by side (trials alternate so a noisy machine disturbs both alike):

- **aegis-flow**: forked from each worker's pre-warmed interpreter (torch already imported, the
  check modules loaded), as the supervisor does; starting those interpreters happens when the
  supervisor starts and is not timed;
- **cold**: ``python -m aegis_flow.steps.cli check PLAN`` as a new process — what a check step
  that is its own process (``aegis-flow check`` in an Argo step, or a supervisor without the
  pre-warmed interpreter) pays, torch's import included.

Time of one troubleshoot = from the order until the last rank has its diagnosis. Side effects:
starts processes, writes the io probe's scratch files in a temp dir, prints a table, writes
``--out`` (markdown).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aegis_flow.master.runtime import free_port  # noqa: E402
from aegis_flow.steps.diagnose import COLLECTIVE_PLAN, NODE_LOCAL_PLAN  # noqa: E402
from aegis_flow.supervisor import child as childmod  # noqa: E402
from aegis_flow.supervisor.checks import Starter, bootcheck_or_troubleshoot  # noqa: E402
from aegis_flow.supervisor.prewarm import Zygote, start_zygote  # noqa: E402

PLANS = {"transient": list(NODE_LOCAL_PLAN), "full": [*NODE_LOCAL_PLAN, *COLLECTIVE_PLAN]}
MODES = ("aegis-flow", "cold")


@dataclass
class Trial:
    plan: str
    mode: str
    seconds: float
    ok: bool
    per_check: dict[str, float] = field(default_factory=dict)


def _env(rank: int, world: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    return env


async def _quiet_cold(argv: list[str], env: dict[str, str]) -> childmod.Child:
    return await childmod.start(argv, env, prefix="    [cold check] ", tail_lines=20)


def _warm_starter(zygote: Zygote) -> Starter:
    async def warm(argv: list[str], env: dict[str, str]) -> childmod.Child:
        return await zygote.spawn(argv, env, prefix="    [warm check] ", tail_lines=20,
                                  on_line=None)
    return warm


async def _one(plan: str, starters: Sequence[Starter], world: int, work: str) -> Trial:
    checks = PLANS[plan]
    data: dict[str, Any] = {"checks": checks}
    if any(c in COLLECTIVE_PLAN for c in checks):
        data["rendezvous"] = {"addr": "127.0.0.1", "port": free_port()}
    t0 = time.perf_counter()
    outcomes = await asyncio.gather(*(
        bootcheck_or_troubleshoot("troubleshoot", data, rank=r, world_size=world,
                                  work_dir=work, env=_env(r, world), starters=[starters[r]],
                                  timeout=300)
        for r in range(world)))
    took = time.perf_counter() - t0
    per_check: dict[str, float] = {}
    for _ok, _fault, _detail, report in outcomes:
        for res in report.get("results", []):
            name = str(res["check_type"])
            per_check[name] = max(per_check.get(name, 0.0), float(res["duration"]))
    return Trial(plan, "", took, all(o[0] for o in outcomes), per_check)


async def run(trials: int, world: int, plans: Sequence[str], out_lines: list[str]) -> list[Trial]:
    work = tempfile.mkdtemp(prefix="aegis-bench-ts-")
    zygotes: list[Zygote] = []
    for r in range(world):
        # the zygote is started for a Python command; the checks are what it forks here
        z = start_zygote([sys.executable, "-m", "aegis_flow.steps.cli"], _env(r, world), work)
        if z is None or not await z.ready(timeout=180):
            raise SystemExit("the pre-warmed interpreter did not start")
        zygotes.append(z)
    warm = [_warm_starter(z) for z in zygotes]
    cold: list[Starter] = [_quiet_cold] * world
    results: list[Trial] = []
    try:
        for i in range(trials):
            for plan in plans:
                order = MODES if i % 2 == 0 else MODES[::-1]
                for mode in order:
                    t = await _one(plan, warm if mode == "aegis-flow" else cold, world, work)
                    t.mode = mode
                    results.append(t)
                    line = (f"trial {i + 1}/{trials} {plan:<9} {mode:<10} {t.seconds:7.3f} s "
                            f"{'ok' if t.ok else 'NOT OK'}")
                    print(line, flush=True)
                    out_lines.append(line)
    finally:
        for z in zygotes:
            z.close()
    return results


def _stats(xs: list[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[0], xs[-1]


def table(results: list[Trial], plans: Sequence[str]) -> list[str]:
    rows = ["| plan | checks | aegis-flow (pre-warmed) median [min–max] | cold process median "
            "[min–max] | cold / aegis-flow |", "|---|---|---|---|---|"]
    for plan in plans:
        med: dict[str, float] = {}
        cells = []
        for mode in MODES:
            xs = [t.seconds for t in results if t.plan == plan and t.mode == mode and t.ok]
            bad = sum(1 for t in results if t.plan == plan and t.mode == mode and not t.ok)
            if not xs:
                cells.append(f"no successful trial ({bad} failed)")
                continue
            m, lo, hi = _stats(xs)
            med[mode] = m
            cells.append(f"{m:.3f} s [{lo:.3f}–{hi:.3f}] (n={len(xs)}"
                         + (f", {bad} not ok" if bad else "") + ")")
        ratio = (f"{med['cold'] / med['aegis-flow']:.1f}×" if len(med) == 2 else "–")
        rows.append(f"| {plan} | {', '.join(PLANS[plan])} | {cells[0]} | {cells[1]} | {ratio} |")
    rows += ["", "Median duration of each check inside its process (max over ranks), seconds:", "",
             "| plan | mode | " + " | ".join(PLANS["full"]) + " |",
             "|---|---|" + "---|" * len(PLANS["full"])]
    for plan in plans:
        for mode in MODES:
            ts = [t for t in results if t.plan == plan and t.mode == mode and t.ok]
            cells = []
            for c in PLANS["full"]:
                xs = [t.per_check[c] for t in ts if c in t.per_check]
                cells.append(f"{statistics.median(xs):.3f}" if xs else "–")
            rows.append(f"| {plan} | {mode} | " + " | ".join(cells) + " |")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--trials", type=int, default=7, help="trials per plan and mode (7)")
    ap.add_argument("--workers", type=int, default=2, help="ranks troubleshooting at once (2)")
    ap.add_argument("--plan", choices=(*PLANS, "both"), default="both")
    ap.add_argument("--out", default=None, help="also write the results as markdown here")
    a = ap.parse_args(argv)
    if a.trials < 1 or a.workers < 1:
        ap.error("--trials and --workers must be at least 1")
    plans = list(PLANS) if a.plan == "both" else [a.plan]
    started = datetime.datetime.now(datetime.timezone.utc)
    log: list[str] = []
    results = asyncio.run(run(a.trials, a.workers, plans, log))
    load = os.getloadavg()
    command = " ".join(["bench/troubleshoot.py", *(sys.argv[1:] if argv is None else argv)])
    header = [f"Run {started:%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
              f"load after {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, Python "
              f"{platform.python_version()}, {a.workers} ranks, {a.trials} trials per cell",
              f"command: .venv/bin/python {command}",
              ""]
    text = "\n".join(header + table(results, plans))
    print()
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n\nTrials:\n\n" + "\n".join(f"    {x}" for x in log) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
