"""Keep-alives: a heartbeat that says nothing new travels as one short line of numbers, the
master reads it without a JSON decode and, while it changes nothing, without the state machine.

Three tiers: the wire form (protocol.KeepAlive, decode_keepalive), the supervisor's choice of
when to send one (supervisor/keepalive.py), and the master's intake of them (runtime): its
numbers are kept, loss detection sees the worker, and the one that could change something (an
old seq, a worker being replaced) goes through ``step`` as the Ack it stands for.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from fakes import FakeNats
from hypothesis import given
from hypothesis import strategies as st

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.master.runtime import Master, MasterConfig
from aegis_flow.master.store import MemoryStore
from aegis_flow.supervisor.keepalive import KeepAlives

SUBJECTS = p.Subjects("default", "j")
counts = st.none() | st.integers(0, p.MAX_STEP)
reals = st.none() | st.floats(0, 1e17, allow_nan=False)


# -- the wire form ----------------------------------------------------------------------------


@given(st.builds(p.KeepAlive, st.integers(0, p.MAX_STEP),
                 st.text("abcdef0123456789-_.:", min_size=1, max_size=64),
                 st.floats(0, 1e12, allow_nan=False), counts, reals, counts, counts, reals,
                 reals, reals, reals))
def test_a_keepalive_reads_back_as_it_was_written(ka: p.KeepAlive) -> None:
    raw = ka.encode()
    assert raw.startswith(p.KEEPALIVE_PREFIX) and len(raw) < 300
    assert p.decode_keepalive(raw) == ka


@pytest.mark.parametrize("raw", [
    b"K1 3 abc 1.5", b"K1 3 abc 1.5 - - - - - - - - -", b"K2 3 abc 1.5 - - - - - - - -",
    b"K1 -3 abc 1.5 - - - - - - - -", b"K1 x abc 1.5 - - - - - - - -",
    b"K1 3 abc nan - - - - - - - -", b"K1 3 abc 1.5 - inf - - - - - -",
    b"K1 3 abc 1.5 - -2.0 - - - - - -", b"K1 3 abc 1.5 1e3 - - - - - - -",
    b"K1 - abc 1.5 - - - - - - - -", b"K1 3 abc - - - - - - - - -",
    b"K1 3 \xff\xfe 1.5 - - - - - - - -", b"K1 3 abc 1.5 99999999999999999999 - - - - - - -",
    b"K1 3 " + b"a" * 65 + b" 1.5 - - - - - - - -", b"K1 3 abc 1.5 - - - - - - - " + b"9" * 600,
])
def test_a_malformed_keepalive_is_refused_with_a_reason(raw: bytes) -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.decode_keepalive(raw)
    assert err.value.reason


def test_only_a_one_token_printable_incarnation_can_travel() -> None:
    assert p.keepalive_safe("a1b2c3") and p.keepalive_safe("pod-uid:7f3a")
    assert not p.keepalive_safe("") and not p.keepalive_safe("a b")
    assert not p.keepalive_safe("é") and not p.keepalive_safe("x" * 65)


# -- the supervisor's choice ------------------------------------------------------------------


def beat(seq: int = 4, *, incarnation: str = "inc1", **data: Any) -> p.Message:
    base = {"node": "n0", "pod_ip": "10.0.0.1", "child_pid": 42, "doing": "", "step": 10,
            "step_rate": 2.5, "beat_lag": 0.001, "doing_for": 3.0,
            "progress": {"steps": 10, "forwards": 11, "last_active": 5.0, "forward_ms": 180.0},
            "resources": {"procs": [{"pid": 42, "cpu": 99.0}]}}
    return p.Message(job="j", namespace="default", pod_name="j-worker-0", type=p.MsgType.ACK,
                     rank=0, seq=seq, incarnation=incarnation, phase="RunCommand",
                     data={**base, **data}, timestamp=1000.0)


def test_no_keepalive_before_the_master_asks_then_only_for_nothing_new() -> None:
    ka = KeepAlives()
    assert ka.compact(beat(), 0.0) is None and ka.compact(beat(), 1.0) is None  # not asked
    for every in (0.5, 61, True, "5", None):
        ka.asked(every)
        assert ka.every is None
    ka.asked(5)  # the beat of 1.0 said it all, and less than 5 s ago: a keep-alive now
    short = ka.compact(beat(step=11, doing_for=4.0, resources={"procs": []}), 3.0)
    assert short is not None
    got = p.decode_keepalive(short)
    assert (got.seq, got.incarnation, got.step, got.steps, got.forwards, got.forward_ms,
            got.doing_for) == (4, "inc1", 11, 10, 11, 180.0, 4.0)
    assert ka.sent == 1


@pytest.mark.parametrize("change", [
    {"seq": 5}, {"doing": "checks"}, {"child_pid": 43}, {"node": "n1"},
    {"hang_mark": {"ranks": [0], "frame": "f"}}, {"saver": {"state": "running"}},
    {"incarnation": "has space"}])
def test_anything_but_the_moving_numbers_sends_a_full_heartbeat(change: dict[str, Any]) -> None:
    ka = KeepAlives()
    ka.asked(5.0)
    assert ka.compact(beat(), 0.0) is None
    assert ka.compact(beat(), 1.0) is not None
    seq = change.pop("seq", 4)
    incarnation = change.pop("incarnation", "inc1")
    assert ka.compact(beat(seq, incarnation=incarnation, **change), 2.0) is None


def test_a_full_heartbeat_at_least_every_interval() -> None:
    ka = KeepAlives()
    ka.asked(5.0)
    kinds = ["full" if ka.compact(beat(), t / 2) is None else "short" for t in range(24)]
    assert kinds == (["full"] + ["short"] * 9) * 2 + ["full"] + ["short"] * 3


# -- the master's intake ----------------------------------------------------------------------


def ack(rank: int, seq: int, incarnation: str | None = None) -> bytes:
    return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}",
                     type=p.MsgType.ACK, rank=rank, seq=seq,
                     incarnation=incarnation or f"i{rank}",
                     data={"node": f"n{rank}", "pod_ip": f"10.0.0.{rank + 1}"},
                     timestamp=time.time()).encode()


def finish(rank: int, seq: int) -> bytes:
    return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}",
                     type=p.MsgType.FINISH, rank=rank, seq=seq, incarnation=f"i{rank}",
                     data={"ok": True}, timestamp=time.time()).encode()


def keepalive(rank: int, seq: int, incarnation: str | None = None, *, step: int = 7) -> bytes:
    return p.KeepAlive(seq, incarnation or f"i{rank}", time.time(), step=step, step_rate=2.0,
                       steps=step, forwards=step + 1, forward_ms=150.0).encode()


async def running(workers: int = 2, *, beaten: bool = True) -> Master:
    mm = Master(MasterConfig(job="j", workers=workers), store=MemoryStore())
    mm.nc = FakeNats()
    await mm._load()
    for r in range(workers):
        await mm.on_message(ack(r, 0), SUBJECTS.master(r))
    seq = mm.status.seq
    for r in range(workers):
        await mm.on_message(finish(r, seq), SUBJECTS.master(r))
    for r in range(workers if beaten else 0):  # the beats that show the run order arrived
        await mm.on_message(ack(r, mm.status.seq), SUBJECTS.master(r))
    assert mm.status.phase is m.Phase.RUNCOMMAND
    return mm


def test_every_order_asks_for_keepalives_unless_turned_off() -> None:
    async def go() -> None:
        mm = await running()
        orders = [json.loads(raw)["data"] for _, raw in mm.nc.sent]
        assert orders and all(d.get("keepalive") == 5.0 for d in orders)
        off = Master(MasterConfig(job="j", workers=1, keepalives=False), store=MemoryStore())
        off.nc = FakeNats()
        await off._load()
        await off.on_message(ack(0, 0), SUBJECTS.master(0))
        assert off.nc.sent and all("keepalive" not in json.loads(raw)["data"]
                                   for _, raw in off.nc.sent)
    asyncio.run(go())


def test_a_keepalive_that_changes_nothing_keeps_the_numbers_and_skips_the_machine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        mm = await running()
        before, sent = mm.status, len(mm.nc.sent)
        mm.last_seen[1] = 0.0
        stepped: list[m.Event] = []
        real_step = m.step
        monkeypatch.setattr(m, "step", lambda s, e, **kw: stepped.append(e) or real_step(
            s, e, **kw))
        await mm.on_message(keepalive(1, before.seq, step=40), SUBJECTS.master(1))
        assert stepped == [] and mm.status is before and len(mm.nc.sent) == sent
        assert mm.last_seen[1] > 0.0 and mm.counts[1] == (before.seq, 40, 41)
        assert mm.forward_ms[1] == (before.seq, 150.0)
        assert mm.observer is not None and mm.observer.views[1].step == 40
        assert b'aegis_heartbeats_total{kind="keepalive"} 1.0' in mm.observer.render()
    asyncio.run(go())


def test_a_keepalive_with_an_old_seq_gets_the_order_again() -> None:
    """The worker missed the broadcast; its keep-alives show the old seq. The master answers as
    it answers a full heartbeat: the current order, on the worker's own subject."""
    async def go() -> None:
        mm = await running(beaten=False)  # no beat has shown the run order yet
        seq = mm.status.seq
        mm.nc.sent.clear()
        mm._broadcast = None  # long past (a re-send within a beat of it is skipped)
        await mm.on_message(keepalive(0, seq - 1), SUBJECTS.master(0))
        assert [(s, json.loads(raw)["seq"], json.loads(raw)["data"]["order"])
                for s, raw in mm.nc.sent] == [(SUBJECTS.worker(0), seq, "run")]
    asyncio.run(go())


