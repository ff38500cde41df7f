"""The hang check: a progress watchdog with two thresholds, and the hung process's stacks.

Side effects: :class:`HangWatchdog` has none (time is an argument). :class:`ProgressSocket` binds
a Unix datagram socket (the receiving end of :mod:`aegis_flow.progress`) and removes it on close;
:func:`collect_stacks` runs ``py-spy dump`` as a subprocess when py-spy is installed.
Standard library only.

Activity is, from the strongest signal on: a *new* step number from
``aegis_flow.progress.step(n)``; a change in the counts the pre-warmed interpreter takes with no
change to the script (optimizer steps and outermost module forwards, ``zygote._arm_progress``);
else output from the process. Once a progress signal was seen, output no longer counts (a
process that logs while stuck in a collective is still hung, and a quiet one that trains is
not). No activity for
``hang_after`` seconds is ``"hang"`` (mark only, the process is kept: T13); for ``quit_after``
seconds, ``"hang_with_quit"`` (a counted failure: T14). ``check`` reports the level every time;
the caller reports a change.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from aegis_flow.steps.base import CheckResult, CheckStatus

HangLevel = Literal["hang", "hang_with_quit"]


@dataclass(frozen=True)
class HangWatchdog:
    hang_after: float
    quit_after: float
    started: float
    last_output: float | None = None
    last_progress: float | None = None
    last_step: int | None = None
    last_counts: tuple[int, int] | None = None  # automatic: (optimizer steps, forwards)

    def __post_init__(self) -> None:
        if not 0 < self.hang_after <= self.quit_after:
            raise ValueError(f"need 0 < hang_after <= quit_after, got hang_after="
                             f"{self.hang_after}, quit_after={self.quit_after}")

    @property
    def mode(self) -> str:
        """``"progress"`` once the progress API was used, ``"torch"`` once the automatic
        counts came, else ``"output"``."""
        if self.last_step is not None:
            return "progress"
        return "output" if self.last_counts is None else "torch"

    def observe_auto(self, now: float, report: AutoProgress) -> HangWatchdog:
        """An automatic report; only counts different from the last ones are progress."""
        counts = (report.steps, report.forwards)
        if counts == self.last_counts:
            return self
        return replace(self, last_progress=now, last_counts=counts)

    def observe_progress(self, now: float, step: int) -> HangWatchdog:
        """A step report; only a step number different from the last one is progress."""
        if step == self.last_step:
            return self
        return replace(self, last_progress=now, last_step=step)

    def observe_output(self, now: float) -> HangWatchdog:
        return replace(self, last_output=now)

    def last_activity(self) -> float:
        if self.last_progress is not None:
            return self.last_progress
        return self.started if self.last_output is None else max(self.started, self.last_output)

    def idle(self, now: float) -> float:
        return max(0.0, now - self.last_activity())

    def check(self, now: float) -> HangLevel | None:
        idle = self.idle(now)
        if idle >= self.quit_after:
            return "hang_with_quit"
        if idle >= self.hang_after:
            return "hang"
        return None

    def to_result(self, now: float, *, stacks: str = "") -> CheckResult:
        """The watchdog's state as the ``hang`` check's result (``fail`` when hung)."""
        level, idle = self.check(now), round(self.idle(now), 3)
        data = {"level": level, "idle_s": idle, "mode": self.mode, "last_step": self.last_step,
                "hang_after": self.hang_after, "quit_after": self.quit_after, "stacks": stacks}
        if level is None:
            return CheckResult.make("hang", CheckStatus.PASS, f"hang ok: last activity "
                                    f"{idle:g} s ago ({self.mode})", timestamp=now, data=data)
        return CheckResult.make("hang", CheckStatus.FAIL, f"{level}: no {self.mode} for {idle:g} s "
                                f"(hang after {self.hang_after:g} s, quit after "
                                f"{self.quit_after:g} s)", timestamp=now, data=data)


@dataclass(frozen=True)
class AutoProgress:
    """What the pre-warmed interpreter counted in the training process (``a`` datagrams):
    optimizer steps and outermost forwards since the process started, the wall time of the
    last of them, and the mean forward time since the previous report (None: no forward)."""

    steps: int
    forwards: int
    last_active: float
    forward_ms: float | None

    @classmethod
    def parse(cls, raw: bytes) -> AutoProgress | None:
        """``a STEPS FORWARDS LAST_ACTIVE FORWARD_MS``; None when malformed."""
        parts = raw.split()
        if len(parts) != 5 or parts[0] != b"a":
            return None
        try:
            steps, forwards = int(parts[1]), int(parts[2])
            last, ms = float(parts[3]), float(parts[4])
        except ValueError:
            return None
        if steps < 0 or forwards < 0 or last != last or ms != ms:  # NaN
            return None
        return cls(steps, forwards, last, ms if ms >= 0 else None)

    def beat(self) -> dict[str, object]:
        """As the heartbeat carries it."""
        return {"steps": self.steps, "forwards": self.forwards,
                "last_active": round(self.last_active, 3),
                "forward_ms": None if self.forward_ms is None else round(self.forward_ms, 3)}


class ProgressSocket:
    """The supervisor's end of :mod:`aegis_flow.progress` and of the pre-warmed interpreter's
    automatic counts: bound, non-blocking datagrams. :meth:`drain` returns the step numbers;
    the latest automatic report is kept in ``auto`` (the counts only grow: the latest says
    all)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.auto: AutoProgress | None = None
        self._steps: list[int] = []
        self.checkpoints: list[tuple[int, str]] = []  # (step, path) said done; caller pops

    def reset(self) -> None:
        """A new training process: its counts start from zero again."""
        self.auto = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def latest(self) -> int | None:
        """The newest step number received and not yet drained (None: none pending); reads
        what waits in the socket first (a step sent just before a checkpoint was saved)."""
        self.poll()
        return max(self._steps) if self._steps else None

    def drain(self) -> list[int]:
        """Every step number received since the last drain, oldest first (malformed ones
        skipped); checkpoints and automatic counts go to ``checkpoints`` and ``auto``."""
        self.poll()
        steps, self._steps = self._steps, []
        return steps

    def poll(self) -> None:
        """Read what is waiting in the socket into the buffers (a reader callback's job: a
        checkpoint report is acted on at once, the steps wait for :meth:`drain`)."""
        steps = self._steps
        while True:
            try:
                raw = self.sock.recv(1024)
            except (BlockingIOError, InterruptedError, OSError):
                return
            if raw.startswith(b"c "):  # aegis_flow.checkpoint.done(step, path)
                _, _, rest = raw.partition(b" ")
                number, _, where = rest.partition(b" ")
                with contextlib.suppress(ValueError):
                    if int(number) >= 0:
                        self.checkpoints.append((int(number), where.decode(errors="replace")))
                continue
            if raw.startswith(b"a "):
                auto = AutoProgress.parse(raw)
                if auto is not None:
                    self.auto = auto
                continue
            with contextlib.suppress(ValueError, IndexError):
                steps.append(int(raw.split()[0]))

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> ProgressSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def find_tool(name: str) -> str | None:
    """``name`` on PATH, else beside this interpreter (a virtualenv's scripts directory)."""
    import sysconfig

    found = shutil.which(name)
    if found is None:
        candidate = Path(sysconfig.get_path("scripts")) / name
        found = str(candidate) if os.access(candidate, os.X_OK) else None
    return found


