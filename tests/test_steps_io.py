"""The io check on real storage faults: a full tmpfs (ENOSPC) and a read-only mount (EROFS).

Root ignores permission bits (DESIGN.md §8), so the faults are real mounts, not chmod.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from aegis_flow.steps.base import CheckStatus
from aegis_flow.steps.io import check_io, probe_io


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()}); "
                    "the io fault tests need root with CAP_SYS_ADMIN")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> None:
    """Write until the file system is full."""
    with open(directory / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def test_healthy_directory_passes_with_throughput(tmp_path: Path) -> None:
    r = check_io(tmp_path)
    assert r.status is CheckStatus.PASS and r.passed, r.detail
    assert r.budget == 30.0
    assert r.data["write_mbps"] > 0 and r.data["read_mbps"] > 0
    assert "MB/s" in r.detail and r.data["bytes"] == 8 * 1024 * 1024
    assert list(tmp_path.iterdir()) == []  # the scratch file is gone


def test_size_is_configurable(tmp_path: Path) -> None:
    r = check_io(tmp_path, size_mib=0.25)
    assert r.passed and r.data["bytes"] == 256 * 1024


def test_full_tmpfs_fails_with_enospc(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "full", "size=1M") as d:
        fill(d)
        r = check_io(d)
        assert r.status is CheckStatus.FAIL and not r.passed
        assert r.data["errno"] == "ENOSPC" and "ENOSPC" in r.detail, r.detail
        assert [p.name for p in d.iterdir()] == ["filler"]  # no scratch file left behind


def test_read_only_mount_fails_with_erofs(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "ro,size=1M") as d:
        r = check_io(d)
        assert r.status is CheckStatus.FAIL
        assert r.data["errno"] == "EROFS" and r.data["step"] == "creating", r.detail


def test_a_tiny_budget_is_a_timeout(tmp_path: Path) -> None:
    r = check_io(tmp_path, budget=0.0001)
    assert r.status is CheckStatus.TIMEOUT and r.failed and r.budget == 0.0001


def test_missing_directory_and_slow_storage_fail(tmp_path: Path) -> None:
    missing = probe_io(tmp_path / "nope")
    assert missing.status is CheckStatus.FAIL and "not a directory" in missing.detail
    slow = probe_io(tmp_path, size_mib=0.25, min_mbps=1e12)
    assert slow.status is CheckStatus.FAIL and "too slow" in slow.detail
