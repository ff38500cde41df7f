"""``aegis-flow run``: one job on one machine — embedded NATS, a master and N supervisors.

Side effects: starts and stops processes (nats-server, the master, one supervisor per rank),
writes the state dir (``run.lock``, ``nats.url``, ``pids.json``, the NATS store, ``runs/``).
Plays the part Kubernetes plays on a cluster: a supervisor that exits with the node-fault or
container-restart code, or dies, is started again as a new incarnation (a node fault on a new
"node"); a master that dies is started again and resumes from the stored status. Nothing is left
running on any exit path.

One run of a job at a time (``run.lock``: an exclusive flock, holding the runner's pid). A run is
a new job: what the last run left (``status.json``, ``logs/``, the NATS store) is moved to
``runs/<id>/`` when that job ended; an interrupted job (a live phase stored) is continued only on
``--resume`` (``rerun="resume"``) and archived on ``--fresh``. Every ending leaves
``status.json``: the master writes it when the job ends; when the runner ends the run itself (a
signal, or it gave up restarting processes) it stops the master first, then the workers, reads
the stored status from the KV and writes it with a ``stopped_by`` note, the fault log's closing
records and the summary line.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aegis_flow.local.nodes import node_name
from aegis_flow.local.progress import ProgressPrinter
from aegis_flow.local.runs import (
    LOCK_FILE,
    RUN_FILES,
    RUNS_DIR,
    RunLock,
    delete_stored_status,
    job_user_options,
    read_stored_status,
)
from aegis_flow.master.machine import ExitCode
from aegis_flow.protocol import Subjects
from aegis_flow.settings import LOCAL, MASTER, WORKER, check_local, master_timeout_for
from aegis_flow.supervisor.child import _die_with_parent
from aegis_flow.supervisor.inject import Injection, fired_marker

if TYPE_CHECKING:
    from aegis_flow.local.natsserver import EmbeddedNats
    from aegis_flow.local.status import LastRun

REPLACE_CODES = {int(ExitCode.NODE_FAULT), int(ExitCode.CONTAINER_RESTART),
                 int(ExitCode.SLOW_NODE_EVICTED)}
NEW_NODE_CODES = {int(ExitCode.NODE_FAULT), int(ExitCode.SLOW_NODE_EVICTED)}
# succeed, failed, conflict, independent, no NATS, a damaged stored status
MASTER_DONE_CODES = {0, 1, 2, 3, 4, 5}
INDEPENDENT_CODES = {3, 4}
RERUN_CHOICES = ("new", "resume", "fresh")
NATS_ROOM = 16 << 20  # free bytes in the NATS store before a server that hit ENOSPC restarts


@dataclass(frozen=True)
class RunConfig:
    command: tuple[str, ...]
    workers: int
    max_retry: int = MASTER.max_retry
    give_up_on_repeat: bool = MASTER.give_up_on_repeat
    job: str = LOCAL.job
    namespace: str = MASTER.namespace
    nats_url: str | None = None  # None: embedded server
    state_dir: Path = Path(LOCAL.state_dir)
    injections: tuple[str, ...] = ()
    connect_timeout: float = MASTER.connect_timeout
    lost_timeout: float = MASTER.lost_timeout
    finish_lag: float = MASTER.finish_lag
    slow_window: float = MASTER.slow_window
    heartbeat: float = WORKER.heartbeat_interval
    grace: float = WORKER.grace
    max_process_restarts: int = LOCAL.max_process_restarts
    prewarm: bool = True
    extra_master_args: tuple[str, ...] = ()
    extra_worker_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = LOCAL.metrics_port  # the master's /metrics port (0 = a free one)
    progress: bool = True  # a status line on stderr every few seconds
    progress_every: float = LOCAL.progress_every
    secure: bool = True  # embedded NATS in operator mode, per-worker credentials (security/)
    jwt_lifetime: float = MASTER.jwt_lifetime  # seconds a worker's NATS JWT lives (renewed)
    hang_after: float | None = None  # the supervisors' hang thresholds (None: their defaults)
    hang_quit_after: float | None = None
    saver: tuple[str, ...] = ()  # a checkpoint saver every supervisor runs beside training
    checkpoint_dir: str = ""  # the command's checkpoints: watched and gated (supervisor)
    checkpoint_pattern: str = "ckpt-*"
    causes: str = ""  # the user's cause table (--causes): every supervisor's classifier
    nproc_per_node: int = 1  # ranks per worker (torchrun's --nproc-per-node)
    # extra environment for the supervisor on one node (and so its checks and command):
    # (node, NAME, value), e.g. ("local-node-1", "AEGIS_SYSFS_ROOT", "/mnt/host-sys")
    node_env: tuple[tuple[str, str, str], ...] = ()
    # what to do with the job's last run: "new" (archive it if it ended, refuse if it was
    # interrupted), "resume" (continue an interrupted one), "fresh" (archive it whatever it is)
    rerun: str = "new"


def _say(text: str) -> None:
    sys.stderr.write(f"[aegis-flow] {text}\n")
    sys.stderr.flush()


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, env=env, start_new_session=True,
                            preexec_fn=_die_with_parent)


def _stop(procs: list[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM every live process group, wait up to ``grace``, then SIGKILL the rest."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            pass


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _GaveUp(Exception):
    """The runner restarted processes too often: it ends the run itself."""


_BARE_PYTHON = ("python", "python3", f"python3.{sys.version_info.minor}")


def with_our_python(command: tuple[str, ...], ours: str = sys.executable
                    ) -> tuple[tuple[str, ...], str]:
    """A command that starts with a bare ``python``/``python3`` runs with the interpreter
    aegis-flow runs in (the one with torch, whether or not its venv is activated), and the
    note that says so; a path (``/usr/bin/python3``, ``./venv/bin/python``) or any other
    program is the user's explicit choice and is left alone. PURE."""
    if not command or command[0] not in _BARE_PYTHON:
        return command, ""
    note = (f"running {command[0]!r} as {ours} (the interpreter aegis-flow runs in; give a "
            "path to use another)")
    return (ours, *command[1:]), note


