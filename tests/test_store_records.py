"""The status stored as a job record plus one record per rank (store.py): what a save writes
does not grow with the job, a master killed between the two writes loses nothing, a restarted
master rebuilds the very status it had, and a transition with nothing to send waits for the
next save. In-process over the memory store; the last test uses a real nats-server's KV."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from fakes import FakeNats

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.master.runtime import Master, MasterConfig
from aegis_flow.master.store import (
    MemoryStore,
    assemble,
    decode_doc,
    encode_doc,
    encode_job,
    encode_worker,
    job_layout,
    worker_key,
)


def msg(rank: int, t: p.MsgType, seq: int, **data: object) -> bytes:
    return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}", type=t,
                     rank=rank, seq=seq, incarnation=f"i{rank}", data=dict(data),
                     timestamp=time.time()).encode()


def master(store: MemoryStore, workers: int) -> Master:
    mm = Master(MasterConfig(job="j", workers=workers, observe=False), store=store)
    mm.nc = FakeNats()
    return mm


async def to_bootcheck(mm: Master) -> None:
    await mm._load()
    for r in range(mm.cfg.workers):
        await mm.on_message(msg(r, p.MsgType.ACK, 0))
    assert mm.status.phase is m.Phase.BOOTCHECKING


def test_the_records_assemble_into_the_one_document_every_reader_knows() -> None:
    status = m.initial_status(3, max_retry=2)
    status = m.evolve(status, workers=tuple(
        m.evolve(w, incarnation=f"i{w.rank}", node=f"n{w.rank}") for w in status.workers))
    records = {r: encode_worker(status.workers[r], ["boom"] if r == 1 else None)
               for r in range(3)}
    job = encode_job(status, {2: records[2]}, events=["e"], stats={"invalid": 1})
    assert job_layout(job) == (3, frozenset({2}))
    doc = assemble(job, {0: records[0], 1: records[1]})  # rank 2 only in the delta
    back, extra = decode_doc(doc)
    assert back == status
    assert extra["tails"] == {"1": ["boom"]} and extra["events"] == ["e"]
    # an old single-key document is read as it is
    old = encode_doc(status, events=[], stats={})
    assert job_layout(old) is None and assemble(old, {}) == old
    # a rank with no record anywhere is named
    with pytest.raises(ValueError, match="no record of rank 1"):
        assemble(job, {0: records[0]})
    with pytest.raises(ValueError, match="rank 0's record is not JSON"):
        assemble(job, {0: b"{nope", 1: records[1]})


@pytest.mark.parametrize("bad", [b'{"format": 2, "status": {"workers": -1}, "delta": {}}',
                                 b'{"format": 2, "status": {"workers": 2}}',
                                 b'{"format": 2, "status": {"workers": 1}, "delta": {"x": {}}}'])
def test_a_damaged_job_record_is_named(bad: bytes) -> None:
    with pytest.raises(ValueError, match="stored status is damaged"):
        job_layout(bad)


def test_what_a_transition_writes_does_not_grow_with_the_job() -> None:
    """Review of the scale harness: the whole document (every rank's record) was written after
    every transition, O(N) bytes each and O(N²) a round. Now one rank's FINISH writes the job
    record and that rank's record, the same bytes at 64 ranks as at 512 (the job record's event
    list keeps the last 30 lines: past 30 ranks it is full either way)."""
    async def one_finish(workers: int) -> int:
        store = MemoryStore()
        mm = master(store, workers)
        await to_bootcheck(mm)
        await mm.records_written()
        saves = len(store.written)
        await mm.on_message(msg(3, p.MsgType.FINISH, mm.status.seq, ok=True))
        assert len(store.written) == saves  # nothing goes out: it waits for the next save
        await mm.tick()
        await mm.records_written()
        assert len(store.written) == saves + 2  # the job record, then rank 3's record
        assert job_layout(store.job or b"") == (workers, frozenset({3}))
        return store.written[-2] + store.written[-1]

    small, large = asyncio.run(one_finish(64)), asyncio.run(one_finish(512))
    assert abs(large - small) < 64, (small, large)  # a few digits more in ranks and counts
    assert large < 4096


def test_a_transition_that_sends_an_order_is_stored_before_the_order_goes_out() -> None:
    async def go() -> None:
        store = MemoryStore()
        mm = master(store, 4)
        await to_bootcheck(mm)
        for r in range(3):
            await mm.on_message(msg(r, p.MsgType.FINISH, mm.status.seq, ok=True))
        seq = mm.status.seq
        sent = len(mm.nc.sent)

        async def publish(subject: str, data: bytes) -> None:  # the run order
            stored, _ = decode_doc(store.raw or b"")
            assert stored.seq == seq + 1 and stored == mm.status
            assert all(w.seq == seq for w in stored.workers[:3])  # the deferred FINISHes too
            sends.append(data)

        sends: list[bytes] = []
        mm.nc.publish = publish
        await mm.on_message(msg(3, p.MsgType.FINISH, seq, ok=True))
        assert mm.status.phase is m.Phase.RUNCOMMAND and sends and sent >= 1
    asyncio.run(go())


class DiesAfterTheJobRecord(MemoryStore):
    """A master killed between the job record and the worker records: the records never land."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = False

    async def save_records(self, workers: Mapping[int, bytes]) -> None:
        if self.dead:
            raise ConnectionError("killed")
        await super().save_records(workers)


