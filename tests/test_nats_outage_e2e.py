"""End-to-end: the control plane fails, healthy training does not (fault-injection 4a–4d).

Real processes: ``aegis-flow run`` with its embedded nats-server, a master, two supervisors and
train_ddp on gloo. The nats-server is paused (SIGSTOP) or killed (SIGKILL) mid-training, as the
review did; the job must finish with the same parameters as an undisturbed run, nothing counted
and nothing restarted, and leave its final status. The 10 s pause (4b) is a job of the short
soak (``tests/test_soak.py``, kind nats-stop10), judged the same way.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs import TRAIN, Job, assert_nothing_left

ARGS = ["--workers", "2", "--quiet", "--max-retry", "3", "--lost-timeout", "3"]
STEPS, STEP_TIME = 240, 0.05  # ≈ 12 s of training: the faults land while it runs


def train(tmp: Path) -> list[str]:
    return [sys.executable, TRAIN, "--steps", str(STEPS), "--step-time", str(STEP_TIME),
            "--checkpoint-dir", str(tmp / "ck")]


def checksum(job: Job) -> str:
    found = [m.group(1) for line in job.lines
             if (m := re.search(r"params checksum (\S+)", line))]
    assert found, job.output
    return found[-1]


def rank_lines(job: Job, text: str) -> int:
    return sum(line.startswith("[rank ") and text in line for line in job.lines)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The checksum of the same training, undisturbed: both ranks started bare (no aegis-flow,
    no sleep per step; the arithmetic is the same)."""
    from aegis_flow.master.runtime import free_port

    tmp = tmp_path_factory.mktemp("reference")
    port = str(free_port())
    argv = [sys.executable, TRAIN, "--steps", str(STEPS), "--step-time", "0",
            "--checkpoint-dir", str(tmp / "ck")]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={
        **os.environ, "OMP_NUM_THREADS": "1", "RANK": str(r), "LOCAL_RANK": str(r),
        "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        "AEGIS_RESTART_COUNT": "0"}) for r in (0, 1)]
    outs = [p.communicate(timeout=180)[0].decode(errors="replace") for p in procs]
    found = re.findall(r"params checksum (\S+)", outs[0])
    assert found and all(p.returncode == 0 for p in procs), outs
    return found[-1]


@pytest.fixture
def job_in(tmp_path: Path) -> Iterator[list[Job]]:
    jobs: list[Job] = []
    yield jobs
    for job in jobs:
        if job.proc.poll() is None:
            job.proc.send_signal(signal.SIGTERM)
            job.proc.wait(timeout=60)
        print(f"===== output\n{job.output}\n===== rc {job.proc.returncode}")
    assert_nothing_left(str(tmp_path))


def nats_pid(job: Job) -> int:
    pid = job.pids().get("nats")
    assert isinstance(pid, int), job.pids()
    return pid


def pause(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def assert_healthy_end(job: Job, reference: str) -> dict[str, object]:
    rc = job.wait(timeout=240)
    doc = job.status()
    events = "\n".join(doc.get("events", []))
    assert (rc, doc["status"]["phase"], doc["status"]["recover_count"]) == (
        0, "Succeed", 0), events
    assert rank_lines(job, "restart_count") == 2, job.output  # each rank started once
    assert checksum(job) == reference
    return doc


@pytest.mark.e2e
def test_nats_paused_4s_then_killed_costs_nothing(tmp_path: Path, reference: str,
                                                  job_in: list[Job]) -> None:
    """4c: a 4 s pause with a 3 s lost timeout counted a retry and restarted every rank.
    4a/4d: a killed nats-server killed the master, and the runner then killed the training."""
    job = Job(tmp_path, ARGS, train(tmp_path))
    job_in.append(job)
    job.wait_for("[rank 0] step 30", timeout=120)
    pause(nats_pid(job), 4.0)
    job.wait_for("[rank 0] step 100", timeout=120)
    old = nats_pid(job)
    os.kill(old, signal.SIGKILL)
    job.wait_for("nats-server is back", timeout=30)
    assert nats_pid(job) != old
    doc = assert_healthy_end(job, reference)
    events = "\n".join(doc["events"])  # type: ignore[arg-type]
    assert "T6n" in events and "T6b" in events, events
    assert "starting it again" in job.output and "master ended" not in job.output