NODES_FILE = "nodes.json"  # rank → the node the runner started it on (read by the master)


def command_problem(command: tuple[str, ...], cwd: Path,
                    which: Callable[[str], str | None]) -> str | None:
    """Why the command cannot start on this machine (every rank would fail the same way, so
    no retry could help), or None. A Python script must exist; a program must be found."""
    from aegis_flow.supervisor.prewarm import python_command

    program = command[0]
    if "/" in program:
        if not os.access(cwd / program, os.X_OK) or (cwd / program).is_dir():
            return f"the command {program!r} is not an executable file (in {cwd})"
    elif which(program) is None:
        return f"the command {program!r} is not found on PATH"
    if python_command(command):
        rest = [a for a in command[1:] if a != "-u"]
        if rest[0] != "-m" and not (cwd / rest[0]).is_file():
            return f"the script {rest[0]!r} does not exist (in {cwd})"
    return None


_HAS_TORCH = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('torch') else 3)"


def interpreter_problem(command: tuple[str, ...], cwd: Path, ours: str = sys.executable,
                        which: Callable[[str], str | None] = shutil.which) -> str | None:
    """A Python command whose interpreter (an explicit one, not aegis-flow's own) cannot find
    torch: every rank's training and runtime check would fail, so say it before anything
    starts. Asks that interpreter (a ``find_spec``, not an import: well under a second);
    None when it can, when it is ours, or when it cannot be asked."""
    from aegis_flow.supervisor.prewarm import python_command

    if not python_command(command):
        return None
    program = command[0] if "/" in command[0] else (which(command[0]) or command[0])
    path = (cwd / program) if "/" in program else Path(program)
    if os.path.abspath(path) == os.path.abspath(ours):  # not realpath: a venv links its base
        return None
    try:
        asked = subprocess.run([str(path), "-c", _HAS_TORCH], cwd=cwd, timeout=30,
                               capture_output=True)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if asked.returncode != 3:
        return None
    return (f"the interpreter {command[0]!r} cannot import torch, so every rank would fail: "
            f"use a Python that has torch, or a bare 'python' to run aegis-flow's own ({ours})")


