"""Continuous resource monitoring with real processes (issue 19).

Real ``aegis-flow run`` over a real DDP training (``tests/fixtures/quiet_ddp.py``, gloo on
CPU): every supervisor samples its training process (CPU, RSS) and its node's network into
each heartbeat (``supervisor/resources.py``); the master exports them on ``/metrics`` with the
job and rank labels and ``aegis-flow status`` shows them while the job runs. No GPU here: the
GPU gauges are absent (the sampler leaves out what NVML cannot give), and that is asserted too.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_observability_e2e import samples, value

from tests.jobs import Job, assert_nothing_left, http_get

pytestmark = pytest.mark.e2e

FIXTURE = str(Path(__file__).resolve().parent / "fixtures" / "quiet_ddp.py")
#: CPU % a training rank of quiet_ddp.py shows at least: it sleeps 20 ms a step and computes
#: ~2 ms (45 steps/s, 6-8 % of a core here; a rank that only sleeps samples 0.0)
BUSY = 2.0


def test_resource_metrics_reach_metrics_and_status_during_a_real_job(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "0"], ["python", FIXTURE, "20"],
              env={"AEGIS_PRELOAD": "torch"})
    deadline = time.monotonic() + 120
    scrape: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    port_file = tmp_path / "job" / "metrics.port"
    while time.monotonic() < deadline and job.proc.poll() is None:
        if port_file.exists():
            try:
                code, body = http_get(f"http://127.0.0.1:{port_file.read_text().strip()}/metrics")
            except OSError:  # the master went away between two scrapes: asserted below
                break
            if code == 200:
                scrape = samples(body.decode())
                if all(value(scrape, "aegis_worker_cpu_percent", rank=str(r)) > BUSY
                       for r in (0, 1)):
                    break
        time.sleep(0.5)
    assert job.proc.poll() is None, f"the job ended before both ranks showed CPU: {scrape}"
    for r in (0, 1):  # both ranks train: a process that computes, of hundreds of MiB
        assert value(scrape, "aegis_worker_cpu_percent", rank=str(r),
                     aegis_job="job") > BUSY, scrape
        assert value(scrape, "aegis_worker_rss_bytes", rank=str(r)) > 20 * 2**20
    assert any(n == "aegis_worker_network_bytes_per_second" for n, _ in scrape)
    assert not any(n.startswith("aegis_gpu_") and n != "aegis_gpu_xid_events_total"
                   for n, _ in scrape)  # no NVML here: nothing made up
    status = subprocess.run([sys.executable, "-m", "aegis_flow.cli", "status", "job",
                             "--state-dir", str(tmp_path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert status.returncode == 0, status.stderr
    assert "now (each rank's last heartbeat):" in status.stdout, status.stdout
    shown = status.stdout.split("now (each rank's last heartbeat):")[1]
    assert "   0  cpu " in shown and "   1  cpu " in shown and " MiB" in shown, shown
    assert job.wait(180) == 0, job.output
    assert_nothing_left(str(tmp_path))
