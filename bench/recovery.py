#!/usr/bin/env python3
"""In-place recovery, detection and supervision overhead: aegis-flow next to torchrun.

Measures, side by side in one run (trials alternate between the systems so that a noisy machine
disturbs both alike), on ``examples/train_ddp.py`` with the gloo backend:

1. **recovery**: SIGKILL of rank 1's training process -> every rank has completed its first
   optimizer step of the new epoch; ``max over ranks of the new epoch's first-step time - kill
   time``. aegis-flow kills with ``--inject crash:rank=1:after=Ds`` (D seconds after the child
   started) and prints ``AEGIS_KILLED``; for ``torchrun --max-restarts=1`` this script reads rank
   1's pid from its first-step line and SIGKILLs it D seconds after that process started (or at
   once, if every rank reports its first step only later). A trial that does not finish within
   ``--timeout`` or exits non-zero is a failure;
2. **detection** (aegis-flow): the master's ``AEGIS_APPLIED Error`` time - ``AEGIS_KILLED`` time;
3. **overhead**: steps/s (``AEGIS_RATE``, mean over ranks) of the same script with 2 ranks and no
   fault, started bare (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by this script) and under
   ``aegis-flow run``; the ratio of the medians.

Every trial runs in its own session; the process tree is watched while it runs and every
descendant still alive at the end is SIGKILLed (torchrun and aegis-flow put ranks into sessions
or groups of their own). Processes still alive after a system exited by itself are reported.

Side effects: starts processes, writes logs/checkpoints under ``--work-dir`` (deleted for trials
that went well unless ``--keep-logs``), prints a table, writes ``--out`` (markdown).
Standard library only (torch is needed by the training script, not here).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tables  # bench/tables.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"
_VENV_PY = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PY) if _VENV_PY.exists() else sys.executable
TORCHRUN = str(Path(PYTHON).parent / "torchrun")

INFO_RE = re.compile(r"AEGIS_FIRST_STEP_INFO rank (\d+) restart (\d+) pid (\d+) at (\d+(?:\.\d+)?)")
KILLED_RE = re.compile(r"AEGIS_KILLED rank (\d+) at (\d+\.\d+)")
ERROR_RE = re.compile(r"AEGIS_APPLIED Error \S+ (\d+\.\d+)")
START1_RE = re.compile(r"^\[rank (\d+)\] rank \d+/\d+ restart_count 1 ")
RUN_RE = re.compile(r"AEGIS_APPLIED \S+ RunCommand (\d+\.\d+)")
RATE_RE = re.compile(r"AEGIS_RATE (\S+)")
MIN_TRAINING = 1.0  # torchrun: seconds of training (every rank) before the kill, at least


# --------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, starttime, utime + stime) of a live pid (clock ticks), None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12])


def _alive(pid: int, start: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[2] == start and st[0] not in ("Z", "X")


def proc_start_time(pid: int) -> float | None:
    """Unix time at which ``pid`` started (10 ms resolution), None if it is gone."""
    st = _proc_stat(pid)
    if st is None:
        return None
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + st[2] / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (cheap: no walk over all of /proc)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                out += map(int, Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
    return out


class Tree:
    """Remembers every descendant of ``root`` seen while it runs, to kill them all at the end.

    With ``sample=True`` it also keeps (time, {pid: CPU ticks}) every ``interval`` seconds.
    """

    def __init__(self, root: int, interval: float = 0.5, sample: bool = False) -> None:
        self.root = root
        self.seen: dict[int, int] = {}  # pid -> starttime
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._sample = sample
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def scan(self) -> None:
        cpu: dict[int, int] = {}
        frontier = [self.root, *self.seen]  # a remembered orphan's children count too
        done: set[int] = set()
        while frontier:
            pid = frontier.pop()
            if pid in done:
                continue
            done.add(pid)
            for child in _children(pid):
                st = _proc_stat(child)
                if st is None:
                    continue
                if self.seen.get(child) != st[2]:
                    self.seen[child] = st[2]
                frontier.append(child)
        if self._sample:
            for pid, start in self.seen.items():
                st = _proc_stat(pid)
                if st is not None and st[2] == start:
                    cpu[pid] = st[3]
            self.samples.append((time.time(), cpu))

    def _watch(self) -> None:
        with contextlib.suppress(Exception):
            self.scan()
        while not self._stop.wait(self._interval):
            with contextlib.suppress(Exception):
                self.scan()

    def cpu_between(self, t0: float, t1: float, exclude: set[int]) -> float | None:
        """CPU seconds used by the remembered processes not in ``exclude`` within [t0, t1]."""
        inside = [(t, c) for t, c in self.samples if t0 <= t <= t1]
        if len(inside) < 2:
            return None
        (_, a), (_, b) = inside[0], inside[-1]
        ticks = sum(b[pid] - a[pid] for pid in b if pid in a and pid not in exclude)
        return ticks / os.sysconf("SC_CLK_TCK")

    def alive(self) -> list[int]:
        return [pid for pid, start in self.seen.items() if _alive(pid, start)]

    def kill_all(self) -> list[int]:
        """SIGKILL every remembered descendant (and its group); return those that survived."""
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(Exception):
            self.scan()
        for pid in [self.root, *self.alive()]:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.alive()


@dataclass
class Line:
    t: float
    text: str


class Proc:
    """A command in its own session; both output streams read into ``lines`` and a log file."""

    def __init__(
        self, cmd: Sequence[str], env: dict[str, str], log: Path, sample: bool = False
    ) -> None:
        self.lines: list[Line] = []
        self.cond = threading.Condition()
        self.log = log.open("w")
        self.p = subprocess.Popen(
            list(cmd),
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.tree = Tree(self.p.pid, sample=sample)
        self.readers = [
            threading.Thread(target=self._read, args=(s,), daemon=True)
            for s in (self.p.stdout, self.p.stderr)
        ]
        for r in self.readers:
            r.start()

    def _read(self, stream: object) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            text = raw.decode(errors="replace").rstrip("\n")
            with self.cond:
                self.lines.append(Line(time.time(), text))
                self.log.write(f"{time.time():.6f} {text}\n")
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pred: Callable[[list[Line]], object], deadline: float) -> object:
        """Return pred(lines) once truthy; None at the deadline or when the process exited."""
        with self.cond:
            while True:
                got = pred(self.lines)
                if got:
                    return got
                if self.p.poll() is not None and not any(r.is_alive() for r in self.readers):
                    return pred(self.lines) or None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 0.2))

    def wait_exit(self, deadline: float) -> int | None:
        try:
            rc = self.p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        for r in self.readers:
            r.join(timeout=2)
        return rc

    def finish(self) -> tuple[list[int], list[int]]:
        """Kill what is left. Returns (alive after the exit, alive even after SIGKILL)."""
        leftover = []
        if self.p.poll() is not None:  # the system exited by itself: did it leave anything?
            time.sleep(0.3)
            with contextlib.suppress(Exception):
                self.tree.scan()
            leftover = self.tree.alive()
        survivors = self.tree.kill_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(timeout=5)
        for r in self.readers:
            r.join(timeout=2)
        self.log.close()
        return leftover, survivors

    def text(self) -> str:
        with self.cond:
            return "\n".join(line.text for line in self.lines)


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["AEGIS_TIMING"] = "1"  # train_ddp's AEGIS_FIRST_STEP_INFO / AEGIS_RATE markers
    for k in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "AEGIS_RESTART_COUNT",
        "TORCHELASTIC_RESTART_COUNT",
        "PYTHONUNBUFFERED",
    ):
        env.pop(k, None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- trials


@dataclass
class Trial:
    system: str
    index: int
    ok: bool = False
    recovery: float | None = None
    detection: float | None = None
    ordered: float | None = None  # aegis-flow: kill -> the master ordered the new run
    startup: float | None = None  # launch -> every rank finished its first step (epoch 0)
    rank0_first: bool | None = None  # aegis-flow: rank 0's new process printed first
    why: str = ""
    leftover: list[int] = field(default_factory=list)
    wall: float = 0.0
    log: Path | None = None


def train_args(a: argparse.Namespace, ckpt: Path) -> list[str]:
    return [
        str(SCRIPT.relative_to(ROOT)),
        "--steps",
        str(a.steps),
        "--step-time",
        str(a.step_time),
        "--checkpoint-every",
        str(a.checkpoint_every),
        "--checkpoint-dir",
        str(ckpt),
        "--backend",
        "gloo",
    ]


def infos(lines: list[Line]) -> list[tuple[int, int, int, float]]:
    """(rank, restart, pid, time) of every first-step line, in order."""
    out = []
    for line in lines:
        m = INFO_RE.search(line.text)
        if m:
            out.append((int(m[1]), int(m[2]), int(m[3]), float(m[4])))
    return out


def new_epoch_times(lines: list[Line], old_pids: dict[int, int], n: int) -> list[float] | None:
    """First-step times of every rank's first process after ``old_pids``; None until all n."""
    times: dict[int, float] = {}
    for rank, _restart, pid, t in infos(lines):
        if rank in old_pids and pid != old_pids[rank] and rank not in times:
            times[rank] = t
    return [times[r] for r in range(n)] if len(times) == n else None


