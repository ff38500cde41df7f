#!/usr/bin/env python3
"""One node's GPU validation: the checks, the collective bootcheck, and a recovery, in one table.

Run it on a GPU node (every GPU it sees takes part) to see what aegis-flow does there::

    .venv/bin/python bench/gpu_check.py                 # all GPUs; NCCL
    .venv/bin/python bench/gpu_check.py --cpu-ranks 2   # no GPU: the same steps on CPU (gloo)

1. **checks**: ``aegis-flow check gpu`` and ``check runtime`` (NVML: every GPU present, ECC,
   temperature; torch and its CUDA backend really work), their status and time;
2. **collective bootcheck**: ``aegis-flow check allreduce`` with one process per GPU (NCCL on
   GPUs, gloo on CPU): an all_reduce and an all_gather whose results every rank verifies, and
   the bandwidth it measured (on CPU ranks, which share the machine's cores, a rank flagged
   slow with nothing else wrong is measured again, three attempts in all, and the row says
   so; on GPUs a slow rank fails the step at once);
3. **recovery**: ``aegis-flow run --workers 1 --nproc-per-node N`` over
   ``examples/train_ddp.py`` (``AEGIS_TIMING=1``); once every rank has stepped, the last rank
   (a non-zero local rank) is killed with SIGKILL; the time from the kill to every rank's first
   step after the in-place restart, and the CUDA/process-group/NCCL init cost inside it (the
   restarted ranks' ``AEGIS_INIT`` lines: what pre-warming cannot save, as a forked process
   must set up CUDA itself).

Prints one table (``--out FILE``: also as markdown, with the machine and the date). Side
effects: starts processes (all stopped before it returns, also on Ctrl-C), a temporary
directory (removed). Exit 0 when every step passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tables  # bench/tables.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
_VENV_PY = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PY) if _VENV_PY.exists() else sys.executable
FIRST_RE = re.compile(r"AEGIS_FIRST_STEP_INFO rank (\d+) restart (\d+) pid (\d+) at ([\d.]+)")
INIT_RE = re.compile(r"AEGIS_INIT rank (\d+) restart (\d+) seconds ([\d.]+)")

Row = list[str]


def gpu_count() -> int:
    """GPUs torch sees, asked in a child process (this one never initialises CUDA)."""
    out = subprocess.run([PYTHON, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, timeout=120, check=False)
    try:
        return int(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


def check_rows(work: Path) -> tuple[list[Row], bool]:
    done = subprocess.run([PYTHON, "-m", "aegis_flow.cli", "check", "gpu,runtime", "--json",
                           "--dir", str(work)], capture_output=True, text=True, timeout=300,
                          check=False)
    try:
        results = json.loads(done.stdout)
    except ValueError:
        return [["checks gpu, runtime", "ERROR", "-", (done.stderr or done.stdout)[-200:]]], False
    rows, ok = [], True
    for r in results:
        status = str(r.get("status"))
        ok = ok and status in ("pass", "not_applicable")
        rows.append([f"check {r.get('check_type')}", status,
                     f"{float(r.get('duration') or 0) * 1000:.0f} ms",
                     str(r.get("detail") or "")[:90]])
    return rows, ok


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def only_slow(results: list[dict[str, Any]]) -> list[int]:
    """The ranks flagged slow when that is the only failure (every collective verified, the
    performance check failed for slowness alone); [] otherwise."""
    bad = [r for r in results if r.get("status") != "pass"]
    if not bad or any(r.get("check_type") != "allreduce_performance" for r in bad):
        return []
    slow = {int(x) for r in bad for x in (r.get("data") or {}).get("slow_ranks") or []
            if isinstance(x, int)}
    return sorted(slow)


def collective_row(ranks: int, work: Path, *, tries: int = 1) -> tuple[Row, bool]:
    """The collective bootcheck's row. ``tries``: on CPU ranks, which share this machine's
    cores with each other and with whatever else runs, a rank flagged slow (and nothing else
    wrong) is measured again, up to this many times in all; the row says so."""
    flagged: list[list[int]] = []
    for _ in range(tries):
        row, ok, slow = _collective_once(ranks, work)
        if ok or not slow:
            break
        flagged.append(slow)
    if flagged and ok:
        row[3] += (f"; attempt {len(flagged) + 1} of {tries}: the earlier one(s) flagged rank(s) "
                   f"{', '.join(','.join(map(str, s)) for s in flagged)} slow (CPU ranks "
                   "share the cores)")
    elif flagged:
        row[3] = f"rank(s) flagged slow in all {tries} attempts: " + row[3]
    return row, ok


def _collective_once(ranks: int, work: Path) -> tuple[Row, bool, list[int]]:
    url = f"tcp://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([PYTHON, "-m", "aegis_flow.cli", "check", "allreduce", "--json",
                               "--world-size", str(ranks), "--rank", str(r), "--rendezvous",
                               url, "--dir", str(work)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in range(ranks)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            try:
                results.extend(json.loads(out))
            except ValueError:
                results.append({"status": "error", "message": err[-200:]})
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    statuses = {str(r.get("status")) for r in results}
    ok = statuses == {"pass"} and len(results) >= ranks
    data = [r.get("data") or {} for r in results]
    backend = next((d.get("backend") for d in data if d.get("backend")), "?")
    bws = [float(d["rank_bandwidth_gbps"]) for d in data
           if isinstance(d.get("rank_bandwidth_gbps"), int | float)]
    took = max((float(r.get("duration") or 0) for r in results), default=0.0)
    detail = (f"{ranks} ranks, {backend}: all_reduce + all_gather verified"
              + (f", {min(bws):.2f}–{max(bws):.2f} GB/s per rank" if bws else "")
              if ok else "; ".join(str(r.get("detail") or r.get("message") or "")[:80]
                                   for r in results if r.get("status") != "pass"))
    return ["collective bootcheck", "pass" if ok else ",".join(sorted(statuses)),
            f"{took * 1000:.0f} ms", detail], ok, only_slow(results)


def recovery_rows(ranks: int, work: Path, steps: int, timeout: float) -> tuple[list[Row], bool]:
    env = {**os.environ, "AEGIS_TIMING": "1", "OMP_NUM_THREADS": "1"}
    cmd = [PYTHON, "-m", "aegis_flow.cli", "run", "--state-dir", str(work / ".aegis"),
           "--workers", "1", "--nproc-per-node", str(ranks), "--max-retry", "1", "--quiet",
           "--", "python", str(EXAMPLE), "--steps", str(steps), "--step-time", "0.02",
           "--checkpoint-every", "20", "--checkpoint-dir", str(work / "ck")]
    lines: list[tuple[float, str]] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=work, start_new_session=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def firsts(restart: int) -> dict[int, tuple[int, float]]:
        return {int(m[1]): (int(m[3]), float(m[4])) for _, text in list(lines)
                if (m := FIRST_RE.search(text)) and int(m[2]) == restart}

    def fail(why: str) -> tuple[list[Row], bool]:
        tail = " | ".join(t for _, t in lines[-3:])
        return [["recovery (SIGKILL of one rank)", "FAILED", "-", f"{why}: {tail}"[:200]]], False

    deadline = time.monotonic() + timeout
    try:
        while len(firsts(0)) < ranks:
            if time.monotonic() > deadline or proc.poll() is not None:
                return fail("the ranks never all stepped")
            time.sleep(0.1)
        time.sleep(1.0)
        victim = ranks - 1
        pid = firsts(0)[victim][0]
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        while len(firsts(1)) < ranks:
            if time.monotonic() > deadline or proc.poll() is not None:
                return fail("not every rank stepped again")
            time.sleep(0.05)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return fail("the job did not end")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(timeout=5)
    back = max(t for _, t in firsts(1).values()) - killed
    inits = [float(m[3]) for _, text in lines if (m := INIT_RE.search(text)) and m[2] == "1"]
    first_inits = [float(m[3]) for _, text in lines if (m := INIT_RE.search(text))
                   and m[2] == "0"]
    ok = code == 0
    return [
        ["recovery (SIGKILL of one rank)", "pass" if ok else f"exit {code}",
         f"{back:.2f} s", f"rank {victim} killed; kill → every one of {ranks} ranks' first "
         "step after the in-place restart"],
        ["  init inside it (CUDA, process group, NCCL)", "-",
         f"{max(inits):.2f} s" if inits else "-",
         "the slowest restarted rank's AEGIS_INIT (first start: "
         + (f"{max(first_inits):.2f} s)" if first_inits else "-)")],
    ], ok


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs to use (default: every GPU torch sees)")
    ap.add_argument("--cpu-ranks", type=int, default=2,
                    help="ranks when there is no GPU: the same steps on CPU with gloo "
                    "(default 2)")
    ap.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    ap.add_argument("--timeout", type=float, default=300.0, help="for the recovery, seconds")
    ap.add_argument("--out", default=None, help="also write the table as markdown here")
    args = ap.parse_args(argv)
    if args.cpu_ranks < 2 or (args.gpus is not None and args.gpus < 1) or args.steps < 50:
        ap.error("--cpu-ranks must be at least 2, --gpus at least 1, --steps at least 50")
    gpus = gpu_count() if args.gpus is None else args.gpus
    ranks = gpus if gpus >= 1 else args.cpu_ranks
    where = f"{gpus} GPU(s)" if gpus else f"no GPU: {ranks} CPU ranks (gloo)"
    print(f"gpu_check: {where}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="aegis-gpu-check-") as tmp:
        work = Path(tmp)
        rows, ok1 = check_rows(work)
        if ranks >= 2:
            row, ok2 = collective_row(ranks, work, tries=1 if gpus else 3)
            rows.append(row)
        else:
            ok2 = True
            rows.append(["collective bootcheck", "not_applicable", "-", "one GPU: no peer"])
        rec, ok3 = (recovery_rows(ranks, work, args.steps, args.timeout) if ranks >= 2 else
                    ([["recovery", "not_applicable", "-", "one GPU: no non-zero local rank"]],
                     True))
        rows += rec
    header = ["step", "status", "time", "detail"]
    print(tables.render(header, rows, markdown=False))
    if args.out:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        Path(args.out).write_text(f"{when}, {platform.node()} ({os.cpu_count()} CPUs), "
                                  f"{where}:\n\n" + tables.render(header, rows, markdown=True)
                                  + "\n")
    return 0 if ok1 and ok2 and ok3 else 1


if __name__ == "__main__":
    sys.exit(main())
