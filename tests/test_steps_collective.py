"""The collective checks with real ranks: real processes, real torch.distributed over gloo.

Healthy ranks pass connection, performance and health; a rank that never joins makes the others
report a timeout within the budget and end (no hang); a rank slowed down for real
(``AEGIS_TEST_SLOW_RANK``) is the one ``flag_slow`` names. Plus the pure helpers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.master.runtime import free_port
from aegis_flow.steps.base import CheckStatus
from aegis_flow.steps.collective import (
    SLOW_RANK_ENV,
    check_allreduce,
    check_health,
    parse_rendezvous,
    parse_slow_rank,
    ring_schedule,
)
from aegis_flow.steps.slow import flag_slow, peer_median

ROOT = Path(__file__).resolve().parents[1]
PROC_TIMEOUT = 90.0  # generous: a rank still running after this is a hang, and fails the test
SMALL = {"size_mib": 4.0, "iters": 5, "warmup": 1}
# Three ranks on this shared 2-core machine: a rank that shares its core with other work really
# is slower — healthy ranks were seen 2.6x (and, under heavy load, 5x) apart. The end-to-end
# tests judge at 0.25 so that only a real, large slowdown is flagged; the default 0.5 is what
# the unit tests of flag_slow pin down.
FRACTION = 0.25

# One rank: run the checks the spec asks for, print one RESULT line of JSON, exit normally (so
# a hang at interpreter exit would show too) unless the spec asks for a hard exit.
RANK_CODE = r"""
import json, pathlib, sys, time
spec = json.loads(sys.argv[1])
from aegis_flow.steps.collective import check_allreduce, check_health
import torch.distributed as dist
# start together: a cold torch import takes seconds, and differently long on a loaded machine
ready = pathlib.Path(spec["ready"])
(ready / str(spec["rank"])).touch()
until = time.time() + 60
while time.time() < until and not all((ready / str(r)).exists() for r in spec["launched"]):
    time.sleep(0.02)
out = {"rank": spec["rank"], "started": time.time()}
out["allreduce"] = [r.to_dict() for r in check_allreduce(
    world_size=spec["world_size"], rank=spec["rank"], rendezvous=spec["rendezvous"],
    budgets=spec["budgets"], **spec["perf"])]
if spec.get("health"):
    out["health"] = check_health(world_size=spec["world_size"], rank=spec["rank"],
                                 rendezvous=spec["health"], budget=30.0).to_dict()
out["pg_after"] = dist.is_initialized()
out["returned"] = time.time()
print("RESULT " + json.dumps(out), flush=True)
if spec.get("hard_exit"):  # what a caller must do after a probe was abandoned inside torch
    import os
    os._exit(0)
