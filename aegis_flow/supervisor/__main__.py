"""``aegis-flow worker [options] -- CMD ...``: the worker entrypoint (PID 1 safe).

Standard library, nats-py and our light protocol only: this module is what gets injected into
the user's image. Side effects: those of ``agent.Supervisor.run`` (NATS, the child process).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

from aegis_flow.argtypes import positive_int, positive_seconds, saver_command
from aegis_flow.outcome import write_outcome
from aegis_flow.settings import MASTER, WORKER, ConfigError, check_worker, env_value, report
from aegis_flow.supervisor.agent import Supervisor, WorkerConfig
from aegis_flow.supervisor.inject import Injection, InjectionError


def build_parser(prog: str = "aegis-flow worker") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog, usage=f"{prog} [options] -- CMD [ARG ...]",
        description="Run CMD under the aegis-flow supervisor: report to the master over NATS, "
        "obey its orders (run, stop, restart in place, troubleshoot, quit), and fall back to "
        "running CMD as a plain process when the master cannot be reached.")
    env = env_value
    ap.add_argument("--job", default=env("AEGIS_JOB", ""), help="job name (env AEGIS_JOB)")
    ap.add_argument("--namespace", default=env("AEGIS_NAMESPACE", WORKER.namespace))
    # RANK and WORLD_SIZE are torch's names: argparse's int() checks them (a string default)
    ap.add_argument("--rank", type=int, default=os.environ.get("RANK", "-1"),
                    help="rank (env RANK)")
    ap.add_argument("--world-size", type=int, default=os.environ.get("WORLD_SIZE", "0"),
                    help="number of workers (env WORLD_SIZE)")
    ap.add_argument("--nats-url", default=env("AEGIS_NATS_URL", WORKER.nats_url))
    ap.add_argument("--node", default=env("AEGIS_NODE", socket.gethostname()))
    ap.add_argument("--pod-ip", default=os.environ.get("POD_IP", WORKER.pod_ip))
    ap.add_argument("--connect-timeout", type=float, default=WORKER.connect_timeout,
                    help="seconds to reach NATS before running CMD without fault tolerance")
    ap.add_argument("--orphan-timeout", type=float, default=WORKER.orphan_timeout,
                    help="seconds with no master, once the job has begun, before the worker "
                    "stops waiting for one: a running CMD runs to completion and its exit code "
                    "becomes the worker's; more than the master's lost timeout (default "
                    f"{WORKER.orphan_timeout:g})")
    ap.add_argument("--master-timeout", type=float, default=WORKER.master_timeout,
                    help="seconds to wait for the master's first order before falling back; "
                    "more than the master's connect timeout")
    ap.add_argument("--master-connect-timeout", type=positive_seconds,
                    default=MASTER.connect_timeout,
                    help="the master's --connect-timeout, to check --master-timeout against "
                    f"(default {MASTER.connect_timeout:g})")
    ap.add_argument("--heartbeat", type=float, default=WORKER.heartbeat_interval,
                    help="heartbeat interval (s)")
    ap.add_argument("--grace", type=float, default=WORKER.grace,
                    help="seconds between SIGTERM and SIGKILL when stopping CMD")
    ap.add_argument("--work-dir", default=env("AEGIS_WORK_DIR", WORKER.work_dir),
                    help="directory the io check writes to (the checkpoint directory)")
    ap.add_argument("--no-prewarm", dest="prewarm", action="store_false",
                    help="start every run of a Python command cold instead of forking it from "
                    "a pre-warmed interpreter that has already imported torch")
    ap.add_argument("--outcome-dir", default=env("AEGIS_OUTCOME_DIR", ""),
                    help="write the outcome word and node name here at exit, for the Argo "
                    "workflow's guards (env AEGIS_OUTCOME_DIR; empty: do not write)")
    ap.add_argument("--creds", default=env("AEGIS_NATS_CREDS", ""),
                    help="NATS credentials file, as written by `aegis-flow worker-init` "
                    "(renewed before it expires) or any NATS .creds file; if it is missing the "
                    "command runs without fault tolerance (env AEGIS_NATS_CREDS)")
    ap.add_argument("--nkey-seed", default=env("AEGIS_NATS_NKEY_SEED", ""),
                    help="NATS nkey seed file, for a server with nkey users "
                    "(env AEGIS_NATS_NKEY_SEED)")
    ap.add_argument("--hang-after", type=positive_seconds, default=WORKER.hang_after,
                    metavar="SECONDS", help="no progress (progress.step(), else the optimizer "
                    "steps and forwards the pre-warmed interpreter counts, else output) for this "
                    "long: report a hang; the command keeps running (T13; default "
                    f"{WORKER.hang_after:g})")
    ap.add_argument("--hang-quit-after", type=positive_seconds, default=WORKER.hang_quit_after,
                    metavar="SECONDS", help="no progress for this long: ask the master to "
                    f"restart the job (HangWithQuit, T14; default {WORKER.hang_quit_after:g})")
    ap.add_argument("--saver", type=saver_command, default=(), metavar="CMD",
                    help="a checkpoint saver/uploader to run beside CMD, as one shell-like "
                    "string (split like a shell does; no shell runs it), e.g. \"python "
                    "upload.py --dir ckpt\": it gets CMD's environment, its "
                    "output is shown with [rank N saver], it is restarted 3 s after every "
                    "exit (0 included) and stopped when this worker exits")
    ap.add_argument("--checkpoint-dir", default=env("AEGIS_CHECKPOINT_DIR", ""), metavar="DIR",
                    help="where CMD's checkpoints are (env AEGIS_CHECKPOINT_DIR; CMD gets it "
                    "too): rank 0 reports each completed one to the master and, before every "
                    "run, verifies the newest (integrity gate), moves damaged ones aside and "
                    "points DIR/aegis-resume at the first good one ($AEGIS_RESUME_FROM)")
    ap.add_argument("--checkpoint-pattern", default="ckpt-*", metavar="GLOB",
                    help="which names in --checkpoint-dir are checkpoints, newest = largest "
                    "number in the name (default 'ckpt-*'; e.g. 'step_*' for "
                    "torch.distributed.checkpoint directories)")
    ap.add_argument("--nproc-per-node", type=positive_int, default=1, metavar="K",
                    help="local ranks this worker runs, as torchrun's --nproc-per-node (one "
                    "per GPU): each gets LOCAL_RANK 0..K-1, RANK = rank*K + local, WORLD_SIZE = "
                    "world-size*K, LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK = rank; any local "
                    "rank's failure is this worker's, and a restart restarts all K (default 1)")
    ap.add_argument("--causes", default=env("AEGIS_CAUSES", "") or None, metavar="FILE",
                    help="your own cause table (TOML, the format of aegis-flow's "
                    "data/causes.toml; env AEGIS_CAUSES): extends or overrides the default "
                    "rules the log classifier and the live trigger use (a rule with "
                    "live = true is reported the moment a line matches)")
    ap.add_argument("--inject", action="append", default=[], metavar="SPEC",
                    help="fault injection for tests: crash:rank=R:after=5s, "
                    "exit:rank=R:code=3:after=8s (epoch=N|all selects the run epoch)")
    return ap


def parse(argv: list[str], prog: str = "aegis-flow worker") -> tuple[WorkerConfig, str]:
    """The supervisor's config and the outcome directory ("" when none); checked.

    A bad setting (here or in an ``AEGIS_*`` variable) exits 2 with one line on stderr.
    """
    try:
        return _parse(argv, prog)
    except ConfigError as exc:
        raise SystemExit(report(exc)) from None


def _parse(argv: list[str], prog: str) -> tuple[WorkerConfig, str]:
    ap = build_parser(prog)
    if "--" in argv:
        i = argv.index("--")
        opts, command = argv[:i], argv[i + 1:]
    else:
        opts, command = argv, []
    a = ap.parse_args(opts)
    if not command:
        ap.error("no command given: put it after '--', e.g. -- python train.py")
    if not a.job:
        ap.error("--job is required (or set AEGIS_JOB)")
    try:
        injections = tuple(Injection.parse(s) for s in a.inject)
    except InjectionError as exc:
        ap.error(str(exc))
    if a.causes:
        from aegis_flow.steps.classify import CauseTableError, load_table

        try:
            load_table(a.causes)  # a bad table is refused now, not at the first failure
        except CauseTableError as exc:
            ap.error(f"--causes: {exc}")
    cfg = WorkerConfig(command=tuple(command), job=a.job, namespace=a.namespace, rank=a.rank,
                       world_size=a.world_size, nats_url=a.nats_url, node=a.node,
                       pod_ip=a.pod_ip, connect_timeout=a.connect_timeout,
                       master_timeout=a.master_timeout, orphan_timeout=a.orphan_timeout,
                       heartbeat_interval=a.heartbeat,
                       grace=a.grace, injections=injections, work_dir=a.work_dir,
                       prewarm=a.prewarm, nkey_seed=a.nkey_seed,
                       hang_after=a.hang_after, hang_quit_after=a.hang_quit_after,
                       creds=a.creds, saver=a.saver, checkpoint_dir=a.checkpoint_dir,
                       checkpoint_pattern=a.checkpoint_pattern, causes_file=a.causes,
                       nproc_per_node=a.nproc_per_node)
    check_worker(cfg, master_connect_timeout=a.master_connect_timeout)
    return cfg, a.outcome_dir


def main(argv: list[str] | None = None, prog: str = "aegis-flow worker") -> int:
    cfg, outcome_dir = parse(list(sys.argv[1:] if argv is None else argv), prog)
    # the NATS client logs a traceback for every failed reconnect; the supervisor reports NATS
    # errors itself, once per 30 s (agent._nats_error)
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    code = 1
    sup = Supervisor(cfg)
    try:
        code = asyncio.run(sup.run())
    finally:
        if outcome_dir:  # also when run() raised: the workflow must see a word, not nothing
            try:
                word = write_outcome(outcome_dir, code, cfg.node,
                                     restarts=max(0, sup.child_starts - 1))
                sys.stderr.write(f"[aegis-flow worker] outcome {word} (exit {code}) written "
                                 f"to {outcome_dir}\n")
            except OSError as exc:
                sys.stderr.write(f"[aegis-flow worker] cannot write the outcome to "
                                 f"{outcome_dir}: {exc}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
