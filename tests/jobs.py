"""Helpers for end-to-end tests: run ``aegis-flow run`` as a real process and watch it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SLEEPER = str(ROOT / "tests" / "fixtures" / "sleeper.py")
TRAIN = str(ROOT / "examples" / "train_ddp.py")


class Output:
    """A process whose stdout and stderr are collected line by line (waitable)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, *, label: str = "",
                 **popen: Any) -> None:
        self.label = label  # names the process in a failed wait's message
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, cwd=str(cwd), **popen)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, text: str, timeout: float = 60.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(text in line for line in self.lines) < count:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self._reader.is_alive():
                    who = f"{self.label}: " if self.label else ""
                    raise AssertionError(f"{who}{text!r} x{count} not seen; output:\n"
                                         f"{self.output}")
                self._cond.wait(min(left, 0.2))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


class Proc(Output):
    """A master or supervisor process (``jobs.Output``) that may be killed and waited on."""

    ended_at: float | None = None

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            who = f"{self.label} " if self.label else ""
            raise AssertionError(f"{who}still running after {timeout:.1f} s; output:\n"
                                 f"{self.output}") from None
        self.ended_at = time.monotonic()
        self._reader.join(timeout=10)
        return rc

    def index(self, text: str) -> int:
        return next(i for i, line in enumerate(self.lines) if text in line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


class Job(Output):
    """``aegis-flow run`` in a subprocess; output collected line by line."""

    def __init__(self, state_dir: Path, args: list[str], command: list[str], *,
                 env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "AEGIS_PRELOAD": "",
                    **(env or {})}
        super().__init__(
            [sys.executable, "-m", "aegis_flow.cli", "run", "--state-dir", str(state_dir),
             *args, "--", *command], full_env, state_dir)

    def wait(self, timeout: float = 120.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
            raise AssertionError(
                f"job did not end in {timeout} s; output:\n{self.output}") from None
        self._reader.join(timeout=10)
        return rc

    def status(self, job: str = "job") -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.state_dir / job / "status.json").read_text())
        return doc

    def pids(self, job: str = "job") -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / job / "pids.json").read_text())
        return data

    def nats_url(self, job: str = "job") -> str:
        return (self.state_dir / job / "nats.url").read_text().strip()

    def nats_options(self, job: str = "job", namespace: str = "default") -> dict[str, Any]:
        """Connect options of a short-lived user with the master's permissions, minted from
        the job's auth dir (NATS runs in operator mode unless --insecure-nats)."""
        auth_dir = self.state_dir / job / "auth"
        if not (auth_dir / "public.json").is_file():
            return {}
        from aegis_flow import protocol as p
        from aegis_flow.security.issuer import master_permissions
        from aegis_flow.security.operator import load, user_options

        return user_options(load(auth_dir), master_permissions(p.Subjects(namespace, job)),
                            name="test", now=time.time())


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().split(")")[-1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry))
    return found


def assert_nothing_left(text: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while processes_mentioning(text):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes left behind: {processes_mentioning(text)}")
        time.sleep(0.1)


def retries(doc: dict[str, Any]) -> tuple[int, ...]:
    return tuple(w["retries"] for w in doc["status"]["workers"])


def http_get(url: str) -> tuple[int, bytes]:
    """GET ``url``: (status, body), also for HTTP error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
