"""The io check: storage read/write works, and is fast enough (its 30 s budget says how fast).

Side effects: :func:`probe_io` writes, fsyncs, reads back and deletes one scratch file
(``.aegis-io-check-*``) in the directory it is given — the job's work or checkpoint directory.
Standard library only.

The read-back tries to bypass the page cache: after the fsync the file's pages are clean, and
``posix_fadvise(DONTNEED)`` drops them, so the read goes to the device where the OS allows it
(``data["cache_dropped"]`` says whether the call was available). An OSError (ENOSPC, EROFS, EIO,
…) is a ``fail`` naming the errno and the step that hit it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from aegis_flow.steps.base import (
    DEFAULT_BUDGETS,
    CheckResult,
    CheckStatus,
    Outcome,
    run_with_budget,
)

MIB = 1024 * 1024
DEFAULT_SIZE_MIB = 8.0


def _drop_cache(fd: int) -> bool:
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return False
    try:
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    return True


def _mbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / MIB / max(seconds, 1e-9), 1)


def filesystem_of(path: str | os.PathLike[str], *,
                  mountinfo: str = "/proc/self/mountinfo") -> str:
    """The filesystem that holds ``path``: ``"<fstype> <source> <mount point>"`` of the
    deepest mount containing it (``/proc/self/mountinfo``), or "" where that cannot be read.
    Ranks whose io check fails on the same filesystem with the same error share the fault."""
    real = os.path.realpath(path)
    best: tuple[int, str] = (-1, "")
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        mount = fields[4].encode().decode("unicode_escape")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > best[0]:
            best = (len(mount), f"{tail[0]} {tail[1]} {mount}")
    return best[1]


def probe_io(directory: str | os.PathLike[str], *, size_mib: float = DEFAULT_SIZE_MIB,
             min_mbps: float | None = None) -> Outcome:
    """Write ``size_mib`` MiB, fsync, drop the cache, read back and verify a SHA-256."""
    if size_mib <= 0:
        raise ValueError(f"size_mib must be more than 0, got {size_mib}")
    root = Path(directory)
    if not root.is_dir():
        return Outcome(CheckStatus.FAIL, f"io: {root} is not a directory (does it exist?)",
                       {"dir": str(root), "errno": "ENOENT"})
    total = int(size_mib * MIB)
    chunk = os.urandom(min(MIB, total))
    path = root / f".aegis-io-check-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    step = "creating"
    data: dict[str, object] = {"dir": str(root), "bytes": total}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            step = "writing"
            expected = hashlib.sha256()
            t0 = time.perf_counter()
            left = total
            while left > 0:
                piece = chunk[: min(left, len(chunk))]
                view = memoryview(piece)
                while view:  # os.write may write less than asked
                    view = view[os.write(fd, view):]
                expected.update(piece)
                left -= len(piece)
            step = "fsyncing"
            os.fsync(fd)
            write_s = time.perf_counter() - t0
            data["cache_dropped"] = _drop_cache(fd)
        finally:
            os.close(fd)
        step = "reading"
        got = hashlib.sha256()
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while block := f.read(MIB):
                got.update(block)
        read_s = time.perf_counter() - t0
    except OSError as exc:
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        data.update(errno=code, step=step, fs=filesystem_of(root))
        return Outcome(CheckStatus.FAIL,
                       f"io: {step} {path.name} in {root} failed: {code}: {exc.strerror or exc}",
                       data)
    finally:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass  # e.g. EROFS: nothing was created, or the check already failed
    write_mbps, read_mbps = _mbps(total, write_s), _mbps(total, read_s)
    data.update(write_mbps=write_mbps, read_mbps=read_mbps, write_s=round(write_s, 6),
                read_s=round(read_s, 6))
    if got.digest() != expected.digest():
        return Outcome(CheckStatus.FAIL, f"io: data read back from {root} does not match what "
                       "was written (checksum mismatch): the storage corrupts data", data)
    summary = (f"{total / MIB:g} MiB in {root}: write {write_mbps} MB/s (fsync included), "
               f"read {read_mbps} MB/s")
    slowest = min(write_mbps, read_mbps)
    if min_mbps is not None and slowest < min_mbps:
        return Outcome(CheckStatus.FAIL, f"io too slow: {summary}; below the {min_mbps:g} MB/s "
                       "minimum", data)
    return Outcome(CheckStatus.PASS, f"io ok: {summary}", data)


def check_io(directory: str | os.PathLike[str] = ".", *, size_mib: float = DEFAULT_SIZE_MIB,
             min_mbps: float | None = None, budget: float | None = DEFAULT_BUDGETS["io"],
             now: Callable[[], float] = time.time) -> CheckResult:
    """The io check in ``directory`` under its budget (DESIGN.md: 30 s)."""
    return run_with_budget("io", lambda: probe_io(directory, size_mib=size_mib,
                                                  min_mbps=min_mbps), budget, now)