"""


@dataclass
class Rank:
    rank: int
    proc: subprocess.Popen[bytes]
    log: Path
    ended: float | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def result(self) -> dict[str, Any]:
        lines = [ln for ln in self.output().splitlines() if ln.startswith("RESULT ")]
        assert lines, f"rank {self.rank} printed no result:\n{self.output()[-3000:]}"
        out: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
        return out


def kill(rank: Rank) -> None:
    if rank.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank.proc.pid, signal.SIGKILL)
    rank.proc.wait()


def launch(tmp: Path, tag: str, world_size: int, ranks: list[int], *,
           budgets: dict[str, float], perf: dict[str, Any] = SMALL, health: bool = False,
           env: dict[str, str] | None = None, hard_exit: bool = False) -> list[Rank]:
    rendezvous = f"127.0.0.1:{free_port()}"
    health_rdzv = f"127.0.0.1:{free_port()}" if health else None
    ready = tmp / f"{tag}-ready"
    ready.mkdir()
    started = []
    for r in ranks:
        spec = {"world_size": world_size, "rank": r, "rendezvous": rendezvous,
                "budgets": budgets, "perf": perf, "health": health_rdzv,
                "hard_exit": hard_exit, "ready": str(ready), "launched": ranks}
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": str(ROOT)}
        full_env.pop(SLOW_RANK_ENV, None)  # only the test that asks for it slows a rank
        full_env.update(env or {})
        log = tmp / f"{tag}-rank{r}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen([sys.executable, "-c", RANK_CODE, json.dumps(spec)],
                                    stdin=subprocess.DEVNULL, stdout=fh,
                                    stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
                                    start_new_session=True)
        started.append(reaped(Rank(r, proc, log)))
    return started


def reaped(rank: Rank) -> Rank:
    """Record when the process ends, whoever is waiting for it."""
    def reap() -> None:
        rank.proc.wait()
        rank.ended = time.time()

    threading.Thread(target=reap, daemon=True).start()
    return rank


def wait_all(groups: list[list[Rank]], timeout: float = PROC_TIMEOUT) -> None:
    """Wait for every rank; kill them all and fail the test if any is still running at the end."""
    everyone = [r for g in groups for r in g]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if all(r.proc.poll() is not None for r in everyone):
                return
            time.sleep(0.05)
        hung = [r for r in everyone if r.proc.poll() is None]
        logs = "\n".join(f"--- rank {r.rank} ---\n{r.output()[-2000:]}" for r in hung)
        pytest.fail(f"rank(s) {[r.rank for r in hung]} still running after {timeout} s and had "
                    f"to be killed (a hang)\n{logs}")
    finally:
        for r in everyone:
            kill(r)


def by_type(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["check_type"]: r for r in results}


# --- real ranks --------------------------------------------------------------------------------

@pytest.mark.e2e
def test_three_healthy_ranks_pass_connection_performance_and_health(tmp_path: Path) -> None:
    # FRACTION, not the default 0.5: see its comment
    ranks = launch(tmp_path, "healthy", 3, [0, 1, 2], health=True,
                   perf={**SMALL, "slow_fraction": FRACTION},
                   budgets={"allreduce_connection": 60.0, "allreduce_performance": 60.0})
    wait_all([ranks])
    results = {r.rank: r.result() for r in ranks}
    gathered = []
    for rank, out in results.items():
        assert ranks[rank].proc.returncode == 0, ranks[rank].output()[-3000:]
        checks = by_type(out["allreduce"])
        conn, perf = checks["allreduce_connection"], checks["allreduce_performance"]
        assert conn["status"] == "pass" and conn["passed"], conn["detail"]
        assert conn["data"]["missing_ranks"] == [] and conn["data"]["backend"] == "gloo"
        assert conn["budget"] == 60.0
        assert perf["status"] == "pass", perf["detail"]
        d = perf["data"]
        assert d["algbw_gbps"] > 0 and d["rank_bandwidth_gbps"] > 0
        assert math.isclose(d["busbw_gbps"], d["algbw_gbps"] * 2 * 2 / 3)
        assert set(d["send_gbps"]) == {str((rank + 1) % 3), str((rank - 1) % 3)}
        assert d["rank_bandwidth_gbps"] == max(d["send_gbps"].values())
        assert d["all_rank_bandwidth_gbps"][rank] == d["rank_bandwidth_gbps"]
        assert d["slow_ranks"] == [] and d["bytes"] == 4 * 2**20
        assert "GB/s" in perf["detail"] and "busbw" in perf["detail"]
        gathered.append(d["all_rank_bandwidth_gbps"])
        health = out["health"]
        assert health["check_type"] == "health" and health["status"] == "pass", health["detail"]
        assert out["pg_after"] is False  # every check destroyed its process group
    assert gathered[0] == gathered[1] == gathered[2]  # every rank saw the same numbers
    numbers = {r: out["allreduce"][1]["data"]["rank_bandwidth_gbps"]
               for r, out in results.items()}
    assert flag_slow(numbers, FRACTION) == []


@pytest.mark.e2e
def test_a_slowed_rank_is_the_one_flagged(tmp_path: Path) -> None:
    ranks = launch(tmp_path, "slow", 3, [0, 1, 2], env={SLOW_RANK_ENV: "1:0.1"},
                   perf={"size_mib": 1.0, "iters": 3, "warmup": 1, "slow_fraction": FRACTION},
                   budgets={"allreduce_connection": 60.0, "allreduce_performance": 60.0})
    wait_all([ranks])
    perf = {r.rank: by_type(r.result()["allreduce"])["allreduce_performance"] for r in ranks}
    numbers = {rank: p["data"]["rank_bandwidth_gbps"] for rank, p in perf.items()}
    assert flag_slow(numbers, FRACTION) == [1], numbers
    assert all(numbers[1] < 0.2 * numbers[r] for r in (0, 2)), numbers  # by far the slowest
    assert all(p["data"]["slow_ranks"] == [1] for p in perf.values())
    assert perf[1]["status"] == "fail" and "rank 1 is slow" in perf[1]["detail"]
    assert perf[1]["data"]["slow_hook_s"] == 0.1
    assert perf[0]["status"] == perf[2]["status"] == "pass", (perf[0], perf[2])
    assert perf[0]["data"]["slow_hook_s"] == 0.0


# The scenarios below measure no bandwidth, so they run at the same time (the cold torch imports
# overlap), started once by this fixture after the performance tests above have finished.
REUSE_CODE = r"""
import json, sys, time
import aegis_flow.steps.collective as c
rank, rendezvous = int(sys.argv[1]), sys.argv[2]
if rank == 0:  # hold the old store open 1.5 s past the end of a check
    teardown = c._teardown
    def held(s):
        store = s.store
        teardown(s)
        time.sleep(1.5)
        del store
    c._teardown = held
