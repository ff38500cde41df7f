"""The master's asyncio shell: NATS in → ``machine.step`` → carry out the effects.

Side effects (all here, nowhere in the core): a NATS connection, the JetStream KV store
(``store.py``), timers (heartbeat loss, connect timeout, replacement deadline), log output.
The status is persisted after every transition, before any order goes out; a master restarted
mid-run resumes from the stored status while the workers keep training.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.master.store import KVStore, Store, StoreConflict, decode_doc, encode_doc

if TYPE_CHECKING:
    from aegis_flow.master.creds import CredsService
    from aegis_flow.master.observer import Observer

log = logging.getLogger("aegis_flow.master")


@dataclass(frozen=True)
class MasterConfig:
    job: str
    workers: int
    max_retry: int = 3
    namespace: str = "default"
    nats_url: str = "nats://127.0.0.1:4222"
    flap_limit: int = 3
    connect_timeout: float = 60.0  # Pending → Independent (T15)
    lost_timeout: float = 3.0  # no heartbeat for this long → Lost
    replace_timeout: float = 120.0  # Restarting longer than this → Stop (T12)
    linger: float = 5.0  # after the end: keep re-sending the final order to laggards
    tick: float = 0.05
    rendezvous_addr: str = "127.0.0.1"
    status_file: str = ""  # also write the final status document here (local mode)
    slow_fraction: float = 0.5  # a rank below this share of its peers' median is slow
    # observability (observer.py, http.py): None = no HTTP endpoint, 0 = a free port
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    port_file: str = ""  # write the bound metrics port here
    log_dir: str = ""  # the fault log's directory ("" = no fault log)
    gpu_type: str = ""  # the gpu_type label ("" = what the workers report)
    observe: bool = True  # record metrics and the fault log at all


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


class Master:
    def __init__(self, cfg: MasterConfig, *, store: Store | None = None,
                 security: CredsService | None = None, nodes: Any = None) -> None:
        self.cfg = cfg
        self.security = security  # per-worker NATS credentials (master/creds.py), or none
        self.nodes = nodes  # a k8s.api.NodeApi on Kubernetes: Quarantine labels/taints the node
        self.node_jobs: list[asyncio.Future[None]] = []
        self.subjects = p.Subjects(cfg.namespace, cfg.job)
        self.store = store
        self.status = m.initial_status(cfg.workers, cfg.max_retry, flap_limit=cfg.flap_limit)
        self.revision = 0
        self.nc: Any = None
        self.last_seen: dict[int, float] = {}
        self._last_tick: float | None = None
        self._loss_grace_until = 0.0
        self.phase_since = time.monotonic()
        self.started = time.monotonic()
        self.events: collections.deque[str] = collections.deque(maxlen=30)
        self.stats: collections.Counter[str] = collections.Counter()
        self.ended_at: float | None = None
        self.lock = asyncio.Lock()
        self.applied: list[tuple[str, float]] = []  # (event type, wall time applied): benchmarks
        self._ports: dict[int, int] = {}
        self.culprit: int | None = None  # the rank whose failure started this recovery
        self.failures: dict[int, int] = {}  # counted failures by rank (for escalation)
        self.causes: dict[int, dict[str, str]] = {}  # last classified cause by rank
        self.hang_rank: int | None = None
        self.replaced = False  # a worker was replaced since the job last ran
        self.env_reports: dict[int, dict[str, Any]] = {}
        self.bandwidth: dict[int, float] = {}
        self._timing = bool(os.environ.get("AEGIS_TIMING"))
        self.ready = False  # connected to NATS and the status loaded (/readyz)
        self.observer: Observer | None = None
        if cfg.observe:
            from aegis_flow.master.observer import make_observer

            self.observer = make_observer(job=cfg.job, namespace=cfg.namespace,
                                          workers=cfg.workers, gpu_type=cfg.gpu_type,
                                          log_dir=cfg.log_dir)

    # -- persistence ------------------------------------------------------------------------
    def _doc(self) -> bytes:
        return encode_doc(self.status, events=list(self.events), stats=dict(self.stats),
                          updated=time.time(), max_retry=self.cfg.max_retry,
                          failures={str(r): n for r, n in self.failures.items()},
                          causes={str(r): c for r, c in self.causes.items()})

    async def _persist(self) -> None:
        if self.store is not None:
            self.revision = await self.store.save(self._doc(), self.revision)

    async def _load(self) -> None:
        if self.store is None:
            return
        raw, rev = await self.store.load()
        if raw is None:
            await self._persist()
            return
        status, doc = decode_doc(raw)
        if len(status.workers) != self.cfg.workers:
            raise ValueError(f"stored job has {len(status.workers)} workers, not "
                             f"{self.cfg.workers}")
        self.status, self.revision = status, rev
        self.events.extend(doc.get("events", []))
        self.stats.update(doc.get("stats", {}))
        self.failures = {int(r): int(n) for r, n in (doc.get("failures") or {}).items()}
        self.causes = {int(r): dict(c) for r, c in (doc.get("causes") or {}).items()}
        self._note(f"resumed from stored status: {status.phase.value}, seq {status.seq}, "
                   f"retries {status.retries}")

    def _note(self, text: str, level: int = logging.INFO) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.events.append(f"{stamp} {text}")
        log.log(level, text)

    # -- the one executor -------------------------------------------------------------------
    async def apply(self, event: m.Event) -> None:
        async with self.lock:
            before_status = self.status
            before = before_status.phase
            new, effects = m.step(self.status, event, now=time.time())
            self.status = new
            self.applied.append((type(event).__name__, time.time()))
            if self.observer is not None:
                self.observer.transition(before_status, new, event, effects, time.time())
            if self._timing and not isinstance(event, m.Ack) and new is not before_status:
                log.info("AEGIS_APPLIED %s %s %.6f", type(event).__name__, new.phase.value,
                         self.applied[-1][1])
            if before is not new.phase:
                self.phase_since = time.monotonic()
                if new.phase.terminal:
                    self.ended_at = time.monotonic()
                    if self.security is not None:
                        self.security.job_ended()
            for effect in effects:
                await self._execute(effect)

    async def _execute(self, effect: m.Effect) -> None:
        now = time.time()
        if isinstance(effect, m.Persist):
            await self._persist()
        elif isinstance(effect, m.Log):
            if effect.ignored is None:
                self._note(effect.message, logging.getLevelName(effect.level.upper()))
            else:
                self.stats[f"ignored_{effect.ignored.value}"] += 1
                log.debug(effect.message)
        elif isinstance(effect, m.Broadcast):
            await self._publish(self.subjects.broadcast, effect, now)
        elif isinstance(effect, m.Send):
            await self._publish(self.subjects.worker(effect.rank), effect, now)
        elif isinstance(effect, m.ExitWorker):
            await self._publish(self.subjects.worker(effect.rank), effect, now)
            if self.security is not None:  # its successor gets new credentials
                self.security.evict(effect.rank)
        elif isinstance(effect, m.Quarantine):
            self.stats["quarantined"] += 1
            self._note(f"node {effect.node} of rank {effect.rank} quarantined", logging.WARNING)
            if self.nodes is not None and effect.node:  # the client blocks: a worker thread
                self.node_jobs.append(asyncio.get_running_loop().run_in_executor(
                    None, self._quarantine_node, effect))

    def _quarantine_node(self, effect: m.Quarantine) -> None:
        """Label, taint and annotate the node on Kubernetes (k8s.ops; runs in a thread)."""
        from aegis_flow.k8s import ops

        reason = f"hardware fault of rank {effect.rank}"
        for r in ops.quarantine(self.nodes, [effect.node], reason=reason, now=time.time(),
                                by=self.cfg.job):
            if r.error:
                log.warning("quarantining node %s failed: %s", r.node, r.error)
            else:
                log.warning("node %s: %s (%s)", r.node, r.action, r.reason)

    async def _publish(self, subject: str, effect: m.Broadcast | m.Send | m.ExitWorker,
                       now: float) -> None:
        extra: dict[str, Any] = {"restart_count": self.status.recover_count}
        order = effect.order if not isinstance(effect, m.ExitWorker) else m.Order.EXIT
        if order in (m.Order.RUN, m.Order.RUN_INDEPENDENT):
            extra.update(self._run_extra(effect.seq))
        elif order in (m.Order.BOOTCHECK, m.Order.TROUBLESHOOT):
            extra.update(self._check_extra(order, effect.seq))
        msg = p.order_message(self.subjects, effect, now=now, extra=extra)
        await self.nc.publish(subject, msg.encode())

    def _run_extra(self, seq: int) -> dict[str, Any]:
        """Every run epoch gets a fresh rendezvous: a port derived from nothing stale."""
        port = self._ports.get(seq)
        if port is None:
            port = free_port(self.cfg.rendezvous_addr)
            self._ports = {seq: port}
        return {"rendezvous": {"addr": self.cfg.rendezvous_addr, "port": port}}

    def _check_extra(self, order: m.Order, seq: int) -> dict[str, Any]:
        """The check plan for every rank (collectives need all of them, so one plan)."""
        from aegis_flow.steps.classify import Cause
        from aegis_flow.steps.diagnose import plan_checks

        if order is m.Order.BOOTCHECK:
            plan = ["runtime", "env", "io", "gpu", "rdma", "health"]
        else:
            culprit = self.culprit
            raw = self.causes.get(culprit) if culprit is not None else None
            cause = Cause(raw["code"], raw["class"]) if raw else None
            plan = plan_checks(cause, self.failures.get(culprit, 0) if culprit is not None
                               else 0, self.hang_rank is not None,
                               after_replacement=self.replaced)
        data: dict[str, Any] = {
            "checks": plan, "failures": {str(r): n for r, n in self.failures.items()},
            "causes": {str(r): c for r, c in self.causes.items()},
            "hang_rank": self.hang_rank}
        if any(c in ("health", "allreduce_connection", "allreduce_performance") for c in plan):
            data.update(self._run_extra(seq))
        return data

    def _observe(self, msg: p.Message, event: m.Event) -> None:
        """What the runtime (not the pure machine) keeps: causes, failures, reports."""
        before = self.status
        if isinstance(event, m.Error | m.HangWithQuit) and event.seq == before.seq and (
                before.phase is m.Phase.RUNCOMMAND):
            self.culprit = event.rank
            self.failures[event.rank] = self.failures.get(event.rank, 0) + 1
            self.hang_rank = event.rank if isinstance(event, m.HangWithQuit) else None
            code = msg.data.get("cause_code")
            if isinstance(event, m.HangWithQuit):
                self.causes[event.rank] = {"code": "hang", "class": "slow"}
            elif isinstance(code, str):
                self.causes[event.rank] = {"code": code,
                                           "class": str(msg.data.get("cause_class", ""))}
        if isinstance(event, m.Finish) and event.seq == before.seq:
            if before.phase is m.Phase.BOOTCHECKING:
                for r in msg.data.get("results") or []:
                    if isinstance(r, dict) and r.get("check_type") == "env":
                        self.env_reports[event.rank] = dict(r.get("data") or {})
            for r in msg.data.get("results") or []:
                if isinstance(r, dict) and r.get("check_type") == "allreduce_performance":
                    bw = (r.get("data") or {}).get("rank_bandwidth_gbps")
                    if isinstance(bw, int | float):
                        self.bandwidth[event.rank] = float(bw)

    def _after(self, before: m.Status) -> None:
        """Cross-worker verdicts once a round of checks is complete."""
        st = self.status
        if before.phase is m.Phase.BOOTCHECKING and st.phase is not before.phase:
            if len(self.env_reports) == self.cfg.workers:
                from aegis_flow.steps.env import compare_env

                verdict = compare_env(self.env_reports)
                if not verdict.ok:
                    self._note(f"bootcheck: {verdict.detail}", logging.WARNING)
            self.env_reports.clear()
        if before.phase in (m.Phase.BOOTCHECKING, m.Phase.TROUBLESHOOTING) and (
                st.phase is not before.phase):
            if len(self.bandwidth) == self.cfg.workers:
                from aegis_flow.steps.collective import flag_slow

                for r in flag_slow(self.bandwidth, self.cfg.slow_fraction):
                    self.stats["slow_flagged"] += 1
                    self._note(f"rank {r} is slow: {self.bandwidth[r]:.3f} GB/s vs its peers",
                               logging.WARNING)
            self.bandwidth.clear()
        if st.phase is m.Phase.RESTARTING:
            self.replaced = True
        elif st.phase is m.Phase.RUNCOMMAND:
            self.replaced = False

    # -- input ------------------------------------------------------------------------------
    async def on_message(self, raw: bytes, subject: str | None = None) -> None:
        """One message from NATS. ``subject``: where it came; a report must claim the rank its
        subject names (only that rank may publish there). None: an in-process call."""
        try:
            sender = (None if subject is None or subject == self.subjects.control
                      else self.subjects.sender_rank(subject))
            msg = p.decode(raw, job=self.cfg.job, namespace=self.cfg.namespace)
            p.check_sender(msg, sender)
            event = p.to_event(msg)
        except p.ProtocolError as exc:
            self.stats["foreign" if exc.foreign else "invalid"] += 1
            log.warning("dropped a message: %s", exc.reason)
            return
        if isinstance(event, m.CheckpointDone | m.Stop):
            pass
        elif not 0 <= msg.rank < self.cfg.workers:
            self.stats["invalid"] += 1
            log.warning("dropped a message from unknown rank %r", msg.rank)
            return
        else:
            self.last_seen[msg.rank] = time.monotonic()
        if self.observer is not None:
            self.observer.message(msg, event, time.time())
        try:
            self._observe(msg, event)
            before = self.status
            await self.apply(event)
            self._after(before)
        except m.MalformedEvent as exc:
            self.stats["invalid"] += 1
            log.warning("dropped a malformed event: %s", exc)

    async def _cb(self, msg: Any) -> None:
        await self.on_message(msg.data, msg.subject)

    # -- timers -----------------------------------------------------------------------------
    async def tick(self) -> None:
        now = time.monotonic()
        stall = now - (self._last_tick if self._last_tick is not None else now)
        self._last_tick = now
        if stall > max(1.0, self.cfg.lost_timeout / 3):
            # This process was starved (a loaded machine, a stopped VM): the heartbeats that
            # arrived meanwhile are still queued. Let them be processed before judging silence.
            self._loss_grace_until = now + max(0.5, 10 * self.cfg.tick)
            log.warning("master loop stalled for %.1f s; loss detection paused briefly", stall)
        st = self.status
        if st.phase is m.Phase.PENDING and now - self.started > self.cfg.connect_timeout:
            await self.apply(m.ConnectTimeout())
            return
        if st.phase is m.Phase.RESTARTING and now - self.phase_since > self.cfg.replace_timeout:
            missing = [p.rank for p in st.workers if p.restarting]
            await self.apply(m.Stop(f"rank(s) {missing} not back within "
                                    f"{self.cfg.replace_timeout:.0f} s"))
            return
        if st.phase.terminal or now < self._loss_grace_until:
            return
        for pod in st.workers:
            if pod.incarnation is None or pod.restarting:
                continue
            seen = self.last_seen.get(pod.rank, self.started)
            if now - seen > self.cfg.lost_timeout:
                self.last_seen[pod.rank] = now  # one Lost per silence
                await self.apply(m.Lost(pod.rank))

    async def run(self) -> int:
        """Serve until the job ends: 0 succeeded, 1 failed, 2 conflict, 3 independent,
        4 NATS unreachable."""
        import nats

        http = self._serve_http()
        try:
            self.nc = await asyncio.wait_for(nats.connect(
                self.cfg.nats_url, ping_interval=2, max_outstanding_pings=3,
                max_reconnect_attempts=-1, reconnect_time_wait=0.5, allow_reconnect=True,
                connect_timeout=2,
                **(self.security.connect_options() if self.security else {})), timeout=10)
        except Exception as exc:  # noqa: BLE001 - no NATS: the workers will run on their own
            log.error("cannot reach NATS at %s (%s): workers fall back to plain runs",
                      self.cfg.nats_url, exc)
            return 4
        try:
            if self.store is None:
                self.store = await KVStore.open(self.nc, self.subjects.kv_bucket)
            await self._load()
            if self.security is not None:
                if self.status.phase.terminal:
                    self.security.job_ended()
                await self.security.start(self.nc)
            self.started = self.phase_since = time.monotonic()
            await self.nc.subscribe(self.subjects.masters, cb=self._cb)
            await self.nc.subscribe(self.subjects.control, cb=self._cb)
            if self.observer is not None:
                self.observer.loaded(self.status, resumed=self.revision > 1, now=time.time())
            self.ready = True
            while True:
                await self.tick()
                if self.ended_at is not None and (
                        time.monotonic() - self.ended_at > self.cfg.linger or self._all_gone()):
                    break
                if self.status.phase.terminal and self.ended_at is None:
                    self.ended_at = time.monotonic()  # resumed after the end
                await asyncio.sleep(self.cfg.tick)
        except StoreConflict as exc:
            log.error("another master owns job %s: %s", self.cfg.job, exc)
            return 2
        finally:
            if self.security is not None:
                await self.security.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), 2)
        self._note(summary(self.status))
        if self.observer is not None:
            self.observer.close(summary(self.status), time.time())
        if http is not None:
            http.stop()
        if self.cfg.status_file:
            tmp = self.cfg.status_file + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(self._doc())
            os.replace(tmp, self.cfg.status_file)
        return {m.Phase.SUCCEED: 0, m.Phase.FAILED: 1, m.Phase.INDEPENDENT: 3}.get(
            self.status.phase, 1)

    def _serve_http(self) -> Any:
        """Start /metrics, /healthz, /readyz, /progress (http.py) if a port was asked for."""
        if self.cfg.metrics_port is None or self.observer is None:
            return None
        from aegis_flow.master.http import MetricsServer

        obs = self.observer
        try:
            server = MetricsServer(
                render=obs.render, progress=obs.progress, addr=self.cfg.metrics_addr,
                port=self.cfg.metrics_port,
                ready=lambda: self.ready and self.nc is not None and self.nc.is_connected)
        except OSError as exc:  # the job runs on without an endpoint; never the reason it stops
            log.error("no metrics endpoint: %s", exc)
            return None
        server.start()
        log.info("metrics on %s/metrics", server.url)
        if self.cfg.port_file:
            with open(self.cfg.port_file + ".tmp", "w") as fh:
                fh.write(f"{server.port}\n")
            os.replace(self.cfg.port_file + ".tmp", self.cfg.port_file)
        return server

    def _all_gone(self) -> bool:
        now = time.monotonic()
        return all(now - self.last_seen.get(r, 0.0) > 3 * self.cfg.tick + 1.0
                   for r in range(self.cfg.workers))


def summary(status: m.Status) -> str:
    """The user's one-line summary (DESIGN.md §2, observability)."""
    return (f"job {status.phase.value}: max restarts {status.max_retry}, restarted "
            f"{status.recover_count} times; hardware faults rescheduled "
            f"{len(status.error_nodes)} times")
