"""A starved master does not mistake its own stall for silent workers (runtime.tick).

The master runtime with the real ``step``, an in-memory store and a NATS stub; time is the real
monotonic clock, shifted by hand to play a stall.
"""

from __future__ import annotations

import asyncio
import time

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.master.runtime import Master, MasterConfig
from aegis_flow.master.store import MemoryStore


class FakeNats:
    is_connected = True

    async def publish(self, subject: str, data: bytes) -> None:
        pass

    async def flush(self, timeout: float = 1.0) -> None:
        pass


def beat(rank: int, seq: int) -> bytes:
    return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}",
                     type=p.MsgType.ACK, rank=rank, seq=seq, incarnation=f"i{rank}",
                     data={"node": f"n{rank}"}, timestamp=time.time()).encode()


async def running_master() -> Master:
    master = Master(MasterConfig(job="j", workers=2, lost_timeout=3.0, observe=False),
                    store=MemoryStore())
    master.nc = FakeNats()  # type: ignore[assignment]
    await master._load()
    for r in (0, 1):
        await master.on_message(beat(r, 0))
    seq = master.status.seq
    for r in (0, 1):
        await master.on_message(p.Message(
            job="j", namespace="default", pod_name=f"j-worker-{r}", type=p.MsgType.FINISH,
            rank=r, seq=seq, incarnation=f"i{r}", data={"ok": True},
            timestamp=time.time()).encode())
    assert master.status.phase is m.Phase.RUNCOMMAND
    return master


def test_a_stalled_master_waits_for_queued_heartbeats_before_declaring_a_loss() -> None:
    async def go() -> None:
        master = await running_master()
        await master.tick()  # a normal tick: everyone was just heard
        # the process sleeps 10 s (starved): its clock moved, the heartbeats are still queued
        for r in (0, 1):
            master.last_seen[r] -= 10.0
        assert master._last_tick is not None
        master._last_tick -= 10.0
        await master.tick()
        assert master.status.phase is m.Phase.RUNCOMMAND  # no Lost: the stall was ours
        for r in (0, 1):  # the queued heartbeats get processed
            await master.on_message(beat(r, master.status.seq))
        await asyncio.sleep(0.6)
        await master.tick()
        assert master.status.phase is m.Phase.RUNCOMMAND
        assert all(p.retries == 0 for p in master.status.workers)

    asyncio.run(go())


def test_a_really_silent_worker_is_still_lost_after_the_grace() -> None:
    async def go() -> None:
        master = await running_master()
        await master.tick()
        master.last_seen[1] -= 10.0  # rank 1 silent for 10 s while the master ran normally
        master._scan_at = 0.0  # the next scan for silent ranks is due (at most 4 a second)
        await master.tick()
        assert master.status.phase is m.Phase.RESTARTING  # T6: counted, being replaced
        assert master.status.workers[1].retries == 1

        master = await running_master()
        await master.tick()
        for r in (0, 1):
            master.last_seen[r] -= 10.0
        assert master._last_tick is not None
        master._last_tick -= 10.0
        await master.tick()  # a stall: paused
        assert master.status.phase is m.Phase.RUNCOMMAND
        await master.on_message(beat(0, master.status.seq))  # only rank 0 was queued
        await asyncio.sleep(0.6)
        await master.tick()
        assert master.status.phase is m.Phase.RESTARTING
        assert [p.retries for p in master.status.workers] == [0, 1]

    asyncio.run(go())
