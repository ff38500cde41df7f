"""The rehearsal's container shim builds each container's root from the host's; the host
changes meanwhile (other processes' temporary files under a shadowed /tmp). In-process, with
the mounts recorded instead of made."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from aegis_flow.argo.rehearse import shim


def _record_mounts(monkeypatch: pytest.MonkeyPatch, vanish: Path | None) -> list[str]:
    made: list[str] = []

    def mount(src: str, dst: str, flags: int) -> None:
        if vanish is not None and src == str(vanish):  # removed between listdir and mount
            os.rmdir(src)
            raise OSError(errno.ENOENT, f"mount {src} on {dst}: No such file or directory")
        made.append(src)

    monkeypatch.setattr(shim, "_mount", mount)
    monkeypatch.setattr(shim, "_overlay", lambda host, target, layers: False)
    return made


def test_an_entry_gone_from_the_host_meanwhile_is_left_out(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    host = tmp_path / "host"
    (host / "stays").mkdir(parents=True)
    (host / "goes").mkdir()
    made = _record_mounts(monkeypatch, host / "goes")
    shim._populate(str(host), str(tmp_path / "root"), set(), set(), str(tmp_path / "layers"))
    assert made == [str(host / "stays")] * 2  # bound, then remounted read-only


def test_a_mount_that_fails_for_an_entry_still_there_is_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = tmp_path / "host"
    (host / "stays").mkdir(parents=True)

    def refuse(src: str, dst: str, flags: int) -> None:
        raise OSError(errno.EPERM, f"mount {src} on {dst}: Operation not permitted")

    monkeypatch.setattr(shim, "_mount", refuse)
    monkeypatch.setattr(shim, "_overlay", lambda host, target, layers: False)
    with pytest.raises(OSError, match="Operation not permitted"):
        shim._populate(str(host), str(tmp_path / "root"), set(), set(),
                       str(tmp_path / "layers"))
