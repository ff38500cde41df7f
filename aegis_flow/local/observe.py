"""Subcommands for looking at a job: ``status --watch``, ``logs [--follow]``, ``report``.

Thin: parse, call the library (``master/faultlog.py``, ``report.py``), print. Side effects:
reads the job's state dir (``status.json``, ``logs/``), writes the picture ``report`` draws,
prints to stdout/stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aegis_flow.argtypes import job_name


def add_parsers(sub: Any) -> None:
    g = sub.add_parser("logs", help="print a job's fault log (JSON lines), optionally following it",
                       description="The fault log: one record per phase start/end, worker "
                       "report, quarantine, recovery and the job's end, from "
                       "STATE_DIR/JOB/logs/faults.jsonl (and its rotated files).")
    g.add_argument("job", nargs="?", default="job", type=job_name)
    g.add_argument("--state-dir", type=Path, default=Path(".aegis"))
    g.add_argument("--log-dir", type=Path, help="read this directory instead")
    g.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new records until the job ends (or Ctrl-C)")
    g.add_argument("--json", action="store_true", help="print the raw JSON lines")
    g.set_defaults(handler=_logs)

    r = sub.add_parser("report", help="draw a job's timeline picture (phases, faults, recoveries)",
                       description="Draw each worker's phases over time from the fault log, "
                       "with faults and recoveries marked, as a PNG (needs matplotlib: "
                       "pip install 'aegis-flow[report]').")
    r.add_argument("job", nargs="?", default="job", type=job_name)
    r.add_argument("-o", "--output", type=Path, default=Path("timeline.png"),
                   help="the picture to write (default timeline.png)")
    r.add_argument("--state-dir", type=Path, default=Path(".aegis"))
    r.add_argument("--log-dir", type=Path, help="read this directory instead")
    r.set_defaults(handler=_report)


def _log_dir(a: argparse.Namespace) -> Path:
    return Path(a.log_dir) if a.log_dir else a.state_dir / a.job / "logs"


def _logs(a: argparse.Namespace) -> int:
    from aegis_flow.master.faultlog import FaultLogError, follow, format_record, read_records

    d = _log_dir(a)
    if not d.is_dir():
        print(f"aegis-flow logs: no fault log for job {a.job!r} in {d} (was it run with "
              "--state-dir elsewhere? pass --state-dir or --log-dir)", file=sys.stderr)
        return 2
    try:
        records = follow(d) if a.follow else iter(read_records(d))
        for rec in records:
            print(json.dumps(rec, ensure_ascii=False) if a.json else format_record(rec),
                  flush=a.follow)
    except FaultLogError as exc:
        print(f"aegis-flow logs: damaged fault log: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def _report(a: argparse.Namespace) -> int:
    from aegis_flow.master.faultlog import FaultLogError, read_records

    d = _log_dir(a)
    try:
        records = read_records(d) if d.is_dir() else []
    except FaultLogError as exc:
        print(f"aegis-flow report: damaged fault log: {exc}", file=sys.stderr)
        return 1
    if not records:
        print(f"aegis-flow report: no fault log records for job {a.job!r} in {d}",
              file=sys.stderr)
        return 2
    try:
        from aegis_flow.report import draw_timeline
    except ImportError as exc:
        print(f"aegis-flow report: {exc}; install it with pip install 'aegis-flow[report]'",
              file=sys.stderr)
        return 2
    try:
        draw_timeline(records, a.output, title=f"aegis-flow job {a.job}")
    except OSError as exc:
        print(f"aegis-flow report: cannot write {a.output}: {exc}", file=sys.stderr)
        return 2
    print(f"timeline written to {a.output}")
    return 0


def _mtime(path: Path) -> float:
    """When ``path`` was last written; 0 when it does not exist."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def status_command(a: argparse.Namespace, live: Callable[[argparse.Namespace], int]) -> int:
    """``status`` once or ``--watch``: live from NATS while the job runs, else its final file
    (``status.json``, or the newest archived run's), else one line saying there is none."""
    from aegis_flow.local.runs import LOCK_FILE, archived_runs, running_pid

    job_dir = a.state_dir / a.job
    final = job_dir / "status.json"

    shown: list[Path] = []  # the record files shown, in order (watch: was the last one final?)

    def show(path: Path, note: str) -> int:
        shown.append(path)
        raw = path.read_bytes()
        if a.json:
            try:
                print(json.dumps(json.loads(raw), indent=2, sort_keys=True))
            except ValueError:
                print(f"aegis-flow status: {path} is not JSON", file=sys.stderr)
                return 1
        else:
            from aegis_flow.local.status import render

            print(render(raw) + f"\n({note}; from {path})")
        return 0

    def ended_note(path: Path) -> str:
        from aegis_flow.local.status import last_run

        last = last_run(path.read_bytes())
        return ("the run was stopped before the job ended" if last.kind == "interrupted"
                else "the job has ended")

    def once() -> int:
        if not a.nats_url and running_pid(job_dir) is None:
            if final.exists():  # written when the run ended (by the master or the runner)
                return show(final, ended_note(final))
            if (job_dir / "nats.url").exists():  # a run that ended without its record
                print(f"aegis-flow status: job {a.job!r} in {a.state_dir} is not running and "
                      "left no final status (was aegis-flow run killed?); aegis-flow run "
                      "--resume continues it, --fresh archives it and starts over",
                      file=sys.stderr)
                return 1
            runs = [r for r in archived_runs(job_dir) if (r / "status.json").exists()]
            if runs:
                return show(runs[-1] / "status.json", "an archived run")
            print(f"aegis-flow status: no job {a.job!r} in {a.state_dir}", file=sys.stderr)
            return 1
        if not a.nats_url:
            started = _mtime(job_dir / LOCK_FILE)
            if final.exists() and _mtime(final) >= started:  # the run is ending: its record
                return show(final, ended_note(final))
            if _mtime(job_dir / "nats.url") < started or not _mtime(job_dir / "metrics.port"):
                # a new run is starting: the last run's files are still there or being
                # archived, and this run's master has not stored a status yet
                print(f"job {a.job!r} in {a.state_dir} is starting (aegis-flow run pid "
                      f"{running_pid(job_dir)}); no status yet")
                return 0
        rc = live(a)
        port_file = a.state_dir / a.job / "metrics.port"
        if rc == 0 and not a.json and port_file.exists():
            from aegis_flow.local.progress import fetch_progress

            snap = fetch_progress(port_file)
            rates = [f"r{w['rank']} {w['step_rate']:.1f}" for w in (snap or {}).get("workers", [])
                     if isinstance(w.get("step_rate"), int | float)]
            if rates:
                print(f"steps/s: {' · '.join(rates)}")
            print(f"metrics: http://127.0.0.1:{port_file.read_text().strip()}/metrics")
        return rc

    if a.watch is None:
        return once()
    if a.watch <= 0:
        print("aegis-flow status: --watch needs a positive number of seconds", file=sys.stderr)
        return 2
    try:
        def frame() -> tuple[int, bool]:
            """One look: its exit code, and whether it was live (not a record file)."""
            if sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")  # redraw in place
            else:
                print(f"--- {time.strftime('%H:%M:%S')}")
            before = len(shown)
            code = once()
            sys.stdout.flush()
            return code, len(shown) == before

        while True:
            rc, was_live = frame()
            local_run = not a.nats_url and running_pid(job_dir) is not None
            ended = not a.nats_url and (not local_run or (
                final.exists() and _mtime(final) >= _mtime(job_dir / LOCK_FILE)))
            if ended and was_live and final.exists():  # it ended after a live look: end on its
                rc, _ = frame()                    # record, as a plain `status` would show
            if ended or (rc != 0 and not local_run):  # a local run is watched through blips
                return rc
            time.sleep(a.watch)
    except KeyboardInterrupt:
        return 0
