"""A full or broken shared filesystem is the job's fault, not N node faults (T3j; review 9a).

The core (``step``), the worker's report of a failed io check (``shared_fault``), and the real
thing: ``aegis-flow run`` with its state dir on a tmpfs too small for the io check.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aegis_flow import protocol as p
from aegis_flow.master import machine as m
from aegis_flow.steps.base import CheckResult, CheckStatus
from aegis_flow.steps.io import filesystem_of
from aegis_flow.supervisor.checks import shared_fault
from tests.jobs import SLEEPER, Job, assert_nothing_left

KEY = "io tmpfs tmpfs /shared ENOSPC"


def bootchecking(workers: int = 2) -> m.Status:
    s = m.initial_status(workers, 3)
    for r in range(workers):
        s, _ = m.step(s, m.Ack(r, "i"))
    assert s.phase is m.Phase.BOOTCHECKING
    return s


def fail_shared(s: m.Status, rank: int, key: str = KEY) -> tuple[m.Status, list[m.Effect]]:
    return m.step(s, m.Finish(rank, s.seq, False, m.FaultClass.HARDWARE, "io: ENOSPC",
                              shared=key))


def replaced(effects: list[m.Effect]) -> list[int]:
    return [e.rank for e in effects if isinstance(e, m.ExitWorker | m.Quarantine)]


def test_every_rank_failing_the_same_storage_check_fails_the_job_quarantining_nothing() -> None:
    s, effects = fail_shared(bootchecking(), 0)
    assert s.phase is m.Phase.BOOTCHECKING and not replaced(effects)  # held
    s, effects = fail_shared(s, 1)
    assert s.phase is m.Phase.FAILED and not replaced(effects)
    assert "nothing was quarantined" in s.failure and KEY in s.failure
    assert s.retries == (0, 0) and s.error_nodes == frozenset()


def test_a_rank_that_passes_makes_the_held_failure_a_node_fault() -> None:
    s, _ = fail_shared(bootchecking(), 0)
    s, effects = m.step(s, m.Finish(1, s.seq, True))
    assert s.phase is m.Phase.RESTARTING and replaced(effects) == [0]
    assert all(not w.shared for w in s.workers)


def test_different_storage_errors_are_node_faults() -> None:
    s, _ = fail_shared(bootchecking(), 0)
    s, effects = fail_shared(s, 1, KEY.replace("ENOSPC", "EIO"))
    assert s.phase is m.Phase.RESTARTING and replaced(effects) == [0]


def test_the_finish_message_carries_the_shared_key() -> None:
    msg = p.Message(job="j", namespace="default", pod_name="j-worker-1", type=p.MsgType.FINISH,
                    rank=1, seq=1, incarnation="i", data={"ok": False, "fault": "hardware",
                                                          "detail": "io", "shared": KEY},
                    timestamp=0.0)
    event = p.to_event(p.decode(msg.encode(), job="j", namespace="default"))
    assert isinstance(event, m.Finish) and event.shared == KEY


def _io(status: CheckStatus, **data: object) -> CheckResult:
    return CheckResult.make("io", status, "io", data=data)


def test_the_worker_names_the_filesystem_and_errno_of_a_failed_io_check() -> None:
    fs = filesystem_of("/")
    assert fs.split()[-1] == "/"
    assert shared_fault([_io(CheckStatus.FAIL, fs=fs, errno="ENOSPC")]) == f"io {fs} ENOSPC"
    assert shared_fault([_io(CheckStatus.PASS)]) == ""
    assert shared_fault([_io(CheckStatus.FAIL, errno="ENOSPC")]) == ""  # no filesystem known
    other = CheckResult.make("gpu", CheckStatus.FAIL, "gpu")
    assert shared_fault([_io(CheckStatus.FAIL, fs=fs, errno="EIO"), other]) == ""


@contextlib.contextmanager
def tmpfs(mnt: Path, size_mib: int) -> Iterator[Path]:
    """A tmpfs of ``size_mib`` MiB mounted at ``mnt`` (skips where it cannot be mounted)."""
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs",
                           str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs with 12 MiB already used: the io check's 8 MiB do not fit."""
    with tmpfs(tmp_path / "small", 16) as mnt:
        (mnt / "filler").write_bytes(b"\0" * (12 << 20))
        yield mnt


