"""Heartbeats that scale (policy.beat_floor): above 1,000 workers the master asks, in every
order, for fewer heartbeats — its budget spread over the workers, never fewer than three per
lost timeout — and each supervisor beats at the longer of its own interval and that."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fakes import FakeNats

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.master.policy import BEAT_BUDGET, beat_floor
from aegis_flow.master.runtime import Master, MasterConfig
from aegis_flow.master.store import MemoryStore


def test_the_floor_spreads_the_budget_and_keeps_three_beats_per_lost_timeout() -> None:
    assert BEAT_BUDGET == 2000.0
    assert beat_floor(2, 3.0) is None and beat_floor(1000, 3.0) is None  # 0.5 s stands
    assert beat_floor(1024, 3.0) == 0.512
    assert beat_floor(4096, 3.0) == 1.0  # capped: three beats within the 3 s lost timeout
    assert beat_floor(4096, 10.0) == 2.048
    assert beat_floor(8192, 1.2) is None  # a third of the lost timeout is below 0.5 s


def _orders(workers: int) -> list[dict[str, object]]:
    async def go() -> list[dict[str, object]]:
        mm = Master(MasterConfig(job="j", workers=workers, observe=False), store=MemoryStore())
        mm.nc = FakeNats()
        await mm._load()
        for r in range(workers):
            await mm.on_message(p.Message(
                job="j", namespace="default", pod_name=f"j-worker-{r}", type=p.MsgType.ACK,
                rank=r, seq=0, incarnation=f"i{r}", data={}, timestamp=time.time()).encode())
        assert mm.status.phase is m.Phase.BOOTCHECKING
        return [json.loads(raw)["data"] for _, raw in mm.nc.sent]
    return asyncio.run(go())


def test_a_large_jobs_orders_carry_the_floor_a_small_jobs_do_not() -> None:
    small = _orders(4)
    assert small and all("beat_floor" not in d for d in small)
    large = _orders(4096)
    assert large and all(d.get("beat_floor") == 1.0 for d in large)


@pytest.mark.parametrize("floor, every", [(1.0, 1.0), (0.2, 0.5), (None, 0.5), (True, 0.5),
                                         (-1, 0.5), (61, 0.5), ("2", 0.5)])
def test_the_supervisor_beats_at_the_longer_of_its_own_interval_and_the_floor(
        floor: object, every: float) -> None:
    from aegis_flow.supervisor.agent import Supervisor, WorkerConfig

    sup = Supervisor(WorkerConfig(command=("true",), job="j", rank=0, world_size=2,
                                  heartbeat_interval=0.5))
    sup._beat_floor(floor)
    assert sup.beat_every == every and sup.beats.interval == every


def test_a_resend_asked_for_while_the_broadcast_is_in_flight_is_skipped_once() -> None:
    """A heartbeat sent before the broadcast reached its worker shows the old seq; the core
    asks to re-send the order. Within one heartbeat interval of the broadcast the runtime skips
    it (counted); the next heartbeat with the old seq gets the order: a lost broadcast still
    comes back within a beat."""
    async def go() -> None:
        mm = Master(MasterConfig(job="j", workers=2, observe=False), store=MemoryStore())
        mm.nc = FakeNats()
        await mm._load()

        def ack(rank: int) -> bytes:
            return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}",
                             type=p.MsgType.ACK, rank=rank, seq=0, incarnation=f"i{rank}",
                             data={}, timestamp=time.time()).encode()

        for r in (0, 1):
            await mm.on_message(ack(r))
        assert mm.status.phase is m.Phase.BOOTCHECKING
        sent = len(mm.nc.sent)
        await mm.on_message(ack(0))  # in flight: skipped
        assert len(mm.nc.sent) == sent and mm.stats["resends_in_flight"] == 1
        assert mm._broadcast is not None
        seq, order, at = mm._broadcast
        mm._broadcast = (seq, order, at - 1.0)  # one beat later, still the old seq: lost
        await mm.on_message(ack(0))
        subject, raw = mm.nc.sent[-1]
        assert subject == mm.subjects.worker(0) and json.loads(raw)["data"]["order"] == "bootcheck"
    asyncio.run(go())
