"""The live log trigger with real processes (issue 19): a fatal line starts the recovery at once.

Real ``aegis-flow run`` over ``tests/fixtures/live_line.py`` (DDP, gloo): rank 1 prints the
line torch's NCCL watchdog prints on a collective timeout, then never exits nor prints again
(its peer blocks in the next collective). The hang thresholds are the defaults (5 and 15
minutes): without the live trigger nothing would happen for minutes. The supervisor matches the
line against the cause table's live rules as it is printed and reports it; the master starts
the recovery (every rank stopped, troubleshoot, restart) within a second of the line, and the
job succeeds on the next run. A user table given with ``--causes`` makes its own line live; a
bad table is refused before anything starts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aegis_flow.master.faultlog import parse_timestamp
from tests.jobs import Job, assert_nothing_left

pytestmark = pytest.mark.e2e

FIXTURE = str(Path(__file__).resolve().parent / "fixtures" / "live_line.py")
WARM = {"AEGIS_PRELOAD": "torch"}


def _reported_within(tmp_path: Path, output: str, code: str) -> float:
    """Seconds from the printed line (its ``at=``) to the master's record of the report."""
    printed = float(re.search(r"\[rank 1\] .* at=([\d.]+)", output).group(1))  # type: ignore[union-attr]
    records = [json.loads(line) for line in
               (tmp_path / "job" / "logs" / "faults.jsonl").read_text().splitlines()]
    report = next(r for r in records if r["kind"] == "report" and r.get("rank") == 1
                  and r.get("cause") == code)
    return parse_timestamp(report["TimeStamp"]) - printed


def test_an_nccl_timeout_line_starts_the_recovery_within_a_second(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2"], ["python", FIXTURE, "60"],
              env=WARM)
    assert job.wait(240) == 0, job.output
    assert "the output says nccl_timeout" in job.output, job.output
    delay = _reported_within(tmp_path, job.output, "nccl_timeout")
    print(f"live trigger: the line reached the master's fault log {delay * 1000:.0f} ms after "
          "it was printed")
    assert 0 <= delay < 1.0, (delay, job.output)
    assert "[rank 0] rank 0 done" in job.output and "[rank 1] rank 1 done" in job.output
    assert job.status()["status"]["recover_count"] == 1
    assert_nothing_left(str(tmp_path))


def test_a_users_table_makes_its_own_line_live_and_a_bad_table_is_refused(
        tmp_path: Path) -> None:
    table = tmp_path / "causes.toml"
    table.write_text('[[rule]]\ncode = "loader_deadlock"\nclass = "user"\npriority = 80\n'
                     'live = true\npatterns = ["data loader worker .* is stuck"]\n')
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2", "--causes", str(table)],
              ["python", FIXTURE, "60", "--line", "data loader worker 3 is stuck"], env=WARM)
    assert job.wait(240) == 0, job.output
    assert "the output says loader_deadlock" in job.output, job.output
    assert _reported_within(tmp_path, job.output, "loader_deadlock") < 1.0
    assert job.status()["status"]["recover_count"] == 1
    assert_nothing_left(str(tmp_path))
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\ncode = "x"\nclass = "user"\nlive = "yes"\npatterns = ["x"]\n')
    refused = subprocess.run([sys.executable, "-m", "aegis_flow.cli", "run", "--state-dir",
                              str(tmp_path / "other"), "--workers", "2", "--causes", str(bad),
                              "--", "python",
                              FIXTURE, "5"], capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 2, refused.stderr
    assert "'live' must be true or false, got 'yes'" in refused.stderr
    assert "nothing was started" in refused.stderr and not (tmp_path / "other").exists()
