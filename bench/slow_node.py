#!/usr/bin/env python3
"""A slow node evicted at the checkpoint boundary: time to mark, steps lost, throughput.

Each trial runs ``aegis-flow run`` over ``tests/fixtures/slow_ddp.py`` (a real DDP training,
gloo on CPU) in which every forward on node ``local-node-1`` takes ``--slow-ms`` longer (a
throttled node: its peers wait for it in every step). The master marks rank 1 slow after
``--slow-window`` seconds, evicts it right after the next checkpoint (exit 72, node
quarantined), and the job resumes from that checkpoint with rank 1 on a fresh node.

Two ways of saying a checkpoint is complete alternate trial by trial: ``watch`` (no code
change: rank 0's supervisor sees ``ckpt-<step>.pt`` appear in ``--checkpoint-dir``, looking
every second), ``api`` (the script calls ``aegis_flow.checkpoint.done``) and ``round`` (``api``,
and the script also saves at once when ``aegis_flow.checkpoint.requested()`` returns the
fault-tolerance round the master asks for when it marks the rank slow). Per trial:

* **time to mark**: the master's T13s line − the training's first step;
* **mark → eviction**: from the T13s line to the T13e line (how long the job keeps training at
  the slow node's pace after it is known to be slow);
* **steps lost at the boundary**: steps trained after the checkpoint the eviction waited for,
  and trained again after the restart (goal 0);
* **steps lost if killed at detection** (the peer: what evicting at once would cost, measured
  in the same run): steps trained since the last checkpoint at the moment of the mark;
* **throughput** before the eviction (slow node in the job) and after it (steps/s).

Side effects: starts processes under ``--work-dir`` (a temporary directory, removed), prints
a table, writes ``--out`` (markdown). Standard library only (the fixture needs torch).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import tables  # bench/tables.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "slow_ddp.py"
_VENV_PY = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PY) if _VENV_PY.exists() else sys.executable

MARK_RE = re.compile(r"\[aegis-flow master\] T13s: rank (\d+) is slow")
EVICT_RE = re.compile(r"\[aegis-flow master\] T13e: rank (\d+)")
CKPT_RE = re.compile(r"\[aegis-flow master\] checkpoint at step (\d+)$")


@dataclass
class Trial:
    mode: str
    ok: bool
    to_mark: float = float("nan")
    to_evict: float = float("nan")
    lost_boundary: int = -1
    lost_at_detection: int = -1
    rate_before: float = float("nan")
    rate_after: float = float("nan")
    note: str = ""


def run_trial(mode: str, args: argparse.Namespace, work: Path) -> Trial:
    work.mkdir(parents=True)
    log = work / "steps.log"
    cmd = [PYTHON, "-m", "aegis_flow.cli", "run", "--state-dir", str(work / ".aegis"),
           "--workers", str(args.workers), "--max-retry", "1", "--quiet",
           "--slow-window", str(args.slow_window), "--checkpoint-dir", str(work / "ck"),
           "--", "python", str(FIXTURE), "--steps", str(args.steps), "--every",
           str(args.every), "--slow-node", "local-node-1", "--slow-ms", str(args.slow_ms),
           "--log", str(log), *(["--say-done"] if mode in ("api", "round") else []),
           *(["--honour-requests"] if mode == "round" else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    lines: list[tuple[float, str]] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=work, start_new_session=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        return Trial(mode, False, note=f"did not end within {args.timeout:.0f} s")
    reader.join(timeout=5)
    if code != 0 or not log.exists():
        return Trial(mode, False, note=f"exit {code}: " + " | ".join(t for _, t in lines[-3:]))
    return measure(mode, lines, log, args.every)


def measure(mode: str, lines: list[tuple[float, str]], log: Path, every: int) -> Trial:
    runs: list[list[tuple[int, float]]] = []  # the steps of each run of the command
    starts: list[int] = []
    for r in (line.split() for line in log.read_text().splitlines()):
        if r[0] == "start":
            runs.append([])
            starts.append(int(r[1]))
        elif runs:
            runs[-1].append((int(r[1]), float(r[2])))
    mark = next((t for t, text in lines if MARK_RE.search(text)), None)
    if mark is None or not runs or not runs[0]:
        return Trial(mode, False, note="no slow mark")
    if len(runs) != 2 or not runs[1]:
        return Trial(mode, False, note=f"{len(runs)} run(s) of the command, not 2")
    before, after = runs
    steps = before + after
    lost = before[-1][0] - starts[1]  # trained after the checkpoint it resumed from
    evict = next((t for t, text in lines if EVICT_RE.search(text)), float("nan"))
    at_mark = max((s for s, t in before if t <= mark), default=0)
    lost_at_detection = at_mark - (at_mark // every) * every

    def rate(part: list[tuple[int, float]]) -> float:
        if len(part) < 2 or part[-1][1] <= part[0][1]:
            return float("nan")
        return (len(part) - 1) / (part[-1][1] - part[0][1])

    return Trial(mode, True, to_mark=mark - steps[0][1], to_evict=evict - mark,
                 lost_boundary=lost,
                 lost_at_detection=lost_at_detection, rate_before=rate(before),
                 rate_after=rate(after))


def med(values: Sequence[float]) -> str:
    vals = [v for v in values if v == v]
    return f"{statistics.median(vals):.1f}" if vals else "-"


def span(values: Sequence[float]) -> str:
    vals = [v for v in values if v == v]
    return f"{min(vals):.1f}–{max(vals):.1f}" if vals else "-"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--trials", type=int, default=3, help="trials per mode (default 3)")
    ap.add_argument("--workers", type=int, default=2, help="ranks (2-4; default 2)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=50, help="checkpoint period in steps")
    ap.add_argument("--slow-ms", type=float, default=40.0, help="extra ms per forward")
    ap.add_argument("--slow-window", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="per trial, seconds")
    ap.add_argument("--modes", default="watch,api,round",
                    help="comma-separated: watch, api, round (default all three)")
    ap.add_argument("--out", default=None, help="also write the results as markdown here")
    args = ap.parse_args(argv)
    if not 2 <= args.workers <= 4 or args.trials < 1:
        ap.error("--workers must be 2-4 and --trials at least 1")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or not set(modes) <= {"watch", "api", "round"}:
        ap.error("--modes takes a comma-separated subset of watch,api,round")
    base = Path(tempfile.mkdtemp(prefix="aegis-bench-slow-"))
    trials: list[Trial] = []
    try:
        for i in range(args.trials):
            for mode in modes:
                t = run_trial(mode, args, base / f"{mode}-{i}")
                trials.append(t)
                print(f"trial {i + 1}/{args.trials} {mode}: "
                      + (f"mark {t.to_mark:.1f} s, evicted {t.to_evict:.1f} s later, "
                         f"lost {t.lost_boundary} (at detection "
                         f"{t.lost_at_detection}), {t.rate_before:.1f} → {t.rate_after:.1f} "
                         "steps/s" if t.ok else f"FAILED ({t.note})"), file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    header = ["checkpoint said by", "ok", "time to mark s", "mark → eviction s",
              "steps lost at the boundary",
              "steps lost if killed at detection", "steps/s with the slow node",
              "steps/s after eviction", "speed-up"]
    rows = []
    for mode in modes:
        ok = [t for t in trials if t.mode == mode and t.ok]
        ups = [t.rate_after / t.rate_before for t in ok if t.rate_before > 0]
        rows.append([
            {"watch": "directory watch (no code change)",
             "api": "aegis_flow.checkpoint.done()",
             "round": "done() + requested() round"}[mode],
            f"{len(ok)}/{args.trials}", f"{med([t.to_mark for t in ok])} "
            f"({span([t.to_mark for t in ok])})",
            f"{med([t.to_evict for t in ok])} ({span([t.to_evict for t in ok])})",
            f"{med([t.lost_boundary for t in ok])} ({span([t.lost_boundary for t in ok])})",
            f"{med([t.lost_at_detection for t in ok])} "
            f"({span([t.lost_at_detection for t in ok])})",
            med([t.rate_before for t in ok]), med([t.rate_after for t in ok]),
            f"{statistics.median(ups):.1f}×" if ups else "-"])
    print(tables.render(header, rows, markdown=False))
    if args.out:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        Path(args.out).write_text(
            f"{when}, {platform.node()} ({os.cpu_count()} CPUs), {args.workers} ranks, "
            f"{args.steps} steps, checkpoint every {args.every}, +{args.slow_ms:g} ms per "
            f"forward on the slow node, --slow-window {args.slow_window:g}; medians "
            "(range):\n\n" + tables.render(header, rows, markdown=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
