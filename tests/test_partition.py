"""Real network partitions between the control plane (NATS) and the job's processes.

The test builds its own network (``tests/netns.py``): a hub namespace whose bridge carries
198.18.0.1, where nats-server listens; the master in namespace ``m`` (198.18.0.20); each worker
in namespace ``wR`` (198.18.0.1R) with, besides its control link to the hub, a direct data link
to the other worker (198.18.1.1R) that torch's rendezvous and gloo use (GLOO_SOCKET_IFNAME).
So a cut of a control link cuts exactly the control plane, never training traffic. Every
process is started as a bare process inside its namespace (``ip netns exec``), as
tests/test_master_gone.py starts them; the test plays the part of the local runner: a
supervisor that exits with a replace code (70, 71) or dies of a signal is started again
(``runner.REPLACE_CODES``). Training is examples/train_ddp.py with checkpoints, and its final
parameters must equal those of an uninterrupted run.

Scenarios (a cut sets the hub's end of the host's control link down; packets are dropped
silently, nobody is told):

1. worker 1 cut off for longer than the master's lost timeout, then restored: the master counts
   one failure for rank 1 (T6), the job recovers and completes; recover_count is exactly 1;
2. worker 1 cut off for less than the lost timeout: nothing counted, training uninterrupted;
3. the master cut off for longer than the lost timeout: the master hears no worker and cannot
   reach NATS itself, a control-plane outage (T6n): nothing counted, nothing restarted, training
   goes on; recover_count 0.

Needs root and iproute2 (skipped otherwise). Namespaces and processes are removed on every
exit path (fixture teardown), and nothing of them is left after each test.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.local.natsserver import find_nats_server
from aegis_flow.local.runner import REPLACE_CODES
from tests.jobs import ROOT, TRAIN, assert_nothing_left
from tests.netns import HUB_ADDR, Network, NsProc, remove_stale, why_unavailable

pytestmark = pytest.mark.e2e

NATS_PORT = 4222
NATS_URL = f"nats://{HUB_ADDR}:{NATS_PORT}"
MASTER_ADDR = "198.18.0.20"
CTL = {0: "198.18.0.10", 1: "198.18.0.11"}
DATA = {0: "198.18.1.10", 1: "198.18.1.11"}  # rank 0's data address hosts the rendezvous
RDZV_BASE = 29400  # any port: every namespace is private
LOST = 3.0  # the master's --lost-timeout
HEARTBEAT = 0.5  # the workers' --heartbeat
STEPS = 150  # train_ddp steps at 0.1 s: 15 s of training, long enough to span a cut
EVERY = 10  # checkpoint period
TORCH_PRELOAD = "torch,torch._dynamo,torch.nn.parallel,torch.distributed"
DONE_RE = re.compile(r"done: final step (\d+), loss (\S+), params checksum (\S+)")

# the master with its rendezvous on rank 0's data address: MasterConfig.rendezvous_addr has no
# command-line option (yet); this sets it the way an option would
MASTER_ENTRY = """\
import functools, sys
import aegis_flow.master.__main__ as entry
addr, base = sys.argv.pop(1), int(sys.argv.pop(1))
entry.MasterConfig = functools.partial(entry.MasterConfig, rendezvous_addr=addr,
                                       rendezvous_port_base=base)
