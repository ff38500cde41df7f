"""Subcommands of the local runtime: ``run``, ``worker``, ``master``, ``status``, ``stop``.

Thin: parse, validate, call the library. Side effects: those of the functions called.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from aegis_flow import protocol as p
from aegis_flow.argtypes import (
    job_name,
    non_negative_int,
    port,
    positive_int,
    positive_seconds,
    whole_number,
)
from aegis_flow.settings import LOCAL, MASTER, WORKER

SubParsers = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_parsers(sub: Any) -> None:
    r = sub.add_parser(
        "run", help="run a job locally: embedded NATS, a master and N supervised workers",
        usage="aegis-flow run --workers N [options] -- CMD [ARG ...]",
        description="Run CMD as N ranks on this machine under fault tolerance: a killed or "
        "failing rank is detected, diagnosed and every rank restarted in place, up to "
        "--max-retry times. Exits 0 when the job succeeded, 1 when it failed. Every run is a "
        "new job: the last run of the same --job in the same --state-dir is archived to "
        "STATE_DIR/JOB/runs/<id>/ when it ended; one that was interrupted is continued only with "
        "--resume (or archived with --fresh).")
    r.add_argument("--workers", type=whole_number, required=True, help="number of ranks")
    r.add_argument("--max-retry", type=non_negative_int, default=MASTER.max_retry,
                   help=f"max restarts (default {MASTER.max_retry})")
    r.add_argument("--give-up-on-repeat", action=argparse.BooleanOptionalAction,
                   default=MASTER.give_up_on_repeat,
                   help="end the job when a rank fails twice in a row with the same exception "
                   "at the same step (a bug retrying cannot fix) instead of using up the "
                   f"retries (default {'on' if MASTER.give_up_on_repeat else 'off'})")
    r.add_argument("--job", type=job_name, default=LOCAL.job,
                   help=f"job name (default {LOCAL.job!r})")
    r.add_argument("--namespace", type=job_name, default=MASTER.namespace)
    r.add_argument("--nats-url", help="use this NATS server instead of an embedded one")
    r.add_argument("--state-dir", type=Path, default=Path(LOCAL.state_dir),
                   help="where the NATS store, work dir and pid file go "
                   f"(default {LOCAL.state_dir})")
    again = r.add_mutually_exclusive_group()
    again.add_argument("--resume", dest="rerun", action="store_const", const="resume",
                       default="new", help="continue the job's interrupted last run (stopped "
                       "by Ctrl-C/SIGTERM or killed mid-job) from its stored status, with its "
                       "retry counts")
    again.add_argument("--fresh", dest="rerun", action="store_const", const="fresh",
                       help="archive the job's last run whatever state it is in (to "
                       "STATE_DIR/JOB/runs/<id>/) and start over")
    r.add_argument("--inject", action="append", default=[], metavar="SPEC",
                   help="inject a real fault: crash:rank=1:after=5s (SIGKILL) or "
                   "exit:rank=0:code=3:after=8s; add :epoch=N|all; repeatable")
    r.add_argument("--connect-timeout", type=float, default=MASTER.connect_timeout,
                   help="seconds for every worker to connect before all run without the "
                   f"master (default {MASTER.connect_timeout:g})")
    r.add_argument("--lost-timeout", type=float, default=MASTER.lost_timeout,
                   help="seconds without a heartbeat before a worker is lost "
                   f"(default {MASTER.lost_timeout:g})")
    r.add_argument("--finish-lag", type=float, default=MASTER.finish_lag,
                   help="seconds the last rank may still run after the first one finished; "
                   "then it is treated as hung and the job restarts from its checkpoint "
                   f"(default {MASTER.finish_lag:g})")
    r.add_argument("--slow-window", type=float, default=MASTER.slow_window, metavar="SECONDS",
                   help="a rank whose forwards take more than twice its peers' median for this "
                   "long in a row is marked slow, and evicted (its node quarantined, exit 72) "
                   "right after the next checkpoint, never before; --checkpoint-dir or "
                   f"aegis_flow.checkpoint.done() says when (default {MASTER.slow_window:g})")
    r.add_argument("--no-prewarm", dest="prewarm", action="store_false",
                   help="start every run cold instead of forking Python commands from a "
                   "pre-warmed interpreter (slower restarts)")
    r.add_argument("--insecure-nats", action="store_true",
                   help="DEBUGGING ONLY: run the embedded NATS without authentication, so any "
                   "local process can read and forge the job's messages (default: operator "
                   "mode, per-worker credentials fetched over gRPC)")
    r.add_argument("--jwt-lifetime", type=positive_seconds, default=MASTER.jwt_lifetime,
                   help="seconds a worker's NATS credentials live before renewal "
                   f"(default {MASTER.jwt_lifetime:g})")
    r.add_argument("--metrics-port", type=port, default=LOCAL.metrics_port,
                   help="the master's /metrics, /healthz, /readyz port (default 0: a free "
                   "one, written to STATE_DIR/JOB/metrics.port)")
    r.add_argument("--quiet", action="store_true",
                   help="no live progress line (phase, step rates, restarts) on stderr")
    r.add_argument("--hang-after", type=positive_seconds, default=None, metavar="SECONDS",
                   help="a rank with no progress (aegis_flow.progress.step() or output) for "
                   f"this long is reported hung and kept running (T13; default "
                   f"{WORKER.hang_after:g})")
    r.add_argument("--hang-quit-after", type=positive_seconds, default=None, metavar="SECONDS",
                   help="...and for this long: every rank is stopped, troubleshot and restarted "
                   f"(T14, counted; default {WORKER.hang_quit_after:g}; longer than "
                   "--hang-after)")
    r.add_argument("--check-budget", action="append", default=[], metavar="CHECK=SECONDS",
                   help="override a check's budget in bootcheck/troubleshoot, e.g. io=5 "
                   "(repeatable; an overrun is a failure with status timeout)")
    r.add_argument("--node-env", action="append", default=[], metavar="NODE:NAME=VALUE",
                   help="set an environment variable for the worker on one node only, e.g. "
                   "local-node-1:AEGIS_SYSFS_ROOT=/mnt/host-sys (nodes are local-node-RANK, "
                   "local-node-RANK-N after a node-fault replacement); repeatable")
    r.add_argument("--checkpoint-dir", default="", metavar="DIR",
                   help="where the command's checkpoints are (it gets $AEGIS_CHECKPOINT_DIR): "
                   "each completed one is reported to the master (the job's last safe step), "
                   "and before every run the newest is verified, damaged ones are moved aside "
                   "and DIR/aegis-resume points at the first good one ($AEGIS_RESUME_FROM)")
    r.add_argument("--checkpoint-pattern", default="ckpt-*", metavar="GLOB",
                   help="which names in --checkpoint-dir are checkpoints (default 'ckpt-*'; "
                   "the largest number in a name is its step)")
    r.add_argument("--saver", default=None, metavar="CMD",
                   help="run a checkpoint saver/uploader beside training in every worker, "
                   "given as one shell-like string (split like a shell does, no shell runs "
                   "it), e.g. --saver \"python upload.py --dir ckpt\": it gets the rank's "
                   "environment (RANK, WORLD_SIZE, AEGIS_JOB, AEGIS_WORK_DIR, ...), "
                   "its output is shown as [rank N saver], it is restarted 3 s "
                   "after every exit (exit 0 too: it is a daemon) and stopped when its worker "
                   "ends; training never waits for it")
    r.add_argument("--nproc-per-node", type=positive_int, default=1, metavar="K",
                   help="ranks per worker, as torchrun's --nproc-per-node (one per GPU): the "
                   "job trains with WORKERS*K ranks, each with LOCAL_RANK, RANK, WORLD_SIZE, "
                   "LOCAL_WORLD_SIZE and GROUP_RANK/NODE_RANK set as torchrun sets them; a "
                   "worker (a node) is what fails, restarts and is replaced as one (default 1)")
    r.add_argument("--causes", default=None, metavar="FILE",
                   help="your own cause table (TOML, the format of aegis-flow's "
                   "data/causes.toml): extends or overrides the default rules every worker's "
                   "log classifier and live trigger use; a rule with live = true is reported "
                   "the moment a line matches, and the master starts the recovery then")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")
    r.set_defaults(handler=_run)

    w = sub.add_parser("worker", add_help=False,
                       help="the worker entrypoint (supervisor): aegis-flow worker -- CMD ...")
    w.add_argument("args", nargs=argparse.REMAINDER)
    w.set_defaults(handler=lambda a: _worker(a.args))

    m = sub.add_parser("master", add_help=False, help="run one job's master (used by run/Argo)")
    m.add_argument("args", nargs=argparse.REMAINDER)
    m.set_defaults(handler=lambda a: _master(a.args))

    s = sub.add_parser("status", help="show a job's phase, workers, retries and last events")
    s.add_argument("job", nargs="?", default="job", type=job_name)
    s.add_argument("--namespace", type=job_name, default="default")
    s.add_argument("--state-dir", type=Path, default=Path(".aegis"))
    s.add_argument("--nats-url", help="NATS server (default: the one recorded in --state-dir)")
    s.add_argument("--auth-dir", type=Path,
                   help="with --nats-url in operator mode (a cluster job): the aegis-auth "
                   "Secret's files; a short-lived user is minted with its signing key")
    s.add_argument("--json", action="store_true", help="print the stored status as JSON")
    s.add_argument("--watch", nargs="?", const=2.0, type=float, metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until the job ends")
    s.set_defaults(handler=_status_cmd)

    t = sub.add_parser("stop", help="stop a job cleanly (every worker quits; T12)")
    t.add_argument("job", type=job_name)
    t.add_argument("--namespace", type=job_name, default="default")
    t.add_argument("--state-dir", type=Path, default=Path(".aegis"))
    t.add_argument("--nats-url")
    t.add_argument("--auth-dir", type=Path,
                   help="with --nats-url in operator mode (a cluster job): the aegis-auth "
                   "Secret's files (aegis-flow nats-bootstrap DIR); a short-lived user is "
                   "minted with its account signing key")
    t.add_argument("--reason", default="stopped by an operator")
    t.set_defaults(handler=_stop)

    h = sub.add_parser(
        "hang", help="mark one rank of a running job hung by hand (T13; --quit: restart it)",
        description="Mark rank RANK of a running job hung, as its own watchdog would (T13): "
        "the master records the mark and tells every worker (each keeps its process and names "
        "the frame it is in; the frames go to the fault log and `status`). Nothing is killed "
        "or counted. With --quit the rank is reported hung for good (T14): it is charged one "
        "failure and every rank restarts from the last checkpoint. Only while the command "
        "runs (RunCommand).")
    h.add_argument("job", type=job_name)
    h.add_argument("rank", type=non_negative_int)
    h.add_argument("--quit", action="store_true",
                   help="escalate: charge the rank and restart the job's ranks (T14)")
    h.add_argument("--namespace", type=job_name, default="default")
    h.add_argument("--state-dir", type=Path, default=Path(".aegis"))
    h.add_argument("--nats-url")
    h.add_argument("--auth-dir", type=Path,
                   help="with --nats-url in operator mode (a cluster job): the aegis-auth "
                   "Secret's files; a short-lived user is minted with its signing key")
    h.add_argument("--reason", default="marked by an operator")
    h.set_defaults(handler=_hang)


def _worker(args: list[str]) -> int:
    from aegis_flow.supervisor.__main__ import main

    return main(args)


def _master(args: list[str]) -> int:
    from aegis_flow.master.__main__ import main

    return main(args)


def _run(a: argparse.Namespace) -> int:
    import shutil

    from aegis_flow.local.runner import (
        RunConfig,
        command_problem,
        interpreter_problem,
        run_job,
        with_our_python,
    )
    from aegis_flow.settings import ConfigError, check_local, hang_thresholds, report

    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        return _usage("no command given; put it after '--', e.g. "
                      "aegis-flow run --workers 2 -- python train.py")
    command, note = with_our_python(tuple(command))
    problem = (command_problem(command, Path.cwd(), shutil.which)
               or interpreter_problem(command, Path.cwd()))
    if problem is not None:
        return _usage(f"{problem}: nothing was started")
    saver = _saver(a.saver)
    if isinstance(saver, str):
        return _usage(saver)
    if a.causes:
        from aegis_flow.steps.classify import CauseTableError, load_table

        try:
            load_table(a.causes)
        except CauseTableError as exc:
            return _usage(f"--causes: {exc}: nothing was started")
    if note:
        print(f"[aegis-flow] {note}", file=sys.stderr)
    hang: tuple[float | None, float | None] = (a.hang_after, a.hang_quit_after)
    try:
        if hang != (None, None):  # one given: the supervisors get both, the other defaulted
            hang = hang_thresholds(*hang)
        cfg = RunConfig(command=tuple(command), workers=a.workers, max_retry=a.max_retry,
                        job=a.job, namespace=a.namespace, nats_url=a.nats_url,
                        state_dir=a.state_dir, injections=tuple(a.inject),
                        connect_timeout=a.connect_timeout, lost_timeout=a.lost_timeout,
                        finish_lag=a.finish_lag, slow_window=a.slow_window,
                        metrics_port=a.metrics_port, progress=not a.quiet,
                        prewarm=a.prewarm, secure=not a.insecure_nats,
                        jwt_lifetime=a.jwt_lifetime, hang_after=hang[0], hang_quit_after=hang[1],
                        give_up_on_repeat=a.give_up_on_repeat, rerun=a.rerun, saver=saver,
                        checkpoint_dir=a.checkpoint_dir, checkpoint_pattern=a.checkpoint_pattern,
                        causes=os.path.abspath(a.causes) if a.causes else "",
                        nproc_per_node=a.nproc_per_node)
        check_local(cfg)
    except ConfigError as exc:
        return report(exc)
    problem = _check_injections(a.inject, a.workers)
    settings = _check_settings(a)
    if problem or isinstance(settings, str):
        return _usage(problem or str(settings))
    node_env, env = settings
    return run_job(replace(cfg, node_env=node_env, env=env))


def _saver(text: str | None) -> tuple[str, ...] | str:
    """The --saver command as an argument list (a bare python is ours, as for the training
    command), () without one, or the one-line error of a saver that cannot start."""
    import shutil

    from aegis_flow.argtypes import split_command
    from aegis_flow.local.runner import command_problem, with_our_python

    if text is None:
        return ()
    try:
        command = split_command(text)
    except ValueError as exc:
        return f"--saver: {exc}"
    command, _ = with_our_python(command)
    problem = command_problem(command, Path.cwd(), shutil.which)
    if problem is not None:
        return f"--saver: {problem.replace('the command', 'the saver command', 1)}: " \
               "nothing was started"
    return command


def _usage(message: str) -> int:
    """The one-line error of a bad ``run`` command line; the exit code, 2."""
    print(f"aegis-flow: error: {message}", file=sys.stderr)
    return 2


def _check_injections(specs: list[str], workers: int) -> str:
    """An error message for the first bad --inject ("" when every one is good)."""
    from aegis_flow.supervisor.inject import Injection, InjectionError

    try:
        for spec in specs:
            inj = Injection.parse(spec)
            if inj.rank >= workers:
                raise InjectionError(f"{spec!r}: rank {inj.rank} does not exist "
                                     f"(ranks 0..{workers - 1})")
    except InjectionError as exc:
        return f"--inject {exc}"
    return ""


Settings = tuple[tuple[tuple[str, str, str], ...], dict[str, str]]


def _check_settings(a: argparse.Namespace) -> Settings | str:
    """Per-node environment and check budgets (as the workers' environment), or an error
    message."""
    from aegis_flow.local.nodes import NodeEnvError, parse_node_env
    from aegis_flow.steps.base import BUDGETS_ENV, parse_budget

    env: dict[str, str] = {}
    try:
        budgets = dict(parse_budget(b) for b in a.check_budget)
        node_env = tuple(parse_node_env(spec, a.workers) for spec in a.node_env)
    except (ValueError, NodeEnvError) as exc:
        return f"--check-budget/--node-env: {exc}"
    if budgets:
        env[BUDGETS_ENV] = ",".join(f"{k}={v:g}" for k, v in budgets.items())
    return node_env, env


def _url(a: argparse.Namespace) -> str | None:
    if a.nats_url:
        return str(a.nats_url)
    path = a.state_dir / a.job / "nats.url"
    return path.read_text().strip() if path.exists() else None


def _auth_options(a: argparse.Namespace, subjects: p.Subjects) -> dict[str, Any]:
    """Credentials for status/stop when the local job runs NATS in operator mode: a short-lived
    user minted with the job's account signing key from the state dir (none otherwise)."""
    from aegis_flow.local.runs import job_user_options

    auth_dir = getattr(a, "auth_dir", None)
    if auth_dir is not None:
        if not (auth_dir / "public.json").is_file():
            raise SystemExit(f"aegis-flow: --auth-dir {auth_dir} holds no NATS operator keys "
                             "(public.json): give the directory `aegis-flow nats-bootstrap` "
                             "wrote, or the aegis-auth Secret's files")
        return job_user_options(auth_dir.parent, subjects, auth_name=auth_dir.name)
    if a.nats_url:
        return {}
    return job_user_options(a.state_dir / a.job, subjects)


async def _fetch(url: str, subjects: p.Subjects,
                 auth: dict[str, Any] | None = None) -> bytes | None:
    from aegis_flow.local.runs import read_stored_status

    return await read_stored_status(url, subjects, auth or {})


def _status(a: argparse.Namespace) -> int:
    from aegis_flow.local.status import render

    url = _url(a)
    if url is None:
        print(f"aegis-flow status: no NATS URL for job {a.job!r} in {a.state_dir} "
              "(is it running? pass --nats-url)", file=sys.stderr)
        return 2
    try:
        subjects = p.Subjects(a.namespace, a.job)
        raw = asyncio.run(_fetch(url, subjects, _auth_options(a, subjects)))
    except ValueError as exc:  # a worker record or a delta part missing or unreadable
        print(f"aegis-flow status: the stored status of {a.namespace}/{a.job} is damaged: "
              f"{exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001
        print(f"aegis-flow status: cannot reach NATS at {url}: {str(exc) or type(exc).__name__}",
              file=sys.stderr)
        return 2
    if raw is None:
        print(f"aegis-flow status: no job {a.namespace}/{a.job} on {url}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(json.loads(raw), indent=2, sort_keys=True))
    else:
        from aegis_flow.local.progress import fetch_progress

        port_file = a.state_dir / a.job / "metrics.port"  # a local run's master, if running
        live = fetch_progress(port_file) if not a.nats_url and port_file.exists() else None
        print(render(raw, live))
    return 0


def _status_cmd(a: argparse.Namespace) -> int:
    """A running job's status from NATS; an ended one's from STATE_DIR/JOB/status.json."""
    from aegis_flow.local.observe import status_command

    return status_command(a, _status)


def _ended(a: argparse.Namespace) -> str | None:
    """Why ``stop`` has nothing to stop (a local job that is not running), or None."""
    from aegis_flow.local.runs import running_pid

    job_dir = a.state_dir / a.job
    if a.nats_url or running_pid(job_dir) is not None:
        return None
    final = job_dir / "status.json"
    if final.is_file():
        from aegis_flow.master.runtime import summary
        from aegis_flow.master.store import decode_doc

        try:
            status, _ = decode_doc(final.read_bytes())
        except ValueError:
            return f"job {a.job!r} is not running (its final status {final} is unreadable)"
        return f"job {a.job!r} is not running; it ended: {summary(status)}"
    if not job_dir.is_dir():
        return f"no job {a.job!r} in {a.state_dir} (give --state-dir, or --nats-url)"
    return None


def _stop(a: argparse.Namespace) -> int:
    import time

    ended = _ended(a)
    if ended is not None:
        print(f"aegis-flow stop: {ended}", file=sys.stderr)
        return 1
    url = _url(a)
    if url is None:
        print(f"aegis-flow stop: no NATS URL for job {a.job!r}; pass --nats-url",
              file=sys.stderr)
        return 2
    subjects = p.Subjects(a.namespace, a.job)
    msg = p.Message(job=a.job, namespace=a.namespace, pod_name="operator", type=p.MsgType.STOP,
                    data={"reason": a.reason}, timestamp=time.time())

    async def send() -> None:
        from aegis_flow.local.runs import connect_quietly

        nc = await connect_quietly(url, _auth_options(a, subjects))
        await nc.publish(subjects.control, msg.encode())
        await nc.flush()
        await nc.close()

    try:
        asyncio.run(send())
    except Exception as exc:  # noqa: BLE001
        print(f"aegis-flow stop: cannot reach NATS at {url}: {str(exc) or type(exc).__name__}",
              file=sys.stderr)
        return 2
    print(f"asked job {a.namespace}/{a.job} to stop")
    return 0


def _hang(a: argparse.Namespace) -> int:
    """``aegis-flow hang JOB RANK``: check the rank and phase against the stored status, then
    send the operator's Hang (or HangWithQuit) on the job's control subject."""
    import time

    from aegis_flow.master.store import decode_doc
    from aegis_flow.vocab import Phase

    def fail(text: str, code: int) -> int:
        print(f"aegis-flow hang: {text}", file=sys.stderr)
        return code

    ended = _ended(a)
    if ended is not None:
        return fail(ended, 1)
    url = _url(a)
    if url is None:
        return fail(f"no NATS URL for job {a.job!r}; pass --nats-url", 2)
    subjects = p.Subjects(a.namespace, a.job)
    auth = _auth_options(a, subjects)
    kind = p.MsgType.HANG_WITH_QUIT if a.quit else p.MsgType.HANG
    msg = p.Message(job=a.job, namespace=a.namespace, pod_name="operator", type=kind,
                    rank=a.rank, data={"reason": a.reason[:200]}, timestamp=time.time())

    async def send() -> str | None:
        from aegis_flow.local.runs import connect_quietly, read_stored_status

        raw = await read_stored_status(url, subjects, auth)
        if raw is None:
            return f"no job {a.namespace}/{a.job} on {url}"
        status, _ = decode_doc(raw)
        if not a.rank < len(status.workers):
            return (f"job {a.job!r} has ranks 0..{len(status.workers) - 1}; there is no "
                    f"rank {a.rank}")
        if status.phase is not Phase.RUNCOMMAND:
            return (f"job {a.job!r} is in {status.phase.value}: a hang mark means something "
                    "only while the command runs (RunCommand)")
        nc = await connect_quietly(url, auth)
        await nc.publish(subjects.control, msg.encode())
        await nc.flush()
        await nc.close()
        return None

    try:
        problem = asyncio.run(send())
    except ValueError as exc:
        return fail(f"the stored status of {a.job!r} is unreadable: {exc}", 1)
    except Exception as exc:  # noqa: BLE001
        return fail(f"cannot reach NATS at {url}: {str(exc) or type(exc).__name__}", 2)
    if problem is not None:
        return fail(problem, 1)
    if a.quit:
        print(f"reported rank {a.rank} of {a.namespace}/{a.job} hung for good: it is charged "
              "and the ranks restart (T14)")
    else:
        print(f"marked rank {a.rank} of {a.namespace}/{a.job} hung: every worker is told; "
              "nothing is killed (see `aegis-flow status` and the fault log)")
    return 0
