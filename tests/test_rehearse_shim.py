"""The rehearsal's container shim builds each container's root from the host's; the host
changes meanwhile (other processes' temporary files under a shadowed /tmp). In-process, with
the mounts recorded instead of made."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from aegis_flow.argo.rehearse import shim


def _mounts(monkeypatch: pytest.MonkeyPatch, mount: Callable[[str, str, int], None]) -> None:
    """``mount`` in place of the real mount(2); overlayfs refused, so every directory is bound."""
    monkeypatch.setattr(shim, "_mount", mount)
    monkeypatch.setattr(shim, "_overlay", lambda host, target, layers: False)


def test_an_entry_gone_from_the_host_meanwhile_is_left_out(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    host = tmp_path / "host"
    (host / "stays").mkdir(parents=True)
    (host / "goes").mkdir()
    made: list[str] = []

    def mount(src: str, dst: str, flags: int) -> None:
        if src == str(host / "goes"):  # removed between the listing and its mount
            os.rmdir(src)
            raise OSError(errno.ENOENT, f"mount {src} on {dst}: No such file or directory")
        made.append(src)

    _mounts(monkeypatch, mount)
    shim._populate(str(host), str(tmp_path / "root"), set(), set(), str(tmp_path / "layers"))
    assert made == [str(host / "stays")] * 2  # bound, then remounted read-only


def test_a_mount_that_fails_for_an_entry_still_there_is_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = tmp_path / "host"
    (host / "stays").mkdir(parents=True)

    def refuse(src: str, dst: str, flags: int) -> None:
        raise OSError(errno.EPERM, f"mount {src} on {dst}: Operation not permitted")

    _mounts(monkeypatch, refuse)
    with pytest.raises(OSError, match="Operation not permitted"):
        shim._populate(str(host), str(tmp_path / "root"), set(), set(),
                       str(tmp_path / "layers"))
