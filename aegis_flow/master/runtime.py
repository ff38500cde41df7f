"""The master's asyncio shell: NATS in → ``machine.step`` → carry out the effects.

Side effects (all here, nowhere in the core): a NATS connection, the JetStream KV store
(``store.py``), timers (heartbeat loss, connect timeout, replacement deadline), log output,
and with ``nodes`` a daemon thread per quarantine that labels the node on Kubernetes (an
ending master waits ``NODE_JOBS_WAIT`` s for them, no longer).
The status is persisted after every transition, before any order goes out; a master restarted
mid-run resumes from the stored status while the workers keep training.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.master import policy
from aegis_flow.master.anomaly import Anomalies
from aegis_flow.master.model import RDZV_RANK0, RDZV_SPAN, counts, evolve, replaced
from aegis_flow.master.placement import Placement, trusted_node
from aegis_flow.master.slowness import SlowDetector
from aegis_flow.master.store import (
    KVStore,
    Store,
    StoreConflict,
    decode_doc,
    encode_doc,
    encode_job,
    encode_worker,
    job_layout,
)
from aegis_flow.settings import MASTER
from aegis_flow.supervisor.waiting import close_within

if TYPE_CHECKING:
    from aegis_flow.master.creds import CredsService
    from aegis_flow.master.observer import Observer

log = logging.getLogger("aegis_flow.master")
_SLOW = attrgetter("slow")  # a pod marked slow (T13s)


@dataclass(frozen=True)
class MasterConfig:
    job: str
    workers: int
    max_retry: int = MASTER.max_retry
    namespace: str = MASTER.namespace
    nats_url: str = MASTER.nats_url
    flap_limit: int = MASTER.flap_limit
    connect_timeout: float = MASTER.connect_timeout  # Pending → Independent (T15)
    lost_timeout: float = MASTER.lost_timeout  # no heartbeat for this long → Lost
    replace_timeout: float = MASTER.replace_timeout  # Restarting longer than this → Stop (T12)
    outage_limit: float = MASTER.outage_limit  # all silent this long with NATS up: lost (T6n)
    finish_lag: float = MASTER.finish_lag  # still running this long after the first finished
    resumed: bool = False  # an operator resumed the job: every worker was started again (T8r)
    monitor: bool = True  # check the model's invariants on every live transition (monitor.py)
    keepalives: bool = MASTER.keepalives  # orders ask for keep-alives (protocol.KeepAlive)
    linger: float = MASTER.linger  # after the end: keep re-sending the final order to laggards
    tick: float = 0.05
    rendezvous_addr: str = "127.0.0.1"
    rendezvous_port_base: int = 0  # first port of the job's rendezvous window (0 = pick one)
    give_up_on_repeat: bool = MASTER.give_up_on_repeat  # the same error twice in a row: T16
    l2_after: int = MASTER.l2_after  # escalation: container restart from this many failures
    l3_after: int = MASTER.l3_after  # escalation: node quarantine from this many failures
    save_retries: int = 5  # a failed status save is retried this often before degrading
    status_file: str = ""  # also write the final status document here (local mode)
    # Argo: write the decision (``phases.ending``: verdict, quarantined, message) into this
    # directory for the master step's output parameters, and exit 0 once the job has ended
    # whatever the ending, so the branches read the outputs of a step that succeeded
    decision_dir: str = ""
    progress_file: str = ""  # Argo's self-reported progress: "restarts used/max-retry"
    slow_fraction: float = 0.5  # a rank below this share of its peers' median is slow
    slow_window: float = MASTER.slow_window  # ... this long in a row in training: T13s
    slow_evict_within: float = MASTER.slow_evict_within  # no checkpoint this long: say so
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


def pick_port_window(addr: str, *, low: int = 20000, high: int = 32000) -> int:
    """The first port of a window of ``RDZV_SPAN`` ports for a new job's rendezvous, below the
    kernel's ephemeral range (so outgoing connections never take them), every port bindable now.
    Chosen once per job and persisted with its status: the port of each epoch is the core's
    decision (``policy.rendezvous_port``)."""
    import errno
    import random

    rng = random.SystemRandom()
    if addr == RDZV_RANK0:  # rank 0's pod: its own network, nothing here to test against
        return rng.randrange(low, high - RDZV_SPAN)
    for _ in range(50):
        base = rng.randrange(low, high - RDZV_SPAN)
        try:
            for port in range(base, base + RDZV_SPAN):
                with socket.socket() as s:
                    s.bind((addr, port))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:  # rank 0's host, not ours: cannot test it
                return base
            continue
        return base
    return low


def iss_shown(text: str) -> str:
    from aegis_flow.security.issuer import shown

    return shown(text)


class StoreDamaged(RuntimeError):
    """The stored status document cannot be read: the master will not resume from it."""


class Master:
    def __init__(self, cfg: MasterConfig, *, store: Store | None = None,
                 security: CredsService | None = None, nodes: Any = None,
                 placement: Placement | None = None) -> None:
        self.cfg = cfg
        if security is not None:  # no new key for a rank whose worker is alive (F4)
            security.alive = self._alive_for
        # where each rank really runs (placement.py): heartbeats only claim it (review F1)
        self.placement = placement or (security.placement if security is not None else None)
        self._foreign_said: set[int] = set()
        self.security = security  # per-worker NATS credentials (master/creds.py), or none
        self.nodes = nodes  # a k8s.api.NodeApi on Kubernetes: Quarantine labels/taints the node
        self.node_jobs: list[asyncio.Future[None]] = []
        self.subjects = p.Subjects(cfg.namespace, cfg.job)
        self.store = store
        self.status = m.initial_status(
            cfg.workers, cfg.max_retry, flap_limit=cfg.flap_limit,
            give_up_on_repeat=cfg.give_up_on_repeat, l2_after=cfg.l2_after,
            l3_after=cfg.l3_after, rdzv_addr=cfg.rendezvous_addr,
            rdzv_base=cfg.rendezvous_port_base)
        self.revision = 0
        self.nc: Any = None
        self.last_seen: dict[int, float] = {}
        self._last_tick: float | None = None
        self._senders: dict[str, int] = {}  # report subject → the rank it names (parsed once)
        self._loss_grace_until = 0.0
        self._next_loss_check = 0.0  # silent workers are judged once per lost timeout
        self._first_finish: tuple[int, float] | None = None  # (seq, when) of the first Finish
        self.conflict: StoreConflict | None = None  # a save found another master's status
        self._nats_error_at = float("-inf")  # the last NATS client error said (rate-limited)
        self._stats_at = 0.0
        self.phase_since = time.monotonic()
        self.started = time.monotonic()
        self.events: collections.deque[str] = collections.deque(maxlen=30)
        self.stats: collections.Counter[str] = collections.Counter()
        self.ended_at: float | None = None
        self.lock = asyncio.Lock()
        self.last_applied: tuple[str, float] = ("", 0.0)  # (event type, wall time): benchmarks
        self.tails: dict[int, list[str]] = {}  # each rank's last output lines (display only)
        self.store_down_since: float | None = None  # a save failed: degraded, not dead
        # documents sent to the store whose save failed (a timeout): one may land later
        self._unconfirmed: collections.deque[bytes] = collections.deque(maxlen=64)
        self._stats_saved: dict[str, int] = {}
        # the status as last stored (None: nothing stored yet), and ranks whose records the
        # next save must write although they did not change since (their tail changed; a
        # resumed master's delta): a save writes the job record and the changed ranks only
        self._saved: m.Status | None = None
        self._unwritten: set[int] = set()
        self._tail_dirty: set[int] = set()  # ranks whose last output lines changed
        self._newest: dict[int, bytes] = {}  # each rank's newest committed record
        self._encoded: dict[int, tuple[m.PodInfo, list[str] | None, bytes]] = {}
        self._quiet_saved_at = 0.0  # the last save of quiet transitions (tick)
        self._save_took = 0.0  # seconds the last save took
        self._broadcast: tuple[int, m.Order, float] | None = None  # the last: seq, order, when
        self._record_tasks: set[asyncio.Task[None]] = set()
        self._intake: Any = None  # the subscription of the workers' reports (its backlog)
        self._backlog_said = 0.0
        self._scan_at = 0.0  # the next scan for silent ranks (tick)
        self._observe_at = 0.0  # the next look at the ranks' forward times (tick)
        self._anomaly_at = 0.0  # ... and at their resource samples
        self._fresh_resources: set[int] = set()  # ranks whose sample came since that look
        # the quiet transitions not yet checked by the monitor: (status before the first,
        # the last event, how many)
        self._batch: tuple[m.Status, m.Event, int] | None = None
        self.env_reports: dict[int, dict[str, Any]] = {}
        self.bandwidth: dict[int, float] = {}
        # each rank's progress counts in its current run, as its heartbeats carry them: (seq of
        # the run, optimizer steps, forwards) — evidence attached to a hang report (B5)
        self.counts: dict[int, tuple[int, int, int]] = {}
        # each rank's mean forward time (ms) in its current run: (seq, ms); slowness.py
        self.forward_ms: dict[int, tuple[int, float]] = {}
        self.slow = SlowDetector(cfg.slow_fraction, cfg.slow_window)
        self._slow_since: dict[int, float] = {}  # rank → when the runtime first saw it slow
        # each rank's last resource sample (heartbeats: resources.py) in its current run, and
        # the anomaly rules over them (anomaly.py): early evidence, logged, never acted on alone
        self.resources: dict[int, tuple[int, dict[str, Any]]] = {}
        self.anomalies = Anomalies()
        self._timing = bool(os.environ.get("AEGIS_TIMING"))
        self.ready = False  # connected to NATS and the status loaded (/readyz)
        self.stopped_by = ""  # a signal asked the master to stop (request_stop)
        self.observer: Observer | None = None
        if cfg.observe:
            from aegis_flow.master.observer import make_observer

            self.observer = make_observer(job=cfg.job, namespace=cfg.namespace,
                                          workers=cfg.workers, gpu_type=cfg.gpu_type,
                                          log_dir=cfg.log_dir)

    # -- persistence ------------------------------------------------------------------------
    def _doc(self, **extra: Any) -> bytes:
        return encode_doc(self.status, events=list(self.events), stats=dict(self.stats),
                          updated=time.time(), max_retry=self.cfg.max_retry,
                          tails={str(r): t for r, t in self.tails.items()}, **extra)

    def _changed(self, status: m.Status) -> set[int]:
        """The ranks whose records differ from the stored ones (every rank before the first
        save). Unchanged pods are the same objects (the core evolves only what changes), so
        this is a pointer walk, not N comparisons of records."""
        saved = self._saved
        if saved is None or len(saved.workers) != len(status.workers):
            return set(range(len(status.workers)))
        before, after = saved.workers, status.workers
        return {r for r in replaced(before, after) if before[r] != after[r]} \
            | self._unwritten | self._tail_dirty

    async def _persist(self) -> None:
        if self.store is None:
            self._saved = self.status
            return
        status = self.status
        began = time.monotonic()
        stats = dict(self.stats)  # what this document holds: more may be counted while it saves
        records = {r: self._record(status.workers[r]) for r in sorted(self._changed(status))}
        raw = encode_job(status, records, events=list(self.events), stats=stats,
                         updated=time.time(), max_retry=self.cfg.max_retry)
        self._unconfirmed.append(raw)
        try:
            self.revision = await self.store.save(raw, self.revision)
        except StoreConflict:
            # A save that timed out may have landed after all (a paused NATS handles the queued
            # request when it resumes): the store is one revision on, with our own record.
            stored, rev = await self.store.load_job()
            if stored is None or stored not in self._unconfirmed:
                raise
            log.warning("a status save that timed out was stored after all (revision %d)", rev)
            self.revision = await self.store.save(raw, rev)
        self._unconfirmed.clear()
        self._stats_saved = stats
        self._saved = status
        # Committed: the job record holds these records (its delta). Their own keys are written
        # after, off the path of the orders; until a rank's newest record is there, every save
        # carries it in its delta again.
        self._unwritten |= set(records)
        self._tail_dirty -= set(records)
        self._newest.update(records)
        if records and not self._record_tasks:  # one writer; a busy one loops on its own
            task = asyncio.ensure_future(self._write_records())
            self._record_tasks.add(task)
            task.add_done_callback(self._record_tasks.discard)
        self._save_took = time.monotonic() - began
        self.stats["store_saves"] += 1
        self.stats["store_bytes"] += len(raw) + sum(len(r) for r in records.values())
        self._stats_saved["store_saves"] = self.stats["store_saves"]
        self._stats_saved["store_bytes"] = self.stats["store_bytes"]
        self._write_progress()

    def _record(self, pod: m.PodInfo) -> bytes:
        """A rank's record, encoded once per change of its pod or tail (a rank whose key is
        still being written goes into every delta meanwhile: thousands of them in a round)."""
        tail = self.tails.get(pod.rank)
        cached = self._encoded.get(pod.rank)
        if cached is not None and cached[0] is pod and cached[1] is tail:
            return cached[2]
        raw = encode_worker(pod, tail)
        self._encoded[pod.rank] = (pod, tail, raw)
        return raw

    async def _write_records(self) -> None:
        """Write the newest committed record of every rank whose key is behind, until none is
        (one writer: each pass writes each rank once, however many saves came meanwhile). A
        failed pass stops; the next save carries those ranks in its delta and starts again."""
        assert self.store is not None
        while True:
            records = {r: self._newest[r] for r in sorted(self._unwritten) if r in self._newest}
            if not records:
                return
            try:
                await self.store.save_records(records)
            except Exception as exc:  # noqa: BLE001 - the next save's delta carries them again
                self.stats["record_writes_failed"] += 1
                failed = self.stats["record_writes_failed"]
                if failed & (failed - 1) == 0:  # the 1st, 2nd, 4th… failure
                    log.warning("could not write %d worker records (%s): the next save carries "
                                "them", len(records), str(exc) or type(exc).__name__)
                return
            for rank, raw in records.items():
                if self._newest.get(rank) is raw:  # not changed since: its key is current
                    self._unwritten.discard(rank)

    async def records_written(self) -> None:
        """Until every worker record of the saves so far is written (or failed)."""
        while self._record_tasks:
            await asyncio.gather(*self._record_tasks, return_exceptions=True)

    def _write_progress(self) -> None:
        """Argo's self-reported progress of the master step (``ARGO_PROGRESS_FILE``): the
        restarts used of max-retry, so the UI shows "2/3" on the master while it recovers."""
        if not self.cfg.progress_file or self.status.max_retry < 1:
            return
        used = min(self.status.recover_count, self.status.max_retry)
        with contextlib.suppress(OSError):
            with open(self.cfg.progress_file + ".tmp", "w") as fh:
                fh.write(f"{used}/{self.status.max_retry}\n")
            os.replace(self.cfg.progress_file + ".tmp", self.cfg.progress_file)

    async def _save(self) -> bool:
        """Store the status, retrying a failing store; False if it stays gone (degraded)."""
        delay = 0.1
        for attempt in range(self.cfg.save_retries + 1):
            try:
                await self._persist()
            except StoreConflict:
                raise
            except Exception as exc:  # noqa: BLE001 - a timeout, a full disk, NATS gone
                self.stats["save_failed"] += 1
                if attempt == self.cfg.save_retries:
                    if self.store_down_since is None:
                        self.store_down_since = time.monotonic()
                    log.error("cannot store the status (%s): the transition is held back; "
                              "training goes on, loss detection is paused",
                              str(exc) or type(exc).__name__)
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                if self.store_down_since is not None:
                    log.warning("the status store is back after %.1f s",
                                time.monotonic() - self.store_down_since)
                    self.store_down_since = None
                    self._loss_grace_until = time.monotonic() + self.cfg.lost_timeout
                return True
        return False

    async def _load(self) -> None:
        if self.store is None:
            return
        try:
            raw, rev = await self.store.load()
        except ValueError as exc:  # a record or a delta part missing or unreadable
            raise self._damaged(exc) from None
        if raw is None:
            if not self.cfg.rendezvous_port_base:
                base = pick_port_window(self.cfg.rendezvous_addr)
                self.status = evolve(self.status, rdzv_base=base)
            await self._persist()
            return
        try:
            status, doc = decode_doc(raw)
        except ValueError as exc:
            raise self._damaged(exc) from None
        if len(status.workers) != self.cfg.workers:
            raise ValueError(f"stored job has {len(status.workers)} workers, not "
                             f"{self.cfg.workers}")
        self.status, self.revision = status, rev
        self._saved = status
        job, _ = await self.store.load_job()
        layout = job_layout(job) if job is not None else None
        # the records the job record carried may never have reached their keys (a master
        # killed between the two writes): the next save writes them
        self._unwritten = set(layout[1]) if layout is not None else set(range(len(status.workers)))
        self.events.extend(doc.get("events", []))
        self.stats.update(doc.get("stats", {}))
        self._stats_saved = dict(self.stats)
        self.tails = {int(r): list(t) for r, t in (doc.get("tails") or {}).items()}
        self._note(f"resumed from stored status: {status.phase.value}, seq {status.seq}, "
                   f"retries {m.retries_text(status)}")

    def _damaged(self, exc: ValueError) -> StoreDamaged:
        return StoreDamaged(f"the stored status of job {self.cfg.job} is damaged ({exc}); "
                            "the master will not resume from it. Inspect it with "
                            "`aegis-flow status`, then start the job afresh (a new "
                            "--job name or state dir)")

    def _note(self, text: str, level: int = logging.INFO) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.events.append(f"{stamp} {text}")
        log.log(level, text)

    # -- the one executor -------------------------------------------------------------------
    async def apply(self, event: m.Event) -> bool:
        """Step the machine and carry out its effects. The new status is stored before anything
        is sent; if it cannot be stored the transition does not happen (False): the in-memory
        status stays as it was and the event comes again (workers repeat their reports, timers
        fire again)."""
        async with self.lock:
            before_status = self.status
            before = before_status.phase
            new, effects = m.step(self.status, event, now=time.time())
            quiet = bool(effects) and isinstance(effects[0], m.Persist) and _quiet(
                before_status, event, new, effects[1:])
            if quiet:
                # No new order and no phase change (a rank's ack, one FINISH of many; at most
                # a re-send of the stored order): stored with the next save, from the tick. A
                # master killed before then has lost only reports its workers repeat.
                effects = effects[1:]
            elif effects and isinstance(effects[0], m.Persist):
                self._monitor_batch(before_status)
                self.status = new
                try:
                    saved = await self._save()
                except StoreConflict as exc:  # another master stored since: it owns the job
                    self.status = before_status
                    self.conflict = exc  # the main loop ends this master (exit code 2)
                    raise
                if not saved:
                    self.status = before_status
                    return False
                effects = effects[1:]
            self.status = new
            self.last_applied = (type(event).__name__, time.time())
            if new is not before_status and self.cfg.monitor:
                if quiet:  # checked with the quiet transitions around it, before the next save
                    start, _, count = self._batch or (before_status, event, 0)
                    self._batch = (start, event, count + 1)
                else:
                    self._monitor(before_status, event, new, effects)
            if self.observer is not None:
                self.observer.transition(before_status, new, event, effects, time.time())
            if self._timing and not isinstance(event, m.Ack) and new is not before_status:
                log.info("AEGIS_APPLIED %s %s %.6f", type(event).__name__, new.phase.value,
                         self.last_applied[1])
            if before is not new.phase:
                self.phase_since = time.monotonic()
                if new.phase.terminal:
                    self.ended_at = time.monotonic()
                    if self.security is not None:
                        self.security.job_ended()
            for effect in effects:
                await self._execute(effect)
            return True

    def _monitor_batch(self, upto: m.Status) -> None:
        """The quiet transitions since the last check (a run of acks and FINISHes of one seq),
        checked as one transition ending in ``upto``: the state invariants on it and the edge
        checks from the status before the first. Checking each of them alone costs O(N) per
        report, O(N²) per round: at 4,096 ranks more than the round itself."""
        batch, self._batch = self._batch, None
        if batch is not None and self.cfg.monitor:
            start, event, count = batch
            self._monitor(start, event, upto, [],
                          what=f"{event!r} and the {count - 1} report(s) before it"
                          if count > 1 else "")

    def _monitor(self, before: m.Status, event: m.Event, after: m.Status,
                 effects: list[m.Effect], *, what: str = "") -> None:
        """The model checker's invariants on this live transition (master/monitor.py): a
        violation is reported (log, metric, fault log), never acted on."""
        from aegis_flow.master.monitor import violations

        for name in violations(before, event, after, [m.Persist(), *effects]):
            self.stats["invariant_violations"] += 1
            self._note(f"INVARIANT {name} broken by {what or repr(event)} in "
                       f"{before.phase.value}", logging.ERROR)
            if self.observer is not None:
                self.observer.violation(name, event, before.phase.value, time.time())

    async def _execute(self, effect: m.Effect) -> None:
        now = time.time()
        if isinstance(effect, m.Persist):  # step puts it first: apply() stored the status
            pass
        elif isinstance(effect, m.Rearm):
            mono = time.monotonic()
            self.last_seen = dict.fromkeys(range(self.cfg.workers), mono)
            self._next_loss_check = 0.0
        elif isinstance(effect, m.Log):
            if effect.ignored is None:
                self._note(effect.message, logging.getLevelName(effect.level.upper()))
            else:
                self.stats[f"ignored_{effect.ignored.value}"] += 1
                log.debug(effect.message)
        elif isinstance(effect, m.Broadcast):
            await self._publish(self.subjects.broadcast, effect, now)
            self._broadcast = (effect.seq, effect.order, time.monotonic())
        elif isinstance(effect, m.Send):
            if self._in_flight(effect):
                self.stats["resends_in_flight"] += 1
                return
            await self._publish(self.subjects.worker(effect.rank), effect, now)
        elif isinstance(effect, m.ExitWorker):
            await self._publish(self.subjects.worker(effect.rank), effect, now)
            if self.security is not None:  # its successor gets new credentials
                self.security.evict(effect.rank)
        elif isinstance(effect, m.Mark):  # SetIsHanging: every worker notes the mark
            await self._tell_workers(p.MsgType.MARK, effect.seq,
                                     {"hanging": list(effect.hanging)}, now)
        elif isinstance(effect, m.AskCheckpoint):  # a fault-tolerance checkpoint round
            await self._tell_workers(p.MsgType.SAVE, effect.seq,
                                     {"run_id": effect.run_id, "reason": effect.reason}, now)
        elif isinstance(effect, m.Quarantine):
            self.stats["quarantined"] += 1
            self._note(f"node {effect.node} of rank {effect.rank} quarantined "
                       f"({effect.reason})", logging.WARNING)
            if self.nodes is not None and effect.node:  # the client blocks: a thread
                self.node_jobs.append(_in_daemon_thread(self._quarantine_node, effect))

    async def _tell_workers(self, mtype: p.MsgType, seq: int, data: dict[str, Any],
                            now: float) -> None:
        """A notice to every worker of run ``seq`` that is not an order (Mark, Save)."""
        await self.nc.publish(self.subjects.broadcast, p.Message(
            job=self.cfg.job, namespace=self.cfg.namespace, pod_name="master", type=mtype,
            seq=seq, data=data, timestamp=now).encode())

    async def node_jobs_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the node labels still being written (a master that
        ends right after a quarantine writes them first); True when none is left. A call the
        API server holds longer is left to its own timeout (``k8s.client.REQUEST_TIMEOUT``)
        and said so: on Argo the workflow's quarantine step labels the same nodes from the
        master's ``quarantined`` output."""
        pending = [job for job in self.node_jobs if not job.done()]
        if pending:
            _, left = await asyncio.wait(pending, timeout=timeout)
            if left:
                log.warning("%d node label call(s) still wait on the Kubernetes API after "
                            "%g s; the master goes on without them (on Argo the quarantine "
                            "step labels the nodes of its 'quarantined' output)", len(left),
                            timeout)
                return False
        return True

    def _quarantine_node(self, effect: m.Quarantine) -> None:
        """Label, taint and annotate the node on Kubernetes (k8s.ops; runs in a thread)."""
        from aegis_flow.k8s import ops

        reason = f"{effect.reason} {'node' if effect.reason == 'slow' else 'fault'} of rank " \
                 f"{effect.rank}"
        for r in ops.quarantine(self.nodes, [effect.node], reason=reason, now=time.time(),
                                by=self.cfg.job):
            if r.error:
                log.warning("quarantining node %s failed: %s", r.node, r.error)
            else:
                log.warning("node %s: %s (%s)", r.node, r.action, r.reason)

    async def _publish(self, subject: str, effect: m.Broadcast | m.Send | m.ExitWorker,
                       now: float) -> None:
        """Encode an order: its payload and time come from the stored status alone, so a
        re-send of a seq is byte for byte the order first sent (OrdersAreStable)."""
        order = effect.order if not isinstance(effect, m.ExitWorker) else m.Order.EXIT
        st = self.status
        extra = policy.order_data(st, order, effect.seq)
        floor = policy.beat_floor(self.cfg.workers, self.cfg.lost_timeout)
        if floor is not None:  # a large job: fewer heartbeats (the same for every seq)
            extra = {**extra, "beat_floor": floor}
        if self.cfg.keepalives:  # heartbeats that say nothing new may come as keep-alives
            extra = {**extra, "keepalive": policy.keepalive_every(self.cfg.workers)}
        stamp = st.sent_at if effect.seq == st.seq and st.sent_at else now
        msg = p.order_message(self.subjects, effect, now=stamp, extra=extra)
        await self.nc.publish(subject, msg.encode())

    def _in_flight(self, effect: m.Send) -> bool:
        """A re-send of the order just broadcast, asked for by a heartbeat sent before the
        broadcast reached that worker: within one heartbeat interval of the broadcast it is
        skipped (the core asks again on the rank's next heartbeat if the order was lost). At
        4,096 ranks these re-sends were a fifth of the master's work in a round."""
        if self._broadcast is None:
            return False
        seq, order, at = self._broadcast
        gap = policy.beat_floor(self.cfg.workers, self.cfg.lost_timeout) or policy.BEAT_DEFAULT
        return effect.seq == seq and effect.order is order and time.monotonic() - at < gap

    def _count(self, msg: p.Message) -> None:
        """Keep the progress counts a heartbeat or hang report carries (data, no decision)."""
        progress = msg.data.get("progress") if isinstance(msg.data, dict) else None
        if not isinstance(progress, dict) or not 0 <= msg.rank < self.cfg.workers:
            return
        steps, forwards = progress.get("steps"), progress.get("forwards")
        if (isinstance(steps, int) and isinstance(forwards, int) and not isinstance(steps, bool)
                and not isinstance(forwards, bool) and steps >= 0 and forwards >= 0):
            self.counts[msg.rank] = (msg.seq, steps, forwards)
        ms = progress.get("forward_ms")  # (the resources are kept by _keep_resources)
        if isinstance(ms, int | float) and not isinstance(ms, bool) and 0 < ms < 1e9:
            self.forward_ms[msg.rank] = (msg.seq, float(ms))

    def _keep_resources(self, msg: p.Message) -> None:
        """Keep the resource sample a heartbeat carries (data, no decision)."""
        res = msg.data.get("resources") if isinstance(msg.data, dict) else None
        if msg.type is p.MsgType.ACK and isinstance(res, dict) and 0 <= msg.rank < \
                self.cfg.workers:
            self.resources[msg.rank] = (msg.seq, res)
            self._fresh_resources.add(msg.rank)

    def _activity(self, seq: int) -> tuple[tuple[int, int, int], ...]:
        """Every rank's counts in the run of order ``seq`` (a count of an older run is not
        comparable: a restarted process counts from zero)."""
        return tuple((rank, steps, forwards)
                     for rank, (at, steps, forwards) in sorted(self.counts.items())
                     if at == seq)

    def _observe(self, msg: p.Message, event: m.Event) -> None:
        """What the runtime keeps for display and cross-worker notes (no decision): each
        rank's last output lines, the env reports and the bandwidths of a round of checks."""
        before = self.status
        if isinstance(event, m.Error) and event.seq == before.seq:
            tail = msg.data.get("tail")
            if isinstance(tail, list):
                self.tails[event.rank] = [str(line)[:300] for line in tail[-10:]]
                self._tail_dirty.add(event.rank)  # its record holds the tail
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

    # -- input ------------------------------------------------------------------------------
    def _sender(self, subject: str | None) -> int | None:
        """The rank a report subject names (parsed once per subject); None for the control
        subject or an in-process call. ProtocolError: not a subject of this job."""
        sender = self._senders.get(subject) if subject is not None else None
        if sender is None and subject is not None and subject != self.subjects.control:
            sender = self.subjects.sender_rank(subject)
            if len(self._senders) <= self.cfg.workers:  # the valid ones: one per rank
                self._senders[subject] = sender
        return sender

    async def on_message(self, raw: bytes, subject: str | None = None) -> None:
        """One message from NATS. ``subject``: where it came; a report must claim the rank its
        subject names (only that rank may publish there). None: an in-process call."""
        if raw[:3] == p.KEEPALIVE_PREFIX:
            await self._on_keepalive(raw, subject)
            return
        try:
            sender = self._sender(subject)
            msg = p.decode(raw, job=self.cfg.job, namespace=self.cfg.namespace)
            p.check_sender(msg, sender)
            event = p.to_event(msg)
            if isinstance(event, m.Ack) and self.placement is not None:
                msg, event = self._placed(msg, event)
        except p.ProtocolError as exc:
            self._dropped("foreign" if exc.foreign else "invalid", f"a message: {exc.reason}")
            return
        if isinstance(event, m.CheckpointDone) and not self._plausible(event.step):
            self._dropped("invalid", f"a checkpoint at step {event.step}: beyond every step "
                          f"the ranks have reported ({self._steps_seen()})")
            return
        by_operator = subject is not None and subject == self.subjects.control
        if isinstance(event, m.CheckpointDone | m.Stop):
            pass
        elif not 0 <= msg.rank < self.cfg.workers:
            self._dropped("invalid", f"a message from unknown rank {msg.rank!r}")
            return
        elif by_operator and isinstance(event, m.Hang | m.HangWithQuit):
            # aegis-flow hang JOB RANK: the operator means the run going on now
            event = dataclasses.replace(event, seq=self.status.seq, waiting=False)
            self._note(f"an operator marks rank {event.rank} hung"
                       f"{' and asks to restart it' if isinstance(event, m.HangWithQuit) else ''}"
                       f" ({str(msg.data.get('reason', ''))[:200] or 'no reason given'})",
                       logging.WARNING)
        else:
            self.last_seen[msg.rank] = time.monotonic()
            if self.status.outage:  # a worker is heard again: the control plane is back
                await self.apply(m.ControlPlaneBack())
        self._count(msg)
        self._keep_resources(msg)
        if isinstance(event, m.HangWithQuit):
            event = dataclasses.replace(event, activity=self._activity(event.seq))
        if self.observer is not None:
            self.observer.message(msg, event, time.time())
        try:
            self._observe(msg, event)
            before = self.status
            await self.apply(event)
            self._after(before)
        except StoreConflict:  # apply kept it in self.conflict: the main loop exits on it
            return  # (raised here it would vanish into nats-py's callback: a zombie master)
        except m.MalformedEvent as exc:
            self.stats["invalid"] += 1
            log.warning("dropped a malformed event: %s", exc)

    async def _on_keepalive(self, raw: bytes, subject: str | None) -> None:
        """A heartbeat that says nothing new (``protocol.KeepAlive``), from the worker the
        status knows. Its numbers are kept as a full heartbeat's are; the state machine sees
        it only when it could change something (``machine.beat_changes_nothing``: nearly
        never while training), and then as the Ack a full heartbeat would have been."""
        try:
            sender = self._sender(subject)
            ka = p.decode_keepalive(raw)
        except p.ProtocolError as exc:
            self._dropped("invalid", f"a keep-alive: {exc.reason}")
            return
        if sender is None or not 0 <= sender < self.cfg.workers:
            self._dropped("invalid", "a keep-alive that is not on a rank's report subject")
            return
        pod = self.status.workers[sender]
        if pod.incarnation != ka.incarnation:
            # not the worker the status knows (a master that started afresh): its next full
            # heartbeat, within keepalive_every, introduces it
            self.stats["keepalive_unknown"] += 1
            return
        self.last_seen[sender] = time.monotonic()
        if self.status.outage:  # a worker is heard again: the control plane is back
            await self.apply(m.ControlPlaneBack())
        if ka.steps is not None and ka.forwards is not None:
            self.counts[sender] = (ka.seq, ka.steps, ka.forwards)
        if ka.forward_ms is not None and 0 < ka.forward_ms < 1e9:
            self.forward_ms[sender] = (ka.seq, ka.forward_ms)
        if self.observer is not None:
            self.observer.keepalive(sender, ka, time.time())
        if m.beat_changes_nothing(self.status, sender, ka.incarnation, ka.seq):
            return
        event = m.Ack(sender, ka.incarnation, ka.seq, node=pod.node, pod_ip=pod.pod_ip)
        try:
            before = self.status
            await self.apply(event)
            self._after(before)
        except StoreConflict:  # apply kept it in self.conflict: the main loop exits on it
            return

    def _alive_for(self, rank: int) -> float | None:
        """Seconds since rank ``rank``'s current worker was heard, if it still counts as alive
        (known, not being replaced, heard within the lost timeout); else None."""
        if not 0 <= rank < len(self.status.workers):
            return None
        pod = self.status.workers[rank]
        heard = self.last_seen.get(rank)
        if pod.incarnation is None or pod.restarting or heard is None:
            return None
        age = time.monotonic() - heard
        return age if age < self.cfg.lost_timeout else None

    def _dropped(self, kind: str, what: str) -> None:
        """Count a dropped message; say so for the 1st, 2nd, 4th, 8th… of its kind only (a
        flood of 10,000 a second must not become 10,000 log lines a second)."""
        self.stats[kind] += 1
        count = self.stats[kind]
        if count & (count - 1) == 0:
            log.warning("dropped %s (%s %d so far)", what, kind, count)

    def _steps_seen(self) -> int:
        """The highest training step any rank's heartbeat reported (-1: none reported)."""
        views = self.observer.views if self.observer is not None else []
        return max((v.step for v in views if v.step is not None), default=-1)

    def _plausible(self, step: int) -> bool:
        """A checkpoint can only be at a step the job has reached, when the ranks report steps
        (review F8: a step of 10^30 was taken and stuck for good)."""
        seen = self._steps_seen()
        return seen < 0 or step <= seen

    def _placed(self, msg: p.Message, event: m.Ack) -> tuple[p.Message, m.Ack]:
        """The heartbeat with the node the trusted source names (a claim that differs is
        counted as foreign and said once per rank)."""
        assert self.placement is not None
        node, foreign = trusted_node(event.node, self.placement.node_of(event.rank))
        if foreign:
            self.stats["foreign"] += 1
            if event.rank not in self._foreign_said:
                self._foreign_said.add(event.rank)
                log.warning("rank %d claims to run on node %s, but runs on %s: the claim is "
                            "ignored", event.rank, iss_shown(event.node), node)
        if node == event.node:
            return msg, event
        return (dataclasses.replace(msg, data={**msg.data, "node": node}),
                dataclasses.replace(event, node=node))

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
        if await self._bound_the_finish(st, now):
            return
        # O(N log N) over every rank's latest numbers (run on every 50 ms tick they were most
        # of a 4,096-rank master's time): the slow-rank rule once per heartbeat interval (a
        # rank's forward time is new once per beat), at least a second apart; the anomaly
        # rules, whose windows are 30 s and more, every ANOMALY_EVERY seconds
        if now >= self._observe_at:
            self._observe_at = now + policy.observe_every(self.cfg.workers,
                                                          self.cfg.lost_timeout)
            await self._watch_slow(st, now)
        if now >= self._anomaly_at:
            self._anomaly_at = now + policy.ANOMALY_EVERY
            self._watch_resources(st, now)
        if self.security is not None:
            self._count_refusals(self.security.counters())
        # quiet transitions wait QUIET_SAVE, or four times what the last save took: saving
        # never takes more than a fifth of the master's time, however big a round's delta is
        behind = self._saved is not self.status and (
            now - self._quiet_saved_at >= max(QUIET_SAVE, 4 * self._save_took))
        if self.store_down_since is not None or behind or (
                dict(self.stats) != self._stats_saved and now - self._stats_at > 1.0):
            self._stats_at = self._quiet_saved_at = now  # the stored stats and quiet
            # transitions kept current (a few saves a second, not one per report); probe a
            # store that failed
            async with self.lock:
                self._monitor_batch(self.status)
                await self._save()
        if st.phase.terminal or now < self._loss_grace_until or self.store_down_since:
            return
        if now < max(self._next_loss_check, self._scan_at):
            return
        # the scan is O(N): four times a second at most (at 4,096 ranks, every 50 ms tick
        # cost more than the heartbeats themselves)
        self._scan_at = now + min(0.25, self.cfg.lost_timeout / 8)
        if len(self.last_seen) == len(st.workers) and \
                now - min(self.last_seen.values()) <= self.cfg.lost_timeout:
            return  # every rank was heard within the lost timeout (a min in C, not a walk)
        silent = {pod.rank: now - self.last_seen.get(pod.rank, self.started)
                  for pod in st.workers if pod.incarnation is not None and not pod.restarting}
        silent = {r: t for r, t in silent.items() if t > self.cfg.lost_timeout}
        if not silent or now < self._next_loss_check:
            return
        backlog = self._backlog()
        if backlog:
            # Reports wait in the intake queue: a silent rank's heartbeat may be among them (a
            # rank's liveness is stamped when its report is processed). Judge once they are.
            if now - self._backlog_said > 5.0:
                self._backlog_said = now
                log.warning("%d reports wait to be processed; %d rank(s) silent for more than "
                            "%.0f s are judged once they are", backlog, len(silent),
                            self.cfg.lost_timeout)
            return
        # What the core needs to tell a control-plane outage from lost workers (T6n): every
        # rank silent at this instant, and whether the master itself reaches NATS right now.
        self._next_loss_check = now + self.cfg.lost_timeout
        nats_ok = await self._reaches_nats()
        self._last_tick = time.monotonic()  # the probe's wait is not a stall
        ranks = frozenset(silent)
        for rank in sorted(silent):
            await self.apply(m.Lost(rank, silent=ranks, nats_ok=nats_ok,
                                    outlasted=silent[rank] > self.cfg.outage_limit))

    def _backlog(self) -> int:
        """Reports received from NATS and not yet processed (0 without a subscription)."""
        try:
            return int(self._intake.pending_msgs) if self._intake is not None else 0
        except (AttributeError, TypeError, ValueError):
            return 0

    def _count_refusals(self, counters: dict[str, int]) -> None:
        """The credential service's counters, into the stored stats and the metrics."""
        for name, value in counters.items():
            if value and self.stats[f"creds_{name}"] != value:
                self.stats[f"creds_{name}"] = value
        metrics = self.observer.metrics if self.observer is not None else None
        if metrics is not None:
            for reason in ("new_keys", "foreign_reply"):
                metrics.credential_refusals.labels(reason).set(counters.get(reason, 0))
            metrics.revocations.set(counters.get("revocations", 0))

    async def _bound_the_finish(self, st: m.Status, now: float) -> bool:
        """The finish lag: in a synchronous job every rank finishes within seconds of the
        first. A rank still running ``finish_lag`` seconds after the first one finished (a
        process stuck at exit, a rank looping on its own) is reported to the core as hung
        (HangWithQuit, not waiting: its peers are done), which charges it and restarts the
        job from its checkpoint (T14). True when it did."""
        if st.phase is not m.Phase.RUNCOMMAND or not counts(st.workers)[1]:  # none finished
            self._first_finish = None
            return False
        if self._first_finish is None or self._first_finish[0] != st.seq:
            self._first_finish = (st.seq, now)
            return False
        waited = now - self._first_finish[1]
        late = [p.rank for p in st.workers if not p.finished and not p.restarting]
        if waited <= self.cfg.finish_lag or not late:
            return False
        done = [p.rank for p in st.workers if p.finished]
        self._note(f"rank(s) {late} still running {waited:.0f} s after rank(s) {done} finished "
                   f"(more than the finish lag, {self.cfg.finish_lag:g} s): treated as hung",
                   logging.WARNING)
        self._first_finish = None
        await self.apply(m.HangWithQuit(late[0], st.seq, waiting=False))
        return True

    async def _watch_slow(self, st: m.Status, now: float) -> None:
        """Slow ranks during training (slowness.py over the heartbeats' forward times): the
        core marks one (Slow, T13s) and evicts it right after the next checkpoint (T13e)."""
        for rank in list(self.slow.flagged):  # replaced, or its mark was refused: afresh
            if not st.workers[rank].slow:
                self.slow = self.slow.forget(rank)
        for rank in [r for r in self._slow_since if not st.workers[r].slow]:  # not O(N) a tick
            del self._slow_since[rank]
        if st.phase is not m.Phase.RUNCOMMAND:
            return
        samples = {r: ms for r, (seq, ms) in self.forward_ms.items()
                   if seq == st.seq and not st.workers[r].finished}
        self.slow, found = self.slow.observe(now, samples)
        for rank, detail in found:
            self.stats["slow_marked"] += 1
            await self.apply(m.Slow(rank, detail))
        workers = self.status.workers
        for pod in map(workers.__getitem__, compress(range(len(workers)), map(_SLOW, workers))):
            since = self._slow_since.setdefault(pod.rank, now)
            if now - since > self.cfg.slow_evict_within and since >= 0:
                self._slow_since[pod.rank] = -1.0  # said once
                self._note(f"rank {pod.rank} is slow and no checkpoint came within "
                           f"{self.cfg.slow_evict_within:.0f} s: training goes on on the slow "
                           "node (a slow node is better than lost progress); it is evicted "
                           "right after the next checkpoint", logging.WARNING)

    def _watch_resources(self, st: m.Status, now: float) -> None:
        """The anomaly rules (anomaly.py) over every running rank's last resource sample: a
        GPU idle while its peers are busy, memory that only grows, a node's network far below
        its peers'. Early evidence: logged (warning, fault log, a metric), never a decision."""
        if st.phase is not m.Phase.RUNCOMMAND:
            return
        samples = {r: res for r, (seq, res) in self.resources.items()
                   if seq == st.seq and not st.workers[r].finished}
        fresh, self._fresh_resources = self._fresh_resources, set()
        self.anomalies, found = self.anomalies.observe(now, samples, fresh)
        for f in found:
            self.stats[f"anomaly_{f.rule}"] += 1
            self._note(f"early evidence, not acted on alone: rank {f.rank} {f.rule} "
                       f"({f.detail})", logging.WARNING)
            if self.observer is not None:
                self.observer.anomaly(f.rank, f.rule, f.detail, time.time())

    async def _nats_error(self, exc: Exception) -> None:
        """While NATS is out the client fails twice a second: say it once per 30 s."""
        now = time.monotonic()
        self.stats["nats_errors"] += 1
        if now - self._nats_error_at >= 30.0:
            self._nats_error_at = now
            log.warning("NATS: %s; reconnecting (decisions wait for the control plane)",
                        str(exc) or type(exc).__name__)

    async def _reaches_nats(self) -> bool:
        """A round trip to the NATS server (PING/PONG) within a short bound."""
        if self.nc is None or not self.nc.is_connected:
            return False
        try:
            await self.nc.flush(timeout=max(0.2, min(1.0, self.cfg.lost_timeout / 4)))
        except Exception:  # noqa: BLE001 - a timeout, a connection lost meanwhile
            return False
        return True

    async def run(self) -> int:
        """Serve until the job ends: 0 succeeded, 1 failed, 2 conflict, 3 independent,
        4 NATS unreachable, 5 stored status damaged. With ``decision_dir`` every ending of
        the job is 0 (the decision is in the files); the others stay."""
        import nats

        http = self._serve_http()
        try:
            self.nc = await asyncio.wait_for(nats.connect(
                self.cfg.nats_url, ping_interval=2, max_outstanding_pings=3,
                max_reconnect_attempts=-1, reconnect_time_wait=0.5, allow_reconnect=True,
                connect_timeout=2, error_cb=self._nats_error,
                **(self.security.connect_options() if self.security else {})), timeout=10)
        except Exception as exc:  # noqa: BLE001 - no NATS: the workers will run on their own
            log.error("cannot reach NATS at %s (%s): workers fall back to plain runs",
                      self.cfg.nats_url, exc)
            return 4
        try:
            if self.store is None:
                self.store = await KVStore.open(self.nc, self.subjects.kv_bucket)
            await self._load()
            self._write_progress()
            if self.cfg.resumed:  # the core ignores it for a job not yet started or ended
                await self.apply(m.Resume())
            if self.security is not None:
                if self.status.phase.terminal:
                    self.security.job_ended()
                await self.security.start(self.nc)
            self.started = self.phase_since = time.monotonic()
            self._intake = await self.nc.subscribe(self.subjects.masters, cb=self._cb)
            await self.nc.subscribe(self.subjects.control, cb=self._cb)
            if self.observer is not None:
                self.observer.loaded(self.status, resumed=self.revision > 1, now=time.time())
            self.ready = True
            while True:
                if self.conflict is not None:
                    raise self.conflict
                await self.tick()
                if self.ended_at is not None and (
                        time.monotonic() - self.ended_at > self.cfg.linger or self._all_gone()):
                    break
                if self.status.phase.terminal and self.ended_at is None:
                    self.ended_at = time.monotonic()  # resumed after the end
                if self.stopped_by:
                    break
                await asyncio.sleep(self.cfg.tick)
        except StoreConflict as exc:
            log.error("another master owns job %s: %s", self.cfg.job, exc)
            return 2
        except StoreDamaged as exc:
            log.error("%s", exc)
            return 5
        finally:
            with contextlib.suppress(Exception):  # the worker records of the last saves
                await asyncio.wait_for(self.records_written(), 5)
            await self.node_jobs_done(NODE_JOBS_WAIT)
            if self.security is not None:
                await self.security.stop()
            with contextlib.suppress(Exception):
                await close_within(self.nc, 2)
        stopped = bool(self.stopped_by) and not self.status.phase.terminal
        final = summary(self.status) + (f"; stopped by {self.stopped_by}" if stopped else "")
        # under aegis-flow run (a status file) the runner prints the summary as its last word:
        # once, not twice
        self._note(final, logging.DEBUG if self.cfg.status_file else logging.INFO)
        if self.observer is not None:
            self.observer.close(final, time.time(), stopped=stopped)
        if http is not None:
            http.stop()
        if self.cfg.status_file:
            tmp = self.cfg.status_file + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(self._doc(**({"stopped_by": self.stopped_by} if self.stopped_by
                                      else {})))
            os.replace(tmp, self.cfg.status_file)
        if self.stopped_by and not self.status.phase.terminal:
            return 143 if self.stopped_by == "SIGTERM" else 130
        if self.cfg.decision_dir and self.status.phase.terminal:
            self._write_decision(final)
            return 0
        return {m.Phase.SUCCEED: 0, m.Phase.FAILED: 1, m.Phase.INDEPENDENT: 3}.get(
            self.status.phase, 1)

    def _write_decision(self, final: str) -> None:
        """The decision as files, one per output parameter (``phases.Ending.outputs``)."""
        from aegis_flow.phases import ending

        os.makedirs(self.cfg.decision_dir, exist_ok=True)
        for name, value in ending(self.status, final).outputs().items():
            path = os.path.join(self.cfg.decision_dir, name)
            with open(path + ".tmp", "w") as fh:
                fh.write(value)
            os.replace(path + ".tmp", path)
        log.info("decision written to %s", self.cfg.decision_dir)

    def request_stop(self, by: str) -> None:
        """A signal: leave the loop and write the ending (summary, fault log, status file)
        without deciding anything; the stored phase stays what it is."""
        self.stopped_by = by

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


