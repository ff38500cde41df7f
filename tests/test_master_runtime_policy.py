"""The master's runtime carries out the core's decisions and decides nothing itself: a restarted
master re-sends an order byte for byte; a save that fails holds the transition back; a damaged
stored document is refused with the reason. In-process: the real ``Master`` over fakes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping

import pytest
from fakes import FakeNats, FlakyStore

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.master.runtime import Master, MasterConfig, StoreDamaged, summary
from aegis_flow.master.store import MemoryStore, StoreConflict


def msg(rank: int, t: p.MsgType, seq: int, inc: str = "", **data: object) -> bytes:
    return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}", type=t,
                     rank=rank, seq=seq, incarnation=inc or f"i{rank}", data=dict(data),
                     timestamp=time.time()).encode()


def master(store: MemoryStore, **cfg: object) -> Master:
    mm = Master(MasterConfig(job="j", workers=2, observe=False, **cfg),  # type: ignore[arg-type]
                store=store)
    mm.nc = FakeNats()
    return mm


def orders(mm: Master, name: str) -> list[bytes]:
    return [raw for _, raw in mm.nc.sent if json.loads(raw)["data"].get("order") == name]


async def to_running(mm: Master) -> None:
    await mm._load()
    for r in (0, 1):
        await mm.on_message(msg(r, p.MsgType.ACK, 0))
    for r in (0, 1):
        await mm.on_message(msg(r, p.MsgType.FINISH, mm.status.seq, ok=True))
    assert mm.status.phase is m.Phase.RUNCOMMAND


def test_a_restarted_master_resends_the_same_bytes_for_the_same_seq() -> None:
    """code-review §1.2a (restart_probe.py): a new port for RUN and a troubleshoot plan without
    the collectives after a master restart."""
    async def go() -> None:
        store = MemoryStore()
        a = master(store)
        await to_running(a)
        run = orders(a, "run")[-1]
        b = master(store)
        await b._load()
        await b.on_message(msg(0, p.MsgType.ACK, json.loads(run)["seq"] - 1))
        assert orders(b, "run")[-1] == run  # byte for byte: port, epoch, timestamp
        # a communication failure: the troubleshoot includes the collectives ...
        await a.on_message(msg(1, p.MsgType.ERROR, a.status.seq, cause="reset",
                               cause_code="nccl_timeout", cause_class="transient"))
        ts = orders(a, "troubleshoot")[-1]
        assert "allreduce_connection" in json.loads(ts)["data"]["checks"]
        c = master(store)  # ... and so does the re-send of a master restarted after it
        await c._load()
        await c.on_message(msg(0, p.MsgType.ACK, json.loads(ts)["seq"] - 1))
        assert orders(c, "troubleshoot")[-1] == ts
    asyncio.run(go())


def test_a_failed_save_sends_nothing_and_the_repeated_report_goes_through() -> None:
    async def go() -> None:
        store = FlakyStore()
        mm = master(store, save_retries=1)
        await to_running(mm)
        before, sent = mm.status, len(mm.nc.sent)
        store.down = True
        await mm.on_message(msg(1, p.MsgType.ERROR, mm.status.seq, cause="SIGKILL"))
        assert mm.status == before and len(mm.nc.sent) == sent  # nothing on unsaved state
        assert mm.store_down_since is not None and store.failed == 2
        store.down = False
        # the worker repeats its report with every heartbeat until the seq advances
        await mm.on_message(msg(1, p.MsgType.ERROR, mm.status.seq, cause="SIGKILL"))
        assert mm.status.phase is m.Phase.TROUBLESHOOTING
        assert orders(mm, "troubleshoot") and mm.store_down_since is None
    asyncio.run(go())


def test_a_save_that_timed_out_but_landed_is_not_another_master() -> None:
    """A paused NATS handles a queued save after it resumes: the store moved one revision on,
    with our own document. That is not a conflict with another master (exit 2)."""
    async def go() -> None:
        store = FlakyStore()
        mm = master(store, save_retries=0)
        await to_running(mm)
        store.down = store.lands = True
        await mm.on_message(msg(1, p.MsgType.ERROR, mm.status.seq, cause="SIGKILL"))
        assert mm.status.phase is m.Phase.RUNCOMMAND and store.revision == mm.revision + 1
        store.down = False
        await mm.on_message(msg(1, p.MsgType.ERROR, mm.status.seq, cause="SIGKILL"))
        assert mm.status.phase is m.Phase.TROUBLESHOOTING and mm.revision == store.revision
        # a document that is not ours still is a conflict
        store.raw, store.revision = b"{}", store.revision + 1
        with pytest.raises(StoreConflict):
            await mm._persist()
    asyncio.run(go())


def test_loss_detection_pauses_while_the_store_is_down() -> None:
    async def go() -> None:
        store = FlakyStore()
        mm = master(store, save_retries=0, lost_timeout=0.2)
        await to_running(mm)
        store.down = True
        await mm.on_message(msg(1, p.MsgType.ERROR, mm.status.seq, cause="SIGKILL"))
        for r in (0, 1):
            mm.last_seen[r] = time.monotonic() - 10
        await mm.tick()
        assert mm.status.phase is m.Phase.RUNCOMMAND  # no Lost while degraded
    asyncio.run(go())


def test_a_damaged_document_is_refused_with_the_reason() -> None:
    async def go() -> None:
        store = MemoryStore()
        store.raw, store.revision = b'{"status": {"phase": "Nonsense"}}', 3
        mm = master(store)
        with pytest.raises(StoreDamaged, match="damaged.*aegis-flow status"):
            await mm._load()
    asyncio.run(go())


def test_the_summary_counts_restarts_not_recover_count() -> None:
    """B9: every failed job said "restarted R+1 times" after R restarts."""
    st = m.evolve(m.initial_status(2, 3), phase=m.Phase.FAILED, recover_count=4,
                  failure="rank 1 failed 4 times")
    assert "restarted 3 times" in summary(st) and "rank 1 failed 4 times" in summary(st)


def test_status_shows_what_it_can_of_a_damaged_document() -> None:
    from aegis_flow.local.status import render, summary_of

    raw = json.dumps({"status": {"phase": "Nonsense", "seq": 7}, "events": ["12:00 T5"]})
    text = render(raw.encode())
    assert "damaged" in text and "seq          7" in text and "12:00 T5" in text
    assert "damaged" in render(b"\x00garbage") and "damaged" in summary_of(b"{")


def test_status_names_why_a_job_failed_and_the_last_output() -> None:
    from aegis_flow.local.status import render
    from aegis_flow.master.store import encode_doc

    st = m.evolve(m.initial_status(2, 3), phase=m.Phase.FAILED, recover_count=1,
                  failure="rank 1 failed twice in a row with the same error: KeyError: 'x'")
    text = render(encode_doc(st, tails={"1": ["Traceback ...", "KeyError: 'x'"]}))
    assert "why it failed: rank 1 failed twice" in text
    assert "last output of rank 1:" in text and "  KeyError: 'x'" in text


def test_the_stored_stats_follow_without_a_transition() -> None:
    """code-review: `stats.invalid` in the stored status lagged until the next transition."""
    async def go() -> None:
        store = MemoryStore()
        mm = master(store)
        await to_running(mm)
        await mm.on_message(b"not json at all")
        assert mm.stats["invalid"] == 1
        mm._stats_at = 0.0
        await mm.tick()
        assert store.raw is not None and json.loads(store.raw)["stats"]["invalid"] == 1
    asyncio.run(go())


def test_a_message_counted_while_the_stats_are_saved_is_saved_next() -> None:
    """CI: the stored count stayed at 1,238 of 3,000 for good. The flood went on while a save
    was waiting on the store; the count *after* the save was taken as saved, so nothing told
    the next tick that the stored document was behind."""
    class SlowStore(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.during: list[bytes] = []  # messages that arrive while a save waits

        async def save(self, raw: bytes, revision: int,
                       workers: Mapping[int, bytes] | None = None) -> int:
            while self.during:
                await mm.on_message(self.during.pop())
            await asyncio.sleep(0)
            return await super().save(raw, revision, workers)

    async def go() -> None:
        nonlocal mm
        store = SlowStore()
        mm = master(store)
        await to_running(mm)
        await mm.on_message(b"not json at all")
        store.during.append(b"nor this")
        mm._stats_at = 0.0
        await mm.tick()  # saves invalid 1; invalid 2 is counted meanwhile
        assert json.loads(store.raw or b"{}")["stats"]["invalid"] == 1 and mm.stats["invalid"] == 2
        mm._stats_at = 0.0
        await mm.tick()
        assert json.loads(store.raw or b"{}")["stats"]["invalid"] == 2
    mm: Master
    asyncio.run(go())


def test_silence_is_judged_only_once_the_queued_reports_are_processed() -> None:
    """Scale harness, N=1,024: heartbeats waited in the intake queue behind other reports, the
    ranks looked silent and were forgotten (T7p), their next beat was a new ack: a livelock.
    A rank is judged silent only when no report waits to be processed."""
    class Intake:
        pending_msgs = 40

    async def go() -> None:
        mm = master(MemoryStore())
        await to_running(mm)
        mm._intake = Intake()
        now = time.monotonic()
        mm.last_seen = {0: now - 60, 1: now}
        await mm.tick()
        assert mm.status.phase is m.Phase.RUNCOMMAND  # 40 reports wait: not judged yet
        Intake.pending_msgs = 0
        mm._scan_at = 0.0  # (scans are at most 4 a second)
        await mm.tick()
        assert mm.status.phase is not m.Phase.RUNCOMMAND  # rank 0 is lost
        assert mm.status.workers[0].failures == 1 or mm.status.workers[0].restarting
    asyncio.run(go())


def test_a_master_crash_exits_70_which_the_runner_restarts(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An unforeseen exception in the master is not an outcome of the job: exit 70 (logged
    with its traceback), never 1 ("job failed"); ``aegis-flow run`` starts such a master
    again (the kill -9 of a real master: tests/test_local_e2e.py and the soak)."""
    from aegis_flow.local.runner import MASTER_DONE_CODES
    from aegis_flow.master import __main__ as entry

    async def crash(self: Master) -> int:
        raise RuntimeError("planted")

    monkeypatch.setattr(Master, "run", crash)
    code = entry.main(["--job", "j", "--workers", "1", "--nats-url", "nats://127.0.0.1:1"])
    assert code == entry.CRASHED == 70 and code not in MASTER_DONE_CODES
    assert "the master crashed" in caplog.text and "RuntimeError: planted" in caplog.text