sys.exit(entry.main())
"""


@functools.cache
def _master_option(name: str) -> bool:
    from aegis_flow.master.__main__ import build_parser

    return any(name in a.option_strings for a in build_parser()._actions)


def master_argv(args: list[str]) -> list[str]:
    if _master_option("--rendezvous-addr"):
        return [sys.executable, "-m", "aegis_flow.master", "--rendezvous-addr", DATA[0], *args]
    return [sys.executable, "-c", MASTER_ENTRY, DATA[0], str(RDZV_BASE), *args]


def train_argv(ck: Path, steps: int = STEPS, step_time: float = 0.1) -> list[str]:
    return [sys.executable, TRAIN, "--steps", str(steps), "--step-time", str(step_time),
            "--checkpoint-every", str(EVERY), "--checkpoint-dir", str(ck)]


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AEGIS_", "GLOO_", "MASTER_", "NATS_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def checksum_of(output: str) -> tuple[int, float]:
    found = DONE_RE.findall(output)
    assert len(found) == 1, f"expected one done line, found {len(found)}:\n{output}"
    return int(found[0][0]), float(found[0][2])


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, float]:
    """An uninterrupted two-rank run of the same training on 127.0.0.1 (no aegis-flow, no
    step time: the numbers do not depend on it): (final step, params checksum)."""
    tmp = tmp_path_factory.mktemp("baseline")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(train_argv(tmp / "ck", step_time=0.0),
                              env={**base_env(), "RANK": str(r), "WORLD_SIZE": "2",
                                   "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=120)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    return checksum_of(outs[0])


@pytest.fixture
def net() -> Iterator[Network]:
    """The private network; torn down (processes inside killed, namespaces deleted) always."""
    why = why_unavailable()
    if why is not None:
        pytest.skip(f"network partition tests need network namespaces: {why}")
    remove_stale()
    network = Network()
    try:
        network.create()
        for rank in (0, 1):
            network.add_host(f"w{rank}", CTL[rank])
        network.add_host("m", MASTER_ADDR)
        network.link("w0", DATA[0], "w1", DATA[1])
    except RuntimeError as exc:
        network.destroy()
        pytest.skip(f"cannot build the test network: {exc}")
    try:
        yield network
    finally:
        network.destroy()
    assert network.leftovers() == [], "namespaces left behind"


class PartitionJob:
    """nats-server (hub), a master (m) and two supervisors (w0, w1), started by hand; a thread
    starts again a supervisor that exits with a replace code or dies, as the local runner
    does."""

    def __init__(self, net: Network, tmp: Path) -> None:
        self.net, self.tmp = net, tmp
        self.work = tmp / "work"
        self.work.mkdir()
        self.ck = tmp / "ck"
        self.status_file = self.work / "status.json"
        self.procs: list[NsProc] = []
        self.workers: dict[int, NsProc] = {}
        self.replaced: list[tuple[int, int]] = []  # (rank, exit code) of each restart
        self.master: NsProc | None = None
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def _start(self, host: str, argv: list[str], env: dict[str, str], label: str) -> NsProc:
        proc = NsProc(self.net, host, argv, env, self.tmp, label)
        self.procs.append(proc)
        return proc

    def start(self) -> PartitionJob:
        nats = self._start("hub", [str(find_nats_server()), "-a", HUB_ADDR, "-p",
                                   str(NATS_PORT), "-js", "-sd", str(self.tmp / "nats")],
                           base_env(), "nats-server")
        nats.wait_for("Server is ready", timeout=20)
        self.master = self._start("m", master_argv([
            "--job", "j", "--workers", "2", "--max-retry", "3", "--nats-url", NATS_URL,
            "--connect-timeout", "30", "--lost-timeout", str(LOST),
            "--status-file", str(self.status_file), "--metrics-port", "0",
            "--metrics-addr", "127.0.0.1", "--log-dir", str(self.work / "logs")]),
            base_env(), "master")
        for rank in (0, 1):
            self.workers[rank] = self._worker(rank)
        self._watcher.start()
        return self

    def _worker(self, rank: int) -> NsProc:
        n = sum(1 for r, _ in self.replaced if r == rank)
        env = {**base_env(), "AEGIS_PRELOAD": TORCH_PRELOAD, "GLOO_SOCKET_IFNAME": "data"}
        argv = [sys.executable, "-m", "aegis_flow.supervisor", "--job", "j", "--rank",
                str(rank), "--world-size", "2", "--nats-url", NATS_URL, "--node",
                f"node-{rank}", "--pod-ip", CTL[rank], "--heartbeat", str(HEARTBEAT),
                "--work-dir", str(self.work), "--",
                *train_argv(self.ck)]
        return self._start(f"w{rank}", argv, env, f"worker {rank}" + (f" ({n + 1})" if n else ""))

    def _watch(self) -> None:
        """runner.LocalJob._loop's rule: a replace code or a signal starts the rank again,
        while the master runs."""
        while not self._done.is_set():
            assert self.master is not None
            if self.master.proc.poll() is not None:
                return
            for rank, proc in list(self.workers.items()):
                code = proc.proc.poll()
                if code is not None and (code in REPLACE_CODES or code < 0):
                    self.replaced.append((rank, code))
                    self.workers[rank] = self._worker(rank)
            time.sleep(0.05)

    def wait(self, timeout: float) -> int:
        """The master's exit code once it and both workers ended."""
        assert self.master is not None
        deadline = time.monotonic() + timeout
        rc = self.master.wait(timeout)
        self._done.set()
        self._watcher.join(timeout=5)
        for proc in self.workers.values():
            proc.wait(max(1.0, deadline - time.monotonic()) + 15)
        return rc

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.status_file.read_text())
        return doc

    def events(self) -> str:
        return "\n".join(self.status().get("events", []))

    def worker_output(self, rank: int) -> str:
        return "\n".join(p.output for p in self.procs if p.label.startswith(f"worker {rank}"))

    def stop(self) -> None:
        self._done.set()
        for proc in reversed(self.procs):
            proc.kill()
        if self._watcher.is_alive():
            self._watcher.join(timeout=5)

    def dump(self) -> str:
        return "\n".join(f"===== {p.label} (rc {p.proc.returncode})\n{p.output}"
                         for p in self.procs)


