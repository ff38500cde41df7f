"""``bench/gpu_check.py`` on its CPU path (no GPU on these machines): the same steps with gloo.

It must run every step for real and report it: the checks (gpu not applicable without a
driver, runtime passing), the collective bootcheck of 2 processes with both collectives
verified, and a real ``aegis-flow run --workers 1 --nproc-per-node 2`` whose killed rank comes
back, with the recovery time and the restarted ranks' init cost in the table.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs import assert_nothing_left

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_check_runs_every_step_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"),
                           "--cpu-ranks", "2", "--steps", "150", "--out", str(out)],
                          capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no GPU: 2 CPU ranks (gloo)" in done.stderr
    table = out.read_text()
    assert re.search(r"\| check gpu \| not_applicable \|", table), table
    assert re.search(r"\| check runtime \| pass \|", table), table
    assert re.search(r"\| collective bootcheck \| pass \| .* \| 2 ranks, gloo: all_reduce \+ "
                     r"all_gather verified", table), table
    back = re.search(r"\| recovery \(SIGKILL of one rank\) \| pass \| ([\d.]+) s \|", table)
    assert back is not None and 0 < float(back.group(1)) < 60, table
    assert re.search(r"init inside it .* \| ([\d.]+) s \|", table), table
    assert_nothing_left("aegis-gpu-check-")


def test_only_a_slow_flag_with_every_collective_verified_is_measured_again() -> None:
    """CI: the 2 CPU ranks of the collective bootcheck once flagged rank 1 slow (the cores are
    shared); the bench measures again then, and only then."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_check import only_slow

    ok = {"check_type": "allreduce_connection", "status": "pass"}
    slow = {"check_type": "allreduce_performance", "status": "fail", "data": {"slow_ranks": [1]}}
    assert only_slow([ok, slow, {**slow, "status": "pass"}]) == [1]
    assert only_slow([ok, {**ok, "status": "pass"}]) == []  # nothing failed
    assert only_slow([{**ok, "status": "fail"}, slow]) == []  # a collective failed too
    assert only_slow([{"check_type": "allreduce_performance", "status": "timeout"}]) == []
