"""bench/scale.py at N=256 with a short steady state: the harness runs the real master over a
real nats-server, and measures every scenario (a master that never answered fails it).

Bounds are generous (a loaded 2-core machine): this checks the harness works and the master
keeps up with 256 workers, not how fast it is (docs/benchmarks.md has the numbers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def test_scale_harness_at_256_workers(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--workers", "256", "--steady", "3",
         "--timeout", "45", "--json", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [r] = json.loads(out.read_text())
    assert r["ok"] and not r["error"], r
    assert r["n"] == 256 and r["connections"] == 1
    # 1. every worker acked and got the bootcheck order; the round ended with the run order
    assert 0 < r["ack_fanin_s"] < 60
    assert 0 < r["bootcheck_round_s"] < 60
    # 2. heartbeats flowed (256 workers every 0.5 s ≈ 512/s) and the processes were measured
    assert r["steady_s"] >= 3
    assert 256 < r["msgs_per_s"] < 2000
    assert r["master_cpu_pct"] > 0 and r["master_rss_mib"] > 0
    assert r["nats_rss_mib"] > 0 and r["nats_cpu_pct"] >= 0
    # the server's own counts (/varz): at least the heartbeats went in, and out to the master
    assert r["nats_in_per_s"] >= 0.8 * r["msgs_per_s"] and r["nats_out_per_s"] > 256
    assert r["unexpected_orders"] == []
    # heartbeats carry what a worker of 8 GPUs sends; most go as keep-alives (a full one every
    # 5 s); /metrics was read (as Prometheus would) and holds every rank's series
    assert r["keepalive_share"] > 0.5, r["keepalive_share"]
    assert r["scrapes"] >= 1 and r["scrape_bytes"] > 256 * 2000
    # 3. the fault: every worker held the troubleshoot order, then the restart
    assert r["next_order"] == "troubleshoot"
    assert 0 < r["fault_p50_s"] <= r["fault_p99_s"] <= r["fault_max_s"] < 30
    assert 0 < r["troubleshoot_round_s"] and 0 < r["fault_to_restart_s"] < 60
    # the store: what the master put (the harness listens on the bucket's subjects). One
    # round writes each rank's record a few times, not the whole document per report: the old
    # layout wrote ~48 MiB for this fault at N=256, O(N²); this bound is ~10× what it is now.
    assert r["puts_connect"] > 0 and r["puts_fault"] > 0 and r["saves_fault"] > 0
    assert 0 < r["bytes_fault"] < 256 * 8 * 1024, r["bytes_fault"]
    assert r["puts_steady"] == 0  # a steady state with nothing new writes nothing
    assert r["seq_end"] >= 6  # bootcheck, run, troubleshoot, run, hold, troubleshoot, run
    # 4. a rank's node is gone: found lost after the lost timeout (3 s), held, replaced
    assert 0 < r["node_lost_s"] < 30 and 0 < r["replace_to_run_s"] < 60
    # 5. a master killed with SIGKILL: the next one rebuilt the very status from the store
    assert r["resume_same_status"] is True and r["resume_orders"] == []
    assert 0 < r["resume_ready_s"] < 30


def test_scale_harness_with_credentials_at_128_workers(tmp_path: Path) -> None:
    """--creds: operator mode; every worker fetched its own credentials from the master over
    gRPC and connected with them on a connection of its own, the replacement got a new grant
    once its rank was lost, and all five scenarios ran."""
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--workers", "128", "--steady", "3",
         "--timeout", "45", "--creds", "--renew-window", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [r] = json.loads(out.read_text())
    assert r["ok"] and not r["error"], r
    assert r["creds"] is True and r["anonymous_refused"] is True
    assert r["n"] == 128 and r["connections"] == 128  # one per worker: its own user
    assert 0 < r["mint_p50_s"] <= r["mint_p99_s"] and 0 < r["mint_s"] < 60
    assert r["mint_master_cpu_s"] > 0
    assert 0 < r["replace_mint_s"] < 30  # the new pod of rank 1: a new key, granted
    assert 128 < r["msgs_per_s"] < 1000 and r["unexpected_orders"] == []
    # 2b. every worker renewed its JWT (spread over 3 s) and the server holds all 128 on it;
    # nobody was judged lost while reconnecting
    assert r["renew_connected"] == 128 and r["renew_orders"] == []
    assert r["renew_window_s"] == 3 and r["renew_s"] >= 2  # spread over the window
    assert 0 < r["renew_p50_s"] <= r["renew_p99_s"] and 0 < r["renew_s"] < 60
    assert len(r["renew_cpu_s"]) == 3
    assert r["next_order"] == "troubleshoot" and 0 < r["fault_p99_s"] < 30
    assert 0 < r["node_lost_s"] < 30 and 0 < r["replace_to_run_s"] < 60
    assert r["resume_same_status"] is True and r["resume_orders"] == []
    # the tables name the grants
    assert "grants (s)" in proc.stdout and "replacement's grant (s)" in proc.stdout
    assert "renewals over (s)" in proc.stdout and "first→all back (s)" in proc.stdout


def test_scale_harness_fails_a_renewal_that_keeps_the_old_jwt(tmp_path: Path) -> None:
    """The planted error: workers whose renewal never reconnects stay on their old JWT; the
    harness reads the server's own connections (/connz) and fails the run, naming it."""
    script = ("import sys; sys.path.insert(0, 'bench')\n"
              "import nats.aio.client as c\n"
              "async def keep_the_old_connection(self): pass\n"
              "c.Client.force_reconnect = keep_the_old_connection\n"
              "import scale; sys.exit(scale.main(sys.argv[1:]))\n")
    proc = subprocess.run(
        [sys.executable, "-c", script, "--workers", "32", "--steady", "2", "--timeout", "45",
         "--creds", "--renew-window", "0"], capture_output=True, text=True, timeout=180,
        cwd=ROOT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "after renewing, 0 of 32 workers are connected with their new JWT" in proc.stderr


def test_scale_harness_refuses_bad_arguments() -> None:
    for bad in (["--workers", "1"], ["--workers", "a,b"], ["--mint-threads", "0"]):
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), *bad],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "Traceback" not in proc.stderr and "error:" in proc.stderr, proc.stderr