def aegis_trial(a: argparse.Namespace, i: int, work: Path) -> Trial:
    tr = Trial("aegis-flow", i)
    d = work / f"aegis-{i:02d}"
    d.mkdir(parents=True)
    cmd = [
        PYTHON,
        "-m",
        "aegis_flow.cli",
        "run",
        "--workers",
        str(a.workers),
        "--max-retry",
        "1",
        "--state-dir",
        str(d / "state"),
        "--inject",
        f"crash:rank=1:after={a.kill_after}s",
    ]
    if a.no_prewarm:
        cmd.append("--no-prewarm")
    cmd += ["--", PYTHON, *train_args(a, d / "ck")]
    env = base_env()
    env["AEGIS_TIMING"] = "1"
    t0 = time.monotonic()
    deadline = t0 + a.timeout
    launched = time.time()
    proc = Proc(cmd, env, d / "log.txt")
    tr.log = d / "log.txt"
    try:
        rc = proc.wait_exit(deadline)
        tr.wall = time.monotonic() - t0
        lines = list(proc.lines)
        kill = next((m for ln in lines if (m := KILLED_RE.search(ln.text))), None)
        if rc is None:
            tr.why = f"no exit within {a.timeout:.0f} s"
        elif rc != 0:
            tr.why = f"exit code {rc}"
        elif kill is None:
            tr.why = "no AEGIS_KILLED line (job ended before the kill?)"
        if kill is not None:
            t_kill = float(kill[2])
            first: dict[int, int] = {}  # rank -> pid in the epoch of the kill (restart 0)
            epoch0: dict[int, float] = {}
            for rank, restart, pid, t in infos(lines):
                if restart == 0:
                    first.setdefault(rank, pid)
                    epoch0.setdefault(rank, t)
            if len(epoch0) == a.workers:
                tr.startup = max(epoch0.values()) - launched
            times = new_epoch_times(lines, first, a.workers) if len(first) == a.workers else None
            if times is None:  # killed before every rank's first step: use the restart count
                by_rank: dict[int, float] = {}
                for rank, restart, _pid, t in infos(lines):
                    if restart >= 1:
                        by_rank.setdefault(rank, t)
                if len(by_rank) == a.workers:
                    times = list(by_rank.values())
            if times is not None:
                tr.recovery = max(times) - t_kill
            elif not tr.why:
                tr.why = "not every rank reported a first step after the kill"
            for ln in lines:
                m = ERROR_RE.search(ln.text)
                if m and float(m[1]) >= t_kill - 1.0:
                    tr.detection = float(m[1]) - t_kill
                    break
            restarted = [int(m[1]) for ln in lines if (m := START1_RE.search(ln.text))]
            if restarted:
                tr.rank0_first = restarted[0] == 0
            for ln in lines:
                m = RUN_RE.search(ln.text)
                if m and float(m[1]) >= t_kill:
                    tr.ordered = float(m[1]) - t_kill
                    break
        tr.ok = not tr.why and tr.recovery is not None
    finally:
        tr.leftover, survivors = proc.finish()
        if survivors:
            tr.why += f"; could not kill {survivors}"
    return tr