@pytest.fixture
def job(net: Network, tmp_path: Path) -> Iterator[PartitionJob]:
    j = PartitionJob(net, tmp_path)
    try:
        yield j
    finally:
        j.stop()
        print(j.dump())  # shown by pytest when the test failed
    assert_nothing_left(str(tmp_path))


def wait_training(job: PartitionJob) -> None:
    """Both ranks train: rank 0 has reached the checkpoint at step 20."""
    job.workers[0].wait_for(f"step {2 * EVERY} loss", timeout=60)


def assert_trained(job: PartitionJob, baseline: tuple[int, float]) -> None:
    final_step, checksum = checksum_of(job.worker_output(0))
    assert final_step == STEPS
    assert checksum == pytest.approx(baseline[1], rel=1e-5, abs=1e-9)
    assert baseline[0] == STEPS


def test_worker_cut_off_longer_than_lost_timeout_counts_one_failure(
        job: PartitionJob, net: Network, baseline: tuple[int, float]) -> None:
    started = time.monotonic()
    job.start()
    wait_training(job)
    net.cut("w1")
    cut_at = time.monotonic()
    assert job.master is not None
    job.master.wait_for("T6: rank 1 failed", timeout=4 * LOST + 5)
    # silence counts from rank 1's last heartbeat before the cut (at most 0.5 s earlier)
    assert time.monotonic() - cut_at > LOST - HEARTBEAT - 0.2
    time.sleep(max(0.0, cut_at + LOST + 1 - time.monotonic()))  # a cut of 4 s at least
    net.restore("w1")

    rc = job.wait(timeout=90 - (time.monotonic() - started))
    doc = job.status()
    st = doc["status"]
    assert (rc, st["phase"], st["recover_count"]) == (0, "Succeed", 1), job.events()
    assert [w["rank"] for w in st["workers"] if w["failures"]] == [1], st["workers"]
    assert "T6: rank 1 failed" in job.events()
    assert_trained(job, baseline)
    assert "resumed from step" in job.worker_output(0)  # the recovery restarted training
    assert [p.proc.returncode for p in job.workers.values()] == [0, 0]
    print(f"worker processes started again: {job.replaced}; "
          f"took {time.monotonic() - started:.1f} s")


def test_worker_cut_off_shorter_than_lost_timeout_counts_nothing(
        job: PartitionJob, net: Network, baseline: tuple[int, float]) -> None:
    started = time.monotonic()
    job.start()
    wait_training(job)
    net.cut("w1")
    time.sleep(LOST / 3)
    net.restore("w1")

    rc = job.wait(timeout=90 - (time.monotonic() - started))
    st = job.status()["status"]
    assert (rc, st["phase"], st["recover_count"]) == (0, "Succeed", 0), job.events()
    assert job.replaced == []
    assert "T6" not in job.events()
    assert_trained(job, baseline)
    for rank in (0, 1):  # training ran once, uninterrupted
        assert "resumed from step" not in job.worker_output(rank)
    assert [p.proc.returncode for p in job.workers.values()] == [0, 0]
    print(f"took {time.monotonic() - started:.1f} s")


def test_master_cut_off_is_a_control_plane_outage_not_a_failure(
        job: PartitionJob, net: Network, baseline: tuple[int, float]) -> None:
    started = time.monotonic()
    job.start()
    wait_training(job)
    net.cut("m")
    assert job.master is not None
    # the cut lasts until the master says T6n, or 2 lost timeouts and more: it may say so only
    # once it reaches NATS again (its status is stored first)
    said_during_cut = job.master.appears("T6n", timeout=2 * LOST + 2)
    net.restore("m")

    rc = job.wait(timeout=90 - (time.monotonic() - started))
    st = job.status()["status"]
    events = job.events()
    assert (rc, st["phase"], st["recover_count"]) == (0, "Succeed", 0), events
    assert job.replaced == []
    assert "T6n" in job.master.output, events
    assert not re.search(r"\bT6: ", events), events
    assert_trained(job, baseline)
    for rank in (0, 1):  # nothing restarted: training ran once
        assert "resumed from step" not in job.worker_output(rank)
    assert [p.proc.returncode for p in job.workers.values()] == [0, 0]
    print(f"T6n said during the cut: {said_during_cut}; took {time.monotonic() - started:.1f} s")
