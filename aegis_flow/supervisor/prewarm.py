"""The supervisor's side of the pre-warmed interpreter (``zygote.py``).

Side effects: starts the zygote process with the command's own Python, exchanges requests and a
pipe fd with it over a Unix socket, reads the forked child's output. Standard library only.
Any failure (not a Python command, the zygote died or never got ready) means "start the command
the ordinary way": the pre-warm is an optimisation, never a reason for training not to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from aegis_flow.supervisor.child import Child, _die_with_parent
from aegis_flow.supervisor.waiting import wait_or_cancel
from aegis_flow.supervisor.zygote import TITLE_ROOM

ZYGOTE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def python_command(cmd: Sequence[str]) -> bool:
    """True for ``python[3[.X]] script.py ...``, ``python -u script.py`` and ``python -m mod``."""
    if len(cmd) < 2 or not _PYTHON.match(os.path.basename(cmd[0])):
        return False
    rest = [a for a in cmd[1:3] if a != "-u"]
    if not rest:
        return False
    return rest[0] == "-m" or not rest[0].startswith("-")


def _normalise(cmd: Sequence[str]) -> list[str]:
    out = [cmd[0]]
    args = list(cmd[1:])
    while args and args[0] == "-u":
        args.pop(0)
    return out + args


@dataclass
class _Pending:
    """A spawn request on its way: the future its reply resolves, and the read end of the
    child's output pipe (already connected to ``reader``)."""

    reply: asyncio.Future[dict[str, object]]
    reader: asyncio.StreamReader
    transport: asyncio.BaseTransport


