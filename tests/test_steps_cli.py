"""``aegis-flow check`` / ``explain`` through their handlers and as ``python -m``."""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aegis_flow.steps.cli import CheckOptions, add_parsers, main, run_checks

ROOT = Path(__file__).resolve().parent.parent
ALL = ["env", "io", "gpu", "runtime", "rdma", "allreduce_connection", "allreduce_performance",
       "hang"]


def test_check_all_json_prints_every_check_honestly(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-m", "aegis_flow.steps.cli", "check", "all", "--json",
                          "--dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    by_type = {r["check_type"]: r for r in results}
    assert [r["check_type"] for r in results] == ALL
    assert {k: by_type[k]["status"] for k in ALL} == {
        "env": "pass", "io": "pass", "gpu": "not_applicable", "runtime": "pass",
        "rdma": "not_applicable", "allreduce_connection": "not_applicable",
        "allreduce_performance": "not_applicable", "hang": "not_applicable"}
    assert "run inside a job" in by_type["allreduce_connection"]["detail"]
    # a cold process: torch's import is timed apart, the runtime probe stays within its 1 s
    runtime = by_type["runtime"]
    assert runtime["data"]["warm"] is False and runtime["data"]["import_s"] > 0
    assert runtime["duration"] < runtime["budget"] == 1.0
    assert not by_type["gpu"]["passed"]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_handler_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("check", "io", "--dir", str(tmp_path))
    assert args.handler(args) == 0
    assert "PASS" in capsys.readouterr().out
    args = parse("check", "io", "--dir", str(tmp_path / "missing"), "--json")
    assert args.handler(args) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert result["status"] == "fail"


def test_budget_override_forces_a_timeout(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "io", "--dir", str(tmp_path), "--budget", "io=0.0001", "--json"]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert (result["status"], result["budget"]) == ("timeout", 0.0001)


def test_bad_budget_is_rejected_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("check", "io", "--budget", "disk=3")
    assert "CHECK=SECONDS" in capsys.readouterr().err


def test_rdma_and_gpu_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("3: Disabled\n")
    assert main(["check", "rdma", "--sysfs-root", str(tmp_path)]) == 1
    assert "mlx5_0/1" in capsys.readouterr().out
    assert main(["check", "gpu", "--expect-gpus", "0"]) == 0  # nothing to check here


def test_the_sysfs_root_comes_from_the_environment(tmp_path: Path) -> None:
    """AEGIS_SYSFS_ROOT (how a worker on a node gets its root) is the default; the flag wins."""
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("3: Disabled\n")
    env = {"PATH": "/usr/bin:/bin", "AEGIS_SYSFS_ROOT": str(tmp_path)}
    cmd = [sys.executable, "-m", "aegis_flow.steps.cli", "check", "rdma", "--json"]
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert bad.returncode == 1, bad.stderr
    [r] = json.loads(bad.stdout)
    assert r["status"] == "fail" and "mlx5_0/1" in r["detail"]
    empty = tmp_path / "empty"
    empty.mkdir()
    flag = subprocess.run([*cmd, "--sysfs-root", str(empty)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert flag.returncode == 0 and json.loads(flag.stdout)[0]["status"] == "not_applicable"


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1M", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_check_on_a_read_only_dir_exits_1(tmp_path: Path) -> None:
    with read_only(tmp_path / "ro") as d:
        [r] = run_checks("io", CheckOptions(directory=str(d)))
        assert r.failed and r.data["errno"] == "EROFS"


def test_collectives_without_a_job_and_a_missing_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    results = run_checks("allreduce")
    assert [r.status.value for r in results] == ["not_applicable"] * 2
    job = CheckOptions(world_size=2, rank=0, rendezvous="tcp://127.0.0.1:1")
    monkeypatch.setitem(sys.modules, "aegis_flow.steps.collective", None)  # a build without it
    results = run_checks("allreduce", job)
    assert len(results) == 2 and not any(r.failed for r in results)
    assert all("not available" in r.detail for r in results)
    assert run_checks("hang")[0].status.value == "not_applicable"
    with pytest.raises(ValueError, match="unknown check"):
        run_checks("disk")


def test_explain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain"]) == 0
    text = capsys.readouterr().out
    assert "D10" in text and "nccl_timeout" in text and "Escalation" in text
    extra = tmp_path / "c.toml"
    extra.write_text("[[rule]]\ncode = 'my_cause'\nclass = 'user'\npatterns = ['x']\n")
    assert main(["explain", "--causes", str(extra)]) == 0
    assert "my_cause" in capsys.readouterr().out
    extra.write_text("[[rule]]\ncode = 'my_cause'\n")
    assert main(["explain", "--causes", str(extra)]) == 2
    assert "'class' must be one of" in capsys.readouterr().err


def test_brief_is_one_line_unless_a_check_did_not_pass() -> None:
    from aegis_flow.steps.base import CheckResult, CheckStatus
    from aegis_flow.steps.cli import brief

    def res(kind: str, status: CheckStatus, took: float, detail: str = "") -> CheckResult:
        return CheckResult(kind, status is CheckStatus.PASS, status, detail, took, None,
                           0.0, {})

    quiet = [res("env", CheckStatus.PASS, 0.01), res("io", CheckStatus.PASS, 0.2),
             res("gpu", CheckStatus.NOT_APPLICABLE, 0.0),
             res("rdma", CheckStatus.NOT_APPLICABLE, 0.0)]
    assert brief(quiet) == ("4 checks in 0.2 s: 2 passed, 2 not applicable (gpu, rdma)")
    loud = [*quiet, res("runtime", CheckStatus.FAIL, 0.5, "runtime: no torch")]
    lines = brief(loud).splitlines()
    assert len(lines) == 2 and lines[0].startswith("FAIL") and "runtime: no torch" in lines[0]
    assert lines[1] == ("5 checks in 0.7 s: 2 passed, 2 not applicable (gpu, rdma), 1 did not "
                        "pass (runtime)")


def test_the_brief_flag_prints_the_summary_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "aegis_flow.steps.cli", "check", "io,rdma",
                          "--dir", str(tmp_path), "--brief", "--io-size-mib", "1",
                          "--sysfs-root", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith("2 checks in "), out.stdout
    assert out.stdout.rstrip().endswith("1 passed, 1 not applicable (rdma)"), out.stdout