@pytest.mark.e2e
def test_a_full_state_disk_fails_the_job_in_one_line_and_quarantines_nothing(
        small_tmpfs: Path, tmp_path: Path) -> None:
    """9a: every io check said ENOSPC and the master quarantined 8 "nodes" on one tmpfs."""
    job = Job(small_tmpfs, ["--workers", "2", "--quiet", "--no-prewarm", "--insecure-nats"],
              [sys.executable, SLEEPER, "5", "0", str(tmp_path)])
    rc = job.wait(timeout=120)
    assert rc == 1, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Failed" and doc["status"]["error_nodes"] == []
    assert "ENOSPC" in doc["status"]["failure"], doc["status"]
    assert "quarantined" not in job.output.replace("nothing was quarantined", "")
    assert "starting it again" not in job.output  # no worker was replaced
    assert_nothing_left(str(tmp_path))


@pytest.fixture
def state_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs for the state dir (the NATS store, the work dir), to fill up."""
    with tmpfs(tmp_path / "state", 64) as mnt:
        yield mnt


@pytest.mark.e2e
def test_a_state_disk_full_mid_training_ends_cleanly(state_tmpfs: Path, tmp_path: Path) -> None:
    """9b: the state disk filled to 100 % mid-training, then a rank killed: the master died on
    a KV timeout, no status.json. Now nats-server's write error holds every decision (nothing
    is decided on unsaved state, nothing killed) until the disk has room and the runner has
    restarted nats-server; then the held reports are decided. Which decision depends on when
    the troubleshoot's io check ran: on the full disk, every rank fails it the same way — the
    job's storage (T3j): Failed in one line naming ENOSPC, nothing quarantined; after room came
    back, it passes and the rank recovers in place. Both are clean ends; anything else fails."""
    from tests.jobs import TRAIN

    job = Job(state_tmpfs, ["--workers", "2", "--quiet", "--max-retry", "3",
                            "--inject", "crash:rank=1:after=6s"],
              [sys.executable, TRAIN, "--steps", "200", "--step-time", "0.05",
               "--checkpoint-dir", str(tmp_path / "ck")])
    try:
        job.wait_for("[rank 0] step 10", timeout=120)
        filler = state_tmpfs / "filler"
        with open(filler, "wb") as fh:  # every byte left
            try:
                while True:
                    fh.write(b"\0" * (1 << 20))
                    fh.flush()
            except OSError:
                pass
        job.wait_for("AEGIS_KILLED rank 1", timeout=60)
        job.wait_for("nats-server cannot write its store", timeout=60)
        time.sleep(3.0)
        if "T5:" in job.output:
            # the troubleshoot order went out before the store failed: its io checks run on
            # the full disk. Room comes back only once both ranks have checked (each rank's
            # second check line), or a rank checked after it and passed while the other had
            # failed: T3j's rule then takes the failure for its node's (docs/recovery.md)
            with contextlib.suppress(AssertionError):  # no check line: the outcome decides
                for rank in (0, 1):
                    job.wait_for(f"[rank {rank} check]", timeout=30, count=2)
        filler.unlink()  # room again: nats-server is restarted, the held reports decided
        rc = job.wait(timeout=180)
    finally:
        if job.proc.poll() is None:
            job.proc.terminate()
            job.proc.wait(timeout=60)
    doc = job.status()
    st = doc["status"]
    assert "the NATS store has room again: restarting nats-server" in job.output
    assert "master ended" not in job.output and "master crashed" not in job.output
    assert st["error_nodes"] == [] and "quarantined" not in job.output.replace(
        "nothing was quarantined", ""), job.output
    if st["phase"] == "Failed":  # the io check ran on the full disk: the job's storage
        assert rc == 1 and "ENOSPC" in st["failure"] and "T3j" in job.output, job.output
    else:  # the io check ran after room came back: recovered in place
        assert (rc, st["phase"], st["recover_count"]) == (0, "Succeed", 1), job.output
    assert_nothing_left(str(tmp_path))


def test_a_storage_failure_is_reported_in_the_io_checks_own_words(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Finish of a shared storage failure carries the io check's detail, not the generic
    diagnosis (which names L3): the job's one-line failure is the storage's error."""
    import asyncio

    from aegis_flow.supervisor import checks

    fs = filesystem_of("/")
    io = CheckResult.make("io", CheckStatus.FAIL, "io: writing x in /w failed: ENOSPC: No "
                          "space left on device", data={"fs": fs, "errno": "ENOSPC"})

    async def fake_run_plan(*_a: object, **_k: object) -> tuple[list[CheckResult], str]:
        return [io], ""

    monkeypatch.setattr(checks, "run_plan", fake_run_plan)
    ok, fault, detail, report = asyncio.run(checks.bootcheck_or_troubleshoot(
        m.Order.BOOTCHECK, {"checks": ["io"]}, rank=0, world_size=1, work_dir="/tmp",
        env={}, starters=[]))
    assert not ok and fault == "hardware" and report["shared"] == f"io {fs} ENOSPC"
    assert detail.startswith("io: writing x") and "L3" not in detail