out = [c.check_health(world_size=2, rank=rank, rendezvous=rendezvous, budget=30.0).to_dict()
       for _ in range(2)]
print("RESULT " + json.dumps({"health": out}), flush=True)
"""
JOIN_BUDGET = 3.0
ABANDON_BUDGET = 1.5


@dataclass
class Background:
    no_2: list[Rank]  # world 3, ranks 0 and 1 started: rank 2 never joins
    no_0: list[Rank]  # world 3, ranks 1 and 2 started: rank 0 (the store) never joins
    abandon: list[Rank]  # rank 1 sleeps 3 s in its send, the performance budget is 1.5 s
    reuse: list[Rank]  # two health checks on one port, rank 0's old store lingering


def launch_reuse(tmp: Path) -> list[Rank]:
    rendezvous = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop(SLOW_RANK_ENV, None)
    ranks = []
    for r in (0, 1):
        log = tmp / f"reuse-rank{r}.log"
        with log.open("wb") as fh:
            ranks.append(reaped(Rank(r, subprocess.Popen(
                [sys.executable, "-c", REUSE_CODE, str(r), rendezvous], stdout=fh,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
                start_new_session=True), log)))
    return ranks


@pytest.fixture(scope="module")
def background(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    tmp = tmp_path_factory.mktemp("collective")
    join = {"allreduce_connection": JOIN_BUDGET, "allreduce_performance": 30.0}
    bg = Background(
        no_2=launch(tmp, "no2", 3, [0, 1], budgets=join),
        no_0=launch(tmp, "no0", 3, [1, 2], budgets=join),
        abandon=launch(tmp, "abandon", 2, [0, 1], env={SLOW_RANK_ENV: "1:3"},
                       perf={"size_mib": 0.25, "iters": 1, "warmup": 1}, hard_exit=True,
                       budgets={"allreduce_connection": 60.0,
                                "allreduce_performance": ABANDON_BUDGET}),
        reuse=launch_reuse(tmp))
    try:
        yield bg
    finally:
        for r in [*bg.no_2, *bg.no_0, *bg.abandon, *bg.reuse]:
            kill(r)


@pytest.mark.e2e
def test_a_rank_that_never_joins_times_out_within_the_budget(background: Background) -> None:
    """Two of three ranks start, twice over: rank 2 missing, and rank 0 (the store) missing."""
    wait_all([background.no_2, background.no_0])  # fails the test if any had to be killed
    for group, missing in ((background.no_2, [2]), (background.no_0, [0])):
        for r in group:
            out = r.result()
            conn, perf = (by_type(out["allreduce"])[t] for t in
                          ("allreduce_connection", "allreduce_performance"))
            assert conn["status"] in ("timeout", "fail") and not conn["passed"], conn
            assert conn["duration"] <= JOIN_BUDGET + 0.5, conn
            assert conn["data"]["missing_ranks"] == missing, conn
            assert "abandoned_thread" not in conn["data"], conn  # our own waits ended first
            assert perf["status"] == "not_applicable" and "not measured" in perf["detail"]
            assert out["returned"] - out["started"] <= JOIN_BUDGET + 2.0
            assert r.ended is not None and r.ended - out["started"] <= JOIN_BUDGET + 15.0
            assert r.proc.returncode == 0 and out["pg_after"] is False


@pytest.mark.e2e
def test_a_probe_past_its_budget_is_abandoned_on_time(background: Background) -> None:
    """Rank 1 sleeps 3 s in its send, the performance budget is 1.5 s: both ranks report a
    timeout on time, with the thread abandoned inside the measurement; the caller then ends the
    process with os._exit (a normal interpreter exit can abort in torch's destructors)."""
    wait_all([background.abandon])
    for r in background.abandon:
        out = r.result()
        conn, perf = (by_type(out["allreduce"])[t] for t in
                      ("allreduce_connection", "allreduce_performance"))
        assert conn["status"] == "pass", conn
        assert perf["status"] == "timeout" and perf["data"]["abandoned_thread"] is True, perf
        assert perf["duration"] <= ABANDON_BUDGET + 0.5, perf
        assert r.proc.returncode == 0


@pytest.mark.e2e
def test_a_port_reused_at_once_rejoins_rank_0s_new_store(background: Background) -> None:
    wait_all([background.reuse])
    rank0, rank1 = background.reuse
    first, second = rank1.result()["health"]
    assert first["status"] == second["status"] == "pass", (first, second)
    assert second["data"].get("rejoins", 0) >= 1, second  # it did reach the old store first
    assert [h["status"] for h in rank0.result()["health"]] == ["pass", "pass"]


def test_in_process_single_rank_then_training_can_start(tmp_path: Path) -> None:
    """World size 1 in this very process: both checks pass and leave no process group, so a
    training process group can be created afterwards; an existing one is refused, untouched."""
    dist = pytest.importorskip("torch.distributed")
    results = check_allreduce(world_size=1, rank=0, rendezvous=f"127.0.0.1:{free_port()}",
                              budgets={"allreduce_connection": 30.0,
                                       "allreduce_performance": 30.0},
                              size_mib=0.25, iters=2, warmup=1)
    assert [r.status for r in results] == [CheckStatus.PASS] * 2, results
    assert results[1].data["busbw_gbps"] == 0.0 and results[1].data["slow_ranks"] == []
    assert results[1].data["rank_bandwidth_gbps"] == results[1].data["algbw_gbps"] > 0
    health = check_health(world_size=1, rank=0, rendezvous=f"tcp://127.0.0.1:{free_port()}",
                          budget=30.0)
    assert health.status is CheckStatus.PASS, health.detail
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            world_size=1, rank=0)
    try:
        refused = check_health(world_size=1, rank=0, rendezvous=f"127.0.0.1:{free_port()}",
                               budget=10.0)
        assert refused.status is CheckStatus.FAIL
        assert "already exists" in refused.detail
        assert dist.is_initialized()  # the caller's process group is left alone
    finally:
        dist.destroy_process_group()