def test_resource_anomalies_are_logged_once_and_decide_nothing() -> None:
    """The runtime runs the anomaly rules over the heartbeats' resource samples in RunCommand:
    a rank whose memory only grows is said once (a warning, a stat), and nothing else changes:
    no order, no count, the phase stays (early evidence, never acted on alone)."""
    from aegis_flow.master.anomaly import Anomalies, RssGrowth

    async def go() -> None:
        mm = master(MemoryStore())
        await to_running(mm)
        mm.anomalies = Anomalies(rss=RssGrowth(window=6.0))
        before, sent = mm.status, len(mm.nc.sent)
        mb = 2**20
        for i in range(12):  # 12 heartbeats, rank 1 growing 100 MiB each, rank 0 flat
            for rank, rss in ((0, 800 * mb), (1, (800 + 100 * i) * mb)):
                await mm.on_message(msg(rank, p.MsgType.ACK, mm.status.seq, resources={
                    "procs": [{"pid": 10 + rank, "cpu": 95.0, "rss": rss}]}))
            mm._watch_resources(mm.status, 1000.0 + i)
        assert mm.stats["anomaly_rss_growth"] == 1
        assert mm.stats["anomaly_gpu_idle"] == 0 and mm.stats["anomaly_net_low"] == 0
        after = mm.status
        assert (after.phase, after.seq, after.recover_count, after.retries) == (
            before.phase, before.seq, before.recover_count, before.retries)
        assert [(w.failures, w.slow, w.hanging) for w in after.workers] == [(0, False, False)] * 2
        assert orders(mm, "troubleshoot") == []
        assert all(json.loads(raw)["type"] == "ACK" or "order" not in json.loads(raw)["data"]
                   for _, raw in mm.nc.sent[sent:])

    asyncio.run(go())
