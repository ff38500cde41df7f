"""A control-plane outage is not N lost workers (T6n/T6b), through the master's runtime.

The runtime with the real ``step``, an in-memory store and a NATS stub whose PING round trip
can be made to fail; silence is played by shifting the real monotonic clock of each worker's
last heartbeat. The real-process versions (a paused and a killed nats-server) are in
``tests/test_nats_outage_e2e.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aegis_flow.master import machine as m
from aegis_flow.master.runtime import Master
from tests.test_master_stall import FakeNats, beat, running_master


class PausedNats(FakeNats):
    reachable = True

    async def flush(self, timeout: float = 1.0) -> None:
        if not self.reachable:
            raise TimeoutError("nats: flush timeout")


async def _silence(master: Master, ranks: tuple[int, ...], seconds: float) -> None:
    for r in ranks:
        master.last_seen[r] -= seconds
    master._next_loss_check = 0.0
    master._scan_at = 0.0
    await master.tick()


def test_every_worker_silent_at_once_counts_nothing_and_restarts_nothing() -> None:
    async def go() -> None:
        master = await running_master()
        seq = master.status.seq
        await _silence(master, (0, 1), 5.0)
        st = master.status
        assert st.outage and st.phase is m.Phase.RUNCOMMAND and st.seq == seq
        assert st.recover_count == 0 and all(p.retries == 0 for p in st.workers)
        await _silence(master, (0, 1), 5.0)  # still out: ignored, no decision
        assert master.status.outage and master.status.recover_count == 0
        await master.on_message(beat(0, seq))  # a worker is heard: the control plane is back
        assert not master.status.outage
        assert master.status.phase is m.Phase.RUNCOMMAND and master.status.seq == seq
        # rank 1 got a full lost timeout again (Rearm): no loss right away ...
        await master.tick()
        assert master.status.phase is m.Phase.RUNCOMMAND
        # ... but a rank that stays silent after the outage is lost as usual (T6, counted)
        await _silence(master, (1,), 5.0)
        assert master.status.phase is m.Phase.RESTARTING
        assert [p.retries for p in master.status.workers] == [0, 1]

    asyncio.run(go())


def test_a_master_cut_off_from_nats_judges_no_single_silence() -> None:
    async def go() -> None:
        master = await running_master()
        nc = PausedNats()
        master.nc = nc  # type: ignore[assignment]
        nc.reachable = False
        await _silence(master, (1,), 5.0)  # one rank silent, but the master is cut off too
        assert master.status.outage and master.status.recover_count == 0
        nc.reachable = True
        await master.on_message(beat(1, master.status.seq))
        assert not master.status.outage and master.status.phase is m.Phase.RUNCOMMAND

    asyncio.run(go())


def test_a_silence_that_outlasts_the_bound_with_nats_up_is_the_workers() -> None:
    async def go() -> None:
        master = await running_master()
        await _silence(master, (0, 1), 5.0)
        assert master.status.outage
        await _silence(master, (0, 1), master.cfg.outage_limit)  # NATS answers all along
        st = master.status
        assert not st.outage and st.phase is m.Phase.RESTARTING
        assert st.recover_count == 1  # one counted failure; the other rank is replaced

    asyncio.run(go())


def test_one_silent_worker_with_nats_up_is_lost_as_before() -> None:
    async def go() -> None:
        master = await running_master()
        await _silence(master, (1,), 5.0)
        assert not master.status.outage and master.status.phase is m.Phase.RESTARTING

    asyncio.run(go())


def test_a_resumed_job_waits_for_every_worker_and_counts_nothing() -> None:
    """T8r: ``aegis-flow run --resume`` starts every worker again (new processes, new
    incarnations); that is planned, not N failures (it used to cost a counted retry, T6)."""
    s = m.initial_status(2, 3)
    for r in (0, 1):
        s, _ = m.step(s, m.Ack(r, "a"))
    for r in (0, 1):
        s, _ = m.step(s, m.Finish(r, s.seq, True))
    assert s.phase is m.Phase.RUNCOMMAND
    s, effects = m.step(s, m.Resume())
    assert s.phase is m.Phase.RESTARTING and all(p.restarting for p in s.workers)
    assert not any(isinstance(e, m.ExitWorker) for e in effects)
    for r in (0, 1):
        s, _ = m.step(s, m.Ack(r, "b", seq=0))
    assert s.phase is m.Phase.TROUBLESHOOTING and s.recover_count == 0 and s.retries == (0, 0)
    done, effects = m.step(m.evolve(s, phase=m.Phase.SUCCEED), m.Resume())
    assert done.phase is m.Phase.SUCCEED and effects[0].ignored is m.Ignored.LATE  # type: ignore[union-attr]


def test_the_runtime_monitor_reports_a_planted_bug_and_decides_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every live transition is checked against the model checker's invariants: a core that
    takes an outage for lost workers (T6n removed) is caught on the spot — an error line, the
    counter, a fault-log record — and the (wrong) decision itself is left as it is."""
    from aegis_flow.master.faultlog import read_records
    from aegis_flow.master.monitor import kind_of, violations
    from aegis_flow.verify.environment import Kind

    async def go(planted: bool) -> Master:
        if planted:
            monkeypatch.setattr(m, "_outage", lambda status, ev: False)
        master = await running_master()
        from aegis_flow.master.observer import make_observer

        master.observer = make_observer(job="j", namespace="default", workers=2, gpu_type="",
                                        log_dir=str(tmp_path / ("bad" if planted else "ok")))
        await _silence(master, (0, 1), 5.0)
        master.observer.close("end", 0.0)
        return master

    healthy = asyncio.run(go(False))
    assert healthy.status.outage and healthy.stats["invariant_violations"] == 0
    broken = asyncio.run(go(True))
    assert broken.status.phase is m.Phase.RESTARTING  # the wrong decision stands ...
    assert broken.stats["invariant_violations"] >= 1  # ... and is reported
    assert any("INVARIANT OutageCountsNothing" in e for e in broken.events)
    records = list(read_records(tmp_path / "bad"))
    assert any(r.get("cause") == "invariant" for r in records), records
    assert broken.observer is not None and b'aegis_invariant_violations_total{name="Outage' \
        in broken.observer.render()
    # the monitor's labelling of what the world did
    st = healthy.status
    assert kind_of(m.evolve(st, outage=False), m.Lost(0, frozenset({0, 1}))) is Kind.OUTAGE
    assert kind_of(m.evolve(st, outage=False), m.Lost(0)) is Kind.NORMAL
    assert violations(st, m.Resume(), st, []) == []
