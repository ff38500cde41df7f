"""The supervisor's order handling: a superseded order never answers for the current one.

Regression for a flaky T10 end-to-end test: rank 1 waited for rank 0's rendezvous port when the
troubleshoot order came; ``asyncio.wait_for`` inside that wait swallowed the cancellation, so
the old *run* activity went on, started the command late and, when it exited 0, reported
Finish(ok) under the troubleshoot's seq — the master took it as "rank 1 passed its checks" and
the real (failing) check result arrived as a duplicate. Real child processes; the NATS
connection is an in-memory recorder (the supervisor only calls publish/flush on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from aegis_flow import protocol as p
from aegis_flow.master.runtime import free_port
from aegis_flow.supervisor import agent
from aegis_flow.supervisor.agent import Supervisor, WorkerConfig, _await_rendezvous
from aegis_flow.supervisor.child import start as start_child
from aegis_flow.supervisor.waiting import wait_or_cancel
from tests.jobs import SLEEPER


class RecordingConnection:
    """Stands in for nats.aio.client.Client: records what the supervisor publishes."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.sent.append(json.loads(payload))

    async def flush(self, timeout: float = 1.0) -> None:
        return None


def _order(seq: int, order: str, **data: Any) -> bytes:
    msg = p.Message(job="j", namespace="default", pod_name="master", type=p.MsgType.ORDER,
                    rank=-1, seq=seq, data={"order": order, "restart_count": 0, **data},
                    timestamp=0.0)
    return msg.encode()


async def _connect_until_cancelled(addr: str, port: int, timeout: float) -> None:
    """The pattern that lost cancellations: retry a refused connect under ``except OSError``."""
    while True:
        try:
            await wait_or_cancel(asyncio.open_connection(addr, port), 0.2)
            return
        except OSError:
            await asyncio.sleep(0)


@pytest.mark.parametrize("waiter", [_await_rendezvous, _connect_until_cancelled],
                         ids=["rendezvous", "retry-loop"])
def test_waiting_for_a_refused_port_never_swallows_a_cancellation(
        waiter: Callable[[str, int, float], Awaitable[None]]) -> None:
    """Cancel the wait at random moments, many times: every cancellation must propagate.
    (The old loop around ``asyncio.wait_for`` lost about one in ten here.)"""
    port = free_port()  # nothing listens: every attempt is refused at once
    rng = random.Random(4)

    async def main() -> list[str]:
        outcomes = []
        for _ in range(200):
            task = asyncio.ensure_future(waiter("127.0.0.1", port, 5.0))
            await asyncio.sleep(rng.uniform(0, 0.01))
            task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(task), 2.0)
                outcomes.append("returned")
            except asyncio.CancelledError:
                outcomes.append("cancelled")
            except asyncio.TimeoutError:  # went on waiting: the cancellation was lost
                outcomes.append("swallowed")
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return outcomes

    outcomes = asyncio.run(main())
    assert outcomes.count("cancelled") == 200, {o: outcomes.count(o) for o in set(outcomes)}


