"""``make demo``: the main job on one machine, end to end.

An embedded NATS server, a master and 4 supervised workers train the real DDP example
(examples/train_ddp.py, gloo on CPU); rank 1's training process is SIGKILLed a few seconds in;
the master detects it, troubleshoots, restarts every rank in place and the training resumes
from its last checkpoint to success. Side effects: processes, and files under ``--state-dir``
(default ``.aegis/demo``), which is cleared first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from aegis_flow.local.runner import RunConfig, run_job
from aegis_flow.local.status import render, summary_of

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aegis_flow.demo", description=__doc__)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--crash-after", default="6s", help="when rank 1 is killed (default 6s)")
    ap.add_argument("--state-dir", type=Path, default=Path(".aegis/demo"))
    a = ap.parse_args(argv)
    script = ROOT / "examples" / "train_ddp.py"
    if not script.exists():
        print(f"demo: {script} is missing (run from a checkout of aegis-flow)", file=sys.stderr)
        return 2
    shutil.rmtree(a.state_dir, ignore_errors=True)
    ck = a.state_dir / "checkpoints"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"== aegis-flow demo: {a.workers} ranks of examples/train_ddp.py, rank 1 killed "
          f"after {a.crash_after} ==", flush=True)
    t0 = time.monotonic()
    rc = run_job(RunConfig(
        command=(sys.executable, str(script), "--steps", str(a.steps), "--step-time", "0.05",
                 "--checkpoint-every", "10", "--checkpoint-dir", str(ck.absolute())),
        workers=a.workers, max_retry=3, job="demo", state_dir=a.state_dir,
        injections=(f"crash:rank=1:after={a.crash_after}",)))
    took = time.monotonic() - t0
    status_file = a.state_dir / "demo" / "status.json"
    print("\n== status ==")
    if status_file.exists():
        print(render(status_file.read_bytes()).rsplit("\n", 1)[0])
    print(f"exit code {rc} after {took:.1f} s")
    picture = draw_picture(a.state_dir / "demo")
    if picture is not None:
        print(f"timeline picture: {picture} (aegis-flow report demo --state-dir {a.state_dir})")
    print(f"fault log: {a.state_dir / 'demo' / 'logs' / 'faults.jsonl'} "
          f"(aegis-flow logs demo --state-dir {a.state_dir})")
    if status_file.exists():
        print(f"\n== summary ==\n{summary_of(status_file.read_bytes())}")
    return rc


def draw_picture(job_dir: Path) -> Path | None:
    """The timeline picture of the demo job (None, said why, when it cannot be drawn)."""
    from aegis_flow.master.faultlog import read_records

    try:
        records = read_records(job_dir / "logs")
        from aegis_flow.report import draw_timeline

        return draw_timeline(records, job_dir / "timeline.png", title="aegis-flow demo")
    except (ImportError, OSError, ValueError) as exc:
        print(f"no timeline picture: {exc}", file=sys.stderr)
        return None


if __name__ == "__main__":
    sys.exit(main())
