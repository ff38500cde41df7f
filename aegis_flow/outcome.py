"""The outcome files a worker pod leaves for the workflow (DESIGN.md §5).

The worker supervisor writes its outcome word to ``<dir>/outcome``, its node name to
``<dir>/node`` and how often it restarted the command in place to ``<dir>/restarts`` when it
exits; the worker template exposes them as output parameters, which the Argo UI shows on each
rank's pod (the job's ending is the master's decision, not a reduction of these).

Standard library only (plus the core's ``ExitCode``): it is part of the supervisor bundle.
Side effects: only :func:`write_outcome`, which writes the files atomically (a temporary
file in the same directory, fsync, ``os.replace``), so Argo never reads half a word.
"""

from __future__ import annotations

import os
import tempfile

from aegis_flow.master.model import ExitCode

OUTCOME_DIR = "/tmp/aegis"
OUTCOME_NAME, NODE_NAME, RESTARTS_NAME = "outcome", "node", "restarts"
OUTCOME_FILE = f"{OUTCOME_DIR}/{OUTCOME_NAME}"
NODE_FILE = f"{OUTCOME_DIR}/{NODE_NAME}"
RESTARTS_FILE = f"{OUTCOME_DIR}/{RESTARTS_NAME}"  # in-place restarts of the command in the pod
UNKNOWN = "unknown"  # the default when the pod left no file (it was lost, evicted, killed)

# exit code -> outcome word written by the worker pod (any other code: "failed")
OUTCOME_BY_CODE: dict[int, str] = {
    0: "succeeded",
    int(ExitCode.NODE_FAULT): "node-fault",
    int(ExitCode.CONTAINER_RESTART): "container-restart",
    int(ExitCode.SLOW_NODE_EVICTED): "slow-node",
    int(ExitCode.JOB_FAILED): "job-failed",
    int(ExitCode.STOPPED): "stopped",
}


# the master's quit order carries the job's outcome; the supervisor exits with this code
_EXIT_BY_QUIT = {"success": 0, "stopped": int(ExitCode.STOPPED)}


def quit_exit_code(outcome: str) -> int:
    """The exit code for a quit order with ``outcome`` (anything but success/stopped: 73)."""
    return _EXIT_BY_QUIT.get(outcome, int(ExitCode.JOB_FAILED))


def outcome_of(code: int) -> str:
    """The outcome word a worker pod writes for its exit code."""
    return OUTCOME_BY_CODE.get(code, "failed")


def _write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_outcome(directory: str, code: int, node: str, restarts: int = 0) -> str:
    """Write ``outcome``, ``node`` and ``restarts`` (how often the command was restarted in
    place in this pod) into ``directory`` (created if missing); return the word.

    The outcome file is written last: a reader that sees an outcome also sees the others.
    """
    os.makedirs(directory, exist_ok=True)
    word = outcome_of(code)
    _write_atomic(os.path.join(directory, NODE_NAME), node)
    _write_atomic(os.path.join(directory, RESTARTS_NAME), str(restarts))
    _write_atomic(os.path.join(directory, OUTCOME_NAME), word)
    return word