def test_keepalives_from_a_worker_the_status_does_not_know_or_malformed_are_dropped() -> None:
    async def go() -> None:
        mm = await running()
        before = mm.status
        mm.last_seen[0] = 0.0
        await mm.on_message(keepalive(0, before.seq, "someone-else"), SUBJECTS.master(0))
        assert mm.stats["keepalive_unknown"] == 1 and mm.last_seen[0] == 0.0
        invalid = mm.stats["invalid"]
        await mm.on_message(b"K1 garbage", SUBJECTS.master(0))
        await mm.on_message(keepalive(0, before.seq), SUBJECTS.control)  # not a rank's subject
        await mm.on_message(keepalive(7, before.seq), SUBJECTS.master(7))  # no such rank
        assert mm.stats["invalid"] == invalid + 3 and mm.status is before
        assert mm.last_seen[0] == 0.0
    asyncio.run(go())


def test_a_keepalive_from_a_rank_found_lost_brings_it_back_through_the_machine() -> None:
    """Rank 1 was found lost while training (T6: counted, every rank held). Its keep-alives
    resume with the same incarnation: not a beat that changes nothing, so the machine sees it
    as the Ack it stands for, and the worker is back (T8: every rank troubleshoots)."""
    async def go() -> None:
        mm = await running(3)
        await mm.apply(m.Lost(1, silent=frozenset({1}), nats_ok=True))
        assert mm.status.phase is m.Phase.RESTARTING and mm.status.workers[1].restarting
        mm.nc.sent.clear()
        await mm.on_message(keepalive(1, mm.status.workers[1].seq), SUBJECTS.master(1))
        assert mm.status.phase is m.Phase.TROUBLESHOOTING, mm.status.phase
        assert [json.loads(raw)["data"]["order"] for s, raw in mm.nc.sent
                if s == SUBJECTS.broadcast] == ["troubleshoot"]
    asyncio.run(go())
