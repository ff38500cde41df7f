"""The pre-warmed interpreter's protocol cannot mix up replies (review B4, issue 13).

Real zygote processes. The zygote is SIGSTOPped to hold its reply while a spawn is cancelled
(as ``../shared/reviews/helpers/zygote_race.py`` does); every wait is on a condition (the
request sitting in the stopped zygote's socket, a process gone), never a sleep used as a sync.
Before the fix, a spawn cancelled after its request went out left the zygote's ``{"pid"}``
reply queued, the next spawn returned that pid (the cancelled spawn's process), and the
cancelled spawn's process ran on untracked with its pipe's read end leaked.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import struct
import sys
import termios
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from aegis_flow.supervisor.child import Child
from aegis_flow.supervisor.prewarm import Zygote

ENV = {**os.environ, "AEGIS_PRELOAD": ""}  # nothing to preload: the zygote is ready at once
SCRIPT = """\
import os, sys, time
print(f"{sys.argv[1]} pid={os.getpid()}", flush=True)
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def _queued(sock: object) -> int:
    """Bytes we sent that the zygote has not read yet (SIOCOUTQ of our end)."""
    fileno = sock.fileno()  # type: ignore[attr-defined]
    raw = fcntl.ioctl(fileno, termios.TIOCOUTQ, struct.pack("i", 0))
    return int(struct.unpack("i", raw)[0])


def _pipes() -> set[str]:
    """This process's open pipe fds, as ``fd -> pipe:[inode]``."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            found.add(f"{fd}->{target}")
    return found


def _live_children(ppid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields and fields[0] != "Z" and int(fields[1]) == ppid:
            kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def _zygote(script: Path) -> AsyncIterator[Zygote]:
    z = Zygote([sys.executable, str(script)], ENV)
    try:
        assert await z.ready(30), "the zygote never got ready"
        yield z
    finally:
        z.close()


@asynccontextmanager
async def _stopped(z: Zygote) -> AsyncIterator[None]:
    os.kill(z.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(z.proc.pid, signal.SIGCONT)


def _cmd(script: Path, tag: str, seconds: float, code: int) -> list[str]:
    return [sys.executable, str(script), tag, str(seconds), str(code)]


async def _spawn(z: Zygote, script: Path, tag: str, seconds: float, code: int,
                 lines: list[str] | None = None) -> Child:
    return await z.spawn(_cmd(script, tag, seconds, code), ENV, prefix=f"[{tag}] ",
                         tail_lines=5, on_line=None if lines is None else lines.append)


async def _pending_in_stopped_zygote(z: Zygote, task: asyncio.Future[Child]) -> None:
    """Wait until ``task``'s request sits, unread, in the stopped zygote's socket."""
    await _until(lambda: _queued(z.sock) > 0 or task.done(), "the spawn request went out")
    assert not task.done(), "the spawn ended although the zygote is stopped"


async def _check_real(z: Zygote, child: Child, tag: str, lines: list[str], code: int) -> None:
    """``child`` is the process that really ran ``tag``: the pid it prints is ``child.pid``."""
    await _until(lambda: any(line.startswith(f"{tag} pid=") for line in lines),
                 f"{tag} printed its pid")
    printed = int(next(line for line in lines if line.startswith(f"{tag} pid="))
                  .split("=")[1])
    assert child.pid == printed, (
        f"spawn {tag} returned pid {child.pid}, but its process is {printed}: a stale reply "
        "(the cancelled spawn's process) answered it")
    st = await asyncio.wait_for(child.wait(), 15)
    assert st.code == code, st


async def _check_cancelled_child_gone(z: Zygote, pipes_before: set[str]) -> None:
    """The cancelled spawn's process was killed and reaped; no pipe of it stays open."""
    await _until(lambda: bool(z.killed), "the cancelled spawn's process was killed")
    for pid in z.killed:
        await _until(lambda pid=pid: not _alive(pid),  # type: ignore[misc]
                     f"process {pid} of the cancelled spawn reaped (kill -0 fails)")
    assert _live_children(z.proc.pid) == [], "the zygote still has children running"
    await _until(lambda: _pipes() == pipes_before, f"pipes closed: {_pipes() - pipes_before}")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "tagged.py"
    path.write_text(SCRIPT)
    return path


