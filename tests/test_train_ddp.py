"""End-to-end tests of examples/train_ddp.py: real processes, real torch, real gloo."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from aegis_flow.master.runtime import free_port
from aegis_flow.supervisor.integrity import RESUME_LINK, gate, verify

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"
WORLD = 2
STEPS = 30
EVERY = 5
DONE_RE = re.compile(r"done: final step (\d+), loss (\S+), params checksum (\S+)")
RUN_TIMEOUT = 90.0


@dataclass
class Rank:
    rank: int
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Launcher:
    """Starts ranks in their own process groups and guarantees none outlives the test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Rank] = []

    def launch(self, tag: str, ckpt: Path, restart_count: int, *extra: str,
               env_extra: dict[str, str] | None = None) -> list[Rank]:
        port = free_port()
        ranks = []
        for r in range(WORLD):
            env = dict(os.environ)
            env.update(env_extra or {})
            env.update(
                AEGIS_TIMING="1",  # the AEGIS_FIRST_STEP / AEGIS_RATE markers
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE=str(WORLD),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                AEGIS_RESTART_COUNT=str(restart_count),
                OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1",
            )
            log = self.tmp / f"{tag}-rank{r}.log"
            with log.open("wb") as fh:
                proc = subprocess.Popen(
                    [sys.executable, str(SCRIPT), "--steps", str(STEPS)]
                    + ["--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY)]
                    + ["--step-time", "0.01", "--backend", "gloo", "--pg-timeout", "30", *extra],
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            ranks.append(Rank(r, proc, log))
        self.started += ranks
        return ranks

    @staticmethod
    def kill(rank: Rank) -> None:
        if rank.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.proc.pid, signal.SIGKILL)
        rank.proc.wait()

    def cleanup(self) -> None:
        for rank in self.started:
            self.kill(rank)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path_factory.mktemp("train_ddp"))
    try:
        yield launcher
    finally:
        launcher.cleanup()
        for rank in launcher.started:  # no orphans: every rank was reaped
            assert rank.proc.returncode is not None


def wait_all(ranks: list[Rank], timeout: float = RUN_TIMEOUT) -> list[int]:
    deadline = time.monotonic() + timeout
    for rank in ranks:
        try:
            rank.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in ranks:
                Launcher.kill(other)
            logs = "\n".join(f"--- rank {r.rank} ---\n{r.output()[-3000:]}" for r in ranks)
            pytest.fail(f"ranks did not finish within {timeout} s\n{logs}")
    return [rank.proc.returncode for rank in ranks]


def done_line(rank0: Rank) -> tuple[int, float]:
    match = DONE_RE.search(rank0.output())
    assert match, f"rank 0 printed no done line:\n{rank0.output()[-3000:]}"
    return int(match.group(1)), float(match.group(3))


@pytest.fixture(scope="module")
def baseline(launcher: Launcher) -> tuple[int, float]:
    """An uninterrupted run: (final step, checksum)."""
    ranks = launcher.launch("baseline", launcher.tmp / "ck-baseline", 0)
    codes = wait_all(ranks)
    logs = {r.rank: r.output() for r in ranks}
    assert codes == [0] * WORLD, logs
    for r, out in logs.items():
        assert f"rank {r}/{WORLD} restart_count 0 backend gloo" in out
        assert re.search(r"^AEGIS_FIRST_STEP \d+\.\d+$", out, re.M), out
        assert "resumed from step" not in out
    assert f"step {EVERY} loss " in logs[0]
    assert "done:" not in logs[1]
    assert (launcher.tmp / "ck-baseline" / "latest.pt").is_file()
    return done_line(ranks[0])


def test_uninterrupted_run(baseline: tuple[int, float]) -> None:
    final_step, checksum = baseline
    assert final_step == STEPS
    assert checksum == checksum  # not NaN