def test_an_order_superseded_while_waiting_for_the_rendezvous_neither_runs_nor_reports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 gets run (seq 2), then troubleshoot (seq 3) while it still waits for rank 0's
    store: the only report for seq 3 is the troubleshoot's, and the command never starts.
    The wait here is the old bug planted on purpose (it ignores its cancellation), so the seq
    guard alone must keep the superseded order silent."""
    async def stubborn(addr: str, port: int, timeout: float = 3.0) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.6)
        await asyncio.sleep(0.4)

    monkeypatch.setattr(agent, "_await_rendezvous", stubborn)
    marker = tmp_path / "started"
    cmd = (sys.executable, "-c", f"open({str(marker)!r}, 'w').close()")

    async def failing_checks(order: str, cfg: WorkerConfig) -> tuple[bool, str | None, str]:
        await asyncio.sleep(0.3)
        return False, "hardware", f"{order}: planted hardware fault"

    async def main() -> list[dict[str, Any]]:
        sup = Supervisor(WorkerConfig(command=cmd, job="j", rank=1, world_size=2,
                                      work_dir=str(tmp_path), prewarm=False),
                         checks=failing_checks)
        nc = RecordingConnection()
        sup.nc = nc
        port = free_port()  # rank 0's store never comes up
        await sup.on_order(_order(2, "run", rendezvous={"addr": "127.0.0.1", "port": port}))
        await asyncio.sleep(0.2)  # rank 1 is inside the rendezvous wait now
        await sup.on_order(_order(3, "troubleshoot"))
        await asyncio.sleep(1.5)  # past the end of the stubborn wait
        assert sup.activity is not None
        await sup.activity
        return [m for m in nc.sent if m["type"] != p.MsgType.ACK.value]

    reports = asyncio.run(main())
    got = [(m["type"], m["seq"], m["data"]["ok"]) for m in reports]
    assert got == [(p.MsgType.FINISH.value, 3, False)]
    assert reports[0]["data"]["fault"] == "hardware"
    assert not marker.exists(), "the superseded run order started the command"


def test_a_report_for_a_superseded_order_is_dropped(tmp_path: Path) -> None:
    async def main() -> list[dict[str, Any]]:
        sup = Supervisor(WorkerConfig(command=(sys.executable, SLEEPER, "0"), job="j", rank=0,
                                      world_size=1, work_dir=str(tmp_path), prewarm=False))
        sup.nc = nc = RecordingConnection()
        sup.seq = 5
        await sup.report(p.MsgType.FINISH, {"ok": True}, seq=4)
        assert sup.last_report is None
        await sup.report(p.MsgType.FINISH, {"ok": False}, seq=5)
        return nc.sent

    sent = asyncio.run(main())
    assert [(m["seq"], m["data"]["ok"]) for m in sent] == [(5, False)]


def _race(waiter: Callable[[Awaitable[Any], float], Awaitable[Any]], outcome: Any) -> str:
    """The operation ends (``outcome``) and its waiter is cancelled in the same loop step;
    the caller catches OSError the way the retry loops did. What did the caller do?"""
    async def main() -> str:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def caller() -> str:
            try:
                return f"carried on with {await waiter(fut, 5.0)!r}"
            except OSError as exc:
                return f"carried on after {type(exc).__name__}"

        task = asyncio.ensure_future(caller())
        await asyncio.sleep(0)  # the caller waits now
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"

    return asyncio.run(main())


OUTCOMES = [7, ConnectionRefusedError(111, "refused"), ProcessLookupError(3, "no such process")]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=["result", "refused", "no-process"])
def test_wait_or_cancel_raises_cancelled_even_when_the_operation_just_ended(outcome: Any) -> None:
    assert _race(wait_or_cancel, outcome) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for was fixed in Python 3.12")
@pytest.mark.parametrize("outcome", OUTCOMES, ids=["result", "refused", "no-process"])
def test_the_race_catches_asyncio_wait_for_swallowing_the_cancellation(outcome: Any) -> None:
    """The planted error: the same race with ``asyncio.wait_for`` lets the caller carry on."""
    assert _race(asyncio.wait_for, outcome).startswith("carried on")


def test_wait_or_cancel_times_out_and_cancels_the_operation() -> None:
    async def main() -> tuple[bool, Any]:
        ended: list[str] = []

        async def slow() -> int:
            try:
                await asyncio.sleep(30)
            finally:
                ended.append("cancelled")
            return 1

        with pytest.raises(asyncio.TimeoutError):
            await wait_or_cancel(slow(), 0.05)
        return ended == ["cancelled"], await wait_or_cancel(asyncio.sleep(0, "ok"), 5.0)

    assert asyncio.run(main()) == (True, "ok")


def test_a_cancelled_stop_still_kills_the_process_group() -> None:
    """A stop cancelled during its grace period must not leave a TERM-ignoring child behind."""
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")

    async def main() -> tuple[str, int | None]:
        ready = asyncio.Event()
        child = await start_child([sys.executable, "-c", code], dict(os.environ),
                                  on_line=lambda line: ready.set() if line == "ready" else None)
        await asyncio.wait_for(ready.wait(), 60)
        stopping = asyncio.ensure_future(child.stop(grace=60))
        await asyncio.sleep(0.3)
        stopping.cancel()
        try:
            await stopping
            outcome = "returned"
        except asyncio.CancelledError:
            outcome = "cancelled"
        status = await asyncio.wait_for(child.wait(), 20)  # killed, not after the 60 s grace
        return outcome, status.signal

    assert asyncio.run(main()) == ("cancelled", signal.SIGKILL)


def test_the_beats_say_a_hang_mark_only_once_its_frame_is_known(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (an e2e run with four jobs at once): py-spy took longer than a heartbeat
    interval, the beats in between carried the mark with no frame, and the master's fault log
    (which keeps the first beat's frame) said "a frame py-spy could not read" for a rank whose
    frame py-spy read a moment later. A real child process; py-spy stands in slowly."""
    dump = 'Thread 7 (idle): "MainThread"\n    wait (train.py:12)\n'

    def slow_stacks(pid: int) -> str:
        import time as _time

        _time.sleep(0.6)
        return dump

    monkeypatch.setattr(agent, "collect_stacks", slow_stacks)

    async def main() -> list[dict[str, Any] | None]:
        sup = Supervisor(WorkerConfig(command=(sys.executable, SLEEPER, "30"), job="j", rank=1,
                                      world_size=2, work_dir=str(tmp_path), prewarm=False))
        sup.nc = nc = RecordingConnection()
        sup.seq = 4
        sup.child = await start_child(list(sup.cfg.command), env=dict(os.environ))
        try:
            mark = p.Message(job="j", namespace="default", pod_name="master",
                             type=p.MsgType.MARK, rank=-1, seq=4, data={"hanging": [0]},
                             timestamp=0.0)
            await sup.on_order(mark.encode())
            marks: list[dict[str, Any] | None] = []
            for _ in range(4):  # beats while py-spy reads, then after
                await sup.heartbeat()
                marks.append(nc.sent[-1]["data"].get("hang_mark"))
                await asyncio.sleep(0.25)
            return marks
        finally:
            await sup.child.stop(1.0)

    marks = asyncio.run(main())
    assert marks[0] is None and marks[-1] == {"ranks": [0], "frame": "wait (train.py:12)"}, marks
    assert all(m is None or m["frame"] == "wait (train.py:12)" for m in marks), marks