def test_bad_rendezvous_and_arguments() -> None:
    conn, perf = check_allreduce(world_size=2, rank=0, rendezvous="no-port-here", budgets={})
    assert conn.status is CheckStatus.FAIL and "HOST:PORT" in conn.detail
    assert perf.status is CheckStatus.NOT_APPLICABLE and "not measured" in perf.detail
    with pytest.raises(ValueError, match="rank must be"):
        check_allreduce(world_size=2, rank=2, rendezvous="h:1", budgets={})
    with pytest.raises(ValueError, match="backend"):
        check_health(world_size=1, rank=0, rendezvous="h:1", backend="mpi")
    with pytest.raises(ValueError, match="iters"):
        check_allreduce(world_size=1, rank=0, rendezvous="h:1", budgets={}, iters=0)


# --- pure helpers -------------------------------------------------------------------------------

def test_flag_slow_uses_the_median_of_the_peers() -> None:
    assert flag_slow({0: 10.0, 1: 9.0, 2: 4.0, 3: 11.0}) == [2]
    assert flag_slow({0: 10.0, 1: 9.0, 2: 5.0, 3: 11.0}) == []  # 5 is not below 0.5 x 10
    assert flag_slow({0: 10.0, 1: 9.0, 2: 5.0, 3: 11.0}, fraction=0.6) == [2]
    # the rank itself is excluded: with itself in, 1.0's median would be 5.5 and 4.0 not slow
    assert flag_slow({0: 1.0, 1: 10.0, 2: 10.0, 3: 1.0}) == [0, 3]
    assert flag_slow({0: 1.0, 1: 10.0}) == [0]  # two ranks: the peer is the median
    assert flag_slow({0: 1.0, 1: 1.9}) == []
    assert flag_slow({7: 0.001}) == [] and flag_slow({}) == []  # no peers, never slow
    assert flag_slow({0: 0.0, 1: 0.0, 2: 0.0}) == []
    assert flag_slow({5: 3.0, 2: 0.1, 9: 3.0}) == [2]  # any rank ids, sorted result
    assert peer_median({0: 1.0, 1: 2.0, 2: 4.0}, 0) == 3.0 and peer_median({0: 1.0}, 0) is None