def torchrun_trial(a: argparse.Namespace, i: int, work: Path) -> Trial:
    tr = Trial("torchrun", i)
    d = work / f"torchrun-{i:02d}"
    d.mkdir(parents=True)
    cmd = [
        TORCHRUN,
        "--standalone",
        "--nproc-per-node",
        str(a.workers),
        "--max-restarts=1",
        *train_args(a, d / "ck"),
    ]
    t0 = time.monotonic()
    deadline = t0 + a.timeout
    launched = time.time()
    proc = Proc(cmd, base_env(), d / "log.txt")
    tr.log = d / "log.txt"
    n = a.workers

    def first_epoch(lines: list[Line]) -> dict[int, int] | None:
        pids: dict[int, int] = {}
        for rank, _restart, pid, _t in infos(lines):
            pids.setdefault(rank, pid)
        return pids if len(pids) == n else None

    try:
        pids = proc.wait_for(first_epoch, deadline)
        if not isinstance(pids, dict):
            rc = proc.p.poll()
            tr.why = "not every rank reached its first step" + (
                f" (exit code {rc})" if rc is not None else f" within {a.timeout:.0f} s"
            )
            return tr
        tr.startup = max(t for r, _, pid, t in infos(proc.lines) if pids[r] == pid) - launched
        victim = pids[1]
        started = proc_start_time(victim)
        # as aegis-flow's inject: --kill-after after the process started, but only once every
        # rank has trained for a while (a cold start can take longer than --kill-after)
        kill_at = max(time.time() + MIN_TRAINING, (started or 0.0) + a.kill_after)
        while time.time() < kill_at and proc.p.poll() is None:
            time.sleep(min(0.05, max(0.0, kill_at - time.time())))
        if proc.p.poll() is not None or _proc_stat(victim) is None:
            tr.why = "the job ended before the kill"
            return tr
        os.kill(victim, signal.SIGKILL)
        t_kill = time.time()
        with proc.cond:
            proc.log.write(f"[bench] SIGKILL rank 1 pid {victim} at {t_kill:.6f}\n")
        times = proc.wait_for(lambda ls: new_epoch_times(ls, pids, n), deadline)
        if isinstance(times, list):
            tr.recovery = max(times) - t_kill
        rc = proc.wait_exit(deadline)
        tr.wall = time.monotonic() - t0
        if rc is None:
            tr.why = f"no exit within {a.timeout:.0f} s" + (
                "" if tr.recovery is not None else " (no recovery)"
            )
        elif rc != 0:
            tr.why = f"exit code {rc}" + ("" if tr.recovery is not None else " (no recovery)")
        elif tr.recovery is None:
            tr.why = "exit 0 but not every rank reported a first step after the kill"
        tr.ok = not tr.why
        return tr
    finally:
        if not tr.wall:
            tr.wall = time.monotonic() - t0
        tr.leftover, survivors = proc.finish()
        if survivors:
            tr.why += f"; could not kill {survivors}"


