"""Ranks played by a test over a real NATS connection: protocol messages as a worker sends
them, and the bootcheck round in which rank 1 reports a hardware fault (which makes the
master quarantine rank 1's node). Side effects: publishes on the connection it is given."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from aegis_flow import protocol as p


def message(kind: p.MsgType, rank: int, seq: int, data: dict[str, Any]) -> bytes:
    return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}", type=kind,
                     rank=rank, seq=seq, incarnation=f"inc-{rank}", phase="Pending",
                     data=data, timestamp=time.time()).encode()


async def rank1_fails_bootcheck(nc: Any, subjects: p.Subjects, output: Callable[[], str], *,
                                acks: Mapping[int, dict[str, Any]] | None = None,
                                detail: str = "gpu: lost", timeout: float = 60.0) -> None:
    """Ranks 0 and 1 ack (with ``acks[rank]`` as their data) until the bootcheck order comes;
    then rank 0 passes it and rank 1 fails it with a hardware fault. ``output()`` names what
    the master printed when the order does not come."""
    orders: list[p.Message] = []

    async def heard(msg: Any) -> None:
        orders.append(p.decode(msg.data))

    sub = await nc.subscribe(subjects.broadcast, cb=heard)
    deadline = time.monotonic() + timeout
    while not any(o.data.get("order") == "bootcheck" for o in orders):
        assert time.monotonic() < deadline, output()
        for rank in (0, 1):
            await nc.publish(subjects.master(rank), message(
                p.MsgType.ACK, rank, 0, dict((acks or {}).get(rank, {}))))
        await asyncio.sleep(0.3)
    await sub.unsubscribe()
    seq = next(o.seq for o in orders if o.data.get("order") == "bootcheck")
    await nc.publish(subjects.master(0), message(
        p.MsgType.FINISH, 0, seq, {"ok": True, "detail": "fine"}))
    await nc.publish(subjects.master(1), message(
        p.MsgType.FINISH, 1, seq, {"ok": False, "fault": "hardware", "detail": detail}))
    await nc.flush()
