#!/usr/bin/env python3
"""What one report costs the master, in-process: no NATS, no other process, CPU time only.

The scale harness (``scale.py``) measures the whole control plane, on a machine it shares with
nats-server and thousands of simulated workers; its CPU percentages move with the machine's
load by a factor of two from run to run here. This measures only the master's own Python work
per report, as CPU time of this process (``time.process_time``), which the neighbours change
much less: a real ``Master`` (``master/runtime.py``) with its observer and metrics, an
in-memory store and a NATS stand-in that drops what is published, fed the bytes a supervisor
sends on the subjects it sends them on (``Master.on_message``):

* **ack fan-in**: every rank's first heartbeat (Pending → Bootchecking);
* **FINISH fan-in**: every rank's FINISH ok of the bootcheck (→ RunCommand), with the saves
  the master makes (the quiet ones deferred, as in the real loop);
* **heartbeat**: every rank's full heartbeat in RunCommand, ``--rounds`` times (median per
  round), with what a worker of 8 GPUs sends (``beats.numbers``; ``--payload bare``: without);
* **keep-alive**: the same as keep-alives (``protocol.KeepAlive``; NaN in a tree without them);
* **ticks**: one second of the loop's ticks (every 50 ms) right after every rank's sample came
  (the slow-rank and anomaly rules read them all), then one second with none new;
* **/metrics**: one render of everything a scrape returns, and its size.

``--compare DIR`` runs the same in another checkout of aegis-flow (a ``git worktree`` of an
older commit) in a child process, alternating with this one, and prints both side by side.

Side effects: none beyond the child processes of ``--compare`` (waited for); prints a table,
``--out`` writes it as markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import beats  # bench/beats.py (this script's folder is on sys.path)
import tables  # bench/tables.py

ROOT = Path(__file__).resolve().parents[1]


def _beat(p: Any, rank: int, seq: int, beat: int = 1, *, payload: str = "full") -> bytes:
    """The supervisor's heartbeat fields while training. ``full``: with the numbers a worker of
    8 GPUs sends (``beats.numbers``: step, counts, a resource sample of 8 processes and 8
    GPUs); ``bare``: without them (what this benchmark sent before 2026-12-04)."""
    moving = beats.numbers(rank, beat) if payload == "full" else {
        "beat_lag": 0.0, "step_rate": 3.2, "step": 100, "progress": None}
    return p.Message(
        job="j", namespace="default", pod_name=f"j-worker-{rank}", type=p.MsgType.ACK,
        rank=rank, seq=seq, incarnation=f"i{rank}", phase="RunCommand", data={
            "node": f"node-{rank}", "pod_ip": f"10.0.{rank // 250}.{rank % 250 + 1}",
            "child_pid": 1000 + rank, "node_ip": f"10.1.{rank // 250}.{rank % 250 + 1}",
            "gpu_type": "sim", "child_restarts": 0, "doing": "", "doing_for": 1.5, **moving},
        timestamp=time.time()).encode()


async def measure(n: int, rounds: int, payload: str = "full") -> dict[str, float]:
    """The costs at ``n`` ranks: µs of CPU per report, ms of CPU per second of ticks and per
    /metrics render (this process)."""
    from aegis_flow import protocol as p
    from aegis_flow.master import machine as m
    from aegis_flow.master.runtime import Master, MasterConfig
    from aegis_flow.master.store import MemoryStore

    class DropNats:  # the master publishes orders; nobody listens here
        is_connected = True

        async def publish(self, subject: str, data: bytes) -> None:
            pass

        async def flush(self, timeout: float | None = None) -> None:
            pass

    master = Master(MasterConfig(job="j", workers=n, max_retry=2, lost_timeout=1e9),
                    store=MemoryStore())  # (the feed is not a live job: nobody is lost)
    master.nc = DropNats()  # type: ignore[assignment]
    await master._load()
    assert master.observer is not None
    master.observer.loaded(master.status, resumed=False, now=time.time())
    subjects = p.Subjects("default", "j")
    out: dict[str, float] = {}

    acks = [(_beat(p, r, 0), subjects.master(r)) for r in range(n)]
    t = time.process_time()
    for raw, subject in acks:
        await master.on_message(raw, subject)
    out["ack"] = (time.process_time() - t) / n * 1e6
    assert master.status.phase is m.Phase.BOOTCHECKING, master.status.phase

    seq = master.status.seq
    finishes = [(p.Message(job="j", namespace="default", pod_name=f"j-worker-{r}",
                           type=p.MsgType.FINISH, rank=r, seq=seq, incarnation=f"i{r}",
                           phase="Bootchecking", data={"ok": True},
                           timestamp=time.time()).encode(), subjects.master(r))
                 for r in range(n)]
    t = time.process_time()
    for i, (raw, subject) in enumerate(finishes):
        await master.on_message(raw, subject)
        if i % 64 == 63:
            await master.tick()  # the loop's tick: the deferred saves
    out["finish"] = (time.process_time() - t) / n * 1e6
    assert master.status.phase is m.Phase.RUNCOMMAND, master.status.phase

    seq = master.status.seq
    per_round = []
    for i in range(rounds):
        feed = [(_beat(p, r, seq, i + 1, payload=payload), subjects.master(r))
                for r in range(n)]
        t = time.process_time()
        for raw, subject in feed:
            await master.on_message(raw, subject)
        per_round.append((time.process_time() - t) / n * 1e6)
    out["beat"] = statistics.median(per_round)
    out["keepalive"] = float("nan")  # a tree from before keep-alives has none
    if hasattr(p, "KeepAlive"):
        per_round = []
        for i in range(rounds):
            feed = [(p.KeepAlive(seq, f"i{r}", time.time(), step=100 + i, step_rate=2.0,
                                 steps=100 + i, forwards=100 + i, last_active=time.time(),
                                 forward_ms=180.0, beat_lag=0.001, doing_for=3.0).encode(),
                     subjects.master(r)) for r in range(n)]
            t = time.process_time()
            for raw, subject in feed:
                await master.on_message(raw, subject)
            per_round.append((time.process_time() - t) / n * 1e6)
        out["keepalive"] = statistics.median(per_round)
    # a second of the loop's ticks (every 50 ms) with every rank's numbers in: the slow-rank
    # and anomaly rules, the silence scan, the deferred saves
    for key in ("tick", "tick_quiet"):  # every rank's sample new, then none new
        master.last_seen = dict.fromkeys(range(n), time.monotonic())
        t, wall = time.process_time(), time.monotonic()
        while time.monotonic() - wall < 1.0:
            await master.tick()
            await asyncio.sleep(0.05)
        out[key] = (time.process_time() - t) * 1e3
    assert master.status.phase is m.Phase.RUNCOMMAND, master.status.phase
    t = time.process_time()
    size = len(master.observer.render())  # a /metrics scrape
    out["render"] = (time.process_time() - t) * 1e3
    out["render_kib"] = size / 1024
    return out


def child(n: int, rounds: int, payload: str) -> None:
    print(json.dumps(asyncio.run(measure(n, rounds, payload))))


def run_in(tree: Path, n: int, rounds: int, payload: str) -> dict[str, float]:
    """One measurement in a fresh interpreter importing aegis_flow from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, __file__, "--child", str(n), "--rounds", str(rounds),
                           "--payload", payload],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the measurement in {tree} failed:\n{proc.stderr[-2000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def rank_counts(text: str) -> list[int]:
    """``--workers``: comma-separated positive rank counts (argparse says what is wrong)."""
    try:
        ns = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not ns or min(ns) < 1:
        raise argparse.ArgumentTypeError(f"every count must be 1 or more: {text!r}")
    return ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=rank_counts, default=[1024, 4096],
                    help="comma-separated ranks (1024,4096)")
    ap.add_argument("--rounds", type=int, default=5, help="heartbeat rounds (5)")
    ap.add_argument("--trials", type=int, default=3, help="fresh processes per tree (3)")
    ap.add_argument("--compare", type=Path, help="another checkout, measured alternately")
    ap.add_argument("--out", type=Path, help="write the table here (markdown)")
    ap.add_argument("--payload", choices=("full", "bare"), default="full",
                    help="heartbeats with the numbers a worker of 8 GPUs sends (full, the "
                         "default) or without them (bare)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.rounds, a.payload)
        return
    trees = [("this", ROOT)] + ([("compare", a.compare.resolve())] if a.compare else [])
    header = ["N", "tree", "ack µs", "FINISH µs", "heartbeat µs", "heartbeat CPU at N/s",
              "keep-alive µs", "ticks ms/s, samples new", "ticks ms/s, none new", "/metrics ms",
              "/metrics KiB"]
    rows = []
    if a.compare and not (a.compare / "aegis_flow").is_dir():
        ap.error(f"--compare {a.compare}: not a checkout of aegis-flow (no aegis_flow/ in it)")
    for n in a.workers:
        got: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
        for trial in range(a.trials):
            for name, tree in trees:
                got[name].append(run_in(tree, n, a.rounds, a.payload))
                print(f"N={n} {name} trial {trial + 1}: {got[name][-1]}", file=sys.stderr)
        for name, _ in trees:
            med = {k: statistics.median(r[k] for r in got[name])
                   for k in ("ack", "finish", "beat", "keepalive", "tick", "tick_quiet",
                             "render", "render_kib")}
            rows.append([str(n), name, f"{med['ack']:.1f}", f"{med['finish']:.1f}",
                         f"{med['beat']:.1f}", f"{med['beat'] * n / 1e4:.0f} %",
                         f"{med['keepalive']:.1f}",
                         f"{med['tick']:.0f}", f"{med['tick_quiet']:.0f}",
                         f"{med['render']:.0f}",
                         f"{med['render_kib']:.0f}"])
    print(tables.render(header, rows, markdown=False))
    if a.out:
        when = datetime.date.today().isoformat()
        a.out.write_text(f"`{' '.join(sys.argv)}` — {when}, this machine"
                         f" ({os.cpu_count()} cores)\n\n"
                         + tables.render(header, rows, markdown=True) + "\n")


if __name__ == "__main__":
    main()