class Zygote:
    """The client of one pre-warmed interpreter.

    Every spawn request carries an id that the zygote's reply echoes, so a reply can only ever
    answer its own request. A spawn that is given up (cancelled by a newer order, or timed out)
    after its request may have gone out stays registered: when its reply comes, the process it
    names is killed (its whole group) and its pipe closed, and the zygote's exit report of it
    is consumed here (the zygote is its parent and reaps it). ``killed`` lists those pids.
    """

    def __init__(self, cmd: Sequence[str], env: Mapping[str, str], tag: str = "") -> None:
        python = shutil.which(cmd[0], path=env.get("PATH")) or cmd[0]
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        zenv = dict(env)
        zenv["AEGIS_ZYGOTE_FD"] = str(theirs.fileno())
        zenv.setdefault("OMP_NUM_THREADS", env.get("OMP_NUM_THREADS", "1"))
        # ``tag`` (the work dir) is ignored by the zygote; it shows whose zygote this is in ps.
        # The blank argument is room for the title each child gives itself (zygote.set_title)
        self.proc = subprocess.Popen([python, ZYGOTE_SCRIPT, *([tag] if tag else []),
                                      " " * TITLE_ROOM], env=zenv,
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        theirs.close()
        self.sock.setblocking(False)
        self._ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._orphans: set[int] = set()  # killed, their exit report not in yet
        self.killed: list[int] = []  # children of abandoned spawns, killed on their reply
        self._send_lock = threading.Lock()  # one request on the socket at a time
        self._dead = False
        self.can_check = False  # aegis-flow's checks import in it (not so in a foreign Python)
        self.reply_timeout = 10.0  # seconds for the zygote to answer a spawn
        self.refused = ""  # why it will not fork at all (it initialised CUDA), if it said so
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        buf = b""
        try:
            while True:
                data = await loop.sock_recv(self.sock, 65536)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if msg in ("ready", "ready-without-checks"):
                        self.can_check = msg == "ready"
                        self._ready.set_result(True)
                    elif isinstance(msg, dict) and "refused" in msg:  # e.g. it has CUDA
                        self.refused = str(msg["refused"])[:500]
                        sys.stderr.write(f"[aegis-flow worker] {self.refused}\n")
                    elif isinstance(msg, dict) and "exit" in msg:
                        self._exited(msg)
                    elif isinstance(msg, dict):
                        self._reply(msg)
        finally:
            self._dead = True
            if not self._ready.done():
                self._ready.set_result(False)
            for fut in self._exits.values():  # the zygote died: so did its children
                if not fut.done():
                    fut.set_result(-9)
            for pending in self._pending.values():
                if not pending.reply.done():
                    pending.reply.set_result({"error": "the pre-warmed interpreter exited"})
                else:  # abandoned: no reply will come; its child died with the zygote
                    pending.transport.close()
            self._pending.clear()

    def _exited(self, msg: dict[str, object]) -> None:
        pid = int(str(msg["exit"]))
        if pid in self._orphans:  # a child we killed: reaped by the zygote, forgotten here
            self._orphans.discard(pid)
            return
        fut = self._exits.setdefault(pid, asyncio.get_running_loop().create_future())
        sig = msg.get("signal")
        if not fut.done():
            fut.set_result(-int(str(sig)) if sig else int(str(msg["code"])))

    def _reply(self, msg: dict[str, object]) -> None:
        rid = msg.get("id")
        pending = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if pending is not None and not pending.reply.done():
            pending.reply.set_result(msg)
            return
        # the spawn was given up (or the reply answers no request of ours): nothing may run
        # untracked, so the process goes, and with it the pipe we hold for it
        if pending is not None:
            pending.transport.close()
        if "pid" in msg:
            self._discard(int(str(msg["pid"])))

    def _discard(self, pid: int) -> None:
        """Kill the child of an abandoned spawn (its group, and itself in case it has not
        called setsid yet); the zygote reaps it and reports its exit, which we then drop."""
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
        fut = self._exits.pop(pid, None)
        if fut is None or not fut.done():
            self._orphans.add(pid)  # its exit report is still to come
        self.killed.append(pid)
        sys.stderr.write(f"[aegis-flow worker] pre-warmed interpreter: killed process {pid} of "
                         "a start that was cancelled\n")

    @property
    def is_ready(self) -> bool:
        """Has it imported what it pre-warms (without waiting)?"""
        return self._ready.done() and bool(self._ready.result())

    async def ready(self, timeout: float) -> bool:
        try:
            return await wait_or_cancel(asyncio.shield(self._ready), timeout)
        except asyncio.TimeoutError:
            return False

    async def spawn(self, cmd: Sequence[str], env: Mapping[str, str], *, prefix: str,
                    tail_lines: int, on_line: Callable[[str], None] | None) -> Child:
        """Fork ``cmd`` from the zygote. Cancellation-safe: a spawn cancelled (or timed out)
        at any point returns nothing and leaves no process and no pipe behind."""
        loop = asyncio.get_running_loop()
        if self._dead:
            raise OSError("pre-warmed interpreter: it exited")
        rid = next(self._ids)
        r, w = os.pipe()
        reader = asyncio.StreamReader(limit=1 << 20)
        pipe = os.fdopen(r, "rb", buffering=0)
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except BaseException:
            pipe.close()  # a no-op if connect_read_pipe's transport closed it already
            os.close(w)
            raise
        pending = _Pending(loop.create_future(), reader, transport)
        self._pending[rid] = pending
        req = json.dumps({"id": rid, "argv": _normalise(cmd), "env": dict(env),
                          "cwd": os.getcwd()}).encode() + b"\n"
        # the send owns ``w`` and closes it; it runs on even if this task is cancelled, and a
        # request that never went out is forgotten when it fails
        sent = loop.run_in_executor(None, self._send, req, w)
        sent.add_done_callback(lambda f: self._unsent(rid, f))
        try:
            await wait_or_cancel(asyncio.shield(sent), None)
            reply = await wait_or_cancel(pending.reply, self.reply_timeout)
        except BaseException:
            self._give_up(rid, pending)
            raise
        if "pid" not in reply:
            transport.close()
            raise OSError(f"pre-warmed interpreter: {reply.get('error')}")
        pid = int(str(reply["pid"]))
        exited = self._exits.setdefault(pid, loop.create_future())
        return Child(pid, reader, exited, prefix, tail_lines, on_line)

    def _unsent(self, rid: int, sent: asyncio.Future[None]) -> None:
        if sent.cancelled() or sent.exception() is not None:
            pending = self._pending.pop(rid, None)
            if pending is not None:
                if not pending.reply.done():
                    pending.reply.set_result({"error": f"cannot send the request: "
                                                       f"{sent.exception()}"})
                else:
                    pending.transport.close()

    def _give_up(self, rid: int, pending: _Pending) -> None:
        """A spawn ends without a Child (cancelled, timed out, the send failed)."""
        reply = pending.reply
        reply.cancel()  # a no-op if the reply is in
        if reply.cancelled():  # still registered: its reply, if it ever comes, kills the child
            return
        self._pending.pop(rid, None)
        pending.transport.close()
        if not reply.cancelled() and "pid" in reply.result():  # answered as we were cancelled
            self._discard(int(str(reply.result()["pid"])))

    def _send(self, req: bytes, fd: int) -> None:
        try:
            with self._send_lock:
                sent = 0
                while sent < len(req):
                    try:
                        if sent == 0:
                            sent = socket.send_fds(self.sock, [req], [fd])
                        else:
                            sent += self.sock.send(req[sent:])
                    except BlockingIOError:
                        select.select([], [self.sock], [], 1.0)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        for pending in self._pending.values():  # the children die with the zygote
            pending.transport.close()
            if not pending.reply.done():
                pending.reply.set_result({"error": "the pre-warmed interpreter was closed"})
        self._pending.clear()


def start_zygote(cmd: Sequence[str], env: Mapping[str, str], tag: str = "") -> Zygote | None:
    if not python_command(cmd):
        return None
    try:
        return Zygote(cmd, env, tag)
    except OSError as exc:
        sys.stderr.write(f"[aegis-flow worker] no pre-warmed interpreter: {exc}\n")
        return None