@pytest.mark.parametrize("bad", [{"fraction": 0.0}, {"fraction": 1.5},
                                 {"fraction": math.nan}])
def test_flag_slow_rejects_a_bad_fraction(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="fraction"):
        flag_slow({0: 1.0, 1: 1.0}, **bad)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_flag_slow_rejects_a_bad_bandwidth(value: float) -> None:
    with pytest.raises(ValueError, match="rank 1"):
        flag_slow({0: 1.0, 1: value})


@pytest.mark.parametrize("n", range(1, 10))
def test_ring_schedule_isolates_every_transfer(n: int) -> None:
    rounds = ring_schedule(n)
    edges = [e for rnd in rounds for e in rnd]
    for rnd in rounds:
        ranks = [r for e in rnd for r in e]
        assert len(ranks) == len(set(ranks))  # nobody in two transfers at once
    expected = {(r, (r + 1) % n) for r in range(n)} if n > 1 else set()
    if n > 2:
        expected |= {(r, (r - 1) % n) for r in range(n)}
    assert sorted(edges) == sorted(expected)
    assert len(rounds) <= 7
    assert ring_schedule(n) == rounds  # deterministic: every rank computes the same


def test_parse_rendezvous_and_slow_rank() -> None:
    assert parse_rendezvous("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_rendezvous("tcp://node-3:7") == ("node-3", 7)
    assert parse_rendezvous("[::1]:29500") == ("::1", 29500)
    for bad in ("host", ":1", "host:x", "host:0", "host:70000", "[::1]"):
        with pytest.raises(ValueError):
            parse_rendezvous(bad)
    assert parse_slow_rank(None) is None and parse_slow_rank("") is None
    assert parse_slow_rank("2:0.5") == (2, 0.5)
    for bad in ("2", "x:1", "-1:1", "1:-2", "1:nan"):
        with pytest.raises(ValueError, match=SLOW_RANK_ENV):
            parse_slow_rank(bad)
