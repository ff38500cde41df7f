"""A worker whose master is gone exits in bounded time (review 3c, issue 13).

Real processes: a nats-server, a master and two supervisors running a short command. The
master is SIGKILLed after the run order and never restarted. Rank 0's command has finished
(it reported Finish and waits for the quit order); rank 1's command is still running. Expected:
rank 0 exits 0 within the orphan timeout (plus a probe) once the master is gone, but not while
the master is alive though silent for longer than that; rank 1's command runs to completion and
the worker exits with its code; each says "no master for N s"; nothing is left running.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from aegis_flow.local.natsserver import EmbeddedNats
from tests.jobs import Proc, assert_nothing_left

pytestmark = pytest.mark.e2e

ORPHAN = 4.0  # --orphan-timeout of the workers: more than the master's lost timeout (3 s)
SLACK = 4.0  # a probe interval, the probe's own timeout, a loaded machine

# rank R sleeps argv[1+R] seconds and exits with argv[3+R]
COMMAND = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} started", flush=True)
time.sleep(float(sys.argv[1 + rank]))
print(f"rank {rank} done", flush=True)
sys.exit(int(sys.argv[3 + rank]))
"""


def test_workers_finish_on_their_own_when_the_master_is_gone(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    command = tmp_path / "command.py"
    command.write_text(COMMAND)
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AEGIS_PRELOAD": "",
           "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs: list[Proc] = []
    with EmbeddedNats(tmp_path / "nats") as nats:
        try:
            master = Proc([sys.executable, "-m", "aegis_flow.master", "--job", "j",
                           "--workers", "2", "--nats-url", nats.url, "--lost-timeout", "3",
                           "--connect-timeout", "30", "--metrics-port", "0",
                           "--metrics-addr", "127.0.0.1",
                           "--status-file", str(work / "status.json")], env, work)
            procs.append(master)
            workers = [Proc([sys.executable, "-m", "aegis_flow.supervisor",
                             "--orphan-timeout", str(ORPHAN), "--job", "j",
                             "--rank", str(r), "--world-size", "2", "--nats-url", nats.url,
                             "--node", f"node-{r}", "--work-dir", str(work), "--",
                             sys.executable, str(command), "0.3", "12", "0", "3", str(work)],
                            env, work) for r in (0, 1)]
            procs += workers
            for r, w in enumerate(workers):  # the run order came: both commands started
                w.wait_for(f"rank {r} started", timeout=60)
            workers[0].wait_for("rank 0 done", timeout=10)
            # rank 0 now waits for the quit order; the master is alive but sends nothing: a
            # silence longer than the orphan timeout must not end the worker
            time.sleep(ORPHAN + 1.5)
            assert workers[0].proc.poll() is None, workers[0].output
            assert not any("no master" in w.output for w in workers), workers[0].output

            master.proc.send_signal(signal.SIGKILL)  # gone for good: nobody restarts it
            killed_at = time.monotonic()
            assert master.wait(10) == -signal.SIGKILL

            # rank 0: its command finished (exit 0); it exits 0 within the bound
            assert workers[0].wait(ORPHAN + SLACK) == 0, workers[0].output
            assert "no master for" in workers[0].output
            assert "finishing without fault tolerance" in workers[0].output
            assert workers[0].ended_at is not None
            assert workers[0].ended_at - killed_at <= ORPHAN + SLACK

            # rank 1: told why while its command still ran; ran it to completion; its code
            assert workers[1].wait(20) == 3, workers[1].output
            out = workers[1]
            assert out.index("no master for") < out.index("rank 1 done"), out.output
            assert "finishing without fault tolerance" in out.lines[out.index("no master for")]
            assert not any("SIGTERM" in line or "killed by" in line for line in out.lines)
            assert_nothing_left(str(work))
        finally:
            for p in procs:
                p.kill()
