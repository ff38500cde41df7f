"""The optional checkpoint API for training scripts: ``aegis_flow.checkpoint.done(step, path)``.

Say that a checkpoint is complete, so the master records the job's last safe step (a slow rank
is evicted only right after one, never before) — for scripts whose checkpoints the supervisor
cannot see by itself (``aegis-flow run --checkpoint-dir`` watches a directory for completed
``torch.save`` files and torch.distributed.checkpoint directories; this call is for anything
else, e.g. a save to object storage)::

    import aegis_flow.checkpoint
    torch.save(state, tmp); os.replace(tmp, final)
    aegis_flow.checkpoint.done(step, final)

Side effects: under aegis-flow (``$AEGIS_PROGRESS_SOCKET`` set) :func:`done` sends one Unix
datagram ``c <step> <path>`` to the supervisor — non-blocking, errors swallowed; without the
variable it does nothing. :func:`record` writes a checksum manifest beside a checkpoint (see
``aegis_flow.supervisor.integrity``). Standard library only until :func:`record` is called.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from aegis_flow.progress import SOCKET_ENV

MAX_PATH = 900  # bytes of the path that travel (a datagram stays small)


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


def record(path: str | os.PathLike[str]) -> Path:
    """Write the checksum manifest the integrity gate checks before a resume (sha256 and size
    of the file, or of every file of a torch.distributed.checkpoint directory)."""
    from aegis_flow.supervisor.integrity import record as _record

    return _record(path)