# --------------------------------------------------------------------------- overhead


def rates(text: str) -> list[float]:
    return [float(m[1]) for m in RATE_RE.finditer(text)]


@dataclass
class Run:
    rate: float | None  # steps/s, mean over ranks; None: the run failed
    cpu: float | None = None  # aegis-flow: its own processes' CPU during training, cores


def overhead_run(a: argparse.Namespace, kind: str, i: int, work: Path) -> Run:
    d = work / f"overhead-{kind}-{i:02d}"
    d.mkdir(parents=True)
    targs = [
        str(SCRIPT.relative_to(ROOT)),
        "--steps",
        str(a.overhead_steps),
        "--step-time",
        "0",
        "--checkpoint-every",
        str(10**9),
        "--checkpoint-dir",
        str(d / "ck"),
        "--backend",
        "gloo",
    ]
    deadline = time.monotonic() + a.timeout
    procs: list[Proc] = []
    try:
        if kind == "bare":
            port = free_port()
            for r in range(2):
                env = base_env()
                env.update(
                    RANK=str(r),
                    LOCAL_RANK=str(r),
                    WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                )
                procs.append(Proc([PYTHON, *targs], env, d / f"rank{r}.txt"))
        else:
            cmd = [
                PYTHON,
                "-m",
                "aegis_flow.cli",
                "run",
                "--workers",
                "2",
                "--max-retry",
                "0",
                "--state-dir",
                str(d / "state"),
            ]
            if a.no_prewarm:
                cmd.append("--no-prewarm")
            procs.append(Proc([*cmd, "--", PYTHON, *targs], base_env(), d / "log.txt", True))
        codes = [p.wait_exit(deadline) for p in procs]
        found = [x for p in procs for x in rates(p.text())]
        if codes != [0] * len(procs) or len(found) != 2:
            print(f"  overhead {kind} #{i}: exit codes {codes}, rates {found}: see {d}", flush=True)
            return Run(None)
        run = Run(statistics.fmean(found))
        if kind == "aegis":
            lines = list(procs[0].lines)
            steps = infos(lines)
            ends = [ln.t for ln in lines if RATE_RE.search(ln.text)]
            if steps and ends:
                t0, t1 = max(t for *_, t in steps), min(ends)
                used = procs[0].tree.cpu_between(t0, t1, {pid for _, _, pid, _ in steps})
                if used is not None and t1 > t0:
                    run.cpu = used / (t1 - t0)
        if not a.keep_logs:
            shutil.rmtree(d, ignore_errors=True)
        return run
    finally:
        for p in procs:
            p.finish()


