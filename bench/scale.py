#!/usr/bin/env python3
"""The control plane at scale: N simulated workers against the real master and nats-server.

Each simulated worker is a few fields and a heartbeat slot, not a process: it speaks the real
wire protocol (``aegis_flow.protocol``) the way the supervisor does (``supervisor/agent.py``):
an ACK heartbeat every ``--heartbeat`` seconds (0.5 s, the supervisor's default) carrying the
supervisor's heartbeat fields, the last report repeated with every heartbeat until the seq
advances, FINISH ok for a bootcheck/troubleshoot order, nothing for a run or hold order (it
keeps heartbeating) and silence after quit/exit. Workers share NATS connections
(``--per-conn`` workers each, 256 by default); each publishes on its own report subject
``Subjects.master(rank)`` and is subscribed to ``Subjects.worker(rank)``; a connection has one
subscription to the broadcast subject for all of its workers. The master is the real
``python -m aegis_flow.master`` process, the server a real nats-server (``EmbeddedNats``), both
on this machine.

Without ``--creds`` the server runs without authentication. With ``--creds`` it runs as a job
does by default (``aegis-flow run``): operator mode, the master serving ``SyncWorkerCreds`` over
gRPC; every simulated worker fetches its own credentials as ``aegis-flow worker-init`` does
(``security/worker_init.fetch``: a new NKey, the job's bootstrap token; ``--mint-threads``
calls at once) and connects with them on a connection of its own (a worker's user may publish
only its own report subject, so workers cannot share one): N connections, N JWTs the server
checked. Measured besides: the N grants (wall time, p50/p99 per call, the master's CPU
seconds), and in scenario 4 the replacement's own grant, given once the master holds its
rank lost (the dead pod's connection is closed when it falls silent).

One harness process then reads N copies of every broadcast and answers on N connections: on
this 2-core machine it takes as much CPU in a round as the master and the server together.
Copies of one broadcast are decoded once (real workers decode theirs at once, each on its own
machine), and ``--loop uvloop`` runs the harness on uvloop; the CPU seconds each process
spent in the fault round are reported, so it shows where the time of a round went.

Scenarios, for each N of ``--workers``:

1. **connect + bootcheck**: every worker starts heartbeating; the master acks them all and
   broadcasts bootcheck; every worker answers FINISH ok. Measured: the first heartbeat → the
   bootcheck order at every worker (ack fan-in), and the *bootcheck round*: the bootcheck order's
   first arrival → the run order at every worker.
2. **steady state** (``--steady`` seconds in RunCommand): the master's and nats-server's CPU %
   (utime+stime from /proc/<pid>/stat) and RSS (VmRSS), heartbeats/s into the master (what the
   workers published), the messages/s the nats-server itself counted in and out (its
   monitoring endpoint's ``/varz``; out includes the copies to the harness's KV tap), and this
   harness's own CPU % (it shares the machine).
   With ``--creds``, then **every JWT renewed once**: each worker asks the master for a fresh
   JWT over its renewal subject and reconnects with it (``Session.renew``, its 5 s timeout; a
   failed one asked again after 5 s, as ``renew_loop`` does), at the point of
   ``--renew-window`` seconds where its key's renewal share puts it: the supervisor spreads a
   job's renewals over a quarter of the JWT's lifetime (``renew_share``: 900 s of a 1 h JWT),
   and 30 s, the default, is 30 times as dense; 0 renews all at once, as every worker did
   at 2/3 of the lifetime before 2026-12-04. Measured: the first request → every connection
   back, p50/p99 of one renewal with its reconnect, the retries, the CPU seconds in it, and
   from the server's own ``/connz`` that every worker is connected with its new JWT; no
   worker may get a new order (none judged lost while it reconnected).
3. **one fault**: the last rank sends an ERROR for the current run seq. Measured per worker:
   the fault → that worker holding the next order (troubleshoot), p50/p99/max; then the
   troubleshoot order at every worker → the restart (run) order at every worker.
4. **a node fault with one replacement**: rank 1 falls silent (its node is gone); the master
   finds it lost after ``--lost-timeout`` and holds every other worker; a new pod of rank 1 (a
   new incarnation, on another node) starts heartbeating. Measured: the silence → the hold
   order at every live worker, and the replacement's first heartbeat → the run order at every
   worker.
5. **a master SIGKILL and resume**: the workers' beats pause, the master is killed with
   SIGKILL, the status the store holds is read, and the master is started again with the same
   arguments. Measured: its start → ready (``/readyz``), and that the status it rebuilt from
   the store (written by it on SIGTERM, before any worker beat again) equals the stored one;
   then a third master takes the job on, the beats resume, and no worker may get a new order
   in 3 s.

The store: the master keeps its status in a JetStream KV bucket (history 1) as a job record
and one record per rank (``master/store.py``). The harness subscribes to the bucket's subjects
(``$KV.<bucket>.>``), so it sees every put the master makes, and counts puts and bytes per
scenario: independent of what the master says about itself.

Side effects: starts a nats-server and a master per N under a temporary directory (removed),
both stopped on exit, Ctrl-C included; prints tables; ``--out`` writes markdown, ``--json``
the raw numbers. Needs the project's venv (nats-py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import beats  # bench/beats.py (this script's folder is on sys.path)
import tables  # bench/tables.py

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import nats  # noqa: E402

from aegis_flow import protocol as p  # noqa: E402
from aegis_flow.local.natsserver import EmbeddedNats  # noqa: E402
from aegis_flow.local.runs import connect_quietly  # noqa: E402
from aegis_flow.master.store import STATUS_KEY, KVStore, decode_doc, status_to_dict  # noqa: E402
from aegis_flow.supervisor.creds import RENEW_FROM, RENEW_TO, Session, renew_share  # noqa: E402
from aegis_flow.supervisor.keepalive import KeepAlives  # noqa: E402

_VENV_PY = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PY) if _VENV_PY.exists() else sys.executable
JOB, NAMESPACE = "scale", "default"
TICKS = 10  # heartbeat slots per interval: a beat task publishes 1/TICKS of its workers a tick
BEAT_GROUP = 256  # workers per beat task at least (with --creds a connection holds one worker)
CONNECTING = 64  # connections opened at once
RECONNECT_WAIT = 0.5  # the supervisor's reconnect_time_wait (supervisor/agent.py)
RENEW_RETRY = 5.0  # renew_loop's pause after a failed renewal while much of the JWT is left
CLK = os.sysconf("SC_CLK_TCK")
SCRAPE_EVERY = 15.0  # seconds between /metrics reads in the steady state (Prometheus's default)


class BenchError(RuntimeError):
    """The scenario did not happen as expected (the master did not answer in time...)."""


# -- /proc ---------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # fields 14 and 15 of the whole line


def nats_counts(monitor: str) -> tuple[int, int]:
    """(messages in, messages out) the nats-server has counted since it started, from its
    monitoring endpoint's ``/varz`` (``-m PORT``): its own count, not the harness's."""
    import urllib.request

    with urllib.request.urlopen(f"{monitor}/varz", timeout=5) as resp:
        varz = json.loads(resp.read())
    return int(varz["in_msgs"]), int(varz["out_msgs"])


def connected_jwts(monitor: str, limit: int) -> set[str]:
    """The JWTs the server's client connections authenticated with (its ``/connz?auth=1``)."""
    import urllib.request

    with urllib.request.urlopen(f"{monitor}/connz?auth=1&limit={limit}", timeout=30) as r:
        conns = json.load(r).get("connections") or []
    return {str(c.get("jwt", "")) for c in conns}


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# -- the simulated workers ------------------------------------------------------------------
@dataclass
class Worker:
    rank: int
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    seq: int = 0
    order: str = ""
    phase: str = "Pending"
    last_report: bytes | None = None
    report_seq: int = -1
    gone: bool = False
    since: float = field(default_factory=time.monotonic)
    node: str = ""
    first_beat: float | None = None  # when this incarnation's first heartbeat went out
    beats: int = 0  # heartbeats sent (the numbers of a full payload move with it)
    keepalives: KeepAlives = field(default_factory=KeepAlives)  # the supervisor's own logic


