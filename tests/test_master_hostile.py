"""What a hostile or confused peer can make the master do (security review F5, F7, F8).

F5 — a master that finds another master's status in the store leaves at once.

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
import re
import sys
import time
from pathlib import Path

import nats
import pytest

from aegis_flow import protocol as p
from aegis_flow.local.natsserver import EmbeddedNats
from aegis_flow.master.store import STATUS_KEY, KVStore
from tests.jobs import Proc, http_get

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
                    await _listening(master)
                    store = await KVStore.open(nc, subjects.kv_bucket, create=False)
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


def _master(tmp_path: Path, url: str) -> Proc:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return Proc([sys.executable, "-m", "aegis_flow.master", "--job", "j", "--workers", "2",
                 "--nats-url", url, "--connect-timeout", "120", "--metrics-port", "0",
                 "--metrics-addr", "127.0.0.1"], env, tmp_path, label="master")


async def _listening(master: Proc) -> None:
    """Until the master's /readyz says yes: its status is stored *and* it subscribed. (Waiting
    for the stored status alone raced: it is stored before the subscription, and a flood
    published in between went nowhere — 636 of 3,000 lost in one run.)"""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, master.output
        await asyncio.sleep(0.2)
        found = re.search(r"metrics on (http://\S+)/metrics", master.output)
        if found and http_get(found.group(1) + "/readyz")[0] == 200:
            return


async def _stored(nc: object, subjects: p.Subjects) -> dict[str, object]:
    import json

    store = await KVStore.open(nc, subjects.kv_bucket, create=False)
    raw, _ = await store.load()
    assert raw is not None
    doc: dict[str, object] = json.loads(raw)
    return doc


def test_f7_f8_floods_are_counted_promptly_and_quietly_and_steps_are_checked(
        tmp_path: Path) -> None:
    """F7: 100,000 dropped messages showed as 28 in the stored stats until the next
    transition; F8: a checkpoint step of 10^30 was accepted and stuck (max()). Now the stored
    count follows with no transition, the log says it for the 1st,
    2nd, 4th… drop only, a step beyond 2^53 is malformed, and a step beyond what the ranks
    have reported is dropped while one within it is recorded."""
    subjects = p.Subjects("default", "j")
    with EmbeddedNats(tmp_path / "nats") as server:
        master = _master(tmp_path, server.url)
        try:
            async def go() -> dict[str, object]:
                nc = await nats.connect(server.url)
                try:
                    await _listening(master)
                    for i in range(3000):
                        await nc.publish(subjects.master(0), b"{not json %d" % i)
                    await nc.flush()
                    # Before the fix the stored count never followed without a transition, so
                    # any bound catches it; 30 s because a loaded 2-core CI machine took > 5 s
                    # to drain 3,000 messages.
                    deadline = time.monotonic() + 30
                    while (stats := (await _stored(nc, subjects))["stats"]).get(  # type: ignore[attr-defined]
                            "invalid", 0) < 3000:
                        assert time.monotonic() < deadline, (
                            f"the stored count lags: {stats}\n{master.output}")
                        await asyncio.sleep(0.2)

                    def report(kind: p.MsgType, data: dict[str, object]) -> bytes:
                        return p.Message(job="j", namespace="default", pod_name="j-worker-0",
                                         type=kind, rank=0, seq=0, incarnation="inc-0",
                                         phase="Pending", data=data,
                                         timestamp=time.time()).encode()

                    # rank 0 reports it reached step 100 (aegis_flow.progress.step)
                    await nc.publish(subjects.master(0), report(
                        p.MsgType.ACK, {"node": "n0", "step": 100}))
                    for step in (10**30, 10**6, 60):
                        await nc.publish(subjects.master(0), report(
                            p.MsgType.CHECKPOINT, {"step": step}))
                    await nc.flush()
                    deadline = time.monotonic() + 30
                    while (await _stored(nc, subjects))["status"]["checkpoint_step"] != 60:  # type: ignore[index]
                        assert time.monotonic() < deadline, master.output
                        await asyncio.sleep(0.2)
                    return await _stored(nc, subjects)
                finally:
                    await nc.close()

            doc = asyncio.run(go())
            assert doc["status"]["checkpoint_step"] == 60  # type: ignore[index]
            dropped = [line for line in master.lines if "dropped" in line]
            # 3,000 bad messages + 2 implausible steps: about a dozen lines, not 3,002
            assert 3 <= len(dropped) <= 16, dropped
            # both implausible steps were dropped and counted (their lines are among the ones
            # the rate limit leaves out: the 3,001st and 3,002nd drop)
            assert doc["stats"]["invalid"] == 3002  # type: ignore[index]
            assert "(invalid 2048 so far)" in dropped[-1], dropped
        finally:
            master.kill()
