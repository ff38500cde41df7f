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
