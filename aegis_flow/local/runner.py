"""``aegis-flow run``: one job on one machine — embedded NATS, a master and N supervisors.

Side effects: starts and stops processes (nats-server, the master, one supervisor per rank),
writes the state dir (``nats.url``, ``pids.json``, the NATS store). Plays the part Kubernetes
plays on a cluster: a supervisor that exits with the node-fault or container-restart code, or
dies, is started again as a new incarnation (a node fault on a new "node"); a master that dies
is started again and resumes from the stored status. Nothing is left running on any exit path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aegis_flow.local.nodes import node_name
from aegis_flow.local.progress import ProgressPrinter
from aegis_flow.master.machine import ExitCode
from aegis_flow.settings import LOCAL, MASTER, WORKER, check_local, master_timeout_for
from aegis_flow.supervisor.child import _die_with_parent

REPLACE_CODES = {int(ExitCode.NODE_FAULT), int(ExitCode.CONTAINER_RESTART)}
# succeed, failed, conflict, independent, no NATS, a damaged stored status
MASTER_DONE_CODES = {0, 1, 2, 3, 4, 5}
INDEPENDENT_CODES = {3, 4}


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
    # extra environment for the supervisor on one node (and so its checks and command):
    # (node, NAME, value), e.g. ("local-node-1", "AEGIS_SYSFS_ROOT", "/mnt/host-sys")
    node_env: tuple[tuple[str, str, str], ...] = ()


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

    def _master_args(self) -> list[str]:
        c = self.cfg
        return [sys.executable, "-m", "aegis_flow.master", "--job", c.job, "--namespace",
                c.namespace, "--workers", str(c.workers), "--max-retry", str(c.max_retry),
                "--nats-url", self.url, "--connect-timeout", str(c.connect_timeout),
                "--lost-timeout", str(c.lost_timeout),
                "--status-file", str((self.state_dir / "status.json").absolute()),
                "--metrics-port", str(c.metrics_port), "--metrics-addr", "127.0.0.1",
                "--port-file", str((self.state_dir / "metrics.port").absolute()),
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
                "--work-dir", str(self.state_dir / "work"), *injects,
                *([] if c.prewarm else ["--no-prewarm"]), *hang,
                *c.extra_worker_args, "--", *c.command]

    def _secure_nats(self) -> Path:
        """Operator mode: bootstrap the keys (0600, kept across runs), write the server config,
        a fresh bootstrap token for this run, and pick the master's gRPC port."""
        from aegis_flow.master.runtime import free_port
        from aegis_flow.security.operator import bootstrap
        from aegis_flow.security.tokens import new_token, write_token

        auth = bootstrap(self.state_dir / "auth")
        write_token(self.state_dir / "token", new_token())
        (self.state_dir / "creds").mkdir(mode=0o700, exist_ok=True)
        self.grpc_addr = f"127.0.0.1:{free_port()}"
        return auth.write_server_config()

    def _write_pids(self) -> None:
        pids = {"runner": os.getpid(), "master": self.master.pid if self.master else None,
                "workers": {str(r): p.pid for r, p in self.workers.items()}}
        tmp = self.state_dir / "pids.json.tmp"
        tmp.write_text(json.dumps(pids))
        os.replace(tmp, self.state_dir / "pids.json")

    def _on_signal(self, signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    def run(self) -> int:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "work").mkdir(exist_ok=True)
        (self.state_dir / "status.json").unlink(missing_ok=True)
        (self.state_dir / "metrics.port").unlink(missing_ok=True)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        server = None
        try:
            if self.cfg.nats_url is None:
                from aegis_flow.local.natsserver import EmbeddedNats

                config = self._secure_nats() if self.cfg.secure else None
                if not self.cfg.secure:
                    _say("WARNING: --insecure-nats: NATS runs WITHOUT authentication; any local "
                         "process can read and forge this job's messages. For debugging only.")
                server = EmbeddedNats(store_dir=str(self.state_dir / "nats"), config_file=config)
                server.start()
                self.url = server.url
            else:
                self.url = self.cfg.nats_url
            (self.state_dir / "nats.url").write_text(self.url + "\n")
            _say(f"job {self.cfg.job}: {self.cfg.workers} workers, max-retry "
                 f"{self.cfg.max_retry}, NATS {self.url}, state in {self.state_dir}")
            self.master = _spawn(self._master_args(), self.env)
            for rank in range(self.cfg.workers):
                self.workers[rank] = _spawn(self._worker_args(rank), self._worker_env(rank))
            self._write_pids()
            return self._loop()
        except _Interrupted as exc:
            _say(f"interrupted by {signal.Signals(exc.signum).name}; stopping every process")
            return 128 + exc.signum
        finally:
            procs = [*self.workers.values()] + ([self.master] if self.master else [])
            _stop(procs, self.cfg.grace + 2)
            if server is not None:
                server.stop()
            for s, h in old.items():
                signal.signal(s, h)

    def _loop(self) -> int:
        master_code: int | None = None
        deadline = float("inf")
        while True:
            assert self.master is not None
            rc = self.master.poll()
            if rc is not None and master_code is None:
                if rc in MASTER_DONE_CODES:
                    master_code = rc
                    if rc not in INDEPENDENT_CODES:  # the workers were told to quit
                        deadline = time.monotonic() + self.cfg.grace + 10
                else:  # the master died: start it again; it resumes from the stored status
                    self._restart("master", rc)
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
                if code == ExitCode.NODE_FAULT:
                    self.node_gen[rank] = self.node_gen.get(rank, 0) + 1
                self._restart(f"worker {rank}", code)
                self.workers[rank] = _spawn(self._worker_args(rank), self._worker_env(rank))
                self._write_pids()
            if master_code is not None and (len(self.worker_codes) == self.cfg.workers
                                            or time.monotonic() > deadline):
                return self._outcome(master_code)
            self.progress.poll()
            time.sleep(0.05)

    def _restart(self, what: str, code: int) -> None:
        self.restarts += 1
        if self.restarts > self.cfg.max_process_restarts:
            raise RuntimeError(f"gave up: processes were restarted {self.restarts} times")
        why = f"signal {-code}" if code < 0 else f"exit code {code}"
        _say(f"{what} ended ({why}); starting it again")

    def _outcome(self, master_code: int) -> int:
        status_file = self.state_dir / "status.json"
        if status_file.exists():  # the user's summary, last thing before the verdict
            from aegis_flow.local.status import failure_tail, summary_of

            raw = status_file.read_bytes()
            _say(summary_of(raw))
            for line in failure_tail(raw):  # what the failed rank printed last
                _say(f"  {line}")
        if master_code in INDEPENDENT_CODES:  # the workers' exit codes decide
            bad = [c for _, c in sorted(self.worker_codes.items()) if c != 0]
            code = bad[0] if bad else 0
            _say(f"job ran without fault tolerance; exit code {code}")
            return code
        if master_code == 0:
            _say("job succeeded")
            return 0
        _say(f"job failed (master exit code {master_code})")
        return 1


def run_job(cfg: RunConfig) -> int:
    """Run the job to its end; ``settings.ConfigError`` (before anything starts) on bad
    settings."""
    check_local(cfg)
    return LocalJob(cfg).run()