@dataclass
class OrderSeen:
    """One order (seq) as the workers got it: when each rank started holding it."""

    order: str
    at: dict[int, float] = field(default_factory=dict)


PHASE_OF = {"bootcheck": "BootChecking", "troubleshoot": "Troubleshooting",
            "run": "RunCommand", "hold": "Restarting"}


class Fleet:
    """N simulated workers on ceil(N / per_conn) NATS connections."""

    def __init__(self, url: str, n: int, per_conn: int, heartbeat: float, *,
                 payload: str = "full",
                 options: Callable[[int], dict[str, Any]] | None = None) -> None:
        self.url, self.n, self.per_conn, self.heartbeat = url, n, per_conn, heartbeat
        self.payload = payload
        # nats.connect options of the connection whose first worker is rank R (credentials)
        self.options = options
        self.base_heartbeat = heartbeat
        self.subjects = p.Subjects(NAMESPACE, JOB)
        self.workers = [Worker(r) for r in range(n)]
        self.conns: list[Any] = []
        self.orders: dict[int, OrderSeen] = {}
        self.published = 0  # messages sent to the master
        self.keepalives = 0  # ... of them heartbeats sent as keep-alives
        self.bad_orders = 0
        self._decoded: dict[bytes, p.Message] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.beating = False
        self.paused = False  # while the master is swapped (scenario 5): no worker beats

    async def connect(self) -> None:
        """Every connection, CONNECTING at once at a time (N connections with --creds)."""
        starts = list(range(0, self.n, self.per_conn))
        for i in range(0, len(starts), CONNECTING):
            self.conns += await asyncio.gather(*(self.open(s) for s in starts[i:i + CONNECTING]))

    async def open(self, start: int) -> Any:
        """The connection of workers start.. start+per_conn, subscribed to their orders."""
        group = self.workers[start:start + self.per_conn]
        nc = await nats.connect(self.url, max_reconnect_attempts=-1,
                                reconnect_time_wait=RECONNECT_WAIT,
                                pending_size=64 * 1024 * 1024,
                                **(self.options(start) if self.options else {}))
        await nc.subscribe(self.subjects.broadcast,
                           cb=self._on_order(nc, group), pending_msgs_limit=-1)
        for w in group:
            await nc.subscribe(self.subjects.worker(w.rank), cb=self._on_order(nc, [w]),
                               pending_msgs_limit=-1)
        await nc.flush()
        return nc

    def conn_of(self, rank: int) -> Any:
        return self.conns[rank // self.per_conn]

    async def reconnect(self, rank: int) -> None:
        """A new connection for rank ``rank``'s workers (with the options they hold now) in
        the place of the old one, which the caller has closed."""
        start = rank - rank % self.per_conn
        self.conns[rank // self.per_conn] = await self.open(start)

    def _msg(self, w: Worker, mtype: p.MsgType, seq: int, data: dict[str, Any]) -> bytes:
        return p.Message(job=JOB, namespace=NAMESPACE, pod_name=f"{JOB}-worker-{w.rank}",
                         type=mtype, rank=w.rank, seq=max(seq, 0), incarnation=w.incarnation,
                         phase=w.phase, data=data, timestamp=time.time()).encode()

    def _beat(self, w: Worker) -> bytes:
        """The supervisor's heartbeat fields (agent._beat_data). While running, with
        ``payload == "full"`` (the default), the numbers a worker of 8 GPUs sends
        (``beats.numbers``: step, counts, a resource sample of 8 processes and 8 GPUs);
        ``"bare"``: none of them (the harness's heartbeat before 2026-12-04)."""
        running = w.order == "run"
        w.beats += 1
        moving = (beats.numbers(w.rank, w.beats) if running and self.payload == "full" else
                  {"beat_lag": 0.0, "step_rate": None, "step": None, "progress": None})
        msg = p.Message(job=JOB, namespace=NAMESPACE, pod_name=f"{JOB}-worker-{w.rank}",
                        type=p.MsgType.ACK, rank=w.rank, seq=max(w.seq, 0),
                        incarnation=w.incarnation, phase=w.phase, data={
            "node": w.node or f"node-{w.rank}",
            "pod_ip": f"10.0.{w.rank // 250}.{w.rank % 250 + 1}",
            "child_pid": 1000 + w.rank if running else None,
            "node_ip": f"10.1.{w.rank // 250}.{w.rank % 250 + 1}", "gpu_type": "sim",
            "child_restarts": 0,
            "doing": "" if running else "checks done; waiting for the other ranks",
            "doing_for": round(time.monotonic() - w.since, 1), **moving}, timestamp=time.time())
        short = w.keepalives.compact(msg, time.monotonic())  # as the supervisor decides
        if short is not None:
            self.keepalives += 1
        return short or msg.encode()

    async def _publish(self, nc: Any, w: Worker, raw: bytes) -> None:
        await nc.publish(self.subjects.master(w.rank), raw)
        self.published += 1

    def _decode(self, raw: bytes) -> p.Message:
        """An order as a worker decodes it. The copies of one broadcast that N connections
        receive are the same bytes: decoded once (N real workers decode theirs at once, each on
        its own machine; one harness process decoding N copies in turn would add its own
        delay to the fan-out it measures). Read-only: no callback changes a message."""
        msg = self._decoded.get(raw)
        if msg is None:
            msg = p.decode(raw, job=JOB, namespace=NAMESPACE)
            if len(self._decoded) >= 64:
                self._decoded.clear()
            self._decoded[raw] = msg
        return msg

    def _on_order(self, nc: Any, group: list[Worker]) -> Callable[[Any], Any]:
        async def cb(m: Any) -> None:
            now = time.monotonic()
            try:
                msg = self._decode(m.data)
            except p.ProtocolError:
                self.bad_orders += 1
                return
            if msg.type is not p.MsgType.ORDER or msg.pod_name != "master":
                return
            order = str(msg.data.get("order", ""))
            floor = msg.data.get("beat_floor")  # a large job: fewer beats (as the supervisor)
            for w in group:
                w.keepalives.asked(msg.data.get("keepalive"))
            if isinstance(floor, int | float) and 0 < floor <= 60:
                self.heartbeat = max(self.base_heartbeat, float(floor))
            seen = self.orders.setdefault(msg.seq, OrderSeen(order))
            answers = []
            for w in group:
                if w.gone or msg.rank not in (-1, w.rank):
                    continue
                personal_exit = order == "exit" and msg.rank == w.rank and msg.seq == w.seq
                if msg.seq <= w.seq and not personal_exit:
                    continue  # a re-send of an order held already
                w.seq, w.order, w.since = msg.seq, order, now
                w.last_report, w.report_seq = None, -1
                w.phase = PHASE_OF.get(order, w.phase)
                seen.at.setdefault(w.rank, now)
                if order in ("bootcheck", "troubleshoot"):
                    raw = self._msg(w, p.MsgType.FINISH, msg.seq,
                                    {"ok": True, "fault": None, "detail": "simulated checks"})
                    w.last_report, w.report_seq = raw, msg.seq
                    answers.append((w, raw))
                elif order in ("quit", "exit", "run-independent"):
                    w.gone = True
            for w, raw in answers:
                await self._publish(nc, w, raw)
            if answers:
                await nc.flush()
        return cb

    async def report_error(self, rank: int) -> None:
        """Rank ``rank``'s command failed: an ERROR for its current (run) seq, repeated with its
        heartbeats until a new order comes (as the supervisor does)."""
        w = self.workers[rank]
        nc = self.conn_of(rank)
        raw = self._msg(w, p.MsgType.ERROR, w.seq, {
            "cause": "simulated failure", "exit_code": 1, "tail": ["RuntimeError: simulated"]})
        w.last_report, w.report_seq = raw, w.seq
        await self._publish(nc, w, raw)
        await nc.flush()

    def start_beats(self) -> None:
        """A beat task per BEAT_GROUP workers or per connection, whichever holds more: each
        worker publishes on its own connection (the one of its rank, looked up every beat: a
        replacement's is new)."""
        self.beating = True
        size = max(self.per_conn, BEAT_GROUP)
        for start in range(0, self.n, size):
            self._tasks.append(asyncio.ensure_future(
                self._beats(self.workers[start:start + size])))

    async def _beats(self, group: list[Worker]) -> None:
        slots = [group[i::TICKS] for i in range(TICKS)]
        next_at = time.monotonic()
        i = 0
        while self.beating:
            tick = self.heartbeat / TICKS  # the master may ask for fewer (beat_floor)
            for w in slots[i % TICKS]:
                if w.gone or self.paused:
                    continue
                nc = self.conn_of(w.rank)
                await self._publish(nc, w, self._beat(w))
                if w.first_beat is None:
                    w.first_beat = time.monotonic()
                if w.last_report is not None and w.report_seq == w.seq:
                    await self._publish(nc, w, w.last_report)  # repeat until the seq advances
            i += 1
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def replace(self, rank: int) -> Worker:
        """A new pod of rank ``rank`` on another node: a new incarnation that starts from
        nothing (seq 0, Pending) and heartbeats from the next slot on."""
        w = self.workers[rank]
        w.incarnation, w.node = uuid.uuid4().hex[:12], f"node-{rank}-b"
        w.seq, w.order, w.phase, w.since = 0, "", "Pending", time.monotonic()
        w.last_report, w.report_seq, w.first_beat, w.gone = None, -1, None, False
        w.keepalives = KeepAlives()  # a new supervisor: full beats until the master asks
        return w

    async def close(self) -> None:
        self.beating = False
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        for nc in self.conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 5)

    # -- what the workers hold ------------------------------------------------------------
    def all_hold(self, pred: Callable[[Worker], bool]) -> bool:
        return all(pred(w) for w in self.workers)

    async def wait(self, pred: Callable[[Worker], bool], timeout: float, what: str,
                   alive: Callable[[], None]) -> None:
        deadline = time.monotonic() + timeout
        while not self.all_hold(pred):
            alive()
            if time.monotonic() > deadline:
                held: dict[str, int] = {}
                for w in self.workers:
                    key = f"{w.order or '-'}@{w.seq}"
                    held[key] = held.get(key, 0) + 1
                raise BenchError(f"{what}: not every worker after {timeout:.0f} s; "
                                 f"they hold {held}")
            await asyncio.sleep(0.01)


# -- one N ----------------------------------------------------------------------------------
@dataclass
class Result:
    n: int
    connections: int = 0
    ok: bool = False
    error: str = ""
    # scenario 1
    ack_fanin_s: float = float("nan")  # first heartbeat → bootcheck order at every worker
    bootcheck_spread_s: float = float("nan")  # first → last worker got the bootcheck order
    bootcheck_round_s: float = float("nan")  # bootcheck order's first arrival → run at all
    # scenario 2
    steady_s: float = 0.0
    msgs_per_s: float = float("nan")
    master_cpu_pct: float = float("nan")
    master_rss_mib: float = float("nan")
    nats_cpu_pct: float = float("nan")
    nats_rss_mib: float = float("nan")
    nats_in_per_s: float = float("nan")  # the server's own counts (/varz), steady state
    nats_out_per_s: float = float("nan")
    harness_cpu_pct: float = float("nan")
    keepalive_share: float = float("nan")  # of the messages in, heartbeats as keep-alives
    scrapes: int = 0  # /metrics reads in the steady state (every SCRAPE_EVERY s)
    scrape_bytes: int = 0  # the size of the last one
    unexpected_orders: list[str] = field(default_factory=list)
    # scenario 3
    next_order: str = ""
    fault_first_s: float = float("nan")  # the fault → the first worker holds the next order
    fault_p50_s: float = float("nan")  # the fault → a worker holds the next order
    fault_p99_s: float = float("nan")
    fault_max_s: float = float("nan")
    troubleshoot_round_s: float = float("nan")  # troubleshoot at all → run at all
    fault_to_restart_s: float = float("nan")  # the fault → run order at every worker
    restart_p50_s: float = float("nan")  # the fault → a worker holds the restart (run) order
    restart_p99_s: float = float("nan")
    fault_cpu_s: list[float] = field(default_factory=list)  # in it: master, nats, harness
    # scenario 4
    node_lost_s: float = float("nan")  # rank 1 falls silent → hold at every live worker
    replace_to_run_s: float = float("nan")  # the new pod's first beat → run at every worker
    # scenario 5
    resume_ready_s: float = float("nan")  # a new master's start → /readyz answers 200
    resume_same_status: bool = False  # the rebuilt status equals the stored one
    resume_orders: list[str] = field(default_factory=list)  # new orders after the resume
    # the store: every put the master made (the harness listens on $KV.<bucket>.>)
    job_bytes: int = 0  # the job record at the end
    puts_connect: int = 0  # KV puts during scenario 1 (acks + bootcheck round)
    bytes_connect: int = 0
    puts_steady: int = 0
    bytes_steady: int = 0
    puts_fault: int = 0  # scenario 3: the fault → the restart at every worker
    bytes_fault: int = 0
    saves_fault: int = 0  # job-record puts (one per save) in scenario 3
    max_put_bytes: int = 0  # the largest single put
    seq_end: int = 0  # the order seq (transitions that sent an order) at the end
    master_rss_end_mib: float = float("nan")
    # --creds: every worker's grant (SyncWorkerCreds over gRPC) before it connects
    creds: bool = False
    mint_s: float = float("nan")  # the N grants, --mint-threads at once
    mint_p50_s: float = float("nan")  # one call
    mint_p99_s: float = float("nan")
    mint_master_cpu_s: float = float("nan")  # the master's CPU seconds over the N grants
    replace_mint_s: float = float("nan")  # scenario 4: the replacement's grant (one call)
    anonymous_refused: bool = False  # a connection without credentials was refused
    renew_window_s: float = float("nan")  # --renew-window: the renewals spread over it
    renew_s: float = float("nan")  # the first renewal's request → every connection back
    renew_p50_s: float = float("nan")  # one renewal: its request → its connection back
    renew_p99_s: float = float("nan")
    renew_retries: int = 0  # renewals that failed and were asked again
    renew_cpu_s: list[float] = field(default_factory=list)  # in it: master, nats, harness
    renew_orders: list[str] = field(default_factory=list)  # new orders meanwhile (none)
    renew_connected: int = 0  # workers the server holds connected with a new JWT after it
    # every --sample seconds from the first heartbeat: [s, KV puts, KV KiB, master CPU %
    # over the interval, master RSS MiB]: where the time goes when a round is slow
    timeline: list[list[float]] = field(default_factory=list)


class KvTap:
    """Every put into the master's KV bucket, as the server relays it (a plain subscription to
    the bucket's subjects): puts, bytes, job-record puts, and the largest put."""

    def __init__(self) -> None:
        self.puts = self.bytes = self.job_puts = self.max_put = 0

    async def start(self, nc: Any, bucket: str) -> None:
        async def cb(m: Any) -> None:
            size = len(m.data)
            self.puts += 1
            self.bytes += size
            self.max_put = max(self.max_put, size)
            if m.subject.endswith("." + STATUS_KEY):
                self.job_puts += 1
        await nc.subscribe(f"$KV.{bucket}.>", cb=cb, pending_msgs_limit=-1)
        await nc.flush()

    def snap(self) -> tuple[int, int, int]:
        return self.puts, self.bytes, self.job_puts


async def stored_status(nc: Any, bucket: str) -> tuple[dict[str, Any], int]:
    """The status the store holds now (assembled from its records) and the job record's
    size."""
    kv = await nc.jetstream().key_value(bucket)
    raw, _ = await KVStore(kv).load()
    job = await kv.get(STATUS_KEY)
    return status_to_dict(decode_doc(raw or b"")[0]), len(job.value or b"")


@dataclass(frozen=True)
class Secure:
    """A job in operator mode (--creds): its auth dir, bootstrap token and the master's gRPC
    address."""

    auth: Path
    token: str
    grpc: str

    def master_args(self, work: Path) -> list[str]:
        from aegis_flow.security.tokens import write_token

        token_file = write_token(work / "token", self.token)
        return ["--auth-dir", str(self.auth), "--token-file", str(token_file),
                "--grpc-listen", self.grpc]

    def harness_options(self, subjects: p.Subjects) -> dict[str, Any]:
        """The harness's own user: the master's permissions (it reads the KV) and the bucket's
        subjects (the KV tap)."""
        from aegis_flow.security import natsjwt as nj
        from aegis_flow.security.issuer import master_permissions
        from aegis_flow.security.operator import load, user_options

        perms = master_permissions(subjects)
        return user_options(load(self.auth), nj.Permissions(
            pub=perms.pub, sub=(*perms.sub, f"$KV.{subjects.kv_bucket}.>")),
            name="scale-harness", now=time.time(), lifetime=3 * 3600)

    def grant(self, rank: int, timeout: float) -> tuple[Any, float]:
        """Rank ``rank``'s credentials as worker-init fetches them (a new NKey, the bootstrap
        token, SyncWorkerCreds), and how long the call took. The master refuses a rank it
        holds alive (UNAVAILABLE): asked again every 0.25 s, for ``timeout`` seconds in all
        (and at most one more call's deadline)."""
        from aegis_flow.security import worker_init as wi

        cfg = wi.InitConfig(master=self.grpc, job=JOB, namespace=NAMESPACE, worker=str(rank),
                            token=self.token, out=Path(os.devnull), deadline=min(timeout, 20.0),
                            retries=max(1, int(timeout / 0.25)))
        t = time.monotonic()

        def pause(_backoff: float) -> None:
            if time.monotonic() - t > timeout:
                raise BenchError(f"rank {rank}'s credentials: not granted within "
                                 f"{timeout:.0f} s")
            time.sleep(0.25)
        try:
            creds = wi.fetch(cfg, sleep=pause)
        except wi.InitError as exc:
            raise BenchError(f"rank {rank}'s credentials: {exc}") from None
        return creds, time.monotonic() - t


async def refused(url: str) -> bool:
    """Whether the server refuses a connection without credentials."""
    try:
        nc = await connect_quietly(url, {})
    except Exception:  # noqa: BLE001 - nats-py raises several kinds for a refused connect
        return True
    await nc.close()
    return False


async def grant_all(secure: Secure, n: int, threads: int, timeout: float
                    ) -> tuple[list[Any], list[float], float]:
    """Every rank's credentials, ``threads`` calls at once: (creds, seconds per call, wall)."""
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    t = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        got = await asyncio.gather(*(loop.run_in_executor(pool, secure.grant, r, timeout)
                                     for r in range(n)))
    return [c for c, _ in got], [d for _, d in got], time.monotonic() - t


async def renew_all(fleet: Fleet, sessions: list[Any], window: float, timeout: float,
                    alive: Callable[[], None]) -> tuple[list[float], int, float]:
    """Every worker renews its JWT on its own connection once (``Session.renew``: the request,
    the new JWT kept, a reconnect with it), at the point of ``window`` seconds where its key's
    renewal share puts it (``renew_share``: as the supervisor spreads a job's renewals over a
    quarter of the lifetime, compressed; 0: all at once), asked again after RENEW_RETRY s if
    it failed, as ``renew_loop`` does. Returns (seconds from each worker's request to its
    connection back, on the new JWT; failed attempts; seconds until every connection is
    back)."""
    assert fleet.per_conn == 1, "a connection per worker: its own user renews"
    failed = 0
    t = time.monotonic()
    width = RENEW_TO - RENEW_FROM

    async def one(rank: int) -> float:
        nonlocal failed
        session, nc = sessions[rank], fleet.conns[rank]
        await asyncio.sleep(window * (renew_share(session.creds.public_key) - RENEW_FROM)
                            / width)
        while True:
            t1 = time.monotonic()
            try:
                await session.renew(nc)
                break
            except Exception as exc:  # noqa: BLE001 - renew_loop retries any failure
                failed += 1
                if time.monotonic() - t > window + timeout:
                    raise BenchError(f"rank {rank}'s renewal: {exc!r}, still after "
                                     f"{window + timeout:.0f} s") from None
                await asyncio.sleep(RENEW_RETRY)
        while not nc.is_connected:  # it reconnects with its new JWT
            if time.monotonic() - t1 > timeout:
                raise BenchError(f"rank {rank}'s connection not back {timeout:.0f} s after "
                                 "renewing")
            await asyncio.sleep(0.02)
        return time.monotonic() - t1

    runs = [asyncio.ensure_future(one(r)) for r in range(fleet.n)]
    try:
        while not all(r.done() for r in runs):
            alive()
            await asyncio.sleep(0.1)
        took = [r.result() for r in runs]
    finally:
        for r in runs:
            r.cancel()
    return took, failed, time.monotonic() - t


def pdeathsig() -> Callable[[], None] | None:
    """A preexec_fn: the master gets SIGTERM if this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)
    return preexec


def stop_proc(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


async def settle(tap: KvTap, fleet: Fleet, timeout: float, alive: Callable[[], None]) -> None:
    """Until the master's store is quiet: no put for two heartbeat intervals (every worker's
    beat with the newest seq has landed and been stored), plus a second per 2,048 workers: the
    master saves a round's quiet transitions up to four times the last save's duration later,
    and at 8,192 ranks a save of a round takes most of a second."""
    deadline = time.monotonic() + timeout
    quiet_for = 2 * fleet.heartbeat + 0.5 + fleet.n / 2048
    last, since = tap.puts, time.monotonic()
    while time.monotonic() - since < quiet_for:
        alive()
        if time.monotonic() > deadline:
            raise BenchError(f"the store did not go quiet within {timeout:.0f} s")
        await asyncio.sleep(0.1)
        if tap.puts != last:
            last, since = tap.puts, time.monotonic()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(url: str) -> int:
    """Read the master's /metrics once (a Prometheus scrape); its size in bytes."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:  # noqa: S310
        return len(resp.read())


