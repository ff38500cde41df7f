"""One run of a job at a time, and what earlier runs left: ``run.lock``, the archive
``runs/<id>/``, and the stored status read over NATS.

Side effects: takes an flock on ``STATE_DIR/JOB/run.lock``, reads files of the state dir, and
(``read_stored_status``, ``delete_stored_status``) talks to NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Any

from aegis_flow.protocol import Subjects

LOCK_FILE = "run.lock"
RUNS_DIR = "runs"
# what a run leaves in STATE_DIR/JOB that belongs to it (auth/ keys are kept across runs)
RUN_FILES = ("status.json", "logs", "nats", "pids.json", "nats.url")


# -- one run of a job at a time -------------------------------------------------------------
class RunLock:
    """``STATE_DIR/JOB/run.lock``: an exclusive ``flock`` held for the whole run, with the
    runner's pid inside for the message that refuses a second run. The kernel drops the lock
    when the holder dies, so a stale file (its pid gone) is simply taken over. The file is
    never removed (removing it would let two runs lock two different files)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self, wait: float = 1.0) -> int | None:
        """Take the lock: None, or the pid of the run that holds it (0 when unknown). A holder
        whose pid is not alive (a reader's short look) is waited for up to ``wait`` seconds."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _pid_in(self.path)
                if (holder and pid_alive(holder)) or time.monotonic() > deadline:
                    os.close(fd)
                    return holder
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)  # drops the flock
        self.fd = None


def _pid_in(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_pid(job_dir: Path) -> int | None:
    """The pid of the ``aegis-flow run`` running this job now, or None: the pid in ``run.lock``
    if it is alive and the lock is held (a pid reused by another process is not a run)."""
    path = job_dir / LOCK_FILE
    pid = _pid_in(path)
    if not pid or not pid_alive(pid):
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return pid  # held: that run is alive
    finally:
        os.close(fd)  # (drops the probe's lock if it got one)
    return None


def archived_runs(job_dir: Path) -> list[Path]:
    """The job's archived runs (``runs/<id>/``), oldest first."""
    runs = job_dir / RUNS_DIR
    if not runs.is_dir():
        return []
    return sorted((d for d in runs.iterdir() if d.is_dir()),
                  key=lambda d: (d.stat().st_mtime, d.name))


# -- reading the stored status over NATS ----------------------------------------------------
def job_user_options(job_dir: Path, subjects: Subjects,
                     name: str = "aegis-operator-cli", *, auth_name: str = "auth"
                     ) -> dict[str, Any]:
    """``nats.connect`` options for the NATS of a job in operator mode: a short-lived user
    with the master's permissions, minted with the account signing key in
    ``JOB_DIR/auth`` ({} when the job runs without authentication)."""
    auth_dir = job_dir / auth_name
    if not (auth_dir / "public.json").is_file():
        return {}
    from aegis_flow.security import natsjwt as nj
    from aegis_flow.security.issuer import master_permissions
    from aegis_flow.security.operator import load, user_options

    perms = master_permissions(subjects)
    return user_options(load(auth_dir), nj.Permissions(pub=perms.pub, sub=perms.sub),
                        name=name, now=time.time())


async def _quiet(_exc: Exception) -> None:
    """nats-py's error callback; the default prints a traceback for every failed connect."""


async def connect_quietly(url: str, options: dict[str, Any], timeout: float = 5.0) -> Any:
    """A NATS connection that fails with one exception, no reconnects, no tracebacks."""
    import nats

    return await asyncio.wait_for(nats.connect(
        url, connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False,
        error_cb=_quiet, **options), timeout)


async def read_stored_status(url: str, subjects: Subjects,
                             options: dict[str, Any]) -> bytes | None:
    """The job's stored status document from its KV bucket (None: no bucket or no status);
    raises when NATS cannot be reached."""
    from aegis_flow.master.store import KVStore

    nc = await connect_quietly(url, options)
    try:
        try:
            store = await KVStore.open(nc, subjects.kv_bucket, create=False)
        except Exception:  # noqa: BLE001 - no bucket: nothing stored
            return None
        raw, _ = await asyncio.wait_for(store.load(), 5)
        return raw
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def delete_stored_status(url: str, subjects: Subjects) -> None:
    """Remove the job's KV bucket (an external NATS server: a new run must not resume it)."""
    nc = await connect_quietly(url, {})
    try:
        with contextlib.suppress(Exception):  # no bucket: nothing to forget
            await asyncio.wait_for(nc.jetstream().delete_key_value(subjects.kv_bucket), 5)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