# --------------------------------------------------------------------------- report


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "—" if x is None else f"{x * scale:.{digits}f}"


def table(head: list[str], rows: list[list[str]]) -> str:
    return tables.render(head, rows, markdown=True)


def report(
    a: argparse.Namespace,
    trials: list[Trial],
    over: dict[str, list[Run]],
    meta: dict[str, str],
) -> str:
    parts = [
        f"Run: {meta['start']} – {meta['end']} ({meta['wall']}); {meta['machine']}; "
        f"load average {meta['load0']} at the start, {meta['load1']} at the end."
    ]
    systems = [s for s in ("aegis-flow", "torchrun") if any(t.system == s for t in trials)]
    if systems:
        rows = []
        for s in systems:
            ts = [t for t in trials if t.system == s]
            rec = [t.recovery for t in ts if t.ok and t.recovery is not None]
            name = s + (" (--no-prewarm)" if s == "aegis-flow" and a.no_prewarm else "")
            rows.append(
                [name, str(len(ts)), f"{len(rec)}/{len(ts)}"]
                + (
                    [fmt(pct(rec, 0.5)), fmt(pct(rec, 0.9)), fmt(min(rec)), fmt(max(rec))]
                    if rec
                    else ["—"] * 4
                )
            )
        parts.append(
            f"**In-place recovery** ({a.workers} ranks, SIGKILL of rank 1 about "
            f"{a.kill_after:g} s after its process started → every rank finished its "
            "first step of the new epoch), seconds:\n\n"
            + table(["system", "trials", "recovered", "p50", "p90", "min", "max"], rows)
        )
        det = [t.detection for t in trials if t.system == "aegis-flow" and t.detection is not None]
        if det:
            parts.append(
                "**Detection** (aegis-flow: `AEGIS_KILLED` → master applied the Error), "
                "ms:\n\n"
                + table(
                    ["samples", "p50", "p90", "min", "max"],
                    [
                        [
                            str(len(det)),
                            fmt(pct(det, 0.5), 1e3, 1),
                            fmt(pct(det, 0.9), 1e3, 1),
                            fmt(min(det), 1e3, 1),
                            fmt(max(det), 1e3, 1),
                        ]
                    ],
                )
            )
        raw = []
        for s in systems:
            vals = ", ".join(
                fmt(t.recovery) if t.ok else f"FAIL({t.why})" for t in trials if t.system == s
            )
            raw.append(f"- {s}: {vals}")
        walls = {s: statistics.median([t.wall for t in trials if t.system == s]) for s in systems}
        raw.append(
            "- median wall time of a whole trial: "
            + ", ".join(f"{s} {w:.1f} s" for s, w in walls.items())
        )
        starts = {
            s: [t.startup for t in trials if t.system == s and t.startup is not None]
            for s in systems
        }
        raw.append(
            "- median first start (launch → every rank finished its first step, epoch 0): "
            + ", ".join(f"{s} {statistics.median(v):.1f} s" for s, v in starts.items() if v)
        )
        good = [t for t in trials if t.system == "aegis-flow" and t.ok]
        steps = [
            (t.detection, t.ordered, t.recovery)
            for t in good
            if t.detection is not None and t.ordered is not None and t.recovery is not None
        ]
        if steps:
            med = [statistics.median(x) for x in zip(*steps, strict=True)]
            raw.append(
                f"- aegis-flow, medians from the kill: master applied the Error "
                f"{med[0] * 1e3:.0f} ms → master ordered the new run {med[1] * 1e3:.0f} ms → "
                f"every rank finished its first step {med[2]:.2f} s"
            )
        split = {
            k: [t.recovery for t in good if t.rank0_first is k and t.recovery is not None]
            for k in (True, False)
        }
        if any(split.values()):
            raw.append(
                "- aegis-flow recovery by which new process printed its start line first: "
                + "; ".join(
                    f"{name}: median {statistics.median(v):.2f} s ({len(v)} trials)"
                    for name, v in (("rank 0", split[True]), ("another rank", split[False]))
                    if v
                )
            )
        leaks = [f"{t.system} #{t.index}: {len(t.leftover)}" for t in trials if t.leftover]
        raw.append(
            "- processes still alive after the system exited by itself: "
            + (", ".join(leaks) if leaks else "none")
        )
        parts.append("Per trial, in order (seconds):\n\n" + "\n".join(raw))
    if over:
        bare = [r.rate for r in over["bare"] if r.rate is not None]
        aeg = [r.rate for r in over["aegis"] if r.rate is not None]
        cpu = [r.cpu for r in over["aegis"] if r.cpu is not None]
        mb = statistics.median(bare) if bare else None
        ma = statistics.median(aeg) if aeg else None
        ratio = f"{ma / mb * 100:.1f}%" if mb and ma else "—"
        mc = f"{statistics.median(cpu) * 100:.1f}%" if cpu else "—"
        head = [
            "bare runs",
            "aegis-flow runs",
            "bare median",
            "aegis-flow median",
            "aegis-flow / bare",
            "aegis-flow's own CPU (median)",
        ]
        row = [
            f"{len(bare)}/{len(over['bare'])}",
            f"{len(aeg)}/{len(over['aegis'])}",
            fmt(mb, digits=1),
            fmt(ma, digits=1),
            ratio,
            mc,
        ]
        parts.append(
            f"**Supervision overhead** (2 ranks, {a.overhead_steps} steps, --step-time 0, no "
            "checkpoints, no fault; steps/s after the first step, mean over ranks; "
            "aegis-flow's own CPU: what its master, supervisors, zygotes, CLI and nats-server "
            "used while both ranks trained, in % of one core):\n\n"
            + table(head, [row])
            + "\n\nPer run, in order (steps/s): bare "
            + ", ".join(fmt(r.rate, digits=1) for r in over["bare"])
            + "; aegis-flow "
            + ", ".join(fmt(r.rate, digits=1) for r in over["aegis"])
            + " (own CPU "
            + ", ".join(fmt(r.cpu, 100, 1) for r in over["aegis"])
            + " %)"
        )
    return "\n\n".join(parts) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--trials", type=int, default=20, help="recovery trials per system (20)")
    p.add_argument("--workers", type=int, default=4, help="ranks in a recovery trial (4)")
    p.add_argument("--steps", type=int, default=100, help="steps of a recovery trial (100)")
    p.add_argument("--step-time", type=float, default=0.05, help="sleep per step (0.05 s)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="checkpoint period (10)")
    p.add_argument(
        "--kill-after",
        type=float,
        default=3.0,
        help="kill rank 1 this long after its process started (3 s; torchrun: and at least "
        f"{MIN_TRAINING:g} s after every rank's first step)",
    )
    p.add_argument("--timeout", type=float, default=90.0, help="per trial, seconds (90)")
    p.add_argument(
        "--only",
        choices=("aegis", "torchrun", "both"),
        default="both",
        help="which systems' recovery to measure (both)",
    )
    p.add_argument(
        "--no-prewarm", action="store_true", help="run aegis-flow with --no-prewarm (cold restarts)"
    )
    p.add_argument(
        "--overhead-runs",
        type=int,
        default=5,
        help="overhead runs per variant (5; 0 skips the overhead measurement)",
    )
    p.add_argument("--overhead-steps", type=int, default=1000, help="steps per overhead run (1000)")
    p.add_argument("--work-dir", type=Path, help="logs and checkpoints (default: a temp dir)")
    p.add_argument("--keep-logs", action="store_true", help="keep logs of good trials too")
    p.add_argument("--out", type=Path, help="also write the tables here, as markdown")
    a = p.parse_args(argv)
    if a.workers < 2 or a.trials < 0 or a.timeout <= 0 or a.overhead_runs < 0:
        p.error("--workers must be >= 2 (rank 1 is killed), --trials/--overhead-runs >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="aegis-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    start = datetime.datetime.now()
    t0 = time.monotonic()
    load0 = "{:.2f}/{:.2f}/{:.2f}".format(*os.getloadavg())
    machine = f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}"
    print(f"aegis-flow recovery benchmark: {machine}; logs in {work}", flush=True)
    systems = {"aegis": ["aegis"], "torchrun": ["torchrun"], "both": ["aegis", "torchrun"]}
    order = systems[a.only]
    trials: list[Trial] = []
    for i in range(a.trials):
        for s in order if i % 2 == 0 else order[::-1]:
            tr = (aegis_trial if s == "aegis" else torchrun_trial)(a, i, work)
            trials.append(tr)
            status = f"recovery {tr.recovery:.3f} s" if tr.ok and tr.recovery else "FAILED"
            extra = f", detection {tr.detection * 1e3:.1f} ms" if tr.detection is not None else ""
            why = f" ({tr.why}; log {tr.log})" if tr.why else ""
            leak = f", {len(tr.leftover)} processes left behind" if tr.leftover else ""
            print(
                f"  {i + 1:2d}/{a.trials} {tr.system:10s} {status}{extra}{leak}{why} "
                f"[{tr.wall:.1f} s]",
                flush=True,
            )
            if tr.ok and not tr.leftover and not a.keep_logs and tr.log:
                shutil.rmtree(tr.log.parent, ignore_errors=True)
    over: dict[str, list[Run]] = {}
    if a.overhead_runs:
        over = {"bare": [], "aegis": []}
        for i in range(a.overhead_runs):
            for kind in ("bare", "aegis") if i % 2 == 0 else ("aegis", "bare"):
                r = overhead_run(a, kind, i, work)
                over[kind].append(r)
                own = f" (own CPU {r.cpu * 100:.1f}% of a core)" if r.cpu is not None else ""
                print(
                    f"  overhead {kind:5s} #{i + 1}: {fmt(r.rate, digits=1)} steps/s{own}",
                    flush=True,
                )
    wall = time.monotonic() - t0
    meta = {
        "start": start.strftime("%Y-%m-%d %H:%M"),
        "end": datetime.datetime.now().strftime("%H:%M"),
        "wall": f"{wall / 60:.1f} min",
        "machine": machine,
        "load0": load0,
        "load1": "{:.2f}/{:.2f}/{:.2f}".format(*os.getloadavg()),
    }
    text = report(a, trials, over, meta)
    print("\n" + text, flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    runs = [r for rs in over.values() for r in rs]
    clean = all(t.ok and not t.leftover for t in trials) and all(r.rate for r in runs)
    if not a.keep_logs and not a.work_dir and clean:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