async def ready(url: str, timeout: float, alive: Callable[[], None]) -> None:
    """Until the master's /readyz answers 200 (connected, status loaded, subscribed)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive()
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/readyz", timeout=1) as resp:  # noqa: S310
                if resp.status == 200:
                    return
        await asyncio.sleep(0.02)
    raise BenchError(f"the master was not ready within {timeout:.0f} s")


class Masters:
    """The master process of one N, started again on demand with the same arguments."""

    def __init__(self, cmd: list[str], work: Path, env: dict[str, str]) -> None:
        self.cmd, self.work, self.env = cmd, work, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = work / "master.log"
        self.starts = 0
        self.url = ""  # its HTTP endpoints (/readyz)

    def start(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        self.log = self.work / f"master-{self.starts}.log"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*self.cmd, "--metrics-port", str(port)], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT,
                cwd=self.work, env=self.env, preexec_fn=pdeathsig())  # noqa: PLW1509 - prctl
        return self.proc

    def alive(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is not None:
            tail = self.log.read_text(errors="replace").splitlines()[-15:]
            raise BenchError(f"the master exited with {proc.returncode}:\n" + "\n".join(tail))


async def run_scenarios(res: Result, url: str, nats_pid: int, masters: Masters,
                        args: argparse.Namespace, monitor: str,
                        secure: Secure | None = None) -> None:
    subjects = p.Subjects(NAMESPACE, JOB)
    sessions: list[Any] = []
    if secure is not None:  # every worker's own grant first, as worker-init before the pod
        res.creds = True
        await ready(masters.url, args.timeout, masters.alive)  # its gRPC server is up
        assert masters.proc is not None
        c0 = cpu_seconds(masters.proc.pid)
        got, took, res.mint_s = await grant_all(secure, res.n, args.mint_threads, args.timeout)
        masters.alive()
        res.mint_master_cpu_s = cpu_seconds(masters.proc.pid) - c0
        res.mint_p50_s, res.mint_p99_s = statistics.median(took), pct(took, 99)
        sessions = [Session(c) for c in got]
    fleet = Fleet(url, res.n, 1 if secure else args.per_conn, args.heartbeat,
                  payload=args.payload,
                  options=(lambda r: sessions[r].connect_options()) if secure else None)
    mon = await nats.connect(url, **(secure.harness_options(subjects) if secure else {}))
    if secure is not None:  # the server really asks for credentials
        res.anonymous_refused = await refused(url)
    tap = KvTap()
    await tap.start(mon, subjects.kv_bucket)
    alive = masters.alive

    def pid() -> int:
        assert masters.proc is not None
        return masters.proc.pid

    def seqs_of(order: str) -> list[int]:
        return sorted(s for s, o in fleet.orders.items() if o.order == order)

    async def sample() -> None:
        last_t, last_cpu = time.monotonic(), cpu_seconds(pid())
        while True:
            await asyncio.sleep(args.sample)
            with contextlib.suppress(Exception):
                now, cpu = time.monotonic(), cpu_seconds(pid())
                res.timeline.append([round(now - t0, 1), tap.puts, round(tap.bytes / 1024),
                                     round(100 * (cpu - last_cpu) / (now - last_t)),
                                     round(rss_mib(pid()))])
                last_t, last_cpu = now, cpu

    sampler: asyncio.Task[None] | None = None
    try:
        await fleet.connect()
        res.connections = len(fleet.conns)
        # -- 1. connect + bootcheck ---------------------------------------------------------
        t0 = time.monotonic()
        fleet.start_beats()
        sampler = asyncio.ensure_future(sample())
        await fleet.wait(lambda w: w.order in ("bootcheck", "run"), args.timeout,
                         "the bootcheck order", alive)
        boot = fleet.orders[seqs_of("bootcheck")[0]]
        res.ack_fanin_s = max(boot.at.values()) - t0
        res.bootcheck_spread_s = max(boot.at.values()) - min(boot.at.values())
        await fleet.wait(lambda w: w.order == "run", args.timeout, "the run order", alive)
        run1 = fleet.orders[seqs_of("run")[0]]
        res.bootcheck_round_s = max(run1.at.values()) - min(boot.at.values())
        res.puts_connect, res.bytes_connect, _ = tap.snap()
        await settle(tap, fleet, args.timeout, alive)  # the beats carrying the run seq land
        # -- 2. steady state ----------------------------------------------------------------
        puts1, bytes1, _ = tap.snap()
        known = set(fleet.orders)
        pub0, ka0, w0 = fleet.published, fleet.keepalives, time.monotonic()
        m0, n0, h0 = cpu_seconds(pid()), cpu_seconds(nats_pid), cpu_seconds(os.getpid())
        in0, out0 = await asyncio.to_thread(nats_counts, monitor)
        rss_m, rss_n = [], []
        scraped = w0 - SCRAPE_EVERY + 1.0  # the first scrape 1 s in, then every SCRAPE_EVERY
        while time.monotonic() - w0 < args.steady:
            await asyncio.sleep(min(1.0, max(0.0, args.steady - (time.monotonic() - w0))))
            alive()
            rss_m.append(rss_mib(pid()))
            rss_n.append(rss_mib(nats_pid))
            if time.monotonic() - scraped >= SCRAPE_EVERY:  # as Prometheus would
                scraped = time.monotonic()
                res.scrapes += 1
                res.scrape_bytes = await asyncio.to_thread(scrape, masters.url)
        in1, out1 = await asyncio.to_thread(nats_counts, monitor)
        dt = time.monotonic() - w0
        m1, n1, h1 = cpu_seconds(pid()), cpu_seconds(nats_pid), cpu_seconds(os.getpid())
        res.nats_in_per_s, res.nats_out_per_s = (in1 - in0) / dt, (out1 - out0) / dt
        res.steady_s = dt
        res.msgs_per_s = (fleet.published - pub0) / dt
        res.keepalive_share = (fleet.keepalives - ka0) / max(1, fleet.published - pub0)
        res.master_cpu_pct = 100 * (m1 - m0) / dt
        res.nats_cpu_pct = 100 * (n1 - n0) / dt
        res.harness_cpu_pct = 100 * (h1 - h0) / dt
        res.master_rss_mib = max(rss_m)
        res.nats_rss_mib = max(rss_n)
        res.unexpected_orders = [f"{o.order}@{s}" for s, o in sorted(fleet.orders.items())
                                 if s not in known]
        puts2, bytes2, jobs2 = tap.snap()
        res.puts_steady, res.bytes_steady = puts2 - puts1, bytes2 - bytes1
        if res.unexpected_orders:
            raise BenchError(f"orders during the steady state: {res.unexpected_orders} "
                             "(the master lost workers?)")
        if secure is not None:  # -- 2b. every JWT renewed once ----------------------------
            known = set(fleet.orders)
            old = [s.creds.jwt for s in sessions]
            cpu0 = [cpu_seconds(pid()), cpu_seconds(nats_pid), cpu_seconds(os.getpid())]
            res.renew_window_s = args.renew_window
            took, res.renew_retries, res.renew_s = await renew_all(
                fleet, sessions, args.renew_window, args.timeout, alive)
            res.renew_cpu_s = [b - a for a, b in zip(cpu0, [
                cpu_seconds(pid()), cpu_seconds(nats_pid), cpu_seconds(os.getpid())],
                strict=True)]
            res.renew_p50_s, res.renew_p99_s = statistics.median(took), pct(took, 99)
            jwts = await asyncio.to_thread(connected_jwts, monitor, res.n + 16)
            res.renew_connected = sum(s.creds.jwt in jwts and s.creds.jwt != o
                                      for s, o in zip(sessions, old, strict=True))
            if res.renew_connected != res.n:
                raise BenchError(f"after renewing, {res.renew_connected} of {res.n} workers "
                                 "are connected with their new JWT")
            await asyncio.sleep(2.0)  # the beats on the new connections; nothing may change
            alive()
            res.renew_orders = [f"{o.order}@{s}" for s, o in sorted(fleet.orders.items())
                                if s not in known]
            if res.renew_orders:
                raise BenchError(f"orders while the workers renewed: {res.renew_orders} "
                                 "(the master lost workers?)")
        # -- 3. one fault ---------------------------------------------------------------------
        run_seq = fleet.workers[0].seq
        cpu0 = [cpu_seconds(pid()), cpu_seconds(nats_pid), cpu_seconds(os.getpid())]
        tf = time.monotonic()
        await fleet.report_error(res.n - 1)
        await fleet.wait(lambda w: w.seq > run_seq, args.timeout, "the order after the fault",
                         alive)
        nxt = min(s for s in fleet.orders if s > run_seq)
        res.next_order = fleet.orders[nxt].order
        lat = [fleet.orders[nxt].at[w.rank] - tf for w in fleet.workers
               if w.rank in fleet.orders[nxt].at]
        if len(lat) != res.n:  # a worker jumped past it (a newer order came first)
            raise BenchError(f"only {len(lat)} of {res.n} workers held order {nxt}")
        res.fault_p50_s, res.fault_p99_s = statistics.median(lat), pct(lat, 99)
        res.fault_first_s = min(lat)
        res.fault_max_s = max(lat)
        await fleet.wait(lambda w: w.order == "run" and w.seq > nxt, args.timeout,
                         "the restart (run) order", alive)
        restart = fleet.orders[min(s for s, o in fleet.orders.items()
                                   if s > nxt and o.order == "run")]
        res.troubleshoot_round_s = max(restart.at.values()) - max(fleet.orders[nxt].at.values())
        res.fault_to_restart_s = max(restart.at.values()) - tf
        back_at = [t - tf for t in restart.at.values()]
        res.restart_p50_s, res.restart_p99_s = statistics.median(back_at), pct(back_at, 99)
        res.fault_cpu_s = [b - a for a, b in zip(cpu0, [cpu_seconds(pid()), cpu_seconds(nats_pid),
                                                       cpu_seconds(os.getpid())], strict=True)]
        await settle(tap, fleet, args.timeout, alive)  # the beats carrying the new seq
        puts3, bytes3, jobs3 = tap.snap()
        res.puts_fault, res.bytes_fault, res.saves_fault = (puts3 - puts2, bytes3 - bytes2,
                                                            jobs3 - jobs2)
        res.master_rss_end_mib = rss_mib(pid())
        # -- 4. a node fault with one replacement --------------------------------------------
        run_seq = fleet.workers[0].seq
        victim = 1 % res.n
        fleet.workers[victim].gone = True
        tl = time.monotonic()
        if secure is not None:  # its node is gone, and with it the pod's own connection
            with contextlib.suppress(Exception):
                await asyncio.wait_for(fleet.conn_of(victim).close(), 5)
        await fleet.wait(lambda w: w.gone or (w.order == "hold" and w.seq > run_seq),
                         args.timeout, "the hold order after a lost rank", alive)
        hold = min(s for s, o in fleet.orders.items() if s > run_seq and o.order == "hold")
        res.node_lost_s = max(fleet.orders[hold].at.values()) - tl
        if secure is not None:  # the new pod's worker-init: a new key, granted now it is lost
            creds, res.replace_mint_s = await asyncio.to_thread(secure.grant, victim,
                                                                args.timeout)
            sessions[victim] = Session(creds)
            await fleet.reconnect(victim)
        fresh = fleet.replace(victim)
        await fleet.wait(lambda w: w.order == "run" and w.seq > hold, args.timeout,
                         "the run order after the replacement", alive)
        back = fleet.orders[min(s for s, o in fleet.orders.items()
                                if s > hold and o.order == "run")]
        assert fresh.first_beat is not None
        res.replace_to_run_s = max(back.at.values()) - fresh.first_beat
        # -- 5. a master SIGKILL and resume ----------------------------------------------------
        await settle(tap, fleet, args.timeout, alive)  # the store holds every transition
        # The beats pause while the master is swapped, so the status the new master holds
        # when it stops is the one it rebuilt, with no event of its own (a kill and a start
        # take less than the lost timeout: no rank is judged lost meanwhile).
        fleet.paused = True
        await asyncio.sleep(0.5)
        known = set(fleet.orders)
        assert masters.proc is not None
        masters.proc.kill()
        masters.proc.wait()
        before, _ = await stored_status(mon, subjects.kv_bucket)
        tr = time.monotonic()
        masters.start()
        await ready(masters.url, args.timeout, alive)
        res.resume_ready_s = time.monotonic() - tr
        stop_proc(masters.proc)  # SIGTERM: it writes the status it holds to --status-file
        rebuilt = json.loads((masters.work / "status.json").read_bytes())["status"]
        res.resume_same_status = rebuilt == before
        masters.start()  # and the job goes on under a third master
        await ready(masters.url, args.timeout, alive)
        fleet.paused = False
        await asyncio.sleep(3.0)  # the workers beat on; nothing may change
        alive()
        res.resume_orders = [f"{o.order}@{s}" for s, o in sorted(fleet.orders.items())
                             if s not in known]
        if not res.resume_same_status:
            (masters.work / "before-kill.json").write_text(json.dumps(before, indent=1))
            diff = {k: (before.get(k), rebuilt.get(k)) for k in set(before) | set(rebuilt)
                    if before.get(k) != rebuilt.get(k) and k != "workers"}
            pods = [r for r, (a, b) in enumerate(zip(before["workers"], rebuilt["workers"],
                                                     strict=True)) if a != b]
            raise BenchError(f"the resumed master's status differs: {diff}, ranks {pods[:10]}")
        if res.resume_orders:
            raise BenchError(f"orders after the resume: {res.resume_orders}")
        res.job_bytes = (await stored_status(mon, subjects.kv_bucket))[1]
        res.max_put_bytes = tap.max_put
        res.seq_end = max(fleet.orders)
        res.ok = True
    finally:
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(BaseException):
                await sampler
        await fleet.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(mon.close(), 5)


def run_one(n: int, args: argparse.Namespace, base: Path) -> Result:
    res = Result(n)
    work = base / f"n{n}"
    work.mkdir(parents=True)
    secure: Secure | None = None
    config: Path | None = None
    if args.creds:  # operator mode, as `aegis-flow run` by default
        from aegis_flow.security.operator import bootstrap
        from aegis_flow.security.tokens import new_token

        auth = bootstrap(work / "auth")
        config = auth.write_server_config()
        secure = Secure(auth.path, new_token(), f"127.0.0.1:{free_port()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:  # the server's monitoring port (/varz: its message counts)
        sock.bind(("127.0.0.1", 0))
        mport = sock.getsockname()[1]
    with EmbeddedNats(work / "nats", config_file=config,
                      extra_args=["-m", str(mport)]) as server:
        masters = Masters(
            [PYTHON, "-m", "aegis_flow.master", "--job", JOB, "--namespace", NAMESPACE,
             "--workers", str(n), "--nats-url", server.url,
             "--connect-timeout", str(args.timeout), "--lost-timeout",
             str(args.lost_timeout), "--replace-timeout", str(args.timeout),
             "--metrics-addr", "127.0.0.1",
             "--status-file", str(work / "status.json"), "--log-level", args.master_log_level,
             *([] if args.keepalives else ["--no-keepalives"]),
             *(secure.master_args(work) if secure else [])],
            work, env)
        try:
            masters.start()
            coro = run_scenarios(res, server.url, server.pid, masters, args,
                                 f"http://127.0.0.1:{mport}", secure)
            if args.loop == "uvloop":
                import uvloop

                uvloop.run(coro)
            else:
                asyncio.run(coro)
        except BenchError as exc:
            res.error = str(exc)
            lines = masters.log.read_text(errors="replace").splitlines()
            lost = sum("lost before start" in line for line in lines)
            if lost:
                res.error += f"\n  the master forgot {lost} acked ranks as lost before start (T7p)"
            tail = lines[-8:]
            if tail and "master exited" not in res.error:
                res.error += "\n  master log: " + "\n  master log: ".join(tail)
        finally:
            stop_proc(masters.proc)
    return res


# -- output ---------------------------------------------------------------------------------
def _f(x: float, digits: int = 2) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


ROUND_HEADER = ["N", "conns", "acks→bootcheck at all (s)", "bootcheck round (s)",
                "fault→next order first (s)", "p50 (s)", "p99 (s)", "max (s)",
                "troubleshoot round (s)", "fault→restart p50 (s)", "p99 (s)", "at all (s)",
                "CPU s in it: master / nats / harness"]
STEADY_HEADER = ["N", "msgs/s in", "keep-alives", "master CPU %", "master RSS MiB", "nats CPU %",
                 "nats RSS MiB", "nats msgs/s in", "nats msgs/s out", "harness CPU %"]
STORE_HEADER = ["N", "job record KiB", "KV puts connect+boot", "MiB", "KV puts steady", "KiB",
                "KV puts fault→restart", "KiB", "saves", "KiB per save", "largest put KiB"]
CREDS_HEADER = ["N", "grants (s)", "one grant p50 (s)", "p99 (s)", "master CPU s",
                "replacement's grant (s)", "renewals over (s)", "first→all back (s)",
                "one renewal+reconnect p50 (s)", "p99 (s)", "retried",
                "CPU s in it: master / nats / harness"]
RESILIENCE_HEADER = ["N", "rank silent→hold at all (s)", "new pod's first beat→run at all (s)",
                     "master SIGKILL→new master ready (s)", "rebuilt status = stored",
                     "orders after the resume"]


def round_rows(results: Sequence[Result]) -> list[list[str]]:
    return [[str(r.n), str(r.connections), _f(r.ack_fanin_s), _f(r.bootcheck_round_s),
             _f(r.fault_first_s, 3), _f(r.fault_p50_s, 3), _f(r.fault_p99_s, 3),
             _f(r.fault_max_s, 3),
             _f(r.troubleshoot_round_s), _f(r.restart_p50_s), _f(r.restart_p99_s),
             _f(r.fault_to_restart_s),
             " / ".join(_f(x, 1) for x in r.fault_cpu_s) or "-"] for r in results]


def steady_rows(results: Sequence[Result]) -> list[list[str]]:
    return [[str(r.n), _f(r.msgs_per_s, 0), _f(100 * r.keepalive_share, 0) + " %",
             _f(r.master_cpu_pct, 1), _f(r.master_rss_mib, 0),
             _f(r.nats_cpu_pct, 0), _f(r.nats_rss_mib, 0), _f(r.nats_in_per_s, 0),
             _f(r.nats_out_per_s, 0), _f(r.harness_cpu_pct, 0)]
            for r in results]


def store_rows(results: Sequence[Result]) -> list[list[str]]:
    return [[str(r.n), _f(r.job_bytes / 1024, 1), str(r.puts_connect),
             _f(r.bytes_connect / 2**20, 2), str(r.puts_steady), _f(r.bytes_steady / 1024, 1),
             str(r.puts_fault), _f(r.bytes_fault / 1024, 1), str(r.saves_fault),
             _f(r.bytes_fault / r.saves_fault / 1024 if r.saves_fault else float("nan"), 1),
             _f(r.max_put_bytes / 1024, 1)] for r in results]


def resilience_rows(results: Sequence[Result]) -> list[list[str]]:
    return [[str(r.n), _f(r.node_lost_s), _f(r.replace_to_run_s), _f(r.resume_ready_s),
             ("yes" if r.resume_same_status else "no") if r.ok else "-",
             str(len(r.resume_orders)) if r.ok else "-"] for r in results]


def creds_rows(results: Sequence[Result]) -> list[list[str]]:
    return [[str(r.n), _f(r.mint_s), _f(r.mint_p50_s, 3), _f(r.mint_p99_s, 3),
             _f(r.mint_master_cpu_s, 1), _f(r.replace_mint_s, 2), _f(r.renew_window_s, 0),
             _f(r.renew_s),
             _f(r.renew_p50_s, 3), _f(r.renew_p99_s, 3), str(r.renew_retries),
             " / ".join(_f(x, 1) for x in r.renew_cpu_s) or "-"]
            for r in results if r.creds]


def render_all(results: Sequence[Result], *, markdown: bool) -> str:
    parts = [tables.render(ROUND_HEADER, round_rows(results), markdown=markdown), "",
             tables.render(STEADY_HEADER, steady_rows(results), markdown=markdown), "",
             tables.render(STORE_HEADER, store_rows(results), markdown=markdown), "",
             tables.render(RESILIENCE_HEADER, resilience_rows(results), markdown=markdown)]
    if any(r.creds for r in results):
        parts += ["", tables.render(CREDS_HEADER, creds_rows(results), markdown=markdown)]
    errors = [f"N={r.n}: {r.error}" for r in results if r.error]
    if errors:
        parts += ["", "Failed:", *errors]
    return "\n".join(parts)


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({model or platform.processor()}), {platform.platform()}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="256,1024",
                    help="comma-separated worker counts (default 256,1024)")
    ap.add_argument("--steady", type=float, default=60.0,
                    help="seconds of steady-state heartbeats (default 60)")
    ap.add_argument("--heartbeat", type=float, default=0.5,
                    help="heartbeat interval of every worker (default 0.5, the supervisor's)")
    ap.add_argument("--payload", choices=("full", "bare"), default="full",
                    help="heartbeats while running: 'full' carries what a worker of 8 GPUs "
                         "sends (step, counts, a resource sample of 8 processes and 8 GPUs); "
                         "'bare' none of those numbers (default full)")
    ap.add_argument("--keepalives", action=argparse.BooleanOptionalAction, default=True,
                    help="the master asks for keep-alives between full heartbeats (default; "
                         "--no-keepalives: every heartbeat in full, as before 2026-12-04)")
    ap.add_argument("--per-conn", type=int, default=256,
                    help="simulated workers per NATS connection (default 256; 1 with --creds)")
    ap.add_argument("--creds", action="store_true",
                    help="operator mode, as a job by default: every worker fetches its own "
                         "credentials from the master (SyncWorkerCreds) and connects with them "
                         "on a connection of its own")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                    help="the harness's own event loop (uvloop: less of the machine for "
                         "simulating N connections; needs `pip install uvloop`)")
    ap.add_argument("--renew-window", type=float, default=30.0,
                    help="with --creds: seconds over which every worker renews its JWT once, "
                         "where its key puts it, as the supervisor spreads them over a "
                         "quarter of the lifetime (900 s for a 1 h JWT; default 30: 30 times "
                         "denser); 0: all at once, as before 2026-12-04")
    ap.add_argument("--mint-threads", type=int, default=32,
                    help="with --creds: credential fetches at once (default 32)")
    ap.add_argument("--lost-timeout", type=float, default=3.0,
                    help="the master's --lost-timeout (default 3, the master's)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds each round may take before the run is failed (default 120)")
    ap.add_argument("--master-log-level", default="WARNING",
                    help="the master's --log-level (INFO shows every transition)")
    ap.add_argument("--sample", type=float, default=5.0,
                    help="seconds between samples of the store and the master (default 5)")
    ap.add_argument("--keep", help="keep the work folders (logs, status files) here")
    ap.add_argument("--out", help="write the tables here (markdown, with date and machine)")
    ap.add_argument("--json", help="write the raw numbers here (JSON)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.workers.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--workers: a comma-separated list of worker counts, not {args.workers!r}")
    if not sizes or min(sizes) < 2:
        ap.error("--workers: every count must be at least 2 (scenario 4 replaces rank 1)")
    if args.loop == "uvloop":
        import importlib.util

        if importlib.util.find_spec("uvloop") is None:
            ap.error("--loop uvloop: uvloop is not installed here (pip install uvloop; the "
                     "project's dev extra has it)")
    if args.renew_window < 0:
        ap.error("--renew-window must be 0 (all at once) or more seconds")
    for name in ("per_conn", "mint_threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    base = Path(tempfile.mkdtemp(prefix="aegis-scale-"))
    results: list[Result] = []
    try:
        for n in sizes:
            started = time.monotonic()
            print(f"N={n} ...", file=sys.stderr, flush=True)
            res = run_one(n, args, base)
            print(f"N={n}: {'ok' if res.ok else 'FAILED: ' + res.error} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
            if not res.ok:  # where the time went
                print("  [s, KV puts, KV KiB, master CPU %, RSS MiB]: "
                      + " ".join(map(str, res.timeline)), file=sys.stderr, flush=True)
            results.append(res)
    finally:
        if args.keep:
            shutil.copytree(base, args.keep, dirs_exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)
    print(render_all(results, markdown=False))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.out:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        per_conn = 1 if args.creds else args.per_conn
        cmd = " ".join(["python", "bench/scale.py", *(argv if argv is not None else
                                                      sys.argv[1:])])
        Path(args.out).write_text(
            f"`{cmd}` — {stamp}, {machine()}; heartbeat {args.heartbeat} s, steady "
            f"{args.steady:.0f} s, {per_conn} worker{'s' if per_conn > 1 else ''} per "
            f"connection{', credentials' if args.creds else ''}"
            f"{f', renewals over {args.renew_window:.0f} s' if args.creds else ''}, "
            f"harness loop {args.loop}, "
            f"master "
            f"--lost-timeout {args.lost_timeout}\n\n"
            + render_all(results, markdown=True) + "\n")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