#: quiet transitions (acks, FINISHes that send nothing) are stored this often at most
QUIET_SAVE = 0.2
#: how long an ending master waits for the node labels it is still writing
NODE_JOBS_WAIT = 10.0


def _in_daemon_thread(fn: Callable[..., None], *args: Any) -> asyncio.Future[None]:
    """Run ``fn(*args)`` in a daemon thread; a future of the running loop says when it ended
    (an exception is logged, not raised). Not the loop's executor: the interpreter joins its
    threads at exit, so one call that an API server holds would hold the master's exit too
    (``Master.node_jobs_done`` bounds the wait)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not done.done():
            done.set_result(None)

    def body() -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a thread's failure is logged, never lost
            log.exception("%s failed", getattr(fn, "__name__", "a node call"))
        finally:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(settle)

    threading.Thread(target=body, name="aegis-node-label", daemon=True).start()
    return done


def _quiet(before: m.Status, event: m.Event, after: m.Status, effects: list[m.Effect]) -> bool:
    """A transition whose storing can wait for the next save (pure): a rank's own report (an
    ack or a FINISH, which its worker repeats with every heartbeat until the seq moves on), the
    same phase and order (seq), and no effect beyond a log line or a re-send of that order (the
    core re-derives it from the status on every heartbeat that shows an older seq; the order
    and its seq were stored when it was first sent). Everything a restarted master must never
    lose (a new seq, an outcome, a charge with its restart) comes with a new order, so it is
    stored before that order goes out."""
    return (isinstance(event, m.Ack | m.Finish)
            and before.phase is after.phase and before.seq == after.seq
            and not after.phase.terminal
            and all(isinstance(e, m.Log) or isinstance(e, m.Send) and e.seq == after.seq
                    for e in effects))


def summary(status: m.Status) -> str:
    """The user's one-line summary (DESIGN.md §2, observability), and why a failed job failed.

    Restarts: recoverCount, except after T11, which sets it to max-retry + 1 for the failure
    that was not restarted."""
    restarts = min(status.recover_count, status.max_retry)
    text = (f"job {status.phase.value}: max restarts {status.max_retry}, restarted "
            f"{restarts} times; hardware faults rescheduled {len(status.error_nodes)} times")
    if status.phase is m.Phase.FAILED and (status.failure or status.stop_reason):
        text += f"; {status.failure or 'stopped: ' + status.stop_reason}"
    return text
