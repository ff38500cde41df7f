"""Several ranks per worker (``--nproc-per-node``, torchrun's shape) with real processes.

Real ``aegis-flow run --workers 2 --nproc-per-node 2`` over a real DDP training of 4 ranks
(``tests/fixtures/ranks_ddp.py``, gloo on CPU): every rank gets the variables torchrun sets;
a SIGKILL of one non-zero local rank (global rank 3, local rank 1 of worker 1) is that
worker's failure; every rank of every worker restarts in place and the job succeeds. The
master sees two workers (the unit it replaces), and says which local rank failed.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.jobs import Job, assert_nothing_left

pytestmark = pytest.mark.e2e

FIXTURE = str(Path(__file__).resolve().parent / "fixtures" / "ranks_ddp.py")
ENV_RE = re.compile(r"\[rank (\d)\] env RANK=(\d) LOCAL_RANK=(\d) WORLD_SIZE=(\d) "
                    r"LOCAL_WORLD_SIZE=(\d) GROUP_RANK=(\d) NODE_RANK=(\d) restart=(\d) "
                    r"pid=(\d+)")


def test_two_workers_of_two_ranks_train_and_recover_from_a_killed_local_rank(
        tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--nproc-per-node", "2", "--max-retry", "2"],
              ["python", FIXTURE, "8"], env={"AEGIS_PRELOAD": "torch"})
    job.wait_for("env RANK=3", timeout=120)
    time.sleep(2)  # every rank is training
    first = {int(m[1]): m for m in ENV_RE.findall(job.output) if m[7] == "0"}
    assert sorted(first) == [0, 1, 2, 3], job.output
    for rank, m in first.items():  # prefix, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, …
        worker, local = divmod(rank, 2)
        assert m[1:7] == (str(rank), str(local), "4", "2", str(worker), str(worker)), m
    os.kill(int(first[3][8]), signal.SIGKILL)
    assert job.wait(240) == 0, job.output
    assert re.search(r"\[aegis-flow master\] T\w+: rank 1 failed \(", job.output), job.output
    assert "local rank 1 (rank 3): killed by SIGKILL" in job.output, job.output
    again = {int(m[1]) for m in ENV_RE.findall(job.output) if m[7] == "1"}
    assert again == {0, 1, 2, 3}, job.output  # every rank restarted, in place
    for rank in range(4):
        assert f"[rank {rank}] rank {rank} done after" in job.output, job.output
    doc = job.status()["status"]
    assert doc["recover_count"] == 1 and len(doc["workers"]) == 2
    assert doc["error_nodes"] == []  # in place: no node was quarantined
    assert_nothing_left(str(tmp_path))
