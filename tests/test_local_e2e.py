"""End-to-end: real nats-server, real master and supervisor processes, real child processes.

Most cases use a small stand-in command (tests/fixtures/sleeper.py) so they are quick; the
training case runs the real PyTorch DDP example with gloo.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aegis_flow import protocol as p
from tests.jobs import SLEEPER, TRAIN, Job, assert_nothing_left, retries

pytestmark = pytest.mark.e2e

FAST = ["--lost-timeout", "2", "--no-prewarm"]


def sleeper(tmp: Path, seconds: float, code: int = 0) -> list[str]:
    return [sys.executable, SLEEPER, str(seconds), str(code), str(tmp)]


def test_one_crash_recovers_in_place_and_resumes_training(tmp_path: Path) -> None:
    """4 real DDP ranks; rank 1's training process SIGKILLed → every rank restarts in place."""
    ck = tmp_path / "ck"
    job = Job(tmp_path, ["--workers", "4", "--max-retry", "2",
                         "--inject", "crash:rank=1:after=2s"],
              [sys.executable, TRAIN, "--steps", "60", "--step-time", "0.1",
               "--checkpoint-every", "5", "--checkpoint-dir", str(ck)],
              env={"AEGIS_PRELOAD": "torch,torch._dynamo,torch.nn.parallel,torch.distributed"})
    rc = job.wait(timeout=240)
    assert rc == 0, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Succeed"
    assert retries(doc) == (1, 1, 1, 1)
    assert doc["status"]["recover_count"] == 1
    assert "killed by SIGKILL" in job.output
    assert "resumed from step" in job.output
    assert "done: final step 60" in job.output
    assert "restarted 1 times" in job.output
    assert_nothing_left(str(tmp_path))


def test_crashes_beyond_max_retry_fail_the_job(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "1", *FAST,
                         "--inject", "crash:rank=0:after=0.3s:epoch=all"],
              sleeper(tmp_path, 30))
    rc = job.wait(timeout=90)
    assert rc == 1, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Failed"
    assert doc["status"]["recover_count"] == 2
    assert retries(doc) == (2, 1)
    assert_nothing_left(str(tmp_path))


def test_master_killed_mid_run_resumes_from_stored_status(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2", *FAST,
                         "--inject", "crash:rank=1:after=0.5s"],
              sleeper(tmp_path, 5))
    job.wait_for("restart 1", count=2)  # both ranks run their second epoch
    os.kill(job.pids()["master"], signal.SIGKILL)
    rc = job.wait(timeout=90)
    assert rc == 0, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Succeed"
    assert retries(doc) == (1, 1)
    assert doc["status"]["recover_count"] == 1
    assert "resumed from stored status" in job.output
    assert "master ended (signal 9)" in job.output
    assert_nothing_left(str(tmp_path))


def test_worker_without_nats_runs_the_command_plainly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aegis_flow.cli", "worker", "--job", "j", "--rank", "0",
         "--world-size", "1", "--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "2",
         "--", *sleeper(tmp_path, 0.1, 7)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert "FAULT TOLERANCE IS OFF" in proc.stderr
    assert "done" in proc.stdout


def test_run_with_unreachable_nats_falls_back_with_the_command_exit_code(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--nats-url", "nats://127.0.0.1:1", *FAST],
              sleeper(tmp_path, 0.2, 5))
    assert job.wait(timeout=90) == 5, job.output
    assert "FAULT TOLERANCE IS OFF" in job.output
    assert_nothing_left(str(tmp_path))


def test_garbage_and_foreign_messages_are_dropped_and_counted(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", *FAST], sleeper(tmp_path, 4))
    job.wait_for("restart 0", count=2)
    subjects = p.Subjects("default", "job")

    async def spam() -> None:
        import nats

        nc = await nats.connect(job.nats_url(), **job.nats_options())
        foreign = p.Message(job="other", namespace="default", pod_name="x",
                            type=p.MsgType.ERROR, rank=0, seq=2, incarnation="i",
                            data={"cause": "evil"})
        wrong_rank = p.Message(job="job", namespace="default", pod_name="x",
                               type=p.MsgType.ERROR, rank=9, seq=2, incarnation="i")
        for payload in (b"not json", b"[1,2]", b'{"version": 99}', foreign.encode(),
                        wrong_rank.encode(), b"\xff\xfe"):
            await nc.publish(subjects.master(0), payload)  # rank 9 on rank 0's: dropped too
        await nc.flush()
        await nc.close()

    asyncio.run(spam())
    assert job.wait(timeout=60) == 0, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Succeed"
    assert retries(doc) == (0, 0)
    assert doc["stats"]["invalid"] == 5
    assert doc["stats"]["foreign"] == 1


def test_lossy_transport_still_completes_with_exact_counts(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2", "--lost-timeout", "4",
                         "--no-prewarm", "--inject", "crash:rank=1:after=0.5s"],
              sleeper(tmp_path, 2), env={"AEGIS_TEST_DROP": "0.3:7"})
    assert job.wait(timeout=120) == 0, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Succeed"
    assert retries(doc) == (1, 1)
    assert doc["status"]["recover_count"] == 1
    assert "dropping 30% of messages" in job.output


