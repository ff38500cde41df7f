"""End to end: the real checks pick the recovery branch (no injected check result).

A synthetic sysfs tree stands for one node's RDMA NIC; ``--node-env`` gives it to that node
only (``AEGIS_SYSFS_ROOT``), so the replacement node that a quarantine brings does not have it —
as a pod rescheduled onto another machine would not. Real nats-server, master, supervisors,
check processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.jobs import ROOT, Job, assert_nothing_left, retries

pytestmark = pytest.mark.e2e

NIC_DOWN = str(ROOT / "tests" / "fixtures" / "nic_down.py")
FAST = ["--lost-timeout", "3", "--quiet"]
# checks forked from a pre-warmed interpreter that has imported torch (as in production)
WARM = {"AEGIS_PRELOAD": "torch"}


def sysfs(root: Path, state: str, phys: str) -> Path:
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "phys_state").write_text(phys + "\n")
    return root


def test_real_rdma_checks_quarantine_only_the_broken_nodes(tmp_path: Path) -> None:
    """Two broken nodes, each found by the real rdma check (no injected result):

    1. rank 1's first node has a DOWN port: bootcheck fails (T3) → worker 1 exits node-fault,
       ``local-node-1`` lands in errorNodes, rank 1 starts again on ``local-node-1-1``;
    2. that node passes bootcheck, then its port goes DOWN mid-run and its training fails
       (T5); the troubleshoot's rdma check fails → diagnosis hardware (D1, L3) → T10:
       ``local-node-1-1`` is quarantined too, rank 1 moves to ``local-node-1-2`` (no synthetic
       tree there: a healthy node), every check passes (T9) and the job finishes.
    """
    bad = sysfs(tmp_path / "sys-node-1", "1: DOWN", "3: Disabled")
    flaky = sysfs(tmp_path / "sys-node-1-1", "4: ACTIVE", "5: LinkUp")
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2", *FAST,
                         "--node-env", f"local-node-1:AEGIS_SYSFS_ROOT={bad}",
                         "--node-env", f"local-node-1-1:AEGIS_SYSFS_ROOT={flaky}"],
              [sys.executable, NIC_DOWN, "30", str(tmp_path)], env=WARM)
    assert job.wait(timeout=180) == 0, job.output
    doc = job.status()
    events = "\n".join(doc["events"])
    assert doc["status"]["phase"] == "Succeed", events
    assert doc["status"]["error_nodes"] == ["local-node-1", "local-node-1-1"]
    assert retries(doc) == (1, 1)  # the training failure counted; the replacements did not
    assert job.output.count("worker 1 ended (exit code 70)") == 2
    assert doc["status"]["workers"][1]["node"] == "local-node-1-2"
    assert "injected" not in job.output  # the real checks decided
    t3 = [e for e in doc["events"] if "T3: rank 1" in e]
    t10 = [e for e in doc["events"] if "T10: rank 1" in e]
    assert t3 and "rdma" in t3[0] and "mlx5_0/1" in t3[0], events
    assert t10 and "L3" in t10[0] and "rdma" in t10[0] and "mlx5_0/1" in t10[0], events
    assert "T9:" in events
    assert "link down" in job.output
    assert_nothing_left(str(tmp_path))


@pytest.mark.parametrize("args,message", [
    (["--node-env", "node-9:X=1"], "unknown node 'node-9'"),
    (["--node-env", "local-node-5:X=1"], "rank 5, which does not exist"),
    (["--node-env", "local-node-1:1X=1"], "not an environment variable name"),
    (["--node-env", "local-node-1"], "expected NODE:NAME=VALUE"),
    (["--check-budget", "io=0"], "must be more than 0 seconds"),
    (["--check-budget", "disk=3"], "expected CHECK=SECONDS"),
    (["--hang-after", "10", "--hang-quit-after", "5"], "must be shorter than hang-quit-after"),
    (["--hang-after", "1000"], "hang-quit-after (900 s, the default)"),
    (["--workers", "0"], "workers (0) must be at least 1"),
    (["--lost-timeout", "-1"], "the lost timeout (-1 s) must be more than 0 seconds"),
    (["--hang-after", "-1"], "must be more than 0 seconds"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_bad_run_settings_are_clear_errors(tmp_path: Path, args: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from aegis_flow import cli

    try:
        code = cli.main(["run", "--workers", "2", "--state-dir", str(tmp_path), *args,
                         "--", "true"])
    except SystemExit as exc:  # argparse's own check of a value's type
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "job").exists()  # nothing was started


def test_run_help_documents_the_new_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from aegis_flow import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    for flag in ("--hang-after", "--hang-quit-after", "--check-budget", "--node-env"):
        assert flag in out


def test_hang_thresholds_reach_the_supervisors(tmp_path: Path) -> None:
    """--hang-after/--hang-quit-after for real: a silent rank is marked hung (T13), then the
    job is stopped, troubleshot and restarted (T14, counted); with --max-retry 0 that fails
    the job. The default thresholds (300/900 s) would not fire within this test."""
    silent = [sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path)]
    job = Job(tmp_path, ["--workers", "1", "--max-retry", "0", *FAST, "--no-prewarm",
                         "--hang-after", "1", "--hang-quit-after", "2.5"], silent)
    assert job.wait(timeout=120) == 1, job.output
    doc = job.status()
    events = "\n".join(doc["events"])
    assert "T13: rank 0 looks hung" in events
    assert "T14+T11: rank 0 failed (hang)" in events, events
    assert doc["status"]["phase"] == "Failed"
    assert retries(doc) == (1,)
    assert_nothing_left(str(tmp_path))


def test_run_settings_reach_the_workers(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI → RunConfig → each supervisor's argv and environment (no processes started)."""
    from aegis_flow import cli
    from aegis_flow.local import runner

    seen: list[runner.RunConfig] = []

    def run_job(cfg: runner.RunConfig) -> int:
        seen.append(cfg)
        return 0

    monkeypatch.setattr(runner, "run_job", run_job)
    (tmp_path / "train.py").write_text("")  # a script that exists: the CLI checks it does
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--workers", "2", "--state-dir", str(tmp_path),
                     "--hang-after", "7", "--check-budget", "io=5",
                     "--check-budget", "gpu=2.5",
                     "--node-env", "local-node-1:AEGIS_SYSFS_ROOT=/mnt/host-sys",
                     "--", "python", "train.py"]) == 0
    cfg = seen[0]
    job = runner.LocalJob(cfg)
    args0 = job._worker_args(0)
    assert args0[args0.index("--hang-after") + 1] == "7.0"
    assert args0[args0.index("--hang-quit-after") + 1] == "900.0"  # default, kept >= 7
    env0, env1 = job._worker_env(0), job._worker_env(1)
    assert env0["AEGIS_CHECK_BUDGETS"] == env1["AEGIS_CHECK_BUDGETS"] == "io=5,gpu=2.5"
    assert env1["AEGIS_SYSFS_ROOT"] == "/mnt/host-sys"
    assert "AEGIS_SYSFS_ROOT" not in env0 or env0["AEGIS_SYSFS_ROOT"] != "/mnt/host-sys"
    job.node_gen[1] = 1  # after a node-fault replacement: a new node without that setting
    assert job._worker_env(1).get("AEGIS_SYSFS_ROOT") != "/mnt/host-sys"
    assert "--hang-after" not in runner.LocalJob(runner.RunConfig(("x",), 1))._worker_args(0)
