"""Observability without processes: the master runtime (real step, in-memory store, fake
NATS) records metrics and fault log lines; the fault log rotates and is followed; the
supervisor's numbers; the HTTP endpoints; the timeline; the CLI's error paths."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aegis_flow import protocol as p
from aegis_flow.local.observe import add_parsers
from aegis_flow.local.progress import progress_line
from aegis_flow.master import machine as m
from aegis_flow.master.endpoints import READINESS_PROBE
from aegis_flow.master.faultlog import (
    FILE_NAME,
    FaultLog,
    FaultLogError,
    follow,
    log_files,
    read_records,
    record,
)
from aegis_flow.master.http import MetricsServer
from aegis_flow.master.runtime import Master, MasterConfig, summary
from aegis_flow.master.store import MemoryStore
from aegis_flow.report import draw_timeline, recovery_window, timeline
from aegis_flow.supervisor.stats import BeatClock, StepRate, gpu_type
from tests.jobs import http_get


class FakeNats:
    is_connected = True

    async def publish(self, subject: str, data: bytes) -> None:
        pass


def msg(mtype: p.MsgType, rank: int, seq: int, data: dict[str, Any] | None = None,
        incarnation: str = "") -> bytes:
    return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}", type=mtype,
                     rank=rank, seq=seq, incarnation=incarnation or f"i{rank}",
                     data=data or {}, timestamp=time.time()).encode()


def beat(rank: int, seq: int, incarnation: str = "", **data: Any) -> bytes:
    base = {"node": f"n{rank}", "pod_ip": f"10.0.0.{rank}", "node_ip": f"192.168.0.{rank}",
            "gpu_type": "A800"}
    return msg(p.MsgType.ACK, rank, seq, {**base, **data}, incarnation)


def checks(*names: str, status: str = "pass") -> dict[str, Any]:
    return {"ok": True, "results": [{"check_type": n, "status": status, "duration": 0.25}
                                    for n in names]}


def value(master: Master, name: str, **labels: str) -> float:
    """A series' value as a scrape of /metrics shows it (0 when absent)."""
    assert master.observer is not None and master.observer.metrics is not None
    for family in text_string_to_metric_families(master.observer.render().decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


async def hardware_fault_job(log_dir: Path) -> Master:
    """2 workers: bootcheck, run, rank 1 OOMs, its troubleshoot finds broken hardware, rank 1
    comes back on a new node, troubleshoot passes, the job runs again and succeeds."""
    master = Master(MasterConfig(job="j", workers=2, max_retry=2, log_dir=str(log_dir)),
                    store=MemoryStore())
    master.nc = FakeNats()
    await master._load()
    assert master.observer is not None
    master.observer.loaded(master.status, resumed=False, now=time.time())
    for r in (0, 1):
        await master.on_message(beat(r, 0, beat_lag=0.02, child_restarts=0))
    assert master.status.phase is m.Phase.BOOTCHECKING
    seq = master.status.seq
    for r in (0, 1):
        await master.on_message(msg(p.MsgType.FINISH, r, seq, checks("env", "io", "gpu")))
    assert master.status.phase is m.Phase.RUNCOMMAND
    seq = master.status.seq
    for r in (0, 1):
        await master.on_message(beat(r, seq, step_rate=12.5, step=40, child_restarts=0))
    error = msg(p.MsgType.ERROR, 1, seq, {"cause": "exit code 137", "cause_code": "oom",
                                          "cause_class": "transient",
                                          "ended_at": time.time() - 0.05})
    await master.on_message(error)
    await master.on_message(error)  # a repeat: ignored by the machine, not recorded twice
    assert master.status.phase is m.Phase.TROUBLESHOOTING
    seq = master.status.seq
    await master.on_message(msg(p.MsgType.FINISH, 0, seq, checks("io", "gpu")))
    bad = checks("io", "gpu")
    bad.update(ok=False, fault="hardware", detail="gpu: 1 device lost")
    bad["results"][1]["status"] = "fail"
    await master.on_message(msg(p.MsgType.FINISH, 1, seq, bad))
    assert master.status.phase is m.Phase.RESTARTING
    await master.on_message(beat(1, 0, incarnation="i1-new", node="n1-new"))
    assert master.status.phase is m.Phase.TROUBLESHOOTING
    seq = master.status.seq
    for r in (0, 1):
        await master.on_message(msg(p.MsgType.FINISH, r, seq, checks("io", "gpu"),
                                    incarnation="i1-new" if r else ""))
    assert master.status.phase is m.Phase.RUNCOMMAND
    seq = master.status.seq
    for r in (0, 1):
        await master.on_message(msg(p.MsgType.FINISH, r, seq, {"ok": True},
                                    incarnation="i1-new" if r else ""))
    assert master.status.phase is m.Phase.SUCCEED
    master.observer.close(summary(master.status), time.time())
    return master


def test_the_runtime_records_checks_faults_recovery_and_jobs(tmp_path: Path) -> None:
    master = asyncio.run(hardware_fault_job(tmp_path))
    job = {"aegis_job": "j", "aegis_namespace": "default"}
    size = {"gpu_type": "A800", "worker_num": "2"}
    # checks: bootcheck (round 0) on both; the troubleshoots (round 1): 2 + 2 io, one gpu failed
    assert value(master, "aegis_check_duration_seconds_count", check_type="env", round="0",
                 outcome="pass", **size) == 2
    assert value(master, "aegis_check_duration_seconds_count", check_type="io", round="1",
                 outcome="pass", **size) == 4
    assert value(master, "aegis_check_duration_seconds_count", check_type="gpu", round="1",
                 outcome="fail", **size) == 1
    assert value(master, "aegis_check_duration_seconds_sum", check_type="env", round="0",
                 outcome="pass", **size) == pytest.approx(0.5)
    assert value(master, "aegis_check_round_seconds_count", kind="troubleshoot",
                 outcome="fail", **size) == 1
    assert value(master, "aegis_check_round_seconds_count", kind="troubleshoot",
                 outcome="pass", **size) == 1
    # the fault: detected once (50 ms after the process ended), recovered at L3 (new node)
    assert value(master, "aegis_time_to_detect_seconds_count", kind="error", **size) == 1
    assert 0.04 < value(master, "aegis_time_to_detect_seconds_sum", kind="error", **size) < 5
    assert value(master, "aegis_reports_total", type="Error") == 1
    assert value(master, "aegis_restarts_total", cause="oom", level="L3") == 1
    assert value(master, "aegis_time_to_recover_seconds_count", level="L3", **size) == 1
    assert value(master, "aegis_worker_replacements_total", level="L3") == 1
    assert value(master, "aegis_jobs_created_total", **size) == 1
    assert value(master, "aegis_jobs_succeeded_total", **size) == 1
    assert value(master, "aegis_jobs_failed_total", **size) == 0
    assert value(master, "aegis_job_phase", phase="Succeed", **job) == 1
    assert value(master, "aegis_job_phase", phase="RunCommand", **job) == 0
    assert value(master, "aegis_job_recover_count", **job) == 1
    assert value(master, "aegis_job_quarantined_nodes", **job) == 1
    assert value(master, "aegis_worker_retries", rank="1", **job) == 1
    assert value(master, "aegis_worker_step_rate", rank="0", **job) == 12.5
    assert value(master, "aegis_worker_heartbeat_lag_seconds", rank="0", **job) == 0.02

    recs = read_records(tmp_path)
    quarantine = [r for r in recs if r["kind"] == "quarantine"]
    assert [(r["rank"], r["NodeName"], r["level"]) for r in quarantine] == [(1, "n1", "L3")]
    failed = [r for r in recs if r["kind"] == "report" and r["cause"] == "hardware"]
    assert [(r["rank"], r["level"], r["Phase"]) for r in failed] == [(1, "L3", "Troubleshooting")]
    errors = [r for r in recs if r["kind"] == "report" and r["cause"] == "oom"]
    assert len(errors) == 1 and errors[0]["PodIP"] == "10.0.0.1"
    assert errors[0]["NodeIP"] == "192.168.0.1"
    back = [r for r in recs if r["kind"] == "connected" and r["cause"] == "new_incarnation"]
    assert [(r["rank"], r["NodeName"]) for r in back] == [(1, "n1-new")]
    assert [(r["cause"], r["level"]) for r in recs if r["kind"] == "recovered"] == [
        ("oom", "L3")]
    job_phases = [r["Phase"] for r in recs if r["kind"] == "phase_start" and r["rank"] is None]
    assert job_phases == ["Pending", "BootChecking", "RunCommand", "Troubleshooting",
                          "Restarting", "Troubleshooting", "RunCommand", "Succeed"]
    assert recs[-1]["kind"] == "summary"
    assert recs[-1]["Message"].endswith("restarted 1 times; hardware faults rescheduled 1 times")
    assert (tmp_path / "metrics.prom").read_text().count("aegis_jobs_succeeded_total") >= 1


def test_the_recorded_timeline_draws(tmp_path: Path) -> None:
    asyncio.run(hardware_fault_job(tmp_path / "logs"))
    recs = read_records(tmp_path / "logs")
    tl = timeline(recs)
    assert tl.rows == ("job", "rank 0", "rank 1")
    assert {b.phase for b in tl.bars if b.row == "rank 1"} >= {"RunCommand", "Restarting"}
    assert all(b.end >= b.start for b in tl.bars)
    assert {mk.kind for mk in tl.marks} == {"fault", "quarantine", "replaced", "recovered"}
    out = draw_timeline(recs, tmp_path / "t.png")
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    # the recovery gets a panel of its own: from before the first fault to after it healed
    lo, hi = recovery_window(tl)  # type: ignore[misc]
    first_fault = min(mk.at for mk in tl.marks if mk.kind == "fault")
    healed = min(mk.at for mk in tl.marks if mk.kind == "recovered" and mk.at >= first_fault)
    # (the fault log keeps milliseconds: in this fast in-process job the fault and the
    # recovery can share one, as a clean-clone CI run showed)
    assert lo <= first_fault <= healed <= hi <= tl.end and lo < hi
    assert lo < first_fault or lo == 0.0  # padded before the fault, unless the log began there
    import matplotlib.image

    rows, _, _ = matplotlib.image.imread(str(out)).shape
    quiet = timeline([r for r in recs if r.get("kind") not in ("recovered",)])
    assert recovery_window(quiet) is None  # no recovery: one panel, shorter
    shorter = draw_timeline([r for r in recs if r.get("kind") != "recovered"],
                            tmp_path / "quiet.png")
    assert matplotlib.image.imread(str(shorter)).shape[0] < rows
    with pytest.raises(ValueError, match="no fault log records"):
        timeline([])


def test_without_observer_the_master_runs_the_same(tmp_path: Path) -> None:
    async def go() -> tuple[m.Status, m.Status]:
        plain = Master(MasterConfig(job="j", workers=2, observe=False), store=MemoryStore())
        seen = Master(MasterConfig(job="j", workers=2, log_dir=str(tmp_path)),
                      store=MemoryStore())
        for master in (plain, seen):
            master.nc = FakeNats()
            await master._load()
            for r in (0, 1):
                await master.on_message(beat(r, 0))
        assert plain.observer is None
        return plain.status, seen.status
    a, b = asyncio.run(go())
    assert a.phase is b.phase is m.Phase.BOOTCHECKING and a.seq == b.seq


def test_the_fault_log_rotates_and_reads_back_in_order(tmp_path: Path) -> None:
    log = FaultLog(tmp_path, max_bytes=600, backups=3)
    for i in range(20):
        log.write(record("report", now=1_000_000 + i, phase="RunCommand", message=f"m{i}",
                         rank=i % 2))
    log.close()
    files = log_files(tmp_path)
    assert [f.name for f in files] == [f"{FILE_NAME}.3", f"{FILE_NAME}.2", f"{FILE_NAME}.1",
                                       FILE_NAME]
    assert all(f.stat().st_size <= 600 + 250 for f in files)
    messages = [r["Message"] for r in read_records(tmp_path)]
    assert messages == sorted(messages, key=lambda s: int(s[1:]))  # oldest first, no gaps
    assert messages[-1] == "m19" and len(messages) < 20  # the oldest file was dropped


def test_a_damaged_fault_log_line_is_named(tmp_path: Path) -> None:
    log = FaultLog(tmp_path)
    log.write(record("report", now=1.0, phase="Pending", message="ok"))
    log.close()
    with open(tmp_path / FILE_NAME, "a") as fh:
        fh.write('{"half": \n')
    with pytest.raises(FaultLogError, match=rf"{FILE_NAME}:2: not JSON"):
        read_records(tmp_path)


def test_follow_sees_new_lines_across_a_rotation_and_stops_at_the_summary(
        tmp_path: Path) -> None:
    log = FaultLog(tmp_path, max_bytes=700, backups=10)
    log.write(record("phase_start", now=1.0, phase="Pending", message="first"))
    got: list[str] = []

    def reader() -> None:
        for rec in follow(tmp_path, poll=0.02):
            got.append(rec["Message"])

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    for i in range(12):  # several rotations while the reader follows
        log.write(record("report", now=2.0 + i, phase="RunCommand", message=f"r{i}"))
        time.sleep(0.03)
    log.write(record("summary", now=20.0, phase="Succeed", message="done"))
    t.join(timeout=20)
    log.close()
    assert not t.is_alive()
    assert got == ["first", *[f"r{i}" for i in range(12)], "done"]


def test_step_rate_beat_lag_and_gpu_type(tmp_path: Path) -> None:
    rate = StepRate(window=10)
    assert rate.rate(0.0) is None
    for t, step in [(0.0, 10), (0.0, 12), (1.0, 30), (2.0, 50)]:
        rate.observe(t, step)
    assert rate.rate(2.0) == pytest.approx(19.0)  # (50 - 12) / 2: one sample per moment
    assert rate.last == 50
    assert rate.rate(20.0) == 0.0  # nothing for a whole window
    rate.observe(21.0, 3)  # a restarted run counts from its checkpoint
    assert rate.rate(21.0) is None and rate.last == 3
    clock = BeatClock(0.5)
    clock.beat(10.0)
    clock.beat(10.7)
    assert clock.lag == pytest.approx(0.2)
    gpus = tmp_path / "gpus"
    (gpus / "0000:01:00.0").mkdir(parents=True)
    (gpus / "0000:01:00.0" / "information").write_text(
        "Model: \t\t NVIDIA A800-SXM4-80GB\nIRQ: 42\n")
    assert gpu_type({}, str(gpus)) == "NVIDIA A800-SXM4-80GB"
    assert gpu_type({"AEGIS_GPU_TYPE": "H200"}, str(gpus)) == "H200"
    assert gpu_type({}, str(tmp_path / "none")) == "cpu"


def test_progress_line() -> None:
    snap = {"phase": "RunCommand", "recover_count": 1, "max_retry": 3,
            "workers": [{"rank": 0, "phase": "RunCommand", "step_rate": 19.84},
                        {"rank": 1, "phase": "RunCommand", "step_rate": None}]}
    assert progress_line(snap, 42.4) == "RunCommand · restarts 1/3 · steps/s r0 19.8 r1 - · 42 s"
    snap["workers"][1]["phase"] = "Restarting"
    assert "workers r0:RunCommand,r1:Restarting" in progress_line(snap, 1)
    failed = {"phase": "Failed", "recover_count": 4, "max_retry": 3, "workers": []}
    assert progress_line(failed, 5) == "Failed · restarts 3/3 · 5 s"  # not 4/3 (T11)
    # what a phase waits for, grouped by what the ranks say (the longest wait shown)
    from aegis_flow.supervisor.agent import PREWARMING

    boot = {"phase": "BootChecking", "recover_count": 0, "max_retry": 3,
            "workers": [{"rank": 0, "phase": "BootChecking", "doing": PREWARMING,
                         "doing_for": 6.2},
                        {"rank": 1, "phase": "BootChecking", "doing": PREWARMING,
                         "doing_for": 7.6},
                        {"rank": 2, "phase": "BootChecking",
                         "doing": "checks done; waiting for the other ranks", "doing_for": 0.4}]}
    assert progress_line(boot, 9) == (
        "BootChecking · restarts 0/3 · r0,r1 importing torch into the pre-warmed interpreter, "
        "once for all restarts (8 s) · r2 checks done; waiting for the other ranks · 9 s")


def test_http_endpoints_and_readiness() -> None:
    ready = threading.Event()
    server = MetricsServer(render=lambda: b"aegis_x 1\n", ready=ready.is_set,
                           progress=lambda: {"phase": "Pending"}, addr="127.0.0.1").start()
    try:
        base = server.url
        assert http_get(base + "/healthz") == (200, b"ok\n")
        assert http_get(base + READINESS_PROBE.path)[0] == 503
        ready.set()
        assert http_get(base + READINESS_PROBE.path)[0] == 200
        assert http_get(base + "/metrics") == (200, b"aegis_x 1\n")
        assert json.loads(http_get(base + "/progress")[1]) == {"phase": "Pending"}
        assert http_get(base + "/other")[0] == 404
        with pytest.raises(OSError, match="pick another --metrics-port"):
            MetricsServer(render=bytes, ready=ready.is_set, progress=dict,
                          addr="127.0.0.1", port=server.port)
    finally:
        server.stop()


def parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    add_parsers(ap.add_subparsers(dest="command"))
    return ap.parse_args(list(argv))


def test_logs_and_report_say_what_is_missing(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    a = parse("logs", "nojob", "--state-dir", str(tmp_path))
    assert a.handler(a) == 2
    assert "no fault log for job 'nojob'" in capsys.readouterr().err
    a = parse("report", "nojob", "--state-dir", str(tmp_path), "-o", str(tmp_path / "x.png"))
    assert a.handler(a) == 2
    assert "no fault log records" in capsys.readouterr().err
    logs = tmp_path / "nojob" / "logs"
    logs.mkdir(parents=True)
    (logs / FILE_NAME).write_text("[]\n")
    a = parse("logs", "nojob", "--state-dir", str(tmp_path))
    assert a.handler(a) == 1
    assert "damaged fault log" in capsys.readouterr().err


def test_a_taken_metrics_port_does_not_stop_the_master(caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        master = Master(MasterConfig(job="j", workers=1, metrics_port=port,
                                     metrics_addr="127.0.0.1"), store=MemoryStore())
        assert master._serve_http() is None
    assert "no metrics endpoint" in caplog.text and "pick another --metrics-port" in caplog.text
    free = Master(MasterConfig(job="j", workers=1, metrics_port=0, metrics_addr="127.0.0.1"),
                  store=MemoryStore())
    server = free._serve_http()
    try:
        assert http_get(server.url + "/readyz")[0] == 503  # not connected, status not loaded
    finally:
        server.stop()


def test_early_evidence_is_drawn_but_starts_no_recovery_window(tmp_path: Path) -> None:
    """An anomaly finding or a hang mark's frame is drawn (a diamond on its rank's row) and is
    not a fault: a job with only evidence has no recovery window."""
    from aegis_flow.master.faultlog import record

    recs = [record("phase_start", now=100.0, phase="RunCommand", message="RunCommand"),
            record("phase_start", now=100.0, phase="RunCommand", message="RunCommand", rank=0),
            record("report", now=130.0, phase="RunCommand", message="early evidence",
                   cause="anomaly_rss_growth", rank=0),
            record("report", now=131.0, phase="RunCommand", message="marked hung",
                   cause="hang_mark", rank=0),
            record("summary", now=140.0, phase="Succeed", message="job Succeed")]
    tl = timeline(recs)
    assert [(mk.kind, mk.text) for mk in tl.marks] == [
        ("evidence", "anomaly_rss_growth"), ("evidence", "hang_mark")]
    assert recovery_window(tl) is None
    out = draw_timeline(recs, tmp_path / "evidence.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
