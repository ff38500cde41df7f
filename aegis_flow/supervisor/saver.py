"""A checkpoint saver beside training (``--saver CMD``, issue 18): run it, restart it, stop it.

The saver is the user's long-running daemon (an uploader that copies new checkpoints to object
storage, say). Each worker's supervisor runs one beside its training process, for as long as
the supervisor runs, and restarts it ``RESTART_DELAY`` (3) seconds after *any* exit, a clean
exit 0 included: a daemon that ends is not done, and a fixed delay keeps a crashing one to one
start every 3 s (no back-off). Training never waits for it and never restarts because of it.

``SaverState`` is the pure part (time is an argument). ``Saver`` is the thin shell, and the only
side effects: it spawns the command in its own process group (``child.start``, so it dies with
the supervisor), writes its output to our stdout prefixed ``[rank N saver] `` and one line per
exit to stderr, and signals its process group: SIGTERM to whatever the saver left in its group
when it exits, SIGKILL to those leftovers when it is restarted, and on ``close()`` SIGTERM,
``grace`` seconds, then SIGKILL. Standard library only (injectable into any image).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aegis_flow.settings import WORKER
from aegis_flow.supervisor import child as childmod

RESTART_DELAY = 3.0  # seconds between the saver's exit and its next start (fixed)
CANNOT_START = 127  # the exit code recorded when the command cannot be started (as a shell)

STARTING, RUNNING, RESTARTING, STOPPED = "starting", "running", "restarting", "stopped"


@dataclass(frozen=True)
class SaverState:
    """Where the saver stands. ``status``: starting (before its first start), running,
    restarting (exited; starts again at ``restart_at``, a clock reading), stopped (closed;
    final). ``restarts``: starts after an exit or a failed start. PURE."""

    status: str = STARTING
    pid: int | None = None
    restarts: int = 0
    last_exit_code: int | None = None  # a shell's code: 128+N for signal N; 127 cannot start
    restart_at: float | None = None

    def started(self, pid: int) -> SaverState:
        if self.status == STOPPED:
            return self
        again = self.status == RESTARTING
        return replace(self, status=RUNNING, pid=pid, restart_at=None,
                       restarts=self.restarts + int(again))

    def exited(self, code: int, now: float, delay: float = RESTART_DELAY) -> SaverState:
        """It ended with ``code`` at ``now`` (or could not start): restart ``delay`` later."""
        if self.status == STOPPED:
            return replace(self, pid=None, last_exit_code=code)
        return replace(self, status=RESTARTING, pid=None, last_exit_code=code,
                       restart_at=now + delay)

    def stopped(self) -> SaverState:
        return replace(self, status=STOPPED, pid=None, restart_at=None)

    def wait(self, now: float) -> float:
        """Seconds from ``now`` until the next start (0 when it is not waiting to restart)."""
        return 0.0 if self.restart_at is None else max(0.0, self.restart_at - now)

    def data(self, now: float) -> dict[str, Any]:
        """The heartbeat's ``saver`` entry: small, JSON-ready."""
        out: dict[str, Any] = {"state": self.status, "pid": self.pid, "restarts": self.restarts,
                               "last_exit_code": self.last_exit_code}
        if self.status == RESTARTING:
            out["restart_in"] = round(self.wait(now), 1)
        return out


def saver_env(env: Mapping[str, str]) -> dict[str, str]:
    """The training child's environment less its progress socket: the saver's steps must not
    count as training progress. PURE."""
    return {k: v for k, v in env.items() if k != "AEGIS_PROGRESS_SOCKET"}


def _say(text: str) -> None:
    sys.stderr.write(f"[aegis-flow worker] {text}\n")
    sys.stderr.flush()


class Saver:
    """The saver of one worker: ``start()`` once, ``close()`` on the way out (idempotent)."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], *, rank: int,
                 restart_delay: float = RESTART_DELAY, grace: float = WORKER.grace,
                 clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] = _say) -> None:
        self.command = tuple(command)
        self.env = dict(env)
        self.rank = rank
        self.prefix = f"[rank {rank} saver] "
        self.restart_delay = restart_delay
        self.grace = grace
        self.clock = clock
        self.say = say
        self.state = SaverState()
        self.child: childmod.Child | None = None
        self._task: asyncio.Task[None] | None = None

    def data(self) -> dict[str, Any]:
        return self.state.data(self.clock())

    def owns(self, pid: int) -> bool:
        """Is ``pid`` the saver's process (the PID-1 reaper must leave it to asyncio)?"""
        return self.child is not None and self.child.pid == pid

    def start(self) -> None:
        if self._task is None and self.state.status != STOPPED:
            self._task = asyncio.ensure_future(self._loop())

    async def _spawn(self) -> childmod.Child:
        """Start the command; a cancellation mid-start still records the child, so that
        ``close()`` stops it."""
        starting = asyncio.ensure_future(childmod.start(self.command, self.env,
                                                        prefix=self.prefix, tail_lines=5))
        try:
            self.child = await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self.child = await starting
            raise
        return self.child

    async def _loop(self) -> None:
        name = " ".join(self.command)
        while self.state.status != STOPPED:
            try:
                child = await self._spawn()
            except OSError as exc:
                self.state = self.state.exited(CANNOT_START, self.clock(), self.restart_delay)
                self.say(f"rank {self.rank}: cannot start the saver {name!r}: {exc}; trying "
                         f"again in {self.restart_delay:g} s")
            else:
                self.state = self.state.started(child.pid)
                await child.ended()
                ended_at = self.clock()
                child.signal_group(signal.SIGTERM)  # what it left in its group (restart: KILL)
                status = await child.wait()
                self.state = self.state.exited(status.shell_code, ended_at, self.restart_delay)
                if self.state.status == STOPPED:
                    return
                self.say(f"rank {self.rank}: the saver ended ({status.cause}); restarting it in "
                         f"{self.restart_delay:g} s (restart {self.state.restarts + 1})")
            await asyncio.sleep(self.state.wait(self.clock()))
            if self.child is not None:
                self.child.signal_group(signal.SIGKILL)  # leftovers of the run that ended

    async def close(self) -> None:
        """Stop the saver and keep it stopped: SIGTERM its process group, ``grace`` seconds,
        then SIGKILL (also what it left in the group). Nothing of it runs afterwards."""
        self.state = self.state.stopped()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self.child is not None:
            status = await self.child.stop(self.grace)
            self.state = replace(self.state, last_exit_code=status.shell_code)