def usable_dir(path: Path) -> str | None:
    """Create ``path`` (and its parents) and check it can be written: None, or why not, in a
    few words (the errno's text, without a traceback)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".aegis-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"{exc.strerror or type(exc).__name__}" + (
            f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else "")
    return None


def _error(text: str) -> int:
    """A refusal before anything started: one line, exit code 2."""
    sys.stderr.write(f"aegis-flow: error: {text}\n")
    sys.stderr.flush()
    return 2


class LocalJob:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.state_dir = cfg.state_dir / cfg.job
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **cfg.env}
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.worker_codes: dict[int, int] = {}
        self.node_gen: dict[int, int] = {}
        self.restarts = 0
        self.url = ""
        self.progress = ProgressPrinter(self.state_dir / "metrics.port",
                                        every=cfg.progress_every, enabled=cfg.progress)
        self.grpc_addr = ""  # the master's SyncWorkerCreds address when credentials are on
        self.subjects = Subjects(cfg.namespace, cfg.job)
        self.stopped_by = ""  # set when the runner, not the master, ends the run
        self._stopping = False  # cleaning up: a second signal is not an exception any more
        self.server: EmbeddedNats | None = None  # the embedded nats-server (None: external)
        self._first_master = True  # a master exit 4 (NATS unreachable) is final only at first
        self._nats_dead: EmbeddedNats | None = None  # the server that died, until replaced
        self._nats_retry_at = 0.0
        self._nats_log_at = 0  # how far the server's log was read (critical write errors)
        self._nats_log_check = 0.0
        self._nats_write_error = False  # the store hit a write error: restart once it has room

    def _master_args(self, *, first: bool = False) -> list[str]:
        """The master's command line; ``first``: the run's first master, which on ``--resume``
        tells the core the workers were all started again (T8r: nothing counted)."""
        c = self.cfg
        resumed = ["--resumed"] if first and c.rerun == "resume" else []
        return [sys.executable, "-m", "aegis_flow.master", *resumed, "--job", c.job, "--namespace",
                c.namespace, "--workers", str(c.workers), "--max-retry", str(c.max_retry),
                "--nats-url", self.url, "--connect-timeout", str(c.connect_timeout),
                "--lost-timeout", str(c.lost_timeout), "--finish-lag", str(c.finish_lag),
                "--slow-window", str(c.slow_window),
                "--status-file", str((self.state_dir / "status.json").absolute()),
                "--metrics-port", str(c.metrics_port), "--metrics-addr", "127.0.0.1",
                "--port-file", str((self.state_dir / "metrics.port").absolute()),
                "--node-file", str((self.state_dir / NODES_FILE).absolute()),
                "--log-dir", str((self.state_dir / "logs").absolute()),
                "--give-up-on-repeat" if c.give_up_on_repeat else "--no-give-up-on-repeat",
                *self._master_auth_args(), *c.extra_master_args]

    def _master_auth_args(self) -> list[str]:
        if not self.grpc_addr:
            return []
        return ["--auth-dir", str(self.state_dir / "auth"), "--token-file",
                str(self.state_dir / "token"), "--grpc-listen", self.grpc_addr,
                "--jwt-lifetime", str(self.cfg.jwt_lifetime)]

    def _worker_init_args(self, rank: int) -> list[str]:
        """Locally the credential fetch runs just before the supervisor, in the same process
        (worker-init execs the supervisor whatever happens; without credentials it falls back
        to a plain run)."""
        if not self.grpc_addr:
            return []
        creds = self.state_dir / "creds" / f"{rank}.creds"
        return [sys.executable, "-m", "aegis_flow.security.worker_init", "--master",
                self.grpc_addr, "--job", self.cfg.job, "--namespace", self.cfg.namespace,
                "--worker", str(rank), "--token-file", str(self.state_dir / "token"),
                "--out", str(creds), "--exec", "--"]

    def _node(self, rank: int) -> str:
        return node_name(rank, self.node_gen.get(rank, 0))

    def _worker_env(self, rank: int) -> dict[str, str]:
        node = self._node(rank)
        return {**self.env, **{k: v for n, k, v in self.cfg.node_env if n == node}}

    def _worker_args(self, rank: int) -> list[str]:
        c = self.cfg
        node = self._node(rank)
        hang = [*(["--hang-after", str(c.hang_after)] if c.hang_after else []),
                *(["--hang-quit-after", str(c.hang_quit_after)] if c.hang_quit_after else [])]
        injects = [a for s in c.injections for a in ("--inject", s)]
        creds = (["--creds", str(self.state_dir / "creds" / f"{rank}.creds")]
                 if self.grpc_addr else [])
        return [*self._worker_init_args(rank), sys.executable, "-m", "aegis_flow.supervisor",
                *creds, "--job", c.job, "--namespace",
                c.namespace, "--rank", str(rank), "--world-size", str(c.workers), "--nats-url",
                self.url, "--node", node, "--heartbeat", str(c.heartbeat), "--grace",
                str(c.grace), "--master-timeout", str(master_timeout_for(c.connect_timeout)),
                "--master-connect-timeout", str(c.connect_timeout),
                "--work-dir", str(self.state_dir / "work"), *injects,
                *([] if c.prewarm else ["--no-prewarm"]), *hang,
                *(["--saver", shlex.join(c.saver)] if c.saver else []),
                *(["--checkpoint-dir", os.path.abspath(c.checkpoint_dir), "--checkpoint-pattern",
                   c.checkpoint_pattern] if c.checkpoint_dir else []),
                *(["--causes", c.causes] if c.causes else []),
                *(["--nproc-per-node", str(c.nproc_per_node)] if c.nproc_per_node > 1 else []),
                *c.extra_worker_args, "--", *c.command]

    def _secure_nats(self) -> Path:
        """Operator mode: bootstrap the keys (0600, kept across runs), write the server config,
        a fresh bootstrap token for this run, and pick the master's gRPC port."""
        from aegis_flow.master.runtime import free_port
        from aegis_flow.security.tokens import new_token, write_token

        config = self._server_config()
        write_token(self.state_dir / "token", new_token())
        (self.state_dir / "creds").mkdir(mode=0o700, exist_ok=True)
        self.grpc_addr = f"127.0.0.1:{free_port()}"
        return config

    def _server_config(self) -> Path:
        """The embedded server's operator-mode config (keys bootstrapped once, kept)."""
        from aegis_flow.security.operator import bootstrap

        return bootstrap(self.state_dir / "auth").write_server_config()

    def _nats_config(self) -> Path | None:
        """The embedded server's config, or None without authentication (--insecure-nats)."""
        return self._server_config() if self.cfg.secure else None

    def _nats_options(self) -> dict[str, Any]:
        """Connect options for the runner's own reads of the KV."""
        if self.cfg.nats_url is not None:
            return {}
        return job_user_options(self.state_dir, self.subjects, name="aegis-flow-run")

    def _write_pids(self) -> None:
        pids = {"runner": os.getpid(), "master": self.master.pid if self.master else None,
                "nats": self.server.pid if self.server is not None and self.server.running
                else None,
                "workers": {str(r): p.pid for r, p in self.workers.items()}}
        tmp = self.state_dir / "pids.json.tmp"
        tmp.write_text(json.dumps(pids))
        os.replace(tmp, self.state_dir / "pids.json")
        self._write_nodes()

    def _write_nodes(self) -> None:
        """Where each worker runs, in the runner's words: the master trusts this file, not the
        node a worker names in its heartbeat (review F1)."""
        nodes = {str(r): self._node(r) for r in range(self.cfg.workers)}
        tmp = self.state_dir / "nodes.json.tmp"
        tmp.write_text(json.dumps(nodes))
        os.replace(tmp, self.state_dir / NODES_FILE)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._stopping:  # already stopping everything: let the cleanup finish
            _say(f"{signal.Signals(signum).name}: already stopping every process")
            return
        raise _Interrupted(signum)

    def run(self) -> int:
        problem = usable_dir(self.state_dir)
        if problem is not None:
            return _error(f"cannot keep job {self.cfg.job!r} in {self.cfg.state_dir}: {problem} "
                          "(choose a writable directory with --state-dir)")
        lock = RunLock(self.state_dir / LOCK_FILE)
        holder = lock.acquire()
        if holder is not None:
            return _error(f"job {self.cfg.job!r} in {self.cfg.state_dir} is already running: "
                          f"aegis-flow run pid {holder or 'unknown'} holds "
                          f"{self.state_dir / LOCK_FILE}; wait for it to end or stop it "
                          f"(aegis-flow stop {self.cfg.job} --state-dir {self.cfg.state_dir})")
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            try:
                refused = self._take_over_last_run()
            except _Interrupted as exc:
                return 128 + exc.signum
            if refused is not None:
                return refused
            return self._run()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            lock.release()

    # -- what the job's last run left -------------------------------------------------------
    def _take_over_last_run(self) -> int | None:
        """Archive the last run, keep it for ``--resume``, or refuse (the exit code)."""
        mode, job = self.cfg.rerun, self.cfg.job
        if mode not in RERUN_CHOICES:
            return _error(f"rerun must be one of {RERUN_CHOICES}, not {mode!r}")
        last = self._last_run()
        where = f"job {job!r} in {self.cfg.state_dir}"
        resumable = last.kind in ("interrupted", "unreadable")
        if mode == "resume":
            if not resumable:
                what = ("has nothing to resume" if last.kind == "none"
                        else f"{last.describe()} and cannot be resumed")
                how = ("pass --fresh to archive it and start over" if last.kind == "damaged"
                       else "run it without --resume to start a new run")
                return _error(f"{where} {what}; {how}")
            if last.workers and last.workers != self.cfg.workers:
                return _error(f"{where} was run with --workers {last.workers}, not "
                              f"{self.cfg.workers}; resume it with --workers {last.workers}, "
                              "or start over with --fresh")
            _say(f"{where} {last.describe()}: resuming it from the stored status")
            (self.state_dir / "status.json").unlink(missing_ok=True)
            return None
        if resumable and mode == "new":
            return _error(f"{where} {last.describe()}; pass --resume to continue it, or "
                          "--fresh to archive it and start over")
        if last.kind == "damaged" and mode == "new":
            return _error(f"{where} {last.describe()}; pass --fresh to archive it and start "
                          "over")
        if last.kind != "none" or any((self.state_dir / n).exists() for n in RUN_FILES):
            dest = self._archive(last)
            _say(f"{where}: the last run {last.describe()}; archived to {dest}; "
                 "starting a new run")
        return None

    def _last_run(self) -> LastRun:
        """What the last run left: its final ``status.json`` or, when it has none (killed, or
        never started), the status stored in the KV."""
        from aegis_flow.local.status import LastRun, last_run

        final = self.state_dir / "status.json"
        if final.exists():
            return last_run(final.read_bytes())
        embedded = self.cfg.nats_url is None
        if embedded and not (self.state_dir / "nats" / "jetstream").is_dir():
            return LastRun("none")
        try:
            return last_run(self._peek())
        except _Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - the store or NATS cannot be read
            if not embedded:  # the master will not reach it either: it says so itself
                return LastRun("none")
            return LastRun("unreadable", why=str(exc) or type(exc).__name__)

    def _peek(self) -> bytes | None:
        """The status stored in the KV, read before this run starts anything."""
        if self.cfg.nats_url is not None:
            return asyncio.run(read_stored_status(self.cfg.nats_url, self.subjects, {}))
        from aegis_flow.local.natsserver import EmbeddedNats

        server = EmbeddedNats(store_dir=str(self.state_dir / "nats"),
                              config_file=self._nats_config())
        server.start()
        try:
            return asyncio.run(read_stored_status(server.url, self.subjects,
                                                  self._nats_options()))
        finally:
            server.stop()

    def _archive(self, last: LastRun) -> Path:
        """Move the last run's files to ``runs/<id>/`` (id: when it ended, and a suffix)."""
        final = self.state_dir / "status.json"
        ended = final.stat().st_mtime if final.exists() else time.time()
        dest = (self.state_dir / RUNS_DIR /
                f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(ended))}-{secrets.token_hex(3)}")
        dest.mkdir(parents=True)
        for name in RUN_FILES:
            if (self.state_dir / name).exists():
                os.replace(self.state_dir / name, dest / name)
        if last.raw is not None and not (dest / "status.json").exists():
            (dest / "status.json").write_bytes(last.raw)  # read from the KV: killed run
        (self.state_dir / "metrics.port").unlink(missing_ok=True)
        if self.cfg.nats_url is not None:  # the KV is not ours to move: forget it
            try:
                asyncio.run(delete_stored_status(self.cfg.nats_url, self.subjects))
            except Exception as exc:  # noqa: BLE001 - the master will say NATS is gone
                _say(f"could not delete the stored status on {self.cfg.nats_url}: {exc}")
        return dest

    # -- the run ----------------------------------------------------------------------------
    def _run(self) -> int:
        (self.state_dir / "work").mkdir(exist_ok=True)
        if self.cfg.rerun != "resume":  # a new run: every --inject may fire again
            for i in range(len(self.cfg.injections)):
                Path(fired_marker(str(self.state_dir / "work"), i)).unlink(missing_ok=True)
        (self.state_dir / "status.json").unlink(missing_ok=True)
        (self.state_dir / "metrics.port").unlink(missing_ok=True)
        code = 1
        try:
            if self.cfg.nats_url is None:
                from aegis_flow.local.natsserver import EmbeddedNats

                config = self._secure_nats() if self.cfg.secure else None
                if not self.cfg.secure:
                    _say("WARNING: --insecure-nats: NATS runs WITHOUT authentication; any local "
                         "process can read and forge this job's messages. For debugging only.")
                self.server = EmbeddedNats(store_dir=str(self.state_dir / "nats"),
                                           config_file=config)
                self.server.start()
                self.url = self.server.url
            else:
                self.url = self.cfg.nats_url
            (self.state_dir / "nats.url").write_text(self.url + "\n")
            _say(f"job {self.cfg.job}: {self.cfg.workers} workers, max-retry "
                 f"{self.cfg.max_retry}, NATS {self.url}, state in {self.state_dir}")
            self._write_nodes()  # before the master, which reads it
            self.master = _spawn(self._master_args(first=True), self.env)
            for rank in range(self.cfg.workers):
                self.workers[rank] = _spawn(self._worker_args(rank), self._worker_env(rank))
            self._write_pids()
            code = self._loop()
        except _Interrupted as exc:
            name = signal.Signals(exc.signum).name
            _say(f"interrupted by {name}; stopping every process")
            self.stopped_by = f"{name} to aegis-flow run"
            code = 128 + exc.signum
        except _GaveUp as exc:
            _say(str(exc))
            self.stopped_by = f"aegis-flow run, which {exc}"
            code = 1
        finally:
            self._stopping = True
            if self.master is not None:  # first, so that nothing is decided after the end
                _stop([self.master], 2.0)
            _stop(list(self.workers.values()), self.cfg.grace + 2)
            if self.stopped_by and self.url:
                self._write_record()
            self._warn_unfired()
            if self.server is not None:
                self.server.stop()
        return code

    def _warn_unfired(self) -> None:
        """An --inject that never fired: the run tested nothing it was meant to; say so."""
        for i, spec in enumerate(self.cfg.injections):
            if not os.path.exists(fired_marker(str(self.state_dir / "work"), i)):
                why = Injection.parse(spec).describe_unfired()
                _say(f"WARNING: --inject {spec} never fired: {why}")

    def _write_record(self) -> None:
        """The run was ended by the runner: ``status.json`` (the stored status as last known,
        with ``stopped_by``), the fault log's closing records and the summary line. The master
        is stopped by now, so the KV holds its last word."""
        from aegis_flow.local.status import summary_of, with_stop_note

        final = self.state_dir / "status.json"
        if final.exists():  # the master wrote it (its job ended, or it obeyed our SIGTERM)
            written = final.read_bytes()
            try:
                stopped = "stopped_by" in json.loads(written)
            except ValueError:
                stopped = False
            if stopped:  # the master's ending, with why it was stopped in the runner's words
                written = with_stop_note(written, self.stopped_by, time.time())
                tmp = final.with_name("status.json.tmp")
                tmp.write_bytes(written)
                os.replace(tmp, final)
            _say(summary_of(written))
            return
        try:
            raw = asyncio.run(read_stored_status(self.url, self.subjects, self._nats_options()))
        except Exception as exc:  # noqa: BLE001 - NATS gone too: nothing to read
            _say(f"no final status written: the stored status cannot be read "
                 f"({str(exc) or type(exc).__name__})")
            return
        if raw is None:
            _say("no final status written: the master had stored none yet")
            return
        raw = with_stop_note(raw, self.stopped_by, time.time())
        tmp = final.with_name("status.json.tmp")
        tmp.write_bytes(raw)
        os.replace(tmp, final)
        self._log_stop(raw)
        _say(summary_of(raw))

    def _log_stop(self, raw: bytes) -> None:
        """The fault log's last records: the job's phase ends (stopped), and the summary."""
        from aegis_flow.local.status import summary_of
        from aegis_flow.master.faultlog import FaultLog, record
        from aegis_flow.master.store import decode_doc

        try:
            phase = decode_doc(raw)[0].phase.value
        except ValueError:
            phase = ""
        now = time.time()
        try:
            log = FaultLog(self.state_dir / "logs")
            log.write_many([
                record("phase_end", now=now, phase=phase, pod="aegis-flow-run",
                       message=f"job stopped in {phase}: {self.stopped_by}"),
                record("summary", now=now, phase=phase, pod="aegis-flow-run",
                       message=summary_of(raw))])
            log.close()
        except OSError as exc:
            _say(f"cannot write the fault log's last records: {exc}")

    def _loop(self) -> int:
        master_code: int | None = None
        deadline = float("inf")
        while True:
            assert self.master is not None
            self._keep_nats()
            rc = self.master.poll()
            if rc == 4 and not self._first_master and master_code is None:
                # NATS unreachable for a *restarted* master: the job is not independent, its
                # control plane is out; try again (the embedded server is being restarted)
                self._restart("master", rc)
                time.sleep(1.0)
                self.master = _spawn(self._master_args(), self.env)
                self._write_pids()
                rc = None
            if rc is not None and master_code is None:
                if rc in MASTER_DONE_CODES:
                    master_code = rc
                    if rc not in INDEPENDENT_CODES:  # the workers were told to quit
                        deadline = time.monotonic() + self.cfg.grace + 10
                else:  # the master died: start it again; it resumes from the stored status
                    self._restart("master", rc)
                    self._first_master = False
                    self.master = _spawn(self._master_args(), self.env)
                    self._write_pids()
            for rank, proc in list(self.workers.items()):
                code = proc.poll()
                if code is None or rank in self.worker_codes:
                    continue
                replaced = code in REPLACE_CODES or code < 0  # asked to, or killed
                if not replaced or master_code is not None:
                    self.worker_codes[rank] = code
                    continue
                if code in NEW_NODE_CODES:  # its node is quarantined: the next one
                    self.node_gen[rank] = self.node_gen.get(rank, 0) + 1
                self._restart(f"worker {rank}", code)
                self.workers[rank] = _spawn(self._worker_args(rank), self._worker_env(rank))
                self._write_pids()
            if master_code is not None and (len(self.worker_codes) == self.cfg.workers
                                            or time.monotonic() > deadline):
                return self._outcome(master_code)
            self.progress.poll()
            time.sleep(0.05)

    def _keep_nats(self) -> None:
        """The embedded nats-server died: start it again on the same port with the same
        JetStream store; the master and the workers reconnect to the URL they know, the stored
        status is where it was. Training is never stopped for it. A start that fails (the port
        taken meanwhile, the disk full) is tried again every second."""
        server = self.server
        if server is not None and server.running:
            self._nats_store_check(server)
        if server is None or server.running or time.monotonic() < self._nats_retry_at:
            return
        from aegis_flow.local.natsserver import NatsServerError

        if self._nats_dead is None:  # just died
            code = server.stop()
            self._restart("nats-server", code if code is not None else -9)
            self._nats_dead = server
        try:
            self.server = self._nats_dead.successor().start()
        except NatsServerError as exc:
            first = str(exc).splitlines()[0]
            _say(f"cannot start nats-server again ({first}); trying again in 1 s")
            self._nats_retry_at = time.monotonic() + 1.0
            return
        self._nats_dead = None
        self._write_pids()  # before saying so: whoever reads the line finds the new pid
        _say(f"nats-server is back on {self.server.url}")

    def _nats_store_check(self, server: EmbeddedNats) -> None:
        """A JetStream write error (a full disk) leaves the stream refusing every write until
        the server restarts, even once the disk has room. Once a second: read the new lines of
        the server's log; after a critical write error, restart the server as soon as its
        store has room again (the status store then works again; nothing is lost)."""
        now = time.monotonic()
        if now - self._nats_log_check < 1.0:
            return
        self._nats_log_check = now
        try:
            with open(server.log_file, "rb") as fh:
                fh.seek(self._nats_log_at)
                new = fh.read()
                self._nats_log_at = fh.tell()
        except OSError:
            return
        if b"critical write error" in new:
            if not self._nats_write_error:
                _say("nats-server cannot write its store (disk full?); it is restarted once "
                     "the disk has room; meanwhile nothing is decided, training goes on")
            self._nats_write_error = True
        if not self._nats_write_error:
            return
        try:
            st = os.statvfs(server.store_dir)
        except OSError:
            return
        if st.f_bavail * st.f_frsize < NATS_ROOM:
            return
        self._nats_write_error = False
        _say("the NATS store has room again: restarting nats-server")
        server.stop()  # _keep_nats starts its successor on the same port and store
        self._nats_log_at = 0

    def _restart(self, what: str, code: int) -> None:
        self.restarts += 1
        if self.restarts > self.cfg.max_process_restarts:
            raise _GaveUp(f"gave up: processes were restarted {self.restarts} times")
        why = f"signal {-code}" if code < 0 else f"exit code {code}"
        _say(f"{what} ended ({why}); starting it again")

    def _outcome(self, master_code: int) -> int:
        status_file = self.state_dir / "status.json"
        stopped = ""
        if status_file.exists():  # the user's summary, last thing before the verdict
            from aegis_flow.local.status import failure_tail, summary_of

            raw = status_file.read_bytes()
            _say(summary_of(raw))
            for line in failure_tail(raw):  # what the failed rank printed last
                _say(f"  {line}")
            stopped = stop_reason_of(raw)
        if master_code in INDEPENDENT_CODES:  # the workers' exit codes decide
            bad = [c for _, c in sorted(self.worker_codes.items()) if c != 0]
            code = bad[0] if bad else 0
            _say(f"job ran without fault tolerance; exit code {code}")
            return code
        if master_code == 0:
            _say("job succeeded")
            return 0
        if stopped:  # an operator's stop (T12) or a rank not back in time: not a failure
            _say(f"job stopped: {stopped}")
            return 1
        _say(f"job failed (master exit code {master_code})")
        return 1


def stop_reason_of(raw: bytes) -> str:
    """The stop reason in a final status document ("" when the job was not stopped)."""
    try:
        return str(json.loads(raw).get("status", {}).get("stop_reason") or "")
    except (ValueError, AttributeError):
        return ""


def run_job(cfg: RunConfig) -> int:
    """Run the job to its end; ``settings.ConfigError`` (before anything starts) on bad
    settings."""
    check_local(cfg)
    return LocalJob(cfg).run()
