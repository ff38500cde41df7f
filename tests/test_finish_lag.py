"""A rank that keeps running long after the others finished cannot hold the job forever.

Real processes (``aegis-flow run``, a nats-server, a master, two supervisors): rank 1's
command never ends in its first run (it keeps printing, so no hang detector fires), rank 0
finishes at once. After ``--finish-lag`` the master treats rank 1 as hung (T14): the job is
troubleshot and restarted, the second run ends on both ranks, and the job succeeds with one
restart charged to rank 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import Job, assert_nothing_left

pytestmark = pytest.mark.e2e

SCRIPT = """\
import os, sys, time
rank, run = int(os.environ["RANK"]), int(os.environ["AEGIS_RESTART_COUNT"])
print(f"rank {rank} run {run}", flush=True)
while rank == 1 and run == 0:  # stuck, but not silent: only the finish lag can tell
    time.sleep(0.5)
    print("still here", flush=True)
"""


def test_a_rank_still_running_after_the_others_finished_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "lag.py").write_text(SCRIPT)
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "1", "--finish-lag", "4"],
              ["python", str(tmp_path / "lag.py")])
    assert job.wait(180) == 0, job.output
    lines = job.output.splitlines()
    lag = next(line for line in lines if "after rank(s) [0] finished" in line)
    assert lag.endswith("(more than the finish lag, 4 s): treated as hung"), lag
    assert "rank(s) [1] still running" in lag
    assert any("T14" in line and "rank 1" in line for line in lines), job.output
    assert "[rank 1] rank 1 run 1" in job.output and "[rank 0] rank 0 run 1" in job.output
    status = job.status()["status"]
    assert status["phase"] == "Succeed" and status["recover_count"] == 1
    assert_nothing_left(str(tmp_path))


def test_a_finish_lag_that_is_not_a_duration_is_refused(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--finish-lag", "-1"], ["true"])
    assert job.wait(60) == 2
    assert job.lines == ["aegis-flow: error: the finish lag (-1 s) must be more than 0 seconds: "
                         "pass --finish-lag with a positive number of seconds"], job.output
