"""Wire protocol, status codec and store, and the master runtime over in-memory fakes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.master.runtime import Master, MasterConfig
from aegis_flow.master.store import (
    MemoryStore,
    StoreConflict,
    decode_doc,
    encode_doc,
    status_from_dict,
    status_to_dict,
)
from aegis_flow.supervisor.inject import Injection, InjectionError


def msg(**kw: Any) -> p.Message:
    base: dict[str, Any] = dict(job="j", namespace="default", pod_name="j-worker-0",
                                type=p.MsgType.ACK, rank=0, seq=0, incarnation="a")
    base.update(kw)
    return p.Message(**base)


def test_message_round_trip_uses_the_article_field_names() -> None:
    raw = msg(type=p.MsgType.FINISH, seq=3, data={"ok": True}).encode()
    obj = json.loads(raw)
    assert {"AegisName", "AegisNamespace", "podName", "type", "phase", "data", "timeStamp",
            "seq", "incarnation", "version"} <= set(obj)
    back = p.decode(raw, job="j", namespace="default")
    assert back.type is p.MsgType.FINISH and back.seq == 3
    assert p.to_event(back) == m.Finish(0, 3, True, None, "")


@pytest.mark.parametrize("raw,reason", [
    (b"nope", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"version": 2}', "unsupported protocol version"),
    (json.dumps({"version": 1, "type": "Boom"}).encode(), "unknown message type"),
    (json.dumps({"version": 1, "type": "ACK", "AegisName": "j"}).encode(), "missing"),
    (b"x" * (p.MAX_MESSAGE_BYTES + 1), "exceeds"),
], ids=["not-json", "array", "version", "type", "missing-field", "too-big"])
def test_bad_messages_raise_protocol_error(raw: bytes, reason: str) -> None:
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode(raw, job="j", namespace="default")


def test_foreign_job_is_flagged() -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.decode(msg(job="other").encode(), job="j", namespace="default")
    assert err.value.foreign


def test_negative_seq_and_bool_fields_are_rejected() -> None:
    with pytest.raises(p.ProtocolError, match="negative seq"):
        p.decode(msg(seq=-1).encode(), job="j")
    obj = json.loads(msg().encode())
    obj["rank"] = True
    with pytest.raises(p.ProtocolError, match="rank"):
        p.decode(json.dumps(obj).encode())


def test_job_names_are_dns_labels() -> None:
    assert p.check_name("job", "train-1") == "train-1"
    for bad in ("", "Train", "a.b", "-x", "x" * 64, "a>b"):
        with pytest.raises(ValueError, match="invalid job name"):
            p.check_name("job", bad)


def test_status_codec_round_trips_a_deep_status() -> None:
    s = m.initial_status(3, 2, nodes=("n0", "n1", "n2"))
    for r in range(3):
        s, _ = m.step(s, m.Ack(r, "i"))
    s, _ = m.step(s, m.Finish(1, s.seq, False, m.FaultClass.HARDWARE))
    assert s.phase is m.Phase.RESTARTING and s.error_nodes == {"n1"}
    assert status_from_dict(json.loads(json.dumps(status_to_dict(s)))) == s
    back, doc = decode_doc(encode_doc(s, events=["x"]))
    assert back == s and doc["events"] == ["x"]


def test_damaged_status_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="damaged"):
        status_from_dict({"phase": "Nowhere", "workers": []})
    from aegis_flow.master.store import decode_doc

    # review F5: a document without its status object was a KeyError (a traceback in
    # `status` and in a restarted master)
    for raw in (b'{"stats": {}}', b'{"status": 3}', b"[]", b"\xff", b'{"status": {}}'):
        with pytest.raises(ValueError, match="stored status is damaged"):
            decode_doc(raw)


def test_memory_store_compare_and_set() -> None:
    async def go() -> None:
        store = MemoryStore()
        rev = await store.save(b"a", 0)
        with pytest.raises(StoreConflict):
            await store.save(b"b", 0)
        assert await store.save(b"b", rev) == rev + 1
    asyncio.run(go())


@pytest.mark.parametrize("spec,expected", [
    ("crash:rank=1:after=5s", Injection("crash", 1, 5.0)),
    ("exit:rank=0:code=3:after=8", Injection("exit", 0, 8.0, 3)),
    ("crash:rank=2:epoch=all", Injection("crash", 2, 0.0, 1, None)),
    ("die:rank=1:order=troubleshoot:epoch=1", Injection("die", 1, 0.0, 1, 1, "troubleshoot")),
    ("checkfail:rank=0:fault=container", Injection("checkfail", 0, 0.0, 1, None,
                                                   "troubleshoot", "container")),
    # B10: the README's form fires at the first troubleshoot, whatever its epoch
    ("die:rank=1:order=troubleshoot", Injection("die", 1, 0.0, 1, None, "troubleshoot")),
])
def test_inject_specs_parse(spec: str, expected: Injection) -> None:
    assert Injection.parse(spec) == expected


@pytest.mark.parametrize("spec", ["boom:rank=1", "crash", "crash:rank=x", "crash:rank=1:x=2",
                                  "exit:rank=0:code=300", "crash:rank=1:after=-1",
                                  "checkfail:rank=0:fault=cosmic"])
def test_bad_inject_specs_say_what_is_wrong(spec: str) -> None:
    with pytest.raises(InjectionError):
        Injection.parse(spec)


class FakeNats:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, json.loads(data)))


def test_master_runtime_persists_before_it_sends_and_drops_garbage() -> None:
    async def go() -> None:
        store = MemoryStore()
        master = Master(MasterConfig(job="j", workers=2, max_retry=1), store=store)
        master.nc = FakeNats()
        await master._load()
        await master.on_message(b"garbage")
        await master.on_message(msg(rank=7).encode())
        assert master.stats["invalid"] == 2
        for r in range(2):
            await master.on_message(msg(rank=r, incarnation=f"i{r}").encode())
        assert master.status.phase is m.Phase.BOOTCHECKING
        stored, _ = decode_doc(store.raw or b"")
        assert stored.seq == 1  # persisted with the seq of the order that went out
        subject, order = master.nc.sent[-1]
        assert subject.endswith(".broadcast") and order["data"]["order"] == "bootcheck"
    asyncio.run(go())


def test_report_subjects_name_their_rank() -> None:
    s = p.Subjects("default", "j")
    assert s.master(3) == "aegis.default.j.master.3" and s.sender_rank(s.master(3)) == 3
    assert s.masters == "aegis.default.j.master.*"
    for bad in ("aegis.default.j.master", "aegis.default.j.master.x", "aegis.default.j.master.01",
                "aegis.default.j.master.-1", "aegis.default.k.master.0", "aegis.default.j.creds.0"):
        with pytest.raises(p.ProtocolError, match="not a report subject"):
            s.sender_rank(bad)
    p.check_sender(msg(rank=2), 2)
    p.check_sender(msg(rank=2), None)  # the control subject: no rank binding
    with pytest.raises(p.ProtocolError, match="claiming rank 2 on rank 0's subject"):
        p.check_sender(msg(rank=2), 0)
    with pytest.raises(p.ProtocolError, match="only the control subject"):
        p.check_sender(msg(type=p.MsgType.STOP, rank=1), 1)


def test_a_report_claiming_another_rank_is_dropped_counted_and_changes_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        store = MemoryStore()
        master = Master(MasterConfig(job="j", workers=2, max_retry=1), store=store)
        master.nc = FakeNats()
        await master._load()
        s = master.subjects
        for r in range(2):
            await master.on_message(msg(rank=r, incarnation=f"i{r}").encode(), s.master(r))
        assert master.status.phase is m.Phase.BOOTCHECKING
        before = (master.status, store.revision, store.raw, len(master.nc.sent),
                  dict(master.last_seen))
        forged = msg(type=p.MsgType.FINISH, rank=1, seq=master.status.seq, incarnation="i1",
                     data={"ok": True, "detail": "forged by rank 0: rank 1's checks passed"})
        stop = msg(type=p.MsgType.STOP, rank=0, data={"reason": "forged by rank 0"})
        with caplog.at_level("WARNING", logger="aegis_flow.master"):
            await master.on_message(forged.encode(), s.master(0))
            await master.on_message(stop.encode(), s.master(0))
            await master.on_message(forged.encode(), "aegis.default.j.master.one")
        assert master.stats["invalid"] == 3
        assert "Finish claiming rank 1 on rank 0's subject" in caplog.text
        assert (master.status, store.revision, store.raw, len(master.nc.sent),
                dict(master.last_seen)) == before
        # the same report on rank 1's own subject is taken (so the drop above is the binding)
        await master.on_message(forged.encode(), s.master(1))
        assert master.status != before[0] and master.stats["invalid"] == 3
    asyncio.run(go())


def test_the_supervisor_reports_on_its_own_ranks_subject() -> None:
    from aegis_flow.supervisor.agent import Supervisor, WorkerConfig

    sent: list[tuple[str, int]] = []

    class Recorder:
        async def publish(self, subject: str, data: bytes) -> None:
            sent.append((subject, json.loads(data)["rank"]))

        async def flush(self, timeout: float = 1.0) -> None:
            return None

    sup = Supervisor(WorkerConfig(command=("true",), job="j", rank=3, world_size=4))
    sup.nc = Recorder()
    asyncio.run(sup._publish(sup._msg(p.MsgType.ACK, 0, {})))
    assert sent == [("aegis.default.j.master.3", 3)]


def test_master_resumes_from_stored_status() -> None:
    async def go() -> None:
        store = MemoryStore()
        first = Master(MasterConfig(job="j", workers=2), store=store)
        first.nc = FakeNats()
        await first._load()
        for r in range(2):
            await first.on_message(msg(rank=r, incarnation=f"i{r}").encode())
        second = Master(MasterConfig(job="j", workers=2), store=store)
        await second._load()
        assert second.status == first.status
        assert second.revision == store.revision
        with pytest.raises(ValueError, match="3"):
            await Master(MasterConfig(job="j", workers=3), store=store)._load()
    asyncio.run(go())
