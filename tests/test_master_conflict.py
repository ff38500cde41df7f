"""A master that finds another master's status in the store leaves at once (review F5).

Real processes: a nats-server and a master. Another writer stores a status document for the
job (as a second master of the same job would). The next report the master handles needs a
save, which conflicts. Before the fix the conflict was raised inside nats-py's message
callback, which swallowed it: the master's phase had advanced in memory, its orders were never
sent, and it lived on as a zombie until a timer happened to save (at this commit's parent a
counter bumped by the swallowed error made the next timer save within a second, reporting the
conflict as a NATS error). Now the conflict ends it directly: exit 2 ("another master owns
job"), the in-memory status restored, nothing sent for the transition that was not stored.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import nats
import pytest

from aegis_flow import protocol as p
from aegis_flow.local.natsserver import EmbeddedNats
from aegis_flow.master.store import STATUS_KEY, KVStore
from tests.jobs import Proc

pytestmark = pytest.mark.e2e


def test_a_conflicting_save_in_a_message_ends_the_master(tmp_path: Path) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subjects = p.Subjects("default", "j")
    with EmbeddedNats(tmp_path / "nats") as server:
        master = Proc([sys.executable, "-m", "aegis_flow.master", "--job", "j", "--workers",
                       "2", "--nats-url", server.url, "--connect-timeout", "120",
                       "--metrics-port", "0", "--metrics-addr", "127.0.0.1"], env, tmp_path,
                      label="master")
        try:
            async def go() -> float:
                nc = await nats.connect(server.url)
                try:
                    deadline = time.monotonic() + 60
                    while True:  # the master made its bucket and stored its first status
                        assert time.monotonic() < deadline, master.output
                        await asyncio.sleep(0.2)
                        try:
                            store = await KVStore.open(nc, subjects.kv_bucket, create=False)
                        except Exception:  # noqa: BLE001 - not there yet
                            continue
                        if (await store.load())[0] is not None:
                            break
                    raw, _ = await store.load()
                    assert raw is not None
                    # another master of job j stores its own document
                    await store.kv.put(STATUS_KEY, raw)
                    orders: list[bytes] = []

                    async def heard(msg: object) -> None:
                        orders.append(msg.data)  # type: ignore[attr-defined]

                    await nc.subscribe(subjects.broadcast, cb=heard)
                    ack = p.Message(job="j", namespace="default", pod_name="j-worker-0",
                                    type=p.MsgType.ACK, rank=0, seq=0, incarnation="inc-0",
                                    phase="Pending", data={"node": "n0"},
                                    timestamp=time.time())
                    sent = time.monotonic()
                    await nc.publish(subjects.master(0), ack.encode())
                    await nc.flush()
                    await asyncio.sleep(1.0)
                    assert orders == []  # nothing sent for a transition that was not stored
                    return sent
                finally:
                    await nc.close()

            sent = asyncio.run(go())
            assert master.wait(20) == 2, master.output
            assert master.ended_at is not None and master.ended_at - sent < 10
            assert "another master owns job j" in master.output
            # handled where it happens, not by nats-py's callback as a "NATS" error (it was
            # caught only because that error bumped a counter that a timer then saved)
            assert "NATS: status changed under us" not in master.output, master.output
            assert "Traceback" not in master.output
        finally:
            master.kill()
