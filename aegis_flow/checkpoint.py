"""The optional checkpoint API for training scripts: ``done(step, path)`` and ``requested()``.

Say that a checkpoint is complete, so the master records the job's last safe step (a slow rank
is evicted only right after one, never before) — for scripts whose checkpoints the supervisor
cannot see by itself (``aegis-flow run --checkpoint-dir`` watches a directory for completed
``torch.save`` files and torch.distributed.checkpoint directories; this call is for anything
else, e.g. a save to object storage)::

    import aegis_flow.checkpoint
    torch.save(state, tmp); os.replace(tmp, final)
    aegis_flow.checkpoint.done(step, final)

A fault-tolerance checkpoint round (the master asks for one when it marks a rank slow: that
rank is evicted right after the next checkpoint, so the sooner it comes the sooner the job is
back to full speed): :func:`requested` returns the round's run id (``fault-<seq>-<rank>``) once
per request, and None otherwise; call it once per step where the script saves::

    if rank == 0 and (step % every == 0 or aegis_flow.checkpoint.requested()):
        save(step)

Side effects: under aegis-flow (``$AEGIS_PROGRESS_SOCKET`` set) :func:`done` sends one Unix
datagram ``c <step> <path>`` to the supervisor — non-blocking, errors swallowed; without the
variable it does nothing. :func:`requested` reads the small file ``$AEGIS_SAVE_REQUEST``
names (the supervisor writes it; one ``stat`` per call when nothing changed). :func:`record`
writes a checksum manifest beside a checkpoint (see
``aegis_flow.supervisor.integrity``). Standard library only until :func:`record` is called.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from aegis_flow.progress import SOCKET_ENV

MAX_PATH = 900  # bytes of the path that travel (a datagram stays small)
REQUEST_ENV = "AEGIS_SAVE_REQUEST"  # the file the supervisor writes a round's run id to
_seen: dict[str, object] = {"stat": None, "run_id": ""}


def done(step: int, path: str | os.PathLike[str] = "") -> bool:
    """Report that the checkpoint of training step ``step`` (at ``path``) is complete. Never
    raises, never blocks; True when the report went out."""
    target = os.environ.get(SOCKET_ENV)
    if not target:
        return False
    try:
        n = int(step)
        if n < 0:
            return False
        where = os.fsdecode(os.fspath(path)).replace("\n", " ").encode(errors="replace")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(b"c %d %s" % (n, where[:MAX_PATH]), target)
        return True
    except (OSError, ValueError, TypeError):
        return False  # the supervisor is gone or busy: training must never notice


def requested() -> str | None:
    """The run id of a fault-tolerance checkpoint round the master asks for (``fault-…``),
    returned once per request; None when none is pending or outside aegis-flow. Never raises;
    cheap enough to call every step."""
    path = os.environ.get(REQUEST_ENV)
    if not path:
        return None
    try:
        st = os.stat(path)
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == _seen["stat"]:
            return None
        with open(path, encoding="utf-8", errors="replace") as fh:
            run_id = fh.read(200).strip()
    except OSError:
        return None  # no request (the file is written only when a round is asked for)
    _seen["stat"] = key
    if not run_id or run_id == _seen["run_id"]:
        return None
    _seen["run_id"] = run_id
    return run_id


def record(path: str | os.PathLike[str]) -> Path:
    """Write the checksum manifest the integrity gate checks before a resume (sha256 and size
    of the file, or of every file of a torch.distributed.checkpoint directory)."""
    from aegis_flow.supervisor.integrity import record as _record

    return _record(path)