def test_a_cancelled_spawns_reply_never_answers_a_later_spawn(script: Path) -> None:
    """The review's reproduction: spawn A is cancelled while the zygote holds its reply; the
    next spawn B gets B's own process; A's process is killed and reaped, its pipe closed."""
    async def go() -> None:
        async with _zygote(script) as z:
            pipes = _pipes()
            async with _stopped(z):
                a = asyncio.ensure_future(_spawn(z, script, "A", 60, 0))
                await _pending_in_stopped_zygote(z, a)
                a.cancel()  # a newer order arrived: the old activity is cancelled
                with pytest.raises(asyncio.CancelledError):
                    await a
            lines: list[str] = []
            b = await _spawn(z, script, "B", 0.1, 3, lines)
            await _check_real(z, b, "B", lines, 3)
            await _check_cancelled_child_gone(z, pipes)
            assert len(z.killed) == 1
    asyncio.run(go())


def test_a_spawn_queued_behind_a_cancelled_one_gets_its_own_process(script: Path) -> None:
    """A and B both wait in the stopped zygote; A is cancelled; the zygote answers A first,
    yet B gets its own process, and a later spawn C works normally."""
    async def go() -> None:
        async with _zygote(script) as z:
            pipes = _pipes()
            lines: list[str] = []
            async with _stopped(z):
                a = asyncio.ensure_future(_spawn(z, script, "A", 60, 0))
                await _pending_in_stopped_zygote(z, a)
                sent = _queued(z.sock)
                b = asyncio.ensure_future(_spawn(z, script, "B", 0.1, 4, lines))
                await _until(lambda: _queued(z.sock) > sent, "B's request went out")
                a.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await a
            await _check_real(z, await b, "B", lines, 4)
            c = await _spawn(z, script, "C", 0, 5, lines)
            await _check_real(z, c, "C", lines, 5)
            await _check_cancelled_child_gone(z, pipes)
    asyncio.run(go())


def test_a_spawn_that_timed_out_leaves_no_process_behind(script: Path) -> None:
    """A spawn whose reply is late (timeout) fails; when the reply comes, its process goes."""
    async def go() -> None:
        async with _zygote(script) as z:
            pipes = _pipes()
            z.reply_timeout = 0.5
            async with _stopped(z):
                with pytest.raises(asyncio.TimeoutError):
                    await _spawn(z, script, "A", 60, 0)
                assert _queued(z.sock) > 0  # the request is out: the zygote will fork it
            z.reply_timeout = 10.0
            lines: list[str] = []
            b = await _spawn(z, script, "B", 0, 0, lines)
            await _check_real(z, b, "B", lines, 0)
            await _check_cancelled_child_gone(z, pipes)
    asyncio.run(go())


def test_a_spawn_pending_when_the_zygote_dies_fails_cleanly(script: Path) -> None:
    async def go() -> None:
        async with _zygote(script) as z:
            pipes = _pipes()
            async with _stopped(z):
                a = asyncio.ensure_future(_spawn(z, script, "A", 60, 0))
                await _pending_in_stopped_zygote(z, a)
                os.kill(z.proc.pid, signal.SIGKILL)
            with pytest.raises(OSError, match="pre-warmed interpreter"):
                await asyncio.wait_for(a, 15)
            with pytest.raises(OSError, match="pre-warmed interpreter"):
                await _spawn(z, script, "B", 0, 0)
            await _until(lambda: _pipes() == pipes, "pipes closed")
    asyncio.run(go())


def test_concurrent_spawns_each_get_their_own_process(script: Path) -> None:
    async def go() -> None:
        async with _zygote(script) as z:
            lines: list[str] = []
            kids = await asyncio.gather(*(_spawn(z, script, f"P{i}", 0.1, i, lines)
                                          for i in range(4)))
            for i, kid in enumerate(kids):
                await _check_real(z, kid, f"P{i}", lines, i)
            assert z.killed == []
    asyncio.run(go())
