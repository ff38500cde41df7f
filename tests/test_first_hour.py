"""A new user's mistakes get one line, at once, from the real CLI (issue: the first hour).

Each test runs ``aegis-flow`` in a process and asserts the exact first line of what it says;
nothing is started and no traceback is printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "aegis_flow.cli"]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_a_bad_worker_count_gets_one_message_whatever_its_sign(tmp_path: Path,
                                                               workers: str) -> None:
    out = cli("run", "--workers", workers, "--state-dir", str(tmp_path), "--", "true")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"aegis-flow: error: workers ({workers}) must be at least 1: pass --workers 1 or more"]
    assert list(tmp_path.iterdir()) == []


def test_a_state_dir_that_cannot_be_made_is_named_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    where = blocker / "state"
    out = cli("run", "--workers", "1", "--state-dir", str(where), "--", "true")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"aegis-flow: error: cannot keep job 'job' in {where}: Not a directory (choose a "
        "writable directory with --state-dir)"]


def test_a_state_dir_on_a_filesystem_that_refuses_it(tmp_path: Path) -> None:
    out = cli("run", "--workers", "1", "--state-dir", "/proc/aegis-state", "--", "true")
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith("aegis-flow: error: cannot keep job 'job' in /proc/aegis-state: ")
    assert "Traceback" not in out.stderr


def test_stop_of_a_job_that_does_not_exist(tmp_path: Path) -> None:
    out = cli("stop", "nosuch", "--state-dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"aegis-flow stop: no job 'nosuch' in {tmp_path} (give --state-dir, or --nats-url)"]


def test_stop_of_a_job_that_has_ended_says_how_it_ended(tmp_path: Path) -> None:
    from aegis_flow.master.machine import Phase, initial_status
    from aegis_flow.master.model import evolve
    from aegis_flow.master.store import encode_doc

    done = evolve(initial_status(2, 3), phase=Phase.SUCCEED, recover_count=1)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "status.json").write_bytes(encode_doc(done))
    out = cli("stop", "mine", "--state-dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "aegis-flow stop: job 'mine' is not running; it ended: job Succeed: max restarts 3, "
        "restarted 1 times; hardware faults rescheduled 0 times"]
