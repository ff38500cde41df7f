"""A slow node with real processes: marked, evicted right after the next checkpoint, moved.

Real ``aegis-flow run`` (a nats-server, a master, supervisors, pre-warmed interpreters) over
``tests/fixtures/slow_ddp.py``: a real DDP training (gloo, CPU) in which every forward on node
``local-node-1`` takes 40 ms longer (a throttled node; its peer then waits for it in every
step's collectives). The script uses no aegis-flow API: the forward times come from the
pre-warmed interpreter, the checkpoints from ``--checkpoint-dir``. The master marks rank 1
slow after ``--slow-window``, keeps training until the next checkpoint completes, then evicts
it (exit 72) and quarantines its node (reason slow); rank 1 comes back on ``local-node-1-1``
(fast), every rank resumes from that checkpoint (the integrity gate's choice), and the job
succeeds with nothing charged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.jobs import Job, assert_nothing_left

pytestmark = pytest.mark.e2e

FIXTURE = str(Path(__file__).resolve().parent / "fixtures" / "slow_ddp.py")
WARM = {"AEGIS_PRELOAD": "torch"}


def test_a_slow_node_is_evicted_right_after_the_next_checkpoint_and_never_before(
        tmp_path: Path) -> None:
    log = tmp_path / "steps.log"
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "1", "--slow-window", "3",
                         "--checkpoint-dir", str(tmp_path / "ck")],
              ["python", FIXTURE, "--steps", "400", "--every", "40", "--slow-node",
               "local-node-1", "--slow-ms", "40", "--log", str(log)], env=WARM)
    assert job.wait(300) == 0, job.output
    lines = job.output.splitlines()

    def first(pattern: str) -> int:
        return next(i for i, line in enumerate(lines) if re.search(pattern, line))

    marked = first(r"\[aegis-flow master\] T13s: rank 1 is slow \(forward [\d.]+ ms vs its "
                   r"peers' median [\d.]+ ms")
    evicted = first(r"\[aegis-flow master\] T13e: rank 1 is being replaced \(slow\)")
    # the checkpoint right before the eviction came after the mark: it was waited for
    ckpts = [i for i, line in enumerate(lines[:evicted])
             if re.search(r"\[aegis-flow master\] checkpoint at step \d+$", line)]
    assert ckpts and marked < ckpts[-1] < evicted, job.output
    at = int(lines[ckpts[-1]].rsplit(" ", 1)[1])
    assert "node local-node-1 of rank 1 quarantined (slow)" in job.output
    assert "worker 1 ended (exit code 72)" in job.output
    assert "rank 1 on local-node-1-1 starts at step" in job.output
    # every rank resumed from a checkpoint the eviction waited for, not from the start
    resumed = [int(m) for m in re.findall(r"rank \d on local-node-\S+ starts at step (\d+)",
                                          job.output)]
    assert resumed[:2] == [0, 0] and all(s >= at for s in resumed[2:]) and len(resumed) == 4
    status = job.status()["status"]
    assert status["phase"] == "Succeed" and status["recover_count"] == 0  # not a failure
    assert status["error_nodes"] == ["local-node-1"]
    faults = [json.loads(line) for line in
              (tmp_path / "job" / "logs" / "faults.jsonl").read_text().splitlines()]
    assert [r["rank"] for r in faults if r.get("cause") == "slow" and r["kind"] == "report"] == [1]
    # steps redone after the eviction: those trained between the checkpoint and the stop
    rows = [line.split() for line in log.read_text().splitlines()]
    starts = [i for i, r in enumerate(rows) if r[0] == "start"]
    assert len(starts) == 2, rows[:3]  # the first run, and the one after the eviction
    reached, resumed_at = int(rows[starts[1] - 1][1]), int(rows[starts[1]][1])
    assert resumed_at >= at and 0 <= reached - resumed_at < 40, (reached, resumed_at)
    assert_nothing_left(str(tmp_path))


def test_a_checkpoint_round_asked_for_makes_the_eviction_come_at_once(tmp_path: Path) -> None:
    """No periodic checkpoint would come within the job (--every 100000): without the round
    the master asks for when it marks rank 1 slow, rank 1 would train on slow to the end. The
    script honours ``aegis_flow.checkpoint.requested()``: rank 0 saves at the next step, and
    rank 1 is evicted right after that checkpoint, losing nothing."""
    log = tmp_path / "steps.log"
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "1", "--slow-window", "3",
                         "--checkpoint-dir", str(tmp_path / "ck")],
              ["python", FIXTURE, "--steps", "400", "--every", "100000", "--slow-node",
               "local-node-1", "--slow-ms", "40", "--log", str(log), "--honour-requests",
               "--say-done"], env=WARM)
    assert job.wait(300) == 0, job.output
    lines = job.output.splitlines()

    def first(pattern: str) -> int:
        return next(i for i, line in enumerate(lines) if re.search(pattern, line))

    marked = first(r"\[aegis-flow master\] T13s: rank 1 is slow")
    asked = first(r"a fault-tolerance checkpoint round is asked for \(fault-\d+-1: rank 1 is "
                  r"slow\)")
    saved = first(r"\[rank 0\] checkpoint round fault-\d+-1 at step \d+")
    at = int(lines[saved].rsplit(" ", 1)[1])
    recorded = first(rf"\[aegis-flow master\] checkpoint at step {at}$")
    evicted = first(r"\[aegis-flow master\] T13e: rank 1 is being replaced \(slow\)")
    assert marked < asked < saved and recorded < evicted, job.output
    assert "node local-node-1 of rank 1 quarantined (slow)" in job.output
    assert "rank 1 on local-node-1-1 starts at step" in job.output
    resumed = [int(m) for m in re.findall(r"rank \d on local-node-\S+ starts at step (\d+)",
                                          job.output)]
    assert resumed[2:] == [at, at], job.output  # both ranks resumed from the round's checkpoint
    status = job.status()["status"]
    assert status["phase"] == "Succeed" and status["recover_count"] == 0
    rows = [line.split() for line in log.read_text().splitlines()]
    starts = [i for i, r in enumerate(rows) if r[0] == "start"]
    reached = int(rows[starts[1] - 1][1])
    assert 0 <= reached - at < 40, (reached, at)  # steps redone: those after the round
    assert_nothing_left(str(tmp_path))
