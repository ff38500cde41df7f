"""The training process under the supervisor: start, stream, stop. The one place for child shutdown.

Side effects: spawns the user's command in its own process group (``start_new_session``), with
PR_SET_PDEATHSIG so it dies with the supervisor; writes its output, rank-prefixed, to our
stdout; sends signals to its process group. Standard library only (DESIGN.md §3) and our
``waiting`` helper.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from aegis_flow.settings import ConfigError, env_value
from aegis_flow.supervisor.fold import TracebackFolder
from aegis_flow.supervisor.waiting import wait_or_cancel

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - not Linux: the supervisor's own shutdown still applies
        pass


@dataclass(frozen=True)
class ExitStatus:
    """How the child ended: ``code`` >= 0 for an exit, ``signal`` set when a signal killed it."""

    code: int
    signal: int | None
    tail: tuple[str, ...]
    at: float

    @property
    def ok(self) -> bool:
        return self.code == 0 and self.signal is None

    @property
    def cause(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = str(self.signal)
            return f"killed by {name}"
        return f"exit code {self.code}"

    @property
    def shell_code(self) -> int:
        """The exit code a shell would report (128+N for a signal)."""
        return 128 + self.signal if self.signal is not None else self.code


def _folding() -> bool:
    try:
        return bool(env_value("AEGIS_FOLD_TRACEBACKS", True))
    except ConfigError:
        return True


class Child:
    """One run of the user's command. ``wait()`` returns its ExitStatus.

    ``exited`` resolves to the raw return code (negative: killed by that signal), whichever way
    the process was started (exec, or forked from the pre-warmed interpreter in prewarm.py).
    """

    def __init__(self, pid: int, output: asyncio.StreamReader,
                 exited: asyncio.Future[int], prefix: str, tail_lines: int,
                 on_line: Callable[[str], None] | None) -> None:
        self.pid = pid
        self._output = output
        self._exited = exited
        self._prefix = prefix
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._on_line = on_line
        self._pump = asyncio.ensure_future(self._stream())
        self.started = time.time()
        self.last_output: float | None = None
        self.status: ExitStatus | None = None

    @property
    def running(self) -> bool:
        return not self._exited.done()

    async def _stream(self) -> None:
        out = sys.stdout.buffer
        prefix = self._prefix.encode()
        folder = TracebackFolder() if _folding() else None

        def emit(lines: list[str]) -> None:
            for shown in lines:
                out.write(prefix + shown.encode(errors="replace") + b"\n")
            out.flush()

        while True:
            try:
                line = await self._output.readline()
            except (ValueError, asyncio.LimitOverrunError):  # an endless line: cut it
                line = await self._output.read(1 << 16)
            if not line:
                if folder is not None:
                    emit(folder.flush())
                return
            text = line.decode(errors="replace").rstrip("\n")
            self.last_output = time.time()
            self._tail.append(text)
            if folder is None:
                out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                out.flush()
            else:
                emit(folder.feed(text))
            if self._on_line is not None:
                self._on_line(text)

    async def ended(self) -> int:
        """The raw return code as soon as the process has exited (``wait()`` also waits for
        the rest of its output)."""
        return await asyncio.shield(self._exited)

    async def wait(self) -> ExitStatus:
        rc = await asyncio.shield(self._exited)
        try:
            await wait_or_cancel(asyncio.shield(self._pump), 2.0)
        except asyncio.TimeoutError:  # a grandchild holds the pipe open
            self._pump.cancel()
        if self.status is None:
            self.status = ExitStatus(
                code=rc if rc >= 0 else 128 - rc, signal=-rc if rc < 0 else None,
                tail=tuple(self._tail), at=time.time())
        return self.status

    def signal_group(self, sig: int) -> None:
        """Signal the child's process group, or the child alone if it has none yet.

        (A child forked by the pre-warmed interpreter calls setsid() itself, so for an instant
        after it starts there is no group of its own.)
        """
        try:
            os.killpg(self.pid, sig)
            return
        except (ProcessLookupError, PermissionError):
            pass
        if self.running:
            try:
                os.kill(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    async def stop(self, grace: float = 5.0) -> ExitStatus:
        """SIGTERM the process group, wait ``grace`` seconds, then SIGKILL it."""
        if self.running:
            self.signal_group(signal.SIGTERM)
            try:
                await wait_or_cancel(asyncio.shield(self._exited), grace)
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:  # a cancelled stop still leaves nothing running
                self.signal_group(signal.SIGKILL)
                raise
        self.signal_group(signal.SIGKILL)  # also whatever the command left in its group
        return await self.wait()


class ChildGroup:
    """The K local ranks of one worker (``--nproc-per-node K``), seen as one child: the worker
    fails when any of them fails, and an in-place restart restarts all K.

    ``wait()`` returns when every local rank has exited 0 (the first one's status), or at the
    first that fails: the others are then stopped (SIGTERM, ``grace``, SIGKILL: without their
    peer they would block in a collective) and the failure's status is returned, its local rank
    in ``failed_local``. ``pid`` is local rank 0's (the hang watchdog's process); ``pids`` all.
    """

    def __init__(self, children: Sequence[Child], grace: float = 5.0) -> None:
        if not children:
            raise ValueError("a group of no processes")
        self.children = list(children)
        self.pid = self.children[0].pid
        self.pids = [c.pid for c in self.children]
        self.grace = grace
        self.failed_local: int | None = None
        self.status: ExitStatus | None = None
        self._waited: asyncio.Future[ExitStatus] | None = None

    @property
    def running(self) -> bool:
        return any(c.running for c in self.children)

    @property
    def last_output(self) -> float | None:
        seen = [c.last_output for c in self.children if c.last_output is not None]
        return max(seen) if seen else None

    def wait(self) -> asyncio.Future[ExitStatus]:
        if self._waited is None:
            self._waited = asyncio.ensure_future(self._wait())
        return asyncio.shield(self._waited)

    async def _wait(self) -> ExitStatus:
        pending = {asyncio.ensure_future(c.wait()): i for i, c in enumerate(self.children)}
        first: ExitStatus | None = None
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                local = pending.pop(fut)
                status = fut.result()
                if first is None:
                    first = status
                if not status.ok and self.failed_local is None:
                    self.failed_local, first = local, status
                    await asyncio.gather(*(c.stop(self.grace) for c in self.children
                                           if c.running), return_exceptions=True)
        assert first is not None
        self.status = first
        return first

    def signal_group(self, sig: int) -> None:
        for c in self.children:
            c.signal_group(sig)

    async def stop(self, grace: float = 5.0) -> ExitStatus:
        await asyncio.gather(*(c.stop(grace) for c in self.children), return_exceptions=True)
        return await self.wait()


async def start(cmd: Sequence[str], env: Mapping[str, str], *, prefix: str = "",
                tail_lines: int = 50, on_line: Callable[[str], None] | None = None) -> Child:
    """Start ``cmd`` in a new session; raises FileNotFoundError/PermissionError as exec does."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True, preexec_fn=_die_with_parent, limit=1 << 20)
    assert proc.stdout is not None
    exited = asyncio.ensure_future(proc.wait())
    return Child(proc.pid, proc.stdout, exited, prefix, tail_lines, on_line)


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R running, S sleeping, D disk, T stopped, Z
    zombie), or "" when it cannot be read. Side effect: reads ``/proc/PID/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return ""
    _, _, rest = stat.rpartition(")")  # the command name may hold spaces and parentheses
    return rest.split()[0] if rest.split() else ""


def reap_orphans(known: Callable[[int], bool]) -> int:
    """As PID 1: reap exited processes that are not our own children-in-use. Returns how many."""
    reaped = 0
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or known(info.si_pid):
            return reaped
        try:
            os.waitpid(info.si_pid, os.WNOHANG)
            reaped += 1
        except ChildProcessError:
            return reaped
