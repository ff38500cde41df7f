"""Checkpoints with real processes: completed saves reported, a torn one gated (issue 18).

Real ``aegis-flow run`` (a nats-server, a master, supervisors, pre-warmed interpreters) over
``tests/fixtures/ckpt_job.py``, which saves ``ckpt-10/20/30.pt`` the common atomic way (a
temporary name, then ``os.replace``) and uses no aegis-flow API. Rank 0's supervisor sees each
one complete in ``--checkpoint-dir`` and tells the master. The first run tears its last save
and crashes; before the in-place restart the integrity gate finds ``ckpt-30.pt`` truncated,
moves it aside, and every rank resumes from ``ckpt-20.pt`` through ``$AEGIS_RESUME_FROM``.
Without the gate the restarted run would load the torn file and crash again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.jobs import Job, assert_nothing_left

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WARM = {"AEGIS_PRELOAD": "torch"}


def test_a_torn_checkpoint_is_moved_aside_and_every_rank_resumes_from_the_one_before(
        tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2", "--checkpoint-dir", str(ck)],
              ["python", str(FIXTURES / "ckpt_job.py")], env={**WARM, "TEAR": "1"})
    assert job.wait(180) == 0, job.output
    for step in (10, 20, 30):  # seen complete in the directory, no API call
        assert f"[aegis-flow master] checkpoint at step {step}" in job.output, job.output
    assert "checkpoint ckpt-30.pt is damaged (truncated" in job.output, job.output
    assert "[rank 0] rank 0 run 1 resumes from ckpt-20.pt at step 20" in job.output
    assert "[rank 1] rank 1 run 1 resumes from ckpt-20.pt at step 20" in job.output
    moved = [p.name for p in ck.iterdir() if p.name.startswith("ckpt-30.pt.damaged-")]
    assert len(moved) == 1 and not (ck / "ckpt-30.pt").exists()  # moved, never deleted
    assert os.readlink(ck / "aegis-resume") == "ckpt-20.pt"
    status = job.status()["status"]
    assert status["checkpoint_step"] == 20  # the last safe step, as the gate found it
    faults = [json.loads(line) for line in
              (tmp_path / "job" / "logs" / "faults.jsonl").read_text().splitlines()]
    assert any(r["Message"].startswith("checkpoint gate: checkpoint ckpt-30.pt is damaged")
               and r["rank"] == 0 for r in faults), faults
    assert_nothing_left(str(tmp_path))


SAYS_DONE = """\
import os, sys, time
import aegis_flow.checkpoint
if os.environ["RANK"] == "0":
    time.sleep(0.5)
    assert aegis_flow.checkpoint.done(7, "s3://bucket/run/step-7")
    time.sleep(3)
"""


def test_a_script_can_say_a_checkpoint_is_done(tmp_path: Path) -> None:
    (tmp_path / "says.py").write_text(SAYS_DONE)
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "0"],
              ["python", str(tmp_path / "says.py")])
    assert job.wait(120) == 0, job.output
    assert "[aegis-flow master] checkpoint at step 7" in job.output, job.output
    assert job.status()["status"]["checkpoint_step"] == 7
    assert_nothing_left(str(tmp_path))


def test_a_checkpoint_saved_right_after_its_step_is_not_dropped(tmp_path: Path) -> None:
    """``examples/train_ddp.py`` reports its steps (``progress.step``) and saves right after
    them. The master takes a checkpoint only at a step some heartbeat has shown, and the
    supervisor used to send the checkpoint up to a heartbeat (0.5 s) before the step: every
    save was dropped ("beyond every step the ranks have reported"), and a slow rank waiting
    for a checkpoint was never evicted. The steps now go out in a heartbeat first."""
    ck = tmp_path / "ck"
    example = str(FIXTURES.parent.parent / "examples" / "train_ddp.py")
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "0", "--checkpoint-dir", str(ck)],
              ["python", example, "--steps", "60", "--checkpoint-every", "10", "--keep", "3",
               "--step-time", "0.05", "--checkpoint-dir", str(ck)], env=WARM)
    assert job.wait(180) == 0, job.output
    assert "dropped a checkpoint" not in job.output, job.output
    said = [int(line.rsplit(" ", 1)[1]) for line in job.output.splitlines()
            if line.startswith("[aegis-flow master] checkpoint at step ")]
    assert len(said) >= 2 and said == sorted(said), job.output
    assert job.status()["status"]["checkpoint_step"] == said[-1]
    assert_nothing_left(str(tmp_path))