def test_a_rerun_of_a_finished_job_says_there_is_nothing_to_train(
    launcher: Launcher, baseline: tuple[int, float]
) -> None:
    ckpt = launcher.tmp / "ck-baseline"  # the baseline's checkpoint, at the last step
    ranks = launcher.launch("rerun", ckpt, 0)
    assert wait_all(ranks) == [0] * WORLD
    first = next(line for line in ranks[0].output().splitlines() if "nothing" in line)
    assert first == (f"nothing to train: the checkpoint in {ckpt} is at step {STEPS} of --steps "
                     f"{STEPS}; delete it (or pass another --checkpoint-dir) to train again, or "
                     "raise --steps to train on")
    assert done_line(ranks[0]) == baseline  # the same model, untouched


def test_crash_then_resume_matches_uninterrupted(
    launcher: Launcher, baseline: tuple[int, float]
) -> None:
    ckpt = launcher.tmp / "ck-crash"
    fail_at = 3 * EVERY  # last checkpoint before the crash: step 2 * EVERY
    ranks = launcher.launch("crash", ckpt, 0, "--fail-at-step", str(fail_at), "--fail-rank", "1")
    failing, other = ranks[1], ranks[0]
    try:
        assert failing.proc.wait(timeout=RUN_TIMEOUT) == 1, failing.output()
        assert f"injected failure at step {fail_at}" in failing.output()
        with contextlib.suppress(subprocess.TimeoutExpired):
            other.proc.wait(timeout=5)  # gloo usually notices the dead peer; else we kill it
    finally:
        Launcher.kill(other)
        Launcher.kill(failing)
    assert "done:" not in other.output()
    assert (ckpt / "latest.pt").is_file()

    # The "restart": same checkpoint dir, a NEW rendezvous port, AEGIS_RESTART_COUNT=1, same
    # --fail-at-step (it must not fire again).
    ranks = launcher.launch("resume", ckpt, 1, "--fail-at-step", str(fail_at), "--fail-rank", "1")
    codes = wait_all(ranks)
    assert codes == [0] * WORLD, {r.rank: r.output() for r in ranks}
    for r in ranks:
        assert f"resumed from step {2 * EVERY}" in r.output()
        assert "restart_count 1" in r.output()
    final_step, checksum = done_line(ranks[0])
    assert final_step == baseline[0]
    assert checksum == pytest.approx(baseline[1], rel=1e-5, abs=1e-9)


def test_keep_writes_recorded_checkpoints_and_a_gated_resume_matches_uninterrupted(
    launcher: Launcher, baseline: tuple[int, float]
) -> None:
    ckpt = launcher.tmp / "ck-keep"
    ranks = launcher.launch("keep", ckpt, 0, "--keep", "2")
    assert wait_all(ranks) == [0] * WORLD, {r.rank: r.output() for r in ranks}
    assert done_line(ranks[0]) == baseline  # --keep changes nothing in the training
    last, before = STEPS, STEPS - EVERY
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([
        "latest.pt", f"ckpt-{before}.pt", f"ckpt-{last}.pt",
        f"ckpt-{before}.pt.aegis-sha256.json", f"ckpt-{last}.pt.aegis-sha256.json"])
    assert verify(ckpt / f"ckpt-{last}.pt").reason.startswith(
        "readable by torch.load (sha256 matches the manifest")

    # damage the newest; the gate moves it aside and the script resumes from the one before
    newest = ckpt / f"ckpt-{last}.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    result = gate(ckpt, "ckpt-*", now=datetime(2025, 1, 1, tzinfo=timezone.utc))
    assert result.chosen == ckpt / f"ckpt-{before}.pt" and len(result.damaged) == 1
    ranks = launcher.launch("keep-resume", ckpt, 1, "--keep", "2",
                            env_extra={"AEGIS_RESUME_FROM": str(ckpt / RESUME_LINK)})
    assert wait_all(ranks) == [0] * WORLD, {r.rank: r.output() for r in ranks}
    for r in ranks:
        assert f"resumed from step {before}" in r.output()
    final_step, checksum = done_line(ranks[0])
    assert final_step == baseline[0]
    assert checksum == pytest.approx(baseline[1], rel=1e-5, abs=1e-9)
    assert verify(newest).ok  # written again by the resumed run
    assert (ckpt / f"ckpt-{last}.pt.damaged-20250101T000000Z").is_file()  # never deleted


def test_missing_environment_is_a_clear_error() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode != 0
    assert "environment variable RANK is not set" in result.stderr
