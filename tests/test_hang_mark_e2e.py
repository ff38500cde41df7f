"""The hang mark (the article's SetIsHanging) and ``aegis-flow hang JOB RANK``, for real.

A real ``aegis-flow run`` of a silent DDP training (``tests/fixtures/quiet_ddp.py``, gloo on
CPU). An operator marks rank 1 hung by hand: the master records the mark (T13) and tells every
worker; each keeps its process, says so, and names the frame its process is in (py-spy); the
frames reach the fault log. Nothing is restarted or counted. ``--quit`` escalates (T14): the
rank is charged and every rank restarts. Wrong ranks, wrong phases and ended jobs get a clear
one-line error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.jobs import Job, assert_nothing_left, retries

pytestmark = pytest.mark.e2e

FIXTURE = str(Path(__file__).resolve().parent / "fixtures" / "quiet_ddp.py")
WARM = {"AEGIS_PRELOAD": "torch"}


def hang(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aegis_flow.cli", "hang", "job", *args,
                           "--state-dir", str(state_dir)], capture_output=True, text=True,
                          timeout=60, check=False)


def cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aegis_flow.cli", *args, "--state-dir",
                           str(state_dir)], capture_output=True, text=True, timeout=60,
                          check=False)


def wait_running(job: Job, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = cli(job.state_dir, "status", "job", "--json")
        if done.returncode == 0 and done.stdout.startswith("{") and json.loads(
                done.stdout)["status"]["phase"] == "RunCommand":
            return
        time.sleep(0.5)
    raise AssertionError(f"never ran:\n{job.output}")


def test_an_operator_marks_a_rank_hung_every_worker_names_its_frame_and_nothing_is_killed(
        tmp_path: Path) -> None:
    """Rank 0 stops for good at step 20 (its peer then waits in a collective); the watchdog's
    thresholds are far away, as a long quit threshold would be. The operator marks rank 0 by
    hand: every worker names its frame, nothing is killed; then ``--quit`` charges rank 0 and
    every rank restarts."""
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "1", "--hang-after", "300",
                         "--hang-quit-after", "600"],
              ["python", FIXTURE, "600", "--hang-at", "20"],
              env={**WARM, "QUIET_DDP_SAY_STUCK": "1"})
    wait_running(job)
    wrong = hang(tmp_path, "7")
    assert wrong.returncode == 1 and "there is no rank 7" in wrong.stderr, wrong.stderr
    job.wait_for("[rank 0] stuck at step 20")
    time.sleep(2)  # rank 1 has gone one collective on and waits in it for rank 0
    marked = hang(tmp_path, "0", "--reason", "no step on the dashboard")
    assert marked.returncode == 0 and "marked rank 0" in marked.stdout, marked.stderr
    job.wait_for("an operator marks rank 0 hung (no step on the dashboard)")
    job.wait_for("T13: rank 0 looks hung; process kept")
    # every worker was told, kept its process and named its frame (py-spy)
    job.wait_for("the job is marked hung (rank 0): every process is kept", count=2)
    frames: dict[int, str] = {}
    deadline = time.monotonic() + 20
    while set(frames) != {0, 1} and time.monotonic() < deadline:
        time.sleep(0.5)
        records = [json.loads(line) for line in
                   (tmp_path / "job" / "logs" / "faults.jsonl").read_text().splitlines()]
        frames = {r["rank"]: r["Message"] for r in records if r.get("cause") == "hang_mark"}
    assert set(frames) == {0, 1}, frames
    assert "quiet_ddp.py" in frames[0], frames  # the stuck rank: in the script's own loop
    assert "quiet_ddp.py" not in frames[1] and "a frame py-spy could not read" not in frames[1]
    doc = json.loads(cli(tmp_path, "status", "job", "--json").stdout)
    assert doc["status"]["recover_count"] == 0 and [w["hanging"] for w in
                                                    doc["status"]["workers"]] == [True, False]
    # escalate by hand: rank 0 is charged, every rank restarts (the next run hangs rank 1)
    quit_ = hang(tmp_path, "0", "--quit")
    assert quit_.returncode == 0, quit_.stderr
    job.wait_for("T14: rank 0 failed (hang)")
    # the next run trained again on every rank up to step 20, where it stops rank 1 this time
    # (restart 1 % 2): the progress line's "RunCommand" is no proof of a restart
    job.wait_for("[rank 1] stuck at step 20", timeout=120)
    assert cli(tmp_path, "stop", "job").returncode == 0
    job.wait(120)
    doc = job.status()
    # rank 0 is the one charged (after the restart T9 brings every rank's retries to
    # recoverCount: the charge is in each rank's failures)
    assert [w["failures"] for w in doc["status"]["workers"]] == [1, 0], job.output
    assert retries(doc) == (1, 1) and doc["status"]["recover_count"] == 1, job.output
    ended = hang(tmp_path, "0")
    assert ended.returncode == 1 and "is not running; it ended" in ended.stderr, ended.stderr
    assert_nothing_left(str(tmp_path))


def test_the_cli_checks_rank_and_phase_against_the_stored_status_and_sends_only_then(
        tmp_path: Path) -> None:
    """A real nats-server holding a stored status: a phase other than RunCommand and a rank
    the job does not have are refused with one line and publish nothing; in RunCommand the
    operator's Hang goes out on the control subject (the only one an operator may use)."""
    from aegis_flow import protocol as p
    from aegis_flow.local.natsserver import EmbeddedNats
    from aegis_flow.master import machine as m
    from aegis_flow.master.store import KVStore, encode_doc

    subjects = p.Subjects("default", "job")
    got: list[bytes] = []

    async def store(phase: m.Phase) -> None:
        import nats

        nc = await nats.connect(server.url)
        kv = await KVStore.open(nc, subjects.kv_bucket)
        _, revision = await kv.load()
        status = m.evolve(m.initial_status(2, 1), phase=phase, seq=4)
        await kv.save(encode_doc(status), revision)
        await nc.close()

    def listen_and_run(*args: str) -> subprocess.CompletedProcess[str]:
        import asyncio
        import threading

        import nats

        ready = threading.Event()

        async def listen() -> None:
            nc = await nats.connect(server.url)
            await nc.subscribe(subjects.control, cb=_append)
            await nc.flush()
            ready.set()
            await asyncio.sleep(3)
            await nc.close()

        async def _append(msg: Any) -> None:
            got.append(msg.data)

        t = threading.Thread(target=lambda: asyncio.run(listen()))
        t.start()
        ready.wait(10)
        done = subprocess.run([sys.executable, "-m", "aegis_flow.cli", "hang", "job", *args,
                               "--nats-url", server.url], capture_output=True, text=True,
                              timeout=60, check=False)
        t.join()
        return done

    import asyncio

    with EmbeddedNats(tmp_path / "nats") as server:
        none = listen_and_run("0")
        assert none.returncode == 1 and "no job default/job on" in none.stderr, none.stderr
        asyncio.run(store(m.Phase.BOOTCHECKING))
        early = listen_and_run("0")
        assert early.returncode == 1, early.stderr
        assert early.stderr.strip() == ("aegis-flow hang: job 'job' is in BootChecking: a hang "
                                        "mark means something only while the command runs "
                                        "(RunCommand)")
        asyncio.run(store(m.Phase.RUNCOMMAND))
        wrong = listen_and_run("2")
        assert wrong.returncode == 1 and "ranks 0..1; there is no rank 2" in wrong.stderr
        assert got == []  # nothing was sent for any refusal
        ok = listen_and_run("1", "--quit", "--reason", "by hand")
        assert ok.returncode == 0, ok.stderr
        assert len(got) == 1
        msg = p.decode(got[0], job="job", namespace="default")
        assert (msg.type, msg.rank, msg.data["reason"]) == (p.MsgType.HANG_WITH_QUIT, 1,
                                                            "by hand")
    bad = subprocess.run([sys.executable, "-m", "aegis_flow.cli", "hang", "job", "-1"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "usage:" in bad.stderr
