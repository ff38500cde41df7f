"""End-to-end: a rerun is a new job, resuming is explicit, one run of a job at a time, and every
ending (SIGTERM included) leaves status.json, the fault log's last records and the summary.

Real processes (``aegis-flow run`` with nats-server, a master and supervisors); the command is the
stand-in tests/fixtures/sleeper.py, tagged with the test's tmp dir so that leftovers are found.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.jobs import SLEEPER, Job, assert_nothing_left

FAST = ["--workers", "2", "--quiet", "--lost-timeout", "2", "--no-prewarm"]
CLI = [sys.executable, "-m", "aegis_flow.cli"]


def sleeper(tmp: Path, seconds: float) -> list[str]:
    return [sys.executable, SLEEPER, str(seconds), "0", str(tmp)]


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--state-dir", str(tmp)], capture_output=True,
                          text=True, timeout=60, cwd=str(tmp))


def archives(tmp: Path) -> list[Path]:
    runs = tmp / "job" / "runs"
    return sorted(runs.iterdir()) if runs.is_dir() else []


def faults(log_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / "faults.jsonl").read_text().splitlines()]


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def refused(job: Job) -> str:
    """The run refused at once: exit 2, one line, nothing started."""
    assert job.wait(timeout=60) == 2, job.output
    lines = [line for line in job.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in job.output, job.output
    return lines[0]


@pytest.mark.e2e
def test_rerun_after_success_trains_again_and_archives_the_first_run(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "run.lock").write_text(f"{dead_pid()}\n")  # a stale lock: taken over
    first = Job(tmp_path, [*FAST, "--inject", "crash:rank=1:after=0.3s"], sleeper(tmp_path, 1))
    assert first.wait(timeout=90) == 0, first.output
    doc1 = first.status()
    assert (doc1["status"]["phase"], doc1["status"]["recover_count"]) == ("Succeed", 1)

    second = Job(tmp_path, FAST, sleeper(tmp_path, 0.2))  # same job, same state dir
    assert second.wait(timeout=90) == 0, second.output
    assert "resumed from stored status" not in second.output
    assert second.output.count("] done") == 2, second.output  # the command ran again, 2 ranks
    assert "archived to" in second.output and "starting a new run" in second.output
    doc2 = second.status()
    assert doc2["status"]["phase"] == "Succeed"
    assert doc2["status"]["recover_count"] == 0  # fresh counts, not the first run's
    assert doc2["status"]["seq"] < doc1["status"]["seq"]
    assert [w["retries"] for w in doc2["status"]["workers"]] == [0, 0]

    [archived] = archives(tmp_path)
    assert json.loads((archived / "status.json").read_text()) == doc1
    assert (archived / "nats").is_dir()  # the old store went with it: nothing to resume
    assert [r["kind"] for r in faults(archived / "logs")][-1] == "summary"
    assert [r["Message"] for r in faults(tmp_path / "job" / "logs")][0] == "job started in Pending"

    table = cli(tmp_path, "status")
    assert table.returncode == 0, table.stderr
    assert "Succeed" in table.stdout and "recoverCount 0" in table.stdout
    assert "the job has ended" in table.stdout
    nothing = cli(tmp_path, "status", "nope")
    assert nothing.returncode == 1
    assert nothing.stderr.strip() == f"aegis-flow status: no job 'nope' in {tmp_path}"
    assert_nothing_left(str(tmp_path))


@pytest.mark.e2e
def test_sigterm_record_then_refuse_resume_and_fresh(tmp_path: Path) -> None:
    job = Job(tmp_path, FAST, sleeper(tmp_path, 60))
    job.wait_for("restart 0", count=2)  # both ranks run their command

    # a second run of the same job at once is refused with the first one's pid
    twin = Job(tmp_path, FAST, sleeper(tmp_path, 0.1))
    line = refused(twin)
    assert f"already running: aegis-flow run pid {job.proc.pid}" in line, line

    # SIGTERM: every process stops, then status.json, the fault log's end, the summary
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(timeout=60) == 128 + signal.SIGTERM, job.output
    assert_nothing_left(str(tmp_path))
    doc = job.status()
    assert doc["status"]["phase"] == "RunCommand"  # as stored: the job did not end
    assert doc["stopped_by"] == "SIGTERM to aegis-flow run"
    summary = ("job RunCommand: max restarts 3, restarted 0 times; hardware faults "
               "rescheduled 0 times; stopped by SIGTERM to aegis-flow run")
    assert job.output.splitlines()[-1] == f"[aegis-flow] {summary}", job.output
    last = faults(tmp_path / "job" / "logs")[-2:]
    assert [(r["kind"], r["Phase"]) for r in last] == [("phase_end", "RunCommand"),
                                                        ("summary", "RunCommand")]
    # written by the master (it obeys the runner's SIGTERM) in its own words, or by the runner
    assert last[-1]["Message"] in (summary, summary.replace(" to aegis-flow run", ""))
    table = cli(tmp_path, "status")
    assert table.returncode == 0, table.stderr
    assert "RunCommand" in table.stdout and "stopped by   SIGTERM" in table.stdout
    assert "Traceback" not in table.stdout + table.stderr

    # a plain rerun over the interrupted job names both choices and changes nothing
    line = refused(Job(tmp_path, FAST, sleeper(tmp_path, 0.1)))
    assert "was interrupted in RunCommand" in line and "--resume" in line and "--fresh" in line
    assert job.status() == doc and archives(tmp_path) == []

    # --resume continues it from the stored status
    resumed = Job(tmp_path, [*FAST, "--resume"], sleeper(tmp_path, 0.2))
    assert resumed.wait(timeout=90) == 0, resumed.output
    assert "resumed from stored status: RunCommand" in resumed.output
    after = resumed.status()
    assert after["status"]["phase"] == "Succeed" and "stopped_by" not in after
    assert after["status"]["seq"] > doc["status"]["seq"]
    # every worker was started again by the resume: planned, not a failure (T8r)
    assert after["status"]["recover_count"] == doc["status"]["recover_count"]
    assert any("T8r" in e for e in after["events"]), after["events"]
    assert archives(tmp_path) == []

    # killed outright (no record at all): the stored status still says "interrupted"
    killed = Job(tmp_path, FAST, sleeper(tmp_path, 60))  # the resumed run ended: a new one
    killed.wait_for("restart 0", count=2)
    assert len(archives(tmp_path)) == 1
    os.kill(killed.proc.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert_nothing_left(str(tmp_path))
    assert not (tmp_path / "job" / "status.json").exists()
    gone = cli(tmp_path, "status")
    assert gone.returncode == 1 and "left no final status" in gone.stderr, gone
    assert "Traceback" not in gone.stderr
    line = refused(Job(tmp_path, FAST, sleeper(tmp_path, 0.1)))
    assert "was interrupted in RunCommand" in line and "--fresh" in line, line

    # --fresh archives it and starts over
    fresh = Job(tmp_path, [*FAST, "--fresh"], sleeper(tmp_path, 0.2))
    assert fresh.wait(timeout=90) == 0, fresh.output
    assert "resumed from stored status" not in fresh.output
    assert fresh.output.count("] done") == 2, fresh.output
    assert fresh.status()["status"]["recover_count"] == 0
    newest = archives(tmp_path)
    assert len(newest) == 2
    killed_doc = [json.loads((a / "status.json").read_text()) for a in newest]
    assert {d["status"]["phase"] for d in killed_doc} == {"Succeed", "RunCommand"}
    assert_nothing_left(str(tmp_path))


def test_run_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path: Path) -> None:
    from aegis_flow.local.runs import RunLock, running_pid

    path = tmp_path / "run.lock"
    path.write_text(f"{dead_pid()}\n")
    assert running_pid(tmp_path) is None
    path.write_text(f"{os.getppid()}\n")  # alive, but holds no lock: not a run
    assert running_pid(tmp_path) is None
    first = RunLock(path)
    assert first.acquire() is None  # the stale pid is taken over
    assert running_pid(tmp_path) == os.getpid()
    assert RunLock(path).acquire(wait=0.1) == os.getpid()  # refused, naming the holder
    first.release()
    assert running_pid(tmp_path) is None
    again = RunLock(path)
    assert again.acquire() is None
    again.release()