def test_a_master_killed_between_the_two_writes_loses_nothing() -> None:
    async def go() -> None:
        store = DiesAfterTheJobRecord()
        a = master(store, 4)
        await to_bootcheck(a)
        for r in (0, 2):
            await a.on_message(msg(r, p.MsgType.FINISH, a.status.seq, ok=True))
        await a.records_written()
        store.dead = True
        await a._persist()  # the job record is committed; the records' writes fail
        await a.records_written()
        assert store.records[0] != encode_worker(a.status.workers[0])  # never written
        assert a.stats["record_writes_failed"] == 1 and a._unwritten >= {0, 2}
        # a new master rebuilds the very status from the job record's delta
        store.dead = False
        b = master(store, 4)
        await b._load()
        assert b.status == a.status
        assert b._unwritten == {0, 2}
        # and its next save writes those records, whatever else it changed
        await b.on_message(msg(1, p.MsgType.FINISH, b.status.seq, ok=True))
        await b.tick()
        await b.records_written()
        assert job_layout(store.job or b"") == (4, frozenset({0, 1, 2}))
        assert all(store.records[r] == encode_worker(b.status.workers[r]) for r in (0, 1, 2))
        c = master(store, 4)
        await c._load()
        assert c.status == b.status
    asyncio.run(go())


def test_a_restarted_master_rebuilds_the_status_from_a_real_kv(tmp_path: Path) -> None:
    """Real nats-server, real JetStream KV: the records are keys of the job's bucket, a
    restarted master reads them back to the same status, tails included."""
    import nats

    from aegis_flow.local.natsserver import EmbeddedNats
    from aegis_flow.master.store import KVStore

    async def go(url: str) -> None:
        nc = await nats.connect(url)
        try:
            subjects = p.Subjects("default", "j")
            small = await KVStore.open(nc, subjects.kv_bucket)
            small.max_record = 1024  # a round's job record is split into parts, as at 4,096
            a = Master(MasterConfig(job="j", workers=6, observe=False), store=small)
            a.nc = FakeNats()
            await to_bootcheck(a)
            for r in range(6):
                await a.on_message(msg(r, p.MsgType.FINISH, a.status.seq, ok=True))
            assert a.status.phase is m.Phase.RUNCOMMAND
            await a.on_message(msg(4, p.MsgType.ERROR, a.status.seq, cause="boom",
                                   cause_code="exception", cause_class="transient",
                                   tail=["Traceback", "KeyError: 'x'"]))
            await a.tick()
            assert a._saved is a.status
            kv = await nc.jetstream().key_value(subjects.kv_bucket)
            await a.records_written()
            block = json.loads((await kv.get(worker_key(4))).value)  # ranks 0..63: one key
            assert worker_key(4) == "w.0" and sorted(block) == [str(r) for r in range(6)]
            assert block["4"]["tail"][-1] == "KeyError: 'x'"
            b = Master(MasterConfig(job="j", workers=6, observe=False),
                       store=await KVStore.open(nc, subjects.kv_bucket, create=False))
            b.nc = FakeNats()
            await b._load()
            assert b.status == a.status and b.tails == a.tails
            raw, _ = await KVStore(kv).load()
            assert decode_doc(raw or b"")[0] == a.status
            # the big saves went through parts; only the newest split save's parts remain
            keys = set(await kv.keys())
            parts = {k for k in keys if k.startswith("d.")}
            job = (await kv.get("status")).value
            assert parts and parts == set(json.loads(job)["delta_parts"]), keys
            with pytest.raises(ValueError, match="delta part"):
                from aegis_flow.master.store import join_job
                join_job(job, {})
        finally:
            await nc.close()

    with EmbeddedNats(tmp_path / "nats") as server:
        asyncio.run(go(server.url))