def test_supervisor_killed_is_lost_counted_and_replaced(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2", *FAST],
              sleeper(tmp_path, 4))
    job.wait_for("restart 0", count=2)
    os.kill(int(job.pids()["workers"]["1"]), signal.SIGKILL)
    assert job.wait(timeout=90) == 0, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Succeed"
    assert retries(doc) == (1, 1)
    assert "worker 1 ended (signal 9)" in job.output
    assert "T6" in json.dumps(doc["events"])
    assert_nothing_left(str(tmp_path))


def test_design_walkthrough_end_to_end(tmp_path: Path) -> None:
    """DESIGN.md §2 walkthrough with real processes: 3 workers, max-retry 2."""
    job = Job(tmp_path, ["--workers", "3", "--max-retry", "2", *FAST,
                         # 1. rank 0's training process is killed → T5 (1:0:0)
                         "--inject", "crash:rank=0:after=0.5s:epoch=0",
                         # 2. rank 1's supervisor dies during troubleshooting → T7, T8
                         "--inject", "die:rank=1:order=troubleshoot",
                         # 4. rank 1's command fails → T5 (1:2:1)
                         "--inject", "exit:rank=1:code=3:after=0.5s:epoch=1",
                         # 6. rank 2's command fails → (2:2:3) → T11
                         "--inject", "exit:rank=2:code=4:after=0.5s:epoch=2"],
              sleeper(tmp_path, 30))
    assert job.wait(timeout=120) == 1, job.output
    doc = job.status()
    events = "\n".join(doc["events"])
    assert doc["status"]["phase"] == "Failed"
    assert retries(doc) == (2, 2, 3)
    assert doc["status"]["recover_count"] == 3
    for row in ("T5: rank 0 failed", "T7: rank 1", "T8:", "T9:", "T5: rank 1 failed",
                "T11"):
        assert row in events, events
    assert all(w["phase"] == "Failed" for w in doc["status"]["workers"])
    assert_nothing_left(str(tmp_path))


@pytest.mark.parametrize("fault,code,quarantined", [
    ("hardware", "exit code 70", ["local-node-1"]),
    ("container", "exit code 71", []),
], ids=["node-fault-T10", "container-restart-T10c"])
def test_failed_check_replaces_only_that_worker(tmp_path: Path, fault: str, code: str,
                                                quarantined: list[str]) -> None:
    """T10/T10c for real: the worker exits with the contract code, the runner (playing the
    kubelet) starts it again — on a new node for a node fault — and the job recovers."""
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2", *FAST,
                         "--inject", "crash:rank=0:after=0.5s",
                         "--inject", f"checkfail:rank=1:order=troubleshoot:epoch=1:fault={fault}"],
              sleeper(tmp_path, 2))
    assert job.wait(timeout=90) == 0, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Succeed"
    assert retries(doc) == (1, 1)
    assert doc["status"]["error_nodes"] == quarantined
    assert f"worker 1 ended ({code})" in job.output
    expected_node = "local-node-1-1" if quarantined else "local-node-1"
    assert doc["status"]["workers"][1]["node"] == expected_node
    assert_nothing_left(str(tmp_path))


def test_status_and_stop(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", *FAST], sleeper(tmp_path, 60))
    job.wait_for("restart 0", count=2)
    cli = [sys.executable, "-m", "aegis_flow.cli"]
    table = subprocess.run([*cli, "status", "--state-dir", str(tmp_path)], capture_output=True,
                           text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    assert "RunCommand" in table.stdout and "recoverCount 0" in table.stdout
    as_json = subprocess.run([*cli, "status", "--json", "--state-dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=30)
    assert json.loads(as_json.stdout)["status"]["phase"] == "RunCommand"
    missing = subprocess.run([*cli, "status", "nope", "--state-dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0 and "nope" in missing.stderr
    stop = subprocess.run([*cli, "stop", "job", "--state-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert stop.returncode == 0, stop.stderr
    assert job.wait(timeout=60) == 1
    doc = job.status()
    assert doc["status"]["phase"] == "Failed"
    assert doc["status"]["stop_reason"] == "stopped by an operator"
    assert "job stopped: stopped by an operator" in job.output  # not "job failed"
    again = subprocess.run([*cli, "stop", "job", "--state-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 1
    assert again.stderr.splitlines()[0].startswith(
        "aegis-flow stop: job 'job' is not running; it ended: job Failed: "), again.stderr
    assert_nothing_left(str(tmp_path))


def test_sigterm_leaves_no_process_behind(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", *FAST], sleeper(tmp_path, 60))
    job.wait_for("restart 0", count=2)
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(timeout=60) == 128 + signal.SIGTERM
    assert_nothing_left(str(tmp_path))


def test_bad_inject_spec_is_a_clear_error(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--inject", "crash:rank=5"], sleeper(tmp_path, 1))
    assert job.wait(timeout=30) == 2
    assert "rank 5 does not exist" in job.output
    assert "Traceback" not in job.output
