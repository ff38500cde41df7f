"""The supervisor's side of the pre-warmed interpreter (``zygote.py``).

Side effects: starts the zygote process with the command's own Python, exchanges requests and a
pipe fd with it over a Unix socket, reads the forked child's output. Standard library only.
Any failure (not a Python command, the zygote died or never got ready) means "start the command
the ordinary way": the pre-warm is an optimisation, never a reason for training not to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from aegis_flow.supervisor.child import Child, _die_with_parent
from aegis_flow.supervisor.waiting import wait_or_cancel

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


class Zygote:
    def __init__(self, cmd: Sequence[str], env: Mapping[str, str], tag: str = "") -> None:
        python = shutil.which(cmd[0], path=env.get("PATH")) or cmd[0]
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        zenv = dict(env)
        zenv["AEGIS_ZYGOTE_FD"] = str(theirs.fileno())
        zenv.setdefault("OMP_NUM_THREADS", env.get("OMP_NUM_THREADS", "1"))
        # ``tag`` (the work dir) is ignored by the zygote; it shows whose zygote this is in ps
        self.proc = subprocess.Popen([python, ZYGOTE_SCRIPT, *([tag] if tag else [])], env=zenv,
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        theirs.close()
        self.sock.setblocking(False)
        self._ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._replies: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._reader = asyncio.ensure_future(self._read())
        self._lock = asyncio.Lock()

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
                    if msg == "ready":
                        self._ready.set_result(True)
                    elif isinstance(msg, dict) and "exit" in msg:
                        fut = self._exits.setdefault(int(msg["exit"]), loop.create_future())
                        sig = msg.get("signal")
                        if not fut.done():
                            fut.set_result(-int(sig) if sig else int(msg["code"]))
                    elif isinstance(msg, dict):
                        await self._replies.put(msg)
        finally:
            if not self._ready.done():
                self._ready.set_result(False)
            for fut in self._exits.values():  # the zygote died: so did its children
                if not fut.done():
                    fut.set_result(-9)
            await self._replies.put({"error": "the pre-warmed interpreter exited"})

    async def ready(self, timeout: float) -> bool:
        try:
            return await wait_or_cancel(asyncio.shield(self._ready), timeout)
        except asyncio.TimeoutError:
            return False

    async def spawn(self, cmd: Sequence[str], env: Mapping[str, str], *, prefix: str,
                    tail_lines: int, on_line: Callable[[str], None] | None) -> Child:
        loop = asyncio.get_running_loop()
        async with self._lock:
            r, w = os.pipe()
            try:
                req = json.dumps({"argv": _normalise(cmd), "env": dict(env),
                                  "cwd": os.getcwd()}).encode() + b"\n"
                await loop.run_in_executor(None, self._send, req, w)
            finally:
                os.close(w)
            reply = await asyncio.wait_for(self._replies.get(), 10)
        if "pid" not in reply:
            os.close(r)
            raise OSError(f"pre-warmed interpreter: {reply.get('error')}")
        pid = int(str(reply["pid"]))
        exited = self._exits.setdefault(pid, loop.create_future())
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                     os.fdopen(r, "rb", buffering=0))
        return Child(pid, reader, exited, prefix, tail_lines, on_line)

    def _send(self, req: bytes, fd: int) -> None:
        sent = 0
        while sent < len(req):
            try:
                if sent == 0:
                    sent = socket.send_fds(self.sock, [req], [fd])
                else:
                    sent += self.sock.send(req[sent:])
            except BlockingIOError:
                import select

                select.select([], [self.sock], [], 1.0)

    def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)


def start_zygote(cmd: Sequence[str], env: Mapping[str, str], tag: str = "") -> Zygote | None:
    if not python_command(cmd):
        return None
    try:
        return Zygote(cmd, env, tag)
    except OSError as exc:
        sys.stderr.write(f"[aegis-flow worker] no pre-warmed interpreter: {exc}\n")
        return None
