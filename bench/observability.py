"""What the metrics and the fault log add to the master's handling of a worker message.

Two masters in one process, fed the same messages, alternating which goes first: one with
observability off (``MasterConfig(observe=False)``), one with the Prometheus registry and the
fault log (a real file in a temporary directory, flushed per line). Each message is timed around
``Master.on_message`` (decode → observe → step → effects). The store is the in-memory one and
NATS is a no-op, so the times are the master's own work: on a real master the KV write after
every transition adds a network round trip to both sides alike.

Scenario per job (W workers): heartbeats and Acks → bootcheck with 6 check results per worker →
run (heartbeats carrying step rates) → rank 1 fails → troubleshoot with 4 results per worker →
run → every worker finishes. Reports = Finish and Error messages; heartbeats = ACKs.

    .venv/bin/python bench/observability.py            # 300 jobs × 8 workers
    .venv/bin/python bench/observability.py --jobs 30  # smoke run

Side effects: a temporary directory (removed at the end); prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aegis_flow import protocol as p
from aegis_flow.master.runtime import Master, MasterConfig
from aegis_flow.master.store import MemoryStore

BOOT = ("runtime", "env", "io", "gpu", "rdma", "health")
TROUBLE = ("runtime", "gpu", "io", "rdma")


class NoNats:
    is_connected = True

    async def publish(self, subject: str, data: bytes) -> None:
        pass


def message(kind: p.MsgType, rank: int, seq: int, data: dict[str, Any]) -> bytes:
    return p.Message(job="bench", namespace="default", pod_name=f"bench-worker-{rank}",
                     type=kind, rank=rank, seq=seq, incarnation=f"i{rank}", data=data,
                     timestamp=time.time()).encode()


def beat(rank: int, seq: int, rate: float | None) -> bytes:
    return message(p.MsgType.ACK, rank, seq, {
        "node": f"node-{rank}", "pod_ip": f"10.0.0.{rank}", "node_ip": f"10.1.0.{rank}",
        "gpu_type": "A800", "child_restarts": 0, "beat_lag": 0.001, "step_rate": rate,
        "step": 100 if rate else None})


def finish(rank: int, seq: int, checks: tuple[str, ...]) -> bytes:
    results = [{"check_type": c, "passed": True, "status": "pass", "detail": f"{c} ok",
                "duration": 0.05 + 0.01 * i, "budget": 30.0, "timestamp": time.time(),
                "data": {}} for i, c in enumerate(checks)]
    return message(p.MsgType.FINISH, rank, seq, {
        "ok": True, "fault": None, "detail": "all checks passed", "results": results,
        "diagnosis": {"fault_class": "transient", "reason": "all checks passed"}})


async def one_job(workers: int, log_dir: Path, out: dict[str, dict[str, list[float]]],
                  flip: bool) -> Master:
    plain = Master(MasterConfig(job="bench", workers=workers, observe=False),
                   store=MemoryStore())
    seen = Master(MasterConfig(job="bench", workers=workers, log_dir=str(log_dir)),
                  store=MemoryStore())
    for master in (plain, seen):
        master.nc = NoNats()
        await master._load()
    assert seen.observer is not None
    seen.observer.loaded(seen.status, resumed=False, now=time.time())
    pair = [("without", plain), ("with", seen)]
    if flip:
        pair.reverse()

    async def feed(kind: str, raw: bytes) -> None:
        for name, master in pair:
            t0 = time.perf_counter_ns()
            await master.on_message(raw)
            out[kind][name].append((time.perf_counter_ns() - t0) / 1e6)

    def seq() -> int:
        return plain.status.seq

    for r in range(workers):
        await feed("heartbeat", beat(r, 0, None))
    for r in range(workers):
        await feed("report", finish(r, seq(), BOOT))
    for _ in range(3):
        for r in range(workers):
            await feed("heartbeat", beat(r, seq(), 12.5))
    await feed("report", message(p.MsgType.ERROR, 1, seq(), {
        "cause": "killed by SIGKILL", "code": None, "signal": 9, "cause_code": "unknown",
        "cause_class": "unknown", "tail": ["step 99"] * 10, "ended_at": time.time()}))
    for r in range(workers):
        await feed("report", finish(r, seq(), TROUBLE))
    for r in range(workers):
        await feed("report", message(p.MsgType.FINISH, r, seq(),
                                     {"ok": True, "detail": "command exited 0"}))
    assert plain.status.phase.value == seen.status.phase.value == "Succeed", plain.status.phase
    seen.observer.close("bench", time.time())
    return seen


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--workers", type=int, default=8)
    a = ap.parse_args()
    out: dict[str, dict[str, list[float]]] = {
        k: {"with": [], "without": []} for k in ("report", "heartbeat")}
    with tempfile.TemporaryDirectory(prefix="aegis-bench-obs-") as tmp:
        gc.collect()
        for i in range(a.jobs):
            asyncio.run(one_job(a.workers, Path(tmp) / f"job{i}", out, flip=bool(i % 2)))
        render_ms = []
        last = asyncio.run(one_job(a.workers, Path(tmp) / "last", out, flip=False))
        assert last.observer is not None
        for _ in range(200):
            t0 = time.perf_counter_ns()
            last.observer.render()
            render_ms.append((time.perf_counter_ns() - t0) / 1e6)
    print(f"# observability overhead — {a.jobs} jobs × {a.workers} workers, "
          f"Python {platform.python_version()}\n")
    print("| message | n (each) | p50 without | p50 with | added p50 | p90 without | p90 with "
          "| with / without (p50) |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, d in out.items():
        w, wo = d["with"], d["without"]
        p50w, p50o = statistics.median(w), statistics.median(wo)
        print(f"| {kind} | {len(w)} | {p50o:.3f} ms | {p50w:.3f} ms | **{p50w - p50o:+.3f} ms** "
              f"| {pct(wo, 0.9):.3f} ms | {pct(w, 0.9):.3f} ms | {p50w / p50o:.2f}× |")
    print(f"\nrendering /metrics after a job: p50 "
          f"{statistics.median(render_ms):.3f} ms (served from its own thread)")
    added = statistics.median(out["report"]["with"]) - statistics.median(
        out["report"]["without"])
    print(f"\ntarget: metrics + fault log add < 1 ms to a report (p50): "
          f"{'met' if added < 1.0 else 'NOT met'} ({added:+.3f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
