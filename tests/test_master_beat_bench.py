"""bench/master_beat.py runs: the real master fed a whole job's reports in-process, measured
in child processes, side by side with another checkout (here the same one). It checks the
benchmark works and its table has every row, not how fast anything is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_report_cost_benchmark_runs_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "beat.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "master_beat.py"), "--workers", "64",
         "--trials", "1", "--rounds", "2", "--compare", str(ROOT), "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("64", "this"), ("64", "compare")], proc.stdout
    for row in rows:  # ack, FINISH and heartbeat µs: measured, positive
        assert all(float(x) > 0 for x in row[2:5]), row
    table = out.read_text()
    assert "| 64 | this |" in table and "| 64 | compare |" in table
