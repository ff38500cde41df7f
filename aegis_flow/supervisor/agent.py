"""The worker supervisor ("tini"): talks to the master over NATS and obeys its orders.

Side effects: a NATS connection; starts and stops the training process (``child.py``); writes
to stdout/stderr; ``run()`` returns the exit code the process should leave with. Imports only
the standard library, nats-py and our light protocol (DESIGN.md §3: injectable into any image).

State-based protocol (DESIGN.md §2): every heartbeat (an ACK) carries the incarnation, the last
seq seen and the inner phase; the last Finish/Error for the current seq is repeated with every
heartbeat until the seq advances, so a lost report only delays progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aegis_flow import protocol as p
from aegis_flow.outcome import quit_exit_code
from aegis_flow.settings import WORKER, ConfigError, env_value
from aegis_flow.steps.classify import (
    UNKNOWN_CAUSE,
    Cause,
    CauseTable,
    classify,
    exception_of,
    load_table,
)
from aegis_flow.steps.hang import HangWatchdog, ProgressSocket, collect_stacks, top_frame
from aegis_flow.supervisor import child as childmod
from aegis_flow.supervisor.checks import bootcheck_or_troubleshoot
from aegis_flow.supervisor.child import process_state
from aegis_flow.supervisor.ckptwatch import Watch, newest_complete
from aegis_flow.supervisor.inject import Injection, fired_marker
from aegis_flow.supervisor.integrity import RESUME_LINK, checkpoint_number
from aegis_flow.supervisor.keepalive import KeepAlives
from aegis_flow.supervisor.prewarm import Zygote, start_zygote
from aegis_flow.supervisor.resources import Sampler
from aegis_flow.supervisor.saver import Saver, saver_env
from aegis_flow.supervisor.stats import BeatClock, StepRate, gpu_type
from aegis_flow.supervisor.waiting import close_within, wait_or_cancel
from aegis_flow.vocab import PHASE_OF_ORDER, ExitCode, Order, Phase

# a replacement for the real checks (tests): (order, config) -> (ok, fault class, detail)
CheckFn = Callable[[str, "WorkerConfig"], Awaitable[tuple[bool, str | None, str]]]


@dataclass(frozen=True)
class WorkerConfig:
    command: tuple[str, ...]
    job: str
    rank: int
    world_size: int
    namespace: str = WORKER.namespace
    nats_url: str = WORKER.nats_url
    node: str = field(default_factory=socket.gethostname)
    pod_ip: str = WORKER.pod_ip
    connect_timeout: float = WORKER.connect_timeout  # to reach NATS
    master_timeout: float = WORKER.master_timeout  # > the master's connect timeout (settings)
    orphan_timeout: float = WORKER.orphan_timeout  # no master this long: finish on our own
    heartbeat_interval: float = WORKER.heartbeat_interval
    grace: float = WORKER.grace
    injections: tuple[Injection, ...] = ()
    work_dir: str = WORKER.work_dir
    prewarm: bool = True  # fork Python commands from a pre-warmed interpreter (prewarm.py)
    hang_after: float = WORKER.hang_after  # no progress for this long: Hang (marked, T13)
    hang_quit_after: float = WORKER.hang_quit_after  # ...and for this long: HangWithQuit (T14)
    causes_file: str | None = None  # extra log-classifier rules
    nkey_seed: str = ""  # NATS nkey seed file; needs nkeys (PyNaCl)
    creds: str = ""  # NATS credentials from worker-init (supervisor/creds.py); renewed
    saver: tuple[str, ...] = ()  # a checkpoint saver run beside training (saver.py); () none
    checkpoint_dir: str = ""  # where the command's checkpoints are: watched, gated before a run
    checkpoint_pattern: str = "ckpt-*"  # which names in it are checkpoints (a glob)
    # local ranks this worker runs (torchrun's --nproc-per-node): RANK = rank·K + local,
    # WORLD_SIZE = world_size·K; the master still sees one worker (the unit it replaces)
    nproc_per_node: int = 1
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


# What NATS says (as nats-py words it) when it refuses a user's credentials: at connect
# ("Authorization Violation"), or to a connected user whose key was revoked or ran out.
_REFUSALS = ("authorization violation", "authorization failed", "authentication revoked",
             "authentication expired")
LOCKOUT_GRACE = 10.0  # seconds of refused credentials before a worker concludes it was retired


PREWARMING = "importing torch into the pre-warmed interpreter, once for all restarts"


def refused_credentials(exc: BaseException | None) -> bool:
    """Is this NATS error the server refusing our credentials (not a network fault)?"""
    text = str(exc or "").lower()
    return any(word in text for word in _REFUSALS)


def lockout_exit_code(command_code: int | None) -> int:
    """The exit code of a worker whose credentials the master revoked before it heard its exit
    order: 0 when its command had succeeded, else 71, so the workflow recreates the pod (a new
    pod gets new credentials and rejoins as a new incarnation, which the master expects)."""
    return 0 if command_code == 0 else int(ExitCode.CONTAINER_RESTART)


GATE_TIMEOUT = 300.0  # seconds for the checkpoint integrity gate before a run
CHECKPOINT_SCAN = 1.0  # seconds between two looks at --checkpoint-dir while the command runs
# a checkpoint ahead of the steps the script reported (progress.step sends at most 10 a second,
# so the step just before a save may never be sent) waits this long for a step that reaches it
CHECKPOINT_STEP_WAIT = 5.0


def _warn(text: str) -> None:
    sys.stderr.write(f"[aegis-flow worker] {text}\n")
    sys.stderr.flush()


async def _await_rendezvous(addr: str, port: int, timeout: float = 3.0) -> None:
    """Start a rank > 0 only once rank 0's store listens (or after ``timeout``).

    A client that connects before rank 0 listens is refused and backs off for up to a second
    inside torch; waiting here for the port keeps an in-place restart in the tens of ms.

    Cancellation-safe: ``asyncio.wait_for`` (Python <= 3.11) returns or raises the inner result
    when the inner attempt and a cancellation of this task meet, so a loop around it with an
    ``except OSError`` swallowed the cancellation of an order that had been superseded (the old
    run order then started its command late and reported under the new order's seq).
    ``wait_or_cancel`` never swallows it.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, writer = await wait_or_cancel(asyncio.open_connection(addr, port), 0.2)
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(0.003)
            continue
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        return


def _lossy_from_env(rank: int) -> Callable[[p.Message], bool] | None:
    """AEGIS_TEST_DROP=FRACTION[:SEED] loses that share of messages in both directions."""
    spec = os.environ.get("AEGIS_TEST_DROP", "")
    if not spec:
        return None
    import random

    fraction, _, seed = spec.partition(":")
    rng = random.Random(f"{seed}:{rank}:{os.getpid()}")
    share = float(fraction)
    _warn(f"TEST TRANSPORT: dropping {share:.0%} of messages")
    return lambda _msg: rng.random() < share


def _auth_options(cfg: WorkerConfig) -> dict[str, Any]:
    """nats.connect keyword arguments for an nkey seed (none: no auth).

    An nkey signs the server's nonce with nkeys, which needs PyNaCl (compiled per Python
    and glibc); when it cannot be loaded the error says so instead of a bare ImportError.
    """
    auth: dict[str, Any] = {}
    if cfg.nkey_seed:
        auth["nkeys_seed"] = cfg.nkey_seed
    if auth or cfg.creds:
        try:
            import nkeys  # noqa: F401  (nats-py imports it lazily; fail early and clearly)
        except ImportError as exc:
            raise RuntimeError(
                f"NATS credentials need nkeys and PyNaCl, which this Python "
                f"({sys.version.split()[0]}) cannot load ({exc}); build the supervisor bundle "
                "with native wheels for this Python (aegis-flow bundle --native-wheels DIR)"
            ) from None
    return auth


def _creds_session(cfg: WorkerConfig) -> Any:
    """The worker's credentials (``--creds``, written by worker-init) as a renewing session;
    None without ``--creds``. Raises CredsError when the file is missing or bad."""
    if not cfg.creds:
        return None
    from aegis_flow.supervisor import creds as credsmod

    creds = credsmod.read(cfg.creds)
    late = time.time() - creds.expires_at
    if creds.expires_at and late >= 0:  # no connection: no renewal over NATS either
        raise credsmod.CredsError(f"the credentials in {cfg.creds} expired {late:.0f} s ago; "
                                  "fetch new ones with aegis-flow worker-init")
    return credsmod.Session(creds, cfg.creds)


def _pcie_wanted() -> bool:
    """``AEGIS_SAMPLE_PCIE``: sample the GPUs' PCIe throughput too (a bad value: no, said)."""
    try:
        return bool(env_value("AEGIS_SAMPLE_PCIE", False))
    except ConfigError as exc:
        _warn(f"{exc}: PCIe throughput is not sampled")
        return False


def _report_progress(restarts: int) -> None:
    """On Argo: the job's restarts so far of max-retry as this pod's self-reported progress
    (``$ARGO_PROGRESS_FILE``, ``$AEGIS_MAX_RETRY``), shown on the rank's node while it runs."""
    path, most = os.environ.get("ARGO_PROGRESS_FILE"), os.environ.get("AEGIS_MAX_RETRY", "")
    if not path or not most.isdigit() or int(most) < 1:
        return
    with contextlib.suppress(OSError):
        with open(path, "w") as fh:
            fh.write(f"{min(restarts, int(most))}/{most}\n")


class Supervisor:
    def __init__(self, cfg: WorkerConfig, *, checks: CheckFn | None = None,
                 drop: Callable[[p.Message], bool] | None = None) -> None:
        self.cfg = cfg
        self.subjects = p.Subjects(cfg.namespace, cfg.job)
        self.checks = checks
        self.drop = drop or _lossy_from_env(cfg.rank)  # test hook: a lossy transport
        self.seq = -1
        self.phase = Phase.PENDING
        self.last_report: p.Message | None = None
        self.child: childmod.Child | childmod.ChildGroup | None = None
        self.activity: asyncio.Task[None] | None = None
        self.exit_code: asyncio.Future[int] | None = None
        self.nc: Any = None
        self.last_order_at = 0.0
        # the orphan bound (_master_watch): the last sign of a master (an order, or a probe
        # that found one listening), whether we gave up on it, the last run's exit code
        self.master_seen_at = 0.0
        self._nats_error_at = float("-inf")  # the last NATS error said (rate-limited)
        self._nats_errors = 0
        self.orphaned = False
        # credentials refused (revoked, expired) since this moment, and why; cleared on a
        # reconnect. Refused for LOCKOUT_GRACE: the master retired this worker (_master_watch)
        self.refused_since: float | None = None
        self.refused_why = ""
        self.locked_out = False
        self.command_code: int | None = None
        self.zygote: Zygote | None = None
        self.progress: ProgressSocket | None = None
        self._causes: CauseTable | None = None
        # carried in every heartbeat, exported per worker by the master (stats.py)
        self.child_starts = 0
        self.steps = StepRate()
        self.auto_steps = StepRate()  # optimizer steps the pre-warmed interpreter counted
        self.ckpt_watch = Watch()  # the newest complete checkpoint seen in --checkpoint-dir
        self.ckpt_said = -1  # the newest checkpoint step reported to the master
        # a checkpoint held until the script's reported steps reach it: (seq, step, path, since)
        self.ckpt_held: tuple[int, int, str, float] | None = None
        self._tasks: set[asyncio.Future[None]] = set()  # reports sent from a reader callback
        self.beats = BeatClock(cfg.heartbeat_interval)
        self.beat_every = cfg.heartbeat_interval  # longer in a large job (_beat_floor)
        self.keepalives = KeepAlives()  # heartbeats that say nothing new, in short
        self.gpu_type = gpu_type()
        self.session: Any = None  # supervisor.creds.Session when --creds is given
        # what this worker is busy with, in words, and since when (heartbeats carry it: the
        # progress line says what a phase waits for, e.g. the torch import of pre-warming)
        self.doing = ""
        self.doing_since = time.monotonic()
        self.saver: Saver | None = None  # --saver: started and closed by run()
        # the master's hang mark of the current run (SetIsHanging): the ranks marked, and the
        # frame this rank's process was in when the mark came (heartbeats carry both)
        self.marked: tuple[int, ...] = ()
        self.marked_seq = -1
        self.marked_frame: str | None = ""  # None while py-spy reads it: no beat says the mark
        # where a fault-tolerance checkpoint round the master asks for is written (its run id):
        # $AEGIS_SAVE_REQUEST of the training process and the saver (checkpoint.requested())
        self.save_request = tempfile.mktemp(prefix="aegis-save-request-")
        # the training process's CPU and memory, the node's network, the GPUs (NVML when
        # present), sampled into every heartbeat (resources.py; the master's anomaly rules)
        self.sampler = Sampler(pcie=_pcie_wanted())
        self._sampled: dict[str, Any] = {}  # the newest sample (_sample_loop, in a thread)

    # -- messages ---------------------------------------------------------------------------
    def _msg(self, mtype: p.MsgType, seq: int, data: dict[str, Any]) -> p.Message:
        return p.Message(job=self.cfg.job, namespace=self.cfg.namespace,
                         pod_name=f"{self.cfg.job}-worker-{self.cfg.rank}", type=mtype,
                         rank=self.cfg.rank, seq=max(seq, 0), incarnation=self.cfg.incarnation,
                         phase=self.phase.value, data=data, timestamp=time.time())

    async def _publish(self, msg: p.Message, raw: bytes | None = None) -> None:
        """Send ``msg`` on our report subject (as ``raw`` when given: a keep-alive)."""
        if self.drop is not None and self.drop(msg):
            return
        with contextlib.suppress(Exception):
            await self.nc.publish(self.subjects.master(self.cfg.rank),
                                  msg.encode() if raw is None else raw)
            await self.nc.flush(timeout=1)

    async def report(self, mtype: p.MsgType, data: dict[str, Any], *, seq: int) -> None:
        """Report the outcome of the order ``seq``; dropped when a newer order superseded it
        (an old activity must never answer for the current order)."""
        if seq != self.seq:
            _warn(f"dropped a {mtype.value} for superseded order {seq} (now {self.seq})")
            return
        msg = self._msg(mtype, seq, data)
        self.last_report = msg
        await self._publish(msg)

    async def heartbeat(self) -> None:
        now = time.monotonic()
        self.beats.beat(now)
        msg = self._msg(p.MsgType.ACK, self.seq, self._beat_data())
        await self._publish(msg, self.keepalives.compact(msg, now))
        if self.last_report is not None and self.last_report.seq == self.seq:
            await self._publish(self.last_report)  # repeat until the seq advances

    def _beat_data(self) -> dict[str, Any]:
        running = self.child is not None and self.child.running
        return {"node": self.cfg.node, "pod_ip": self.cfg.pod_ip,
                "child_pid": self.child.pid if self.child and self.child.running else None,
                "node_ip": os.environ.get("AEGIS_NODE_IP", self.cfg.pod_ip),
                "gpu_type": self.gpu_type, "child_restarts": max(0, self.child_starts - 1),
                "beat_lag": round(self.beats.lag, 4),
                "step_rate": self._step_rate() if running else None,
                "step": self.steps.last, "doing": self.doing,
                "progress": (self.progress.auto.beat() if running and self.progress is not None
                             and self.progress.auto is not None else None),
                "doing_for": round(time.monotonic() - self.doing_since, 1),
                **({"hang_mark": {"ranks": list(self.marked), "frame": self.marked_frame}}
                   if self.marked and self.marked_seq == self.seq
                   and self.marked_frame is not None else {}),
                "resources": self._sampled,
                **({"saver": self.saver.data()} if self.saver is not None else {})}

    async def _sample_loop(self) -> None:
        """Sample the resources once per heartbeat interval, in a thread (NVML calls block;
        PCIe throughput blocks ~20 ms per GPU): heartbeats send the newest sample and never
        wait for one. A failed sample is an empty one."""
        while True:
            child = self.child
            pids = ([] if child is None or not child.running else
                    child.pids if isinstance(child, childmod.ChildGroup) else [child.pid])
            try:
                self._sampled = await asyncio.to_thread(self.sampler.sample,
                                                        time.monotonic(), pids)
            except Exception:  # noqa: BLE001 - monitoring must never stop the supervisor
                self._sampled = {}
            await asyncio.sleep(self.beat_every)

    def _step_rate(self) -> float | None:
        """Steps per second: the script's own step numbers, else its optimizer steps."""
        rate = self.steps.rate(time.time())
        return rate if rate is not None or self.steps.last is not None else (
            self.auto_steps.rate(time.time()))

    def _doing(self, what: str) -> None:
        if what != self.doing:
            self.doing, self.doing_since = what, time.monotonic()

    async def _prewarmed(self, zygote: Zygote) -> bool:
        """Wait (at most 120 s) for the pre-warmed interpreter, saying so while it imports."""
        if not zygote.is_ready:
            self._doing(PREWARMING)
        return await zygote.ready(timeout=120)

    # -- orders -----------------------------------------------------------------------------
    async def on_order(self, raw: bytes) -> None:
        try:
            msg = p.decode(raw, job=self.cfg.job, namespace=self.cfg.namespace)
        except p.ProtocolError as exc:
            _warn(f"ignored a bad order: {exc.reason}")
            return
        if msg.type is p.MsgType.MARK and msg.pod_name == "master":
            # a task: the stack dump must not hold up the orders behind it
            self._tasks.add(task := asyncio.ensure_future(self._on_mark(msg)))
            task.add_done_callback(self._tasks.discard)
            return
        if msg.type is p.MsgType.SAVE and msg.pod_name == "master":
            self._on_save(msg)
            return
        if msg.type is not p.MsgType.ORDER or msg.pod_name != "master":
            return
        if self.drop is not None and self.drop(msg):
            return  # the test transport lost this order
        if msg.rank not in (-1, self.cfg.rank):
            return
        self.last_order_at = time.monotonic()
        self._heard_master()
        self._beat_floor(msg.data.get("beat_floor"))
        self.keepalives.asked(msg.data.get("keepalive"))
        try:
            order = Order(msg.data.get("order", ""))
        except ValueError:
            _warn(f"ignored unknown order {msg.data.get('order')!r}")
            return
        # an exit is sent to one worker with the seq of the hold broadcast that came with it
        personal_exit = (order is Order.EXIT and msg.rank == self.cfg.rank
                         and msg.seq == self.seq)
        if msg.seq <= self.seq and not personal_exit:
            return  # duplicate or stale order
        if self.exit_code is not None and self.exit_code.done():
            return  # already leaving
        self.seq = msg.seq
        self.last_report = None
        with contextlib.suppress(OSError):  # a round asked for in the last run is answered
            os.unlink(self.save_request)
        epoch = int(msg.data.get("restart_count", 0))
        for i, inj in enumerate(self.cfg.injections):
            if inj.fires("die", self.cfg.rank, epoch, order.value, self.cfg.work_dir, i):
                _warn(f"injected fault: this supervisor dies on order {order.value!r}")
                os.kill(os.getpid(), signal.SIGKILL)
        if self.activity is not None and not self.activity.done():
            self.activity.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.activity
        self.activity = asyncio.ensure_future(self._obey(order, msg))

    def _on_save(self, msg: p.Message) -> None:
        """The master asks for a fault-tolerance checkpoint round (before a planned eviction):
        write its run id where the training process and the saver look
        (``$AEGIS_SAVE_REQUEST``, ``aegis_flow.checkpoint.requested()``)."""
        run_id = msg.data.get("run_id")
        if msg.seq != self.seq or not isinstance(run_id, str) or not run_id.isprintable():
            return
        self._heard_master()
        tmp = f"{self.save_request}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(run_id[:100] + "\n")
            os.replace(tmp, self.save_request)
        except OSError as exc:
            _warn(f"cannot ask for a checkpoint round: {exc}")
            return
        why = str(msg.data.get("reason", ""))[:200]
        _warn(f"a fault-tolerance checkpoint round is asked for ({run_id}"
              f"{': ' + why if why else ''}): aegis_flow.checkpoint.requested() returns it to "
              "the training script and the saver")

    async def _on_mark(self, msg: p.Message) -> None:
        """The master marks ranks of this run hung (SetIsHanging): every process is kept; this
        rank notes the mark and names the frame its own process is in (the evidence of every
        rank, not only of the one whose watchdog fired)."""
        ranks = msg.data.get("hanging")
        if msg.seq != self.seq or not isinstance(ranks, list) or not all(
                isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            return  # another run's mark, or not a mark
        self._heard_master()
        marked = tuple(sorted(set(ranks)))[:64]
        if marked == self.marked and self.marked_seq == msg.seq:
            return
        # the beats say the mark once its frame is known: the master logs the first beat's
        # frame (py-spy took longer than a beat interval on a loaded machine, and the fault log
        # said "a frame py-spy could not read" for a frame it read a moment later)
        self.marked, self.marked_seq, self.marked_frame = marked, msg.seq, None
        frame = ""
        child = self.child
        if child is not None and child.running:
            stacks = await asyncio.get_running_loop().run_in_executor(
                None, collect_stacks, child.pid)
            frame = top_frame(stacks) or ""
            if not frame:  # say why, in the log and in the fault log (the heartbeat's frame)
                why = (stacks.strip().splitlines() or ["py-spy printed nothing"])[-1]
                frame = f"a frame py-spy could not read ({why[:150]})"
        self.marked_frame = frame[:200]
        who = ", ".join(str(r) for r in marked)
        _warn(f"the job is marked hung (rank{'s' if len(marked) > 1 else ''} {who}): every "
              "process is kept" + (f"; this rank is in {frame}" if frame else ""))

    async def _stop_child(self) -> None:
        if self.child is not None and self.child.running:
            await self.child.stop(self.cfg.grace)

    async def _obey(self, order: Order, msg: p.Message) -> None:
        if order in (Order.BOOTCHECK, Order.TROUBLESHOOT):
            self.phase = PHASE_OF_ORDER[order]
            self._doing("running the checks")
            await self._stop_child()
            if self.checks is not None:
                ok, fault, detail = await self.checks(order.value, self.cfg)
                extra: dict[str, Any] = {}
            else:
                ok, fault, detail, extra = await bootcheck_or_troubleshoot(
                    order, msg.data, rank=self.cfg.rank, world_size=self.cfg.world_size,
                    work_dir=os.path.abspath(self.cfg.work_dir), env=self.child_env(None),
                    starters=self._check_starters())
            epoch = int(msg.data.get("restart_count", 0))
            for i, inj in enumerate(self.cfg.injections):
                if inj.fires("checkfail", self.cfg.rank, epoch, order.value, self.cfg.work_dir,
                             i):
                    ok, fault, detail = False, inj.fault, f"injected {inj.fault} fault"
            await self.report(p.MsgType.FINISH, {"ok": ok, "fault": fault, "detail": detail,
                                                 **extra}, seq=msg.seq)
            self._doing("checks done; waiting for the other ranks")
        elif order is Order.RUN:
            self.phase = Phase.RUNCOMMAND
            self._doing("starting the command")
            await self._stop_child()
            await self._run_child(msg)
        elif order is Order.HOLD:
            self.phase = Phase.RESTARTING
            self._doing("")
            await self._stop_child()
        else:  # quit, exit, run-independent
            await self._stop_child()
            if order is Order.RUN_INDEPENDENT:
                self._finish(-1)
                return
            if order is Order.EXIT:
                code = int(msg.data.get("exit_code", 71))
            else:
                code = quit_exit_code(str(msg.data.get("outcome")))
            self.phase = Phase.SUCCEED if code == 0 else Phase.FAILED
            self._finish(code)

    def _finish(self, code: int) -> None:
        if self.exit_code is not None and not self.exit_code.done():
            self.exit_code.set_result(code)

    def child_env(self, msg: p.Message | None) -> dict[str, str]:
        env = dict(os.environ)
        rdzv = msg.data.get("rendezvous", {}) if msg else {}
        restart = int(msg.data.get("restart_count", 0)) if msg else 0
        k = self.cfg.nproc_per_node
        env.update({
            "RANK": str(self.cfg.rank * k),
            "LOCAL_RANK": os.environ.get("LOCAL_RANK", "0") if k == 1 else "0",
            "WORLD_SIZE": str(self.cfg.world_size * k),
            "MASTER_ADDR": str(rdzv.get("addr", os.environ.get("MASTER_ADDR", "127.0.0.1"))),
            "MASTER_PORT": str(rdzv.get("port", os.environ.get("MASTER_PORT", "29500"))),
            "AEGIS_RESTART_COUNT": str(restart), "AEGIS_JOB": self.cfg.job,
            "PYTHONUNBUFFERED": "1", "AEGIS_WORK_DIR": os.path.abspath(self.cfg.work_dir),
            "AEGIS_NODE": self.cfg.node,
        })
        if k > 1:  # as torchrun sets them; CUDA_VISIBLE_DEVICES is left as it is (torchrun
            # too): each local rank picks its GPU with LOCAL_RANK (local_env)
            env.update({"LOCAL_WORLD_SIZE": str(k), "GROUP_RANK": str(self.cfg.rank),
                        "NODE_RANK": str(self.cfg.rank), "AEGIS_WORKER_RANK": str(self.cfg.rank)})
        if self.progress is not None:
            env["AEGIS_PROGRESS_SOCKET"] = self.progress.path
        env["AEGIS_SAVE_REQUEST"] = self.save_request
        if self.cfg.checkpoint_dir:
            where = os.path.abspath(self.cfg.checkpoint_dir)
            env["AEGIS_CHECKPOINT_DIR"] = where
            env["AEGIS_RESUME_FROM"] = os.path.join(where, RESUME_LINK)
        return env

    async def _gate(self, env: dict[str, str], msg: p.Message | None) -> None:
        """The checkpoint integrity gate before a run (rank 0, ``--checkpoint-dir``): verify
        the newest checkpoint, move damaged ones aside, point ``aegis-resume`` at the first
        good one, and tell the master (fault log). In the pre-warmed interpreter when it can
        (torch is warm there), else cold; bounded; a gate that fails never stops the run."""
        self._doing("verifying the checkpoint to resume from")
        fd, out = tempfile.mkstemp(prefix=".aegis-gate-", suffix=".json")
        os.close(fd)
        os.unlink(out)
        argv = [sys.executable, "-m", "aegis_flow.supervisor.integrity", "gate",
                os.path.abspath(self.cfg.checkpoint_dir), "--pattern",
                self.cfg.checkpoint_pattern, "--out", out]
        result: dict[str, Any] = {}
        why = "no way to start it"
        try:
            for start in self._check_starters():
                try:
                    proc = await start(argv, {**env, "AEGIS_PROGRESS_SOCKET": ""})
                except OSError as exc:
                    why = str(exc)
                    continue
                try:
                    await wait_or_cancel(proc.wait(), GATE_TIMEOUT)
                except asyncio.TimeoutError:
                    await proc.stop(1.0)
                    why = f"it did not finish within {GATE_TIMEOUT:.0f} s"
                    break
                except asyncio.CancelledError:
                    await asyncio.shield(proc.stop(1.0))
                    raise
                try:
                    with open(out) as fh:
                        result = json.load(fh)
                    break
                except (OSError, ValueError) as exc:
                    why = f"no result ({exc})"
        finally:
            if os.path.exists(out):
                os.unlink(out)
        if not result:
            _warn(f"checkpoint gate: {why}; the run starts without it")
            return
        chosen = result.get("chosen")
        if chosen or result.get("damaged") or result.get("error"):
            for line in result.get("messages") or []:
                _warn(f"checkpoint gate: {line}")
        number = checkpoint_number(os.path.basename(chosen)) if chosen else None
        if msg is not None and (result.get("damaged") or result.get("error")) and (
                number is not None):
            await self._publish(self._msg(p.MsgType.CHECKPOINT, msg.seq, {
                "step": number, "path": chosen or "",
                "gate": [str(m)[:300] for m in result.get("messages") or []][:8]}))

    async def _run_child(self, msg: p.Message | None) -> None:
        env = self.child_env(msg)
        epoch = int(env["AEGIS_RESTART_COUNT"])
        _report_progress(epoch)
        active = [(i, inj) for i, inj in enumerate(self.cfg.injections)
                  if inj.applies(self.cfg.rank, epoch)]
        for i, inj in active:
            env = inj.prepare_env(env, fired_marker(self.cfg.work_dir, i))
        if self.cfg.rank != 0 and msg is not None and msg.data.get("rendezvous"):
            await _await_rendezvous(env["MASTER_ADDR"], int(env["MASTER_PORT"]))
        if msg is not None and msg.seq != self.seq:
            return  # a newer order came while waiting: never start the command for this one
        if self.cfg.checkpoint_dir and self.cfg.rank == 0:
            # before rank 0 starts, so before any rank gets past the rendezvous it hosts
            await self._gate(env, msg)
            if msg is not None and msg.seq != self.seq:
                return
        if self.progress is not None:  # the new process counts from zero
            self.progress.drain()
            self.progress.reset()
        try:
            self.command_code = None  # until this run ends on its own
            self.child = await self._start(env)
            self.child_starts += 1
            self.steps.reset()
            self.auto_steps.reset()
        except OSError as exc:
            if msg is not None:
                await self.report(p.MsgType.ERROR, {"cause": f"cannot start command: {exc}",
                                                    "code": 127}, seq=msg.seq)
            return
        killers = [asyncio.ensure_future(inj.kill_later(self.child,
                                                         fired_marker(self.cfg.work_dir, i)))
                   for i, inj in active]
        watch = asyncio.ensure_future(self._watch_hang(self.child))
        try:
            status = await self.child.wait()
            ended_at = time.time()
        finally:
            watch.cancel()
            for k in killers:
                k.cancel()
        self.command_code = status.shell_code
        if msg is None:
            return
        if status.ok:
            await self.report(p.MsgType.FINISH, {"ok": True, "detail": "command exited 0"},
                              seq=msg.seq)
        else:
            await self.report(p.MsgType.ERROR, self._error_report(status, ended_at),
                              seq=msg.seq)
        if self.locked_out:  # no master can reach us again: a new pod must come
            code = lockout_exit_code(status.shell_code)
            _warn(f"the command ended ({status.cause}) while this worker is locked out: "
                  f"exiting with code {code}")
            self._finish(code)
        elif self.orphaned:  # no master to decide: the command's exit code is ours
            _warn(f"the command ended ({status.cause}) with no master: exiting with code "
                  f"{status.shell_code}")
            self._finish(status.shell_code)

    def _error_report(self, status: childmod.ExitStatus, ended_at: float) -> dict[str, Any]:
        """What the master needs to judge a failed run: the cause the log shows, and — for a
        Python exception — its signature (exception, frame and step: the same signature twice
        in a row on one rank is a deterministic error)."""
        cause = self._classify(status.tail)
        text = status.cause if not cause.known else f"{status.cause} ({cause.code})"
        local = self.child.failed_local if isinstance(self.child, childmod.ChildGroup) else None
        if local is not None:  # which of the worker's K local ranks failed
            text = f"local rank {local} (rank {self.cfg.rank * self.cfg.nproc_per_node + local})" \
                   f": {text}"
        data: dict[str, Any] = {
            "cause": text, "code": status.code, "signal": status.signal,
            "cause_code": cause.code, "cause_class": cause.klass,
            "tail": list(status.tail)[-10:], "ended_at": ended_at,
            **({"local_rank": local} if local is not None else {})}
        exc = exception_of(status.tail) if status.signal is None else None
        if exc is not None:
            if self.progress is not None:  # the steps reported just before it died
                for step in self.progress.drain():
                    self.steps.observe(time.time(), step)
            last = self.steps.last
            exception, where = exc
            data["exception"] = exception
            data["cause"] = f"{text}: {exception}"[:200]
            data["signature"] = (f"{exception} at step {last if last is not None else '?'}"
                                 + (f" ({where})" if where else ""))
        return data

    def _classify(self, lines: tuple[str, ...]) -> Cause:
        try:
            if self._causes is None:  # loaded once: the Error report is on the critical path
                self._causes = load_table(self.cfg.causes_file)
            return classify(lines, self._causes)
        except Exception as exc:  # noqa: BLE001 - a bad user table must not lose the report
            _warn(f"log classifier: {exc}")
            return UNKNOWN_CAUSE

    def _live_trigger(self, seq: int) -> Callable[[str], None]:
        """The live trigger of run ``seq``: each output line, as it is printed, against the
        cause table's live rules (an NCCL timeout, a CUDA error, a lost GPU …). The first match
        goes to the master at once as this run's Error (it starts the recovery: every rank is
        stopped by the next order), while the process is kept until that order comes."""
        said = False

        def on_line(text: str) -> None:
            nonlocal said
            if said or self.seq != seq or self._causes is None:
                return
            rule = self._causes.match_live(text)
            if rule is None:
                return
            said = True
            line = text.strip()[:300]
            _warn(f"the output says {rule.code} ({line}): reported now, before the process "
                  "dies or hangs")
            data = {"cause": f"{rule.code} in the output, reported live: {line}"[:200],
                    "cause_code": rule.code, "cause_class": rule.klass, "live": True,
                    "tail": [line], "code": None, "signal": None, "ended_at": time.time()}
            self._tasks.add(task := asyncio.ensure_future(
                self.report(p.MsgType.ERROR, data, seq=seq)))
            task.add_done_callback(self._tasks.discard)

        return on_line

    async def _watch_hang(self, child: childmod.Child | childmod.ChildGroup) -> None:
        """Progress watchdog: progress.step() reports, else output activity (T13/T14)."""
        seq, dog = self.seq, HangWatchdog(self.cfg.hang_after, self.cfg.hang_quit_after,
                                          started=time.time())
        reported: str | None = None
        scanned = float("-inf")
        while child.running and self.seq == seq:
            await asyncio.sleep(min(1.0, self.cfg.hang_after / 4))
            now = time.time()
            if self.progress is not None:
                for step in self.progress.drain():
                    dog = dog.observe_progress(now, step)
                    self.steps.observe(now, step)
                if self.progress.auto is not None:
                    dog = dog.observe_auto(now, self.progress.auto)
                    self.auto_steps.observe(now, self.progress.auto.steps)
                said, self.progress.checkpoints = self.progress.checkpoints, []
                for number, where in said:  # aegis_flow.checkpoint.done(step, path)
                    await self._checkpoint_done(seq, number, where)
                await self._release_checkpoint(seq)
            if (self.cfg.checkpoint_dir and self.cfg.rank == 0
                    and now - scanned >= CHECKPOINT_SCAN):
                scanned = now
                found = await asyncio.get_running_loop().run_in_executor(
                    None, newest_complete, self.cfg.checkpoint_dir, self.cfg.checkpoint_pattern)
                self.ckpt_watch, news = self.ckpt_watch.news(found)
                if news is not None:
                    await self._checkpoint_done(seq, news[0], str(news[1]))
            if child.last_output is not None:
                dog = dog.observe_output(child.last_output)
            level = dog.check(now)
            if level is None or level == reported:
                if level is None:
                    reported = None
                continue
            reported = level
            waiting = process_state(child.pid) == "S"  # asleep: blocked, e.g. on a peer
            stacks = await asyncio.get_running_loop().run_in_executor(
                None, collect_stacks, child.pid)
            frame = top_frame(stacks)
            auto = self.progress.auto if self.progress is not None else None
            data: dict[str, Any] = {
                "idle": dog.idle(now), "waiting": waiting, "mode": dog.mode, "frame": frame,
                "progress": auto.beat() if auto is not None else None}
            where = f" in {frame}" if frame else ""
            if level == "hang":
                _warn(f"no progress ({dog.mode}) for {dog.idle(now):.0f} s{where}: reporting "
                      "a hang (kept running)")
                await self._publish(self._msg(p.MsgType.HANG, seq, data))
            else:
                _warn(f"no progress ({dog.mode}) for {dog.idle(now):.0f} s{where}: asking to "
                      "restart")
                await self._publish(self._msg(p.MsgType.HANG_WITH_QUIT, seq, {
                    **data, "stacks": stacks[-4000:]}))

    def _progress_ready(self) -> None:
        """The progress socket is readable: buffer it; report a checkpoint said done now."""
        if self.progress is None:
            return
        self.progress.poll()
        said, self.progress.checkpoints = self.progress.checkpoints, []
        for number, where in said:
            self._tasks.add(task := asyncio.ensure_future(
                self._checkpoint_done(self.seq, number, where)))
            task.add_done_callback(self._tasks.discard)

    async def _checkpoint_done(self, seq: int, number: int, where: str, *,
                               held: bool = False) -> None:
        """Tell the master a checkpoint is complete (it records the job's last safe step).

        The master takes a checkpoint only at a step the ranks have reported (review F8). So
        the steps read and not yet judged by the watchdog go out in a heartbeat first (same
        connection: it arrives first), and a checkpoint ahead of every step the script
        reported is held until one reaches it (``_release_checkpoint``; progress.step sends
        at most 10 a second, so the step saved at may itself never have been sent)."""
        if number <= self.ckpt_said:
            return
        latest = self.progress.latest() if self.progress is not None else None
        if latest is not None and (self.steps.last is None or latest > self.steps.last):
            self.steps.observe(time.time(), latest)
        if not held and self.steps.last is not None and number > self.steps.last:
            self.ckpt_held = (seq, number, where, time.monotonic())
            return
        self.ckpt_said = number
        if self.steps.last is not None:
            await self.heartbeat()
        await self._publish(self._msg(p.MsgType.CHECKPOINT, seq, {"step": number,
                                                                  "path": where[:300]}))

    async def _release_checkpoint(self, seq: int) -> None:
        """Send a held checkpoint once the reported steps reach it, or after
        ``CHECKPOINT_STEP_WAIT`` (the master then judges it); forget one of another run."""
        if self.ckpt_held is None:
            return
        held_seq, number, where, since = self.ckpt_held
        if held_seq != seq:
            self.ckpt_held = None
        elif ((self.steps.last is not None and self.steps.last >= number)
              or time.monotonic() - since > CHECKPOINT_STEP_WAIT):
            self.ckpt_held = None
            await self._checkpoint_done(seq, number, where, held=True)

    def _check_starters(self) -> list[Any]:
        """Fork the checks from the pre-warmed interpreter if any, else start them cold."""
        async def warm(argv: list[str], env: dict[str, str]) -> childmod.Child:
            if self.zygote is None or not await self._prewarmed(self.zygote):
                raise OSError("no pre-warmed interpreter")
            if not self.zygote.can_check:  # the command's Python lacks aegis-flow: use ours
                raise OSError("aegis-flow's checks are not importable in the command's Python")
            self._doing("running the checks")
            return await self.zygote.spawn(argv, env, prefix=f"[rank {self.cfg.rank} check] ",
                                           tail_lines=20, on_line=None)

        async def cold(argv: list[str], env: dict[str, str]) -> childmod.Child:
            return await childmod.start(argv, env, prefix=f"[rank {self.cfg.rank} check] ")

        return [warm, cold]

    def local_env(self, env: dict[str, str], local: int) -> dict[str, str]:
        """The environment of local rank ``local`` of this worker (``--nproc-per-node``)."""
        k = self.cfg.nproc_per_node
        return {**env, "RANK": str(self.cfg.rank * k + local), "LOCAL_RANK": str(local)}

    async def _start(self, env: dict[str, str]) -> childmod.Child | childmod.ChildGroup:
        """Start the command: one process, or one per local rank (``--nproc-per-node``, a
        group that fails as one). A start that fails midway stops the ranks already started."""
        if self.cfg.nproc_per_node == 1:
            return await self._start_one(env, self.cfg.rank)
        started: list[childmod.Child] = []
        try:
            for local in range(self.cfg.nproc_per_node):
                local_env = self.local_env(env, local)
                started.append(await self._start_one(local_env, int(local_env["RANK"])))
        except BaseException:
            await asyncio.gather(*(c.stop(1.0) for c in started), return_exceptions=True)
            raise
        return childmod.ChildGroup(started, grace=self.cfg.grace)

    async def _start_one(self, env: dict[str, str], rank: int) -> childmod.Child:
        prefix = f"[rank {rank}] "
        live = self._live_trigger(self.seq)
        try:
            if self.zygote is not None and await self._prewarmed(self.zygote):
                try:
                    return await self.zygote.spawn(self.cfg.command, env, prefix=prefix,
                                                   tail_lines=20, on_line=live)
                except (OSError, asyncio.TimeoutError) as exc:
                    _warn(f"pre-warmed start failed ({exc}); starting the command directly")
                    self.zygote.close()
                    self.zygote = None
            return await childmod.start(self.cfg.command, env, prefix=prefix, on_line=live)
        finally:
            self._doing("")  # training: the step rate says the rest

    # -- main -------------------------------------------------------------------------------
    async def run(self) -> int:
        """Supervise; the checkpoint saver (``--saver``) runs beside it from the start and is
        closed on every way out (plain fallback, exception and cancellation included)."""
        if self.cfg.saver:
            self.saver = Saver(self.cfg.saver, saver_env(self.child_env(None)),
                               rank=self.cfg.rank, grace=self.cfg.grace)
            self.saver.start()
        try:
            return await self._supervise()
        finally:
            if self.saver is not None:
                await self.saver.close()
            with contextlib.suppress(Exception):
                self.sampler.close()
            for leftover in (self.save_request, f"{self.save_request}.tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)

    async def _supervise(self) -> int:
        loop = asyncio.get_running_loop()
        self.exit_code = loop.create_future()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._finish, 128 + sig)
        try:
            import nats

            auth = _auth_options(self.cfg)
            self.session = _creds_session(self.cfg)
            if self.session is not None:  # --nats-url wins over the URLs in the creds
                auth.update(self.session.connect_options())
            self.nc = await wait_or_cancel(nats.connect(
                self.cfg.nats_url, connect_timeout=min(self.cfg.connect_timeout, 5.0),
                max_reconnect_attempts=-1, reconnect_time_wait=0.5, ping_interval=2,
                max_outstanding_pings=3, allow_reconnect=True,
                error_cb=self._nats_error, disconnected_cb=None,
                reconnected_cb=self._nats_back, closed_cb=self._nats_closed, **auth),
                self.cfg.connect_timeout)
        except Exception as exc:  # noqa: BLE001 - any failure to connect means fall back
            return await self.run_independent(f"cannot reach NATS at {self.cfg.nats_url}: {exc}")
        with contextlib.suppress(OSError):
            self.progress = ProgressSocket(tempfile.mktemp(prefix="aegis-progress-",
                                                           suffix=".sock"))
            # a checkpoint said done is reported at once (a slow rank is evicted right after)
            asyncio.get_running_loop().add_reader(self.progress.fileno(), self._progress_ready)
        if self.cfg.prewarm:
            self.zygote = start_zygote(self.cfg.command, self.child_env(None),
                                       os.path.abspath(self.cfg.work_dir))
        await self.nc.subscribe(self.subjects.broadcast, cb=self._cb)
        await self.nc.subscribe(self.subjects.worker(self.cfg.rank), cb=self._cb)
        self.last_order_at = self.master_seen_at = time.monotonic()
        self._classify(())  # load the cause table now, not when a rank has just died
        beat = asyncio.ensure_future(self._beat_loop())
        sampling = asyncio.ensure_future(self._sample_loop())
        orphan = asyncio.ensure_future(self._master_watch())
        renew = (asyncio.ensure_future(self.session.renew_loop(self.nc, _warn))
                 if self.session is not None else None)
        reaper = asyncio.ensure_future(self._reap_loop()) if os.getpid() == 1 else None
        try:
            code = await self.exit_code
        finally:
            beat.cancel()
            sampling.cancel()
            orphan.cancel()
            if renew is not None:
                renew.cancel()
            if reaper:
                reaper.cancel()
            if self.activity is not None:
                self.activity.cancel()
                with contextlib.suppress(BaseException):
                    await self.activity
            await self._stop_child()
            if self.zygote is not None:
                self.zygote.close()
                self.zygote = None
            if self.progress is not None:
                with contextlib.suppress(Exception):
                    asyncio.get_running_loop().remove_reader(self.progress.fileno())
                self.progress.close()
            with contextlib.suppress(Exception):
                await close_within(self.nc, 2)
        if code == -1:
            return await self.run_independent("the master told every worker to run on its own")
        return code

    async def _cb(self, msg: Any) -> None:
        await self.on_order(msg.data)

    async def _nats_error(self, exc: Exception) -> None:
        """While NATS is out the client fails twice a second: say so once, then every 30 s
        with a count (training goes on meanwhile; the heartbeats resume on reconnect)."""
        now = time.monotonic()
        if refused_credentials(exc):
            self._refused(now, exc)
        self._nats_errors += 1
        if now - self._nats_error_at >= 30.0:
            more = f" ({self._nats_errors - 1} more since)" if self._nats_errors > 1 else ""
            text = (str(exc) or type(exc).__name__).removeprefix("nats: ")
            _warn(f"NATS: {text}{more}; training goes on, reconnecting")
            self._nats_error_at, self._nats_errors = now, 0

    async def _nats_back(self) -> None:
        if self._nats_error_at > float("-inf"):
            _warn("NATS: reconnected")
        self._nats_error_at, self._nats_errors = float("-inf"), 0
        self.refused_since, self.refused_why = None, ""

    async def _nats_closed(self) -> None:
        """The client closed without our asking: the server dropped us for good (a revoked
        key: "User Authentication Revoked"); nats-py never reconnects a closed client."""
        if self.exit_code is None or self.exit_code.done():
            return  # our own shutdown
        last = getattr(self.nc, "last_error", None)
        self._refused(time.monotonic(), last or "the server closed the connection")

    def _refused(self, now: float, why: object) -> None:
        if self.refused_since is None:
            self.refused_since = now
        self.refused_why = str(why).strip() or type(why).__name__

    def _beat_floor(self, floor: object) -> None:
        """A large job's master asks for fewer heartbeats (policy.beat_floor): beat every
        ``floor`` seconds when that is longer than our own interval (bounded: 60 s)."""
        if isinstance(floor, int | float) and not isinstance(floor, bool) and 0 < floor <= 60:
            every = max(self.cfg.heartbeat_interval, float(floor))
            if every != self.beat_every:
                self.beat_every = self.beats.interval = every

    async def _beat_loop(self) -> None:
        while True:
            await self.heartbeat()
            if self.seq < 0 and time.monotonic() - self.last_order_at > self.cfg.master_timeout:
                _warn(f"no order from the master in {self.cfg.master_timeout:.0f} s")
                self._finish(-1)
                return
            await asyncio.sleep(self.beat_every)

    # -- the orphan bound --------------------------------------------------------------------
    def _heard_master(self) -> None:
        self.master_seen_at = time.monotonic()
        if self.orphaned:
            self.orphaned = False
            _warn("the master is back: fault tolerance resumes")

    async def _master_present(self, timeout: float) -> bool:
        """Is a master listening on our report subject? A heartbeat sent as a NATS request
        tells: the server answers "no responders" at once when nobody subscribes there; a
        master never replies, so a timeout on a connected client means one is listening."""
        import nats.errors

        if self.nc is None or not self.nc.is_connected:
            return False
        msg = self._msg(p.MsgType.ACK, self.seq, self._beat_data())  # one more heartbeat
        if self.drop is not None and self.drop(msg):
            return False
        try:
            await self.nc.request(self.subjects.master(self.cfg.rank), msg.encode(),
                                  timeout=timeout)
        except nats.errors.NoRespondersError:
            return False
        except asyncio.TimeoutError:
            return bool(self.nc.is_connected)
        except Exception:  # noqa: BLE001 - disconnected, draining, no permission: no sign
            return False
        return True

    async def _master_watch(self) -> None:
        """The orphan bound: once the job has begun (an order came), no master for
        ``orphan_timeout`` seconds means none is coming back. The master sends nothing while
        all is well (a command running, a worker waiting for its peers), so silence proves
        nothing: the watch asks NATS whether a master listens, and only when it has not heard
        of one for half the bound (so a healthy job costs one probe per half bound). Training
        is never stopped for it: a running command runs to completion and its exit code
        becomes the worker's (``_run_child``); a worker with no command running exits at once,
        with its last run's code."""
        bound = self.cfg.orphan_timeout
        interval = max(0.1, min(1.0, bound / 8))
        while True:
            await asyncio.sleep(interval)
            if self.seq < 0:  # no order yet: the master timeout's business (_beat_loop)
                continue
            if self._lockout_check():
                return
            if time.monotonic() - self.master_seen_at > bound / 2:
                if await self._master_present(min(1.0, interval)):
                    self._heard_master()
            silent = time.monotonic() - self.master_seen_at
            if silent <= bound:
                continue
            running = self.child is not None and self.child.running
            code = self.command_code if self.command_code is not None else int(ExitCode.STOPPED)
            if not self.orphaned:
                self.orphaned = True
                _warn(f"no master for {silent:.0f} s: finishing without fault tolerance ("
                      + ("the command runs to completion; its exit code will be this worker's)"
                         if running else f"exit code {code}, "
                         + ("the command's)" if self.command_code is not None
                            else "the command did not finish)")))
            if not running:
                self._finish(code)
                return

    def _lockout_check(self) -> bool:
        """A worker whose credentials NATS has refused for LOCKOUT_GRACE seconds was retired by
        the master (its key revoked after an exit order it never heard: it was reconnecting
        when the order went out; or its JWT ran out with no master to renew it). It can never
        hear an order again, so waiting for the orphan bound only delays its replacement. A
        running command runs to completion (training is never stopped for the control plane);
        a worker with none running exits now (``lockout_exit_code``). True when it finished."""
        since = self.refused_since
        if since is None or time.monotonic() - since < LOCKOUT_GRACE:
            return False
        running = self.child is not None and self.child.running
        code = lockout_exit_code(self.command_code)
        if not self.locked_out:
            self.locked_out = True
            _warn(f"NATS refuses this worker's credentials ({self.refused_why}) for "
                  f"{time.monotonic() - since:.0f} s: the master retired this worker (it "
                  "replaced the rank or quarantined the node) before it heard its order; "
                  + ("the command runs to completion, then the worker exits"
                     if running else f"exiting with code {code} so the pod is recreated"))
        if running:
            return False
        self._finish(code)
        return True

    async def _reap_loop(self) -> None:
        while True:
            childmod.reap_orphans(lambda pid: (self.child is not None and pid == self.child.pid)
                                  or (self.saver is not None and self.saver.owns(pid)))
            await asyncio.sleep(1.0)

    async def run_independent(self, why: str) -> int:
        """RunIndependent: fault tolerance is off; the command's exit code is ours."""
        banner = "!" * 78
        _warn(f"{banner}\nFAULT TOLERANCE IS OFF: {why}.\nRunning the command as a plain "
              f"process; its exit code will be this worker's.\n{banner}")
        self.phase = Phase.INDEPENDENT
        try:
            self.child = await childmod.start(self.cfg.command, self.child_env(None),
                                              prefix=f"[rank {self.cfg.rank}] ")
        except OSError as exc:
            _warn(f"cannot start the command: {exc}")
            return 127
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.child.signal_group, sig)
        reaper = asyncio.ensure_future(self._reap_loop()) if os.getpid() == 1 else None
        status = await self.child.wait()
        if reaper is not None:
            reaper.cancel()
        return status.shell_code