def test_the_monitor_checks_the_quiet_transitions_before_the_next_save(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Acks and FINISHes that send nothing are checked as one transition before the save that
    stores them (O(N) per save, not per report). A planted bug there is still caught: a core
    whose FINISH moves the rank past the job's order (WorkerSeqNumBound)."""
    real = m._on_finish

    def planted(status: m.Status, ev: m.Finish, pod: m.PodInfo) -> m.Result:
        new, effects = real(status, ev, pod)
        if ev.rank == 1 and new.phase is status.phase:
            pod = new.workers[1]
            new = m.evolve(new, workers=tuple(
                m.evolve(w, seq=status.seq + 5) if w is pod else w for w in new.workers))
        return new, effects

    async def go(bug: bool) -> Master:
        if bug:
            monkeypatch.setattr(m, "_on_finish", planted)
        mm = master(MemoryStore(), 4)
        await to_bootcheck(mm)
        for r in (0, 1):
            await mm.on_message(msg(r, p.MsgType.FINISH, mm.status.seq, ok=True))
        assert mm._batch is not None and mm.stats["invariant_violations"] == 0  # not yet
        await mm.tick()  # the save: checked first
        assert mm._batch is None
        return mm

    assert asyncio.run(go(False)).stats["invariant_violations"] == 0
    broken = asyncio.run(go(True))
    assert broken.stats["invariant_violations"] >= 1
    assert any("INVARIANT WorkerSeqNumBound broken by Finish(rank=1" in e
               and "and the 1 report(s) before it" in e for e in broken.events), broken.events


def test_which_transitions_may_wait_for_the_next_save() -> None:
    from aegis_flow.master.runtime import _quiet

    st = m.evolve(m.initial_status(2, max_retry=1), phase=m.Phase.BOOTCHECKING, seq=3)
    pod = m.evolve(st.workers[0], seq=2)
    after = m.evolve(st, workers=(pod, st.workers[1]))
    log = m.Log("rank 0 seen")
    resend = m.Send(0, m.Order.BOOTCHECK, 3)
    assert _quiet(st, m.Ack(0, "i0", 2), after, [log, resend])  # a re-send of the stored seq
    assert not _quiet(st, m.Ack(0, "i0", 2), after, [m.Send(0, m.Order.BOOTCHECK, 4)])
    assert not _quiet(st, m.Ack(0, "i0", 2), after, [m.Broadcast(m.Order.RUN, 3)])
    assert not _quiet(st, m.Ack(0, "i0", 2), m.evolve(after, seq=4), [log])  # a new order
    assert not _quiet(st, m.Ack(0, "i0", 2), m.evolve(after, phase=m.Phase.RUNCOMMAND), [])
    assert not _quiet(st, m.Lost(0), after, [log])  # only a rank's own repeated reports
    assert _quiet(st, m.Finish(0, 3, True), after, [log])


def test_a_job_record_whose_rank_records_are_gone_is_refused_with_the_reason() -> None:
    """A record missing (its key purged, a part lost): the master stops with the clear
    damaged-store error (exit 5), not an unforeseen exception."""
    from aegis_flow.master.runtime import StoreDamaged

    async def go() -> None:
        store = MemoryStore()
        a = master(store, 4)
        await to_bootcheck(a)
        await a.records_written()
        store.job = encode_job(a.status, {}, events=[], stats={})  # delta gone ...
        del store.records[2]  # ... and rank 2's key with it
        with pytest.raises(StoreDamaged, match="no record of rank 2"):
            await master(store, 4)._load()
    asyncio.run(go())


def test_status_says_a_damaged_store_is_damaged(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    import argparse

    from aegis_flow.local import cli

    async def fetch(*_: object) -> bytes:
        raise ValueError("stored status is damaged: no record of rank 2")

    monkeypatch.setattr(cli, "_fetch", fetch)
    a = argparse.Namespace(job="j", namespace="default", nats_url="nats://127.0.0.1:1",
                           state_dir=tmp_path, json=False, creds=None, auth_dir=None)
    monkeypatch.setattr(cli, "_url", lambda _a: "nats://127.0.0.1:1")
    monkeypatch.setattr(cli, "_auth_options", lambda *_: {})
    assert cli._status(a) == 1
    err = capsys.readouterr().err
    assert "the stored status of default/j is damaged: stored status is damaged: no record of " \
           "rank 2" in err and "cannot reach NATS" not in err
