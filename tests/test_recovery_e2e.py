"""End-to-end recovery cases from the fault-injection review (shared/reviews/fault-injection.md).

Each test reproduces one row of the review with real processes (embedded NATS, master,
supervisors, real training commands) and states the outcome the decision layer must give:

* 2d — the same rank crashes twice: two in-place recoveries, success; only that rank charged;
* 7b — a one-off container-class error (a CUDA error line): one container restart, success;
* 7  — a deterministic user error (the same KeyError at the same step): give up after the second
  identical failure with a message naming it; ``--no-give-up-on-repeat`` uses every retry;
* 5c — a rank's supervisor SIGKILLed twice: success, the healthy peer never charged;
* 10 — a small seeded soak whose two faults per job hit the same rank: every job recovers.

Jobs are small (2 ranks, a few seconds of training each); on failure the job's whole output is
printed (the ``start`` fixture's teardown), and a job still running is stopped.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.jobs import ROOT, TRAIN, Job, assert_nothing_left

pytestmark = pytest.mark.e2e

ONCE_CUDA = str(ROOT / "tests" / "fixtures" / "once_cuda.py")
USERBUG = str(ROOT / "tests" / "fixtures" / "userbug.py")
#: the zygote preloads torch, as the review ran it ("pre-warmed interpreter on"): fast restarts
TORCH_PRELOAD = {"AEGIS_PRELOAD": "torch,torch._dynamo,torch.nn.parallel,torch.distributed",
                 "AEGIS_TIMING": "1"}  # train_ddp's AEGIS_FIRST_STEP markers
STEPS = 100  # train_ddp steps (see train)
MAX_RETRY = 3

Start = Callable[..., Job]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """``start(args, command, env=None)``: an ``aegis-flow run --workers 2 --quiet`` job in
    tmp_path. Teardown stops a job still running and prints every job's output (pytest shows
    it when the test failed)."""
    jobs: list[Job] = []

    def _start(args: list[str], command: list[str], env: dict[str, str] | None = None) -> Job:
        job = Job(tmp_path, ["--workers", "2", "--quiet", *args], command, env=env)
        jobs.append(job)
        return job

    yield _start
    for job in jobs:
        if job.proc.poll() is None:
            job.proc.send_signal(signal.SIGTERM)
            try:
                job.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait(timeout=10)
        print(f"===== output of: {' '.join(map(str, job.proc.args))}\n{job.output}\n"
              f"===== rc {job.proc.returncode}")


def train(tmp: Path, steps: int = STEPS) -> list[str]:
    """train_ddp at 0.1 s a step: at most 35 steps in the 3.5 s before a fault, so two faults
    never reach the last step (the faults always land) and the third run still has work."""
    return [sys.executable, TRAIN, "--steps", str(steps), "--step-time", "0.1",
            "--checkpoint-dir", str(tmp / "ck")]


def fixture(script: str, tmp: Path, steps: int = 20, step_time: float = 0.2) -> list[str]:
    return [sys.executable, script, str(steps), str(step_time), str(tmp)]


def runs(job: Job, rank: int) -> list[str]:
    """The AEGIS_RESTART_COUNT of every start of rank ``rank``'s training command, in order.
    train_ddp prints ``rank R/W restart_count C …``, the fixtures ``rank R restart C``."""
    start_line = re.compile(rf"^\[rank {rank}\] rank {rank}(?:/\d+)? restart(?:_count)? (\S+)")
    return [m.group(1) for line in job.lines if (m := start_line.match(line))]


def count(job: Job, text: str) -> int:
    """Output lines starting with ``text`` (rank output: ``[rank R] …``, runner: ``[aegis-flow]
    …``), so the master quoting a line in a message never counts twice."""
    return sum(line.startswith(text) for line in job.lines)


def events(doc: dict[str, Any]) -> list[str]:
    return list(doc.get("events", []))


def failures(doc: dict[str, Any]) -> list[int]:
    """``status.workers[r].failures``: the counted failures charged to rank r on its node."""
    workers = doc["status"]["workers"]
    missing = [w["rank"] for w in workers if "failures" not in w]
    assert not missing, (f"status.workers[{missing}] has no 'failures' field (counted failures "
                         f"charged to the rank on its current node): {workers}")
    return [int(w["failures"]) for w in workers]


def assert_succeeded(job: Job, rc: int, recover_count: int) -> dict[str, Any]:
    doc = job.status()
    assert (rc, doc["status"]["phase"], doc["status"]["recover_count"]) == (
        0, "Succeed", recover_count), "\n".join(events(doc))
    return doc


# -- 2d: the same rank crashes twice ------------------------------------------------------------

def test_same_rank_crashing_twice_recovers_twice(tmp_path: Path, start: Start) -> None:
    job = start(["--max-retry", str(MAX_RETRY),
                 "--inject", "crash:rank=1:after=3s:epoch=0",
                 "--inject", "crash:rank=1:after=3s:epoch=1"],
                train(tmp_path), env=TORCH_PRELOAD)
    rc = job.wait(timeout=150)
    fired = count(job, "[aegis-flow inject] AEGIS_KILLED rank 1")
    assert fired == 2, f"{2 - fired} injected crash(es) did not fire"
    doc = assert_succeeded(job, rc, 2)
    # the command ran a third time on both ranks, and that run finished the training
    assert runs(job, 1) == ["0", "1", "2"], runs(job, 1)
    assert runs(job, 0) == ["0", "1", "2"], runs(job, 0)
    assert count(job, f"[rank 0] done: final step {STEPS},") == 1
    assert failures(doc) == [0, 2]
    assert_nothing_left(str(tmp_path))


# -- 7b: a one-off container-class error ---------------------------------------------------------

def test_one_off_cuda_error_restarts_the_container_once(tmp_path: Path, start: Start) -> None:
    job = start(["--max-retry", str(MAX_RETRY)], fixture(ONCE_CUDA, tmp_path))
    rc = job.wait(timeout=120)
    assert count(job, "[rank 1] RuntimeError: CUDA error: unspecified launch failure") == 1
    doc = assert_succeeded(job, rc, 1)
    t10c = [e for e in events(doc) if "T10c" in e]
    assert len(t10c) == 1, "\n".join(events(doc))
    assert sum(line.startswith("[aegis-flow master] T10c") for line in job.lines) == 1
    assert count(job, "[aegis-flow] worker 1 ended (exit code 71)") == 1  # L2: the container, once
    assert runs(job, 1) == ["0", "1"], runs(job, 1)
    assert count(job, "[rank 1] done") == 1 and count(job, "[rank 0] done") >= 1
    assert_nothing_left(str(tmp_path))


# -- 7: a deterministic user error ---------------------------------------------------------------

def test_repeated_user_error_gives_up_and_names_it(tmp_path: Path, start: Start) -> None:
    job = start(["--max-retry", str(MAX_RETRY)], fixture(USERBUG, tmp_path))
    assert job.wait(timeout=120) == 1
    doc = job.status()
    assert doc["status"]["phase"] == "Failed", "\n".join(events(doc))
    # the second identical failure ends the job: no third run, no retries burnt on it
    assert runs(job, 1) == ["0", "1"], runs(job, 1)
    assert doc["status"]["recover_count"] <= 2, "\n".join(events(doc))
    assert count(job, "[rank 1] KeyError: 'x'") == 2  # the user's traceback, once per run
    # the runner's own closing lines say what went wrong, where
    runner = [line for line in job.lines if line.startswith("[aegis-flow] ")]
    assert any("KeyError" in line and re.search(r"\bstep 3\b", line) for line in runner), (
        "no '[aegis-flow] ' line names KeyError and step 3:\n" + "\n".join(runner))
    assert_nothing_left(str(tmp_path))


def test_repeated_user_error_without_give_up_uses_every_retry(tmp_path: Path,
                                                              start: Start) -> None:
    retry = 2  # (max-retry 3 adds a node move and a cold restart to the same proof)
    job = start(["--max-retry", str(retry), "--no-give-up-on-repeat"],
                fixture(USERBUG, tmp_path))
    assert job.wait(timeout=150) == 1
    doc = job.status()
    assert doc["status"]["phase"] == "Failed", "\n".join(events(doc))
    # max-retry restarts, then the (max-retry+1)th failure fails the job (T11)
    assert runs(job, 1) == [str(n) for n in range(retry + 1)], runs(job, 1)
    assert count(job, "[rank 1] KeyError: 'x'") == retry + 1
    assert doc["status"]["recover_count"] == retry + 1, "\n".join(events(doc))
    assert_nothing_left(str(tmp_path))


# -- 5c: a supervisor SIGKILLed twice ------------------------------------------------------------

def test_supervisor_killed_twice_never_charges_the_healthy_rank(tmp_path: Path,
                                                                start: Start) -> None:
    job = start(["--max-retry", str(MAX_RETRY)], train(tmp_path, steps=60), env=TORCH_PRELOAD)
    # both ranks training (rank 1's first step needs rank 0's allreduce)
    job.wait_for("AEGIS_FIRST_STEP_INFO rank 1 restart 0 ", timeout=90)
    first = int(job.pids()["workers"]["1"])
    os.kill(first, signal.SIGKILL)
    job.wait_for("AEGIS_FIRST_STEP_INFO rank 1 restart 1 ", timeout=90)  # training again
    second = int(job.pids()["workers"]["1"])
    assert second != first, "rank 1's supervisor was not replaced"
    os.kill(second, signal.SIGKILL)
    rc = job.wait(timeout=120)
    assert count(job, "[aegis-flow] worker 1 ended (signal 9)") == 2
    doc = assert_succeeded(job, rc, 2)
    assert failures(doc)[0] == 0, f"the healthy rank 0 was charged: {failures(doc)}"
    assert count(job, "[rank 0] done: final step 60,") == 1
    assert_nothing_left(str(tmp_path))


# -- 10: a small seeded soak, both faults of a job on the same rank ------------------------------

SOAK_SEED = 7  # seed 7 mixes ranks 0 and 1, crash and exit faults


def soak_jobs(seed: int, n: int = 3) -> list[tuple[str, int, list[str]]]:
    """``n`` jobs of two faults each, both on one rank, in run epochs 0 and 1: a SIGKILL
    (``crash``) or an exit code (1, 2, 3, 42; never the same code twice in a job, so no job
    looks like a deterministic repeat), 2.0-3.5 s into the epoch."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        rank = rng.randrange(2)
        kinds: list[str] = []
        for _ in (0, 1):
            pool = [k for k in ("crash", "exit1", "exit2", "exit3", "exit42")
                    if k == "crash" or k not in kinds]
            kinds.append(rng.choice(pool))
        afters = [round(rng.uniform(2.0, 3.5), 1) for _ in (0, 1)]
        specs = [f"crash:rank={rank}:after={after}s:epoch={epoch}" if kind == "crash" else
                 f"exit:rank={rank}:code={kind[4:]}:after={after}s:epoch={epoch}"
                 for epoch, (kind, after) in enumerate(zip(kinds, afters, strict=True))]
        jobs.append((f"soak{i}-rank{rank}-{'-'.join(kinds)}", rank, specs))
    return jobs


# one job of this draw: the seeded soak (bench/soak.py; tests/test_soak.py, kind "twice", and
# the 50-job table in docs/benchmarks.md) draws many more two-faults-on-one-rank jobs
@pytest.mark.parametrize("rank,specs", [pytest.param(r, s, id=name)
                                        for name, r, s in soak_jobs(SOAK_SEED, n=1)])
def test_soak_two_faults_on_one_rank_recover(tmp_path: Path, start: Start, rank: int,
                                             specs: list[str]) -> None:
    job = start(["--max-retry", str(MAX_RETRY), *(a for s in specs for a in ("--inject", s))],
                train(tmp_path), env=TORCH_PRELOAD)
    rc = job.wait(timeout=150)
    fired = (count(job, f"[aegis-flow inject] AEGIS_KILLED rank {rank}")
             + count(job, f"[rank {rank}] [aegis-flow inject] exiting with code"))
    assert fired == len(specs), f"{len(specs) - fired} injected fault(s) did not fire: {specs}"
    assert_succeeded(job, rc, len(specs))
    assert runs(job, rank) == ["0", "1", "2"], runs(job, rank)
    assert count(job, f"[rank 0] done: final step {STEPS},") == 1
    assert_nothing_left(str(tmp_path))