def top_frame(stacks: str) -> str | None:
    """The innermost frame of the main thread in a ``py-spy dump`` (``"inner (train.py:3)"``):
    where the process is stuck. None when the dump has no such thread (py-spy missing)."""
    lines = stacks.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Thread ") and line.rstrip().endswith('"MainThread"'):
            for frame in lines[i + 1:]:
                if not frame.startswith((" ", "\t")) or not frame.strip():
                    return None
                return frame.strip()[:200]
    return None


def collect_stacks(pid: int, *, timeout: float = 10.0,
                   which: Callable[[str], str | None] = find_tool) -> str:
    """The Python stacks of process ``pid`` via ``py-spy dump``, or a note saying why not.
    A dump that fails is tried up to four times, waiting longer each time: py-spy now and then
    fails to read a live process ("Failed to find python version from target process"; twice in
    a row on a loaded machine) and reads it a moment later."""
    exe = which("py-spy")
    if exe is None:
        return ("py-spy not installed: no Python stacks collected (pip install py-spy, and give "
                "the supervisor SYS_PTRACE in a container)")
    for pause in (0.2, 0.5, 1.0, 0.0):
        try:
            out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True,
                                 text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return f"py-spy dump --pid {pid} did not answer within {timeout:g} s"
        except OSError as exc:
            return f"py-spy could not run ({Path(exe).name}): {exc}"
        if out.returncode == 0:
            return out.stdout
        time.sleep(pause)
    return (f"py-spy dump --pid {pid} failed (exit {out.returncode}): "
            f"{(out.stderr or out.stdout).strip()}")
