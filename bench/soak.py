#!/usr/bin/env python3
"""Seeded fault soak: N real ``aegis-flow run`` jobs, 1–2 random faults each, exact verdicts.

Every job is a real 2-rank DDP training (``examples/train_ddp.py``, gloo, CPU) under
``aegis-flow run --workers 2``, with its own ``--state-dir``, ``--job`` and checkpoint dir in a
work dir. Its faults are drawn from ``random.Random(seed + job_index)``; job ``i`` always has
fault kind ``kinds[i % len(kinds)]`` (so a short soak covers several kinds), plus at times a
second fault. Before the job runs, its exact outcome is computed from its faults (``expect``):

* a training process SIGKILLed (``crash``), exiting with a code (``exit``), a one-off CUDA error
  line (``cuda``: L2, a container restart), a supervisor SIGKILLed while training
  (``supervisor``): each costs one retry *per recovery round* — faults are placed in run epochs
  (``AEGIS_RESTART_COUNT``), two faults in one epoch (``same-round``) count once, the same rank
  failing in two epochs (``twice``) counts twice;
* a supervisor SIGKILLed during the troubleshoot (``die-troubleshoot``: T7, no double penalty
  during a recovery), the master SIGKILLed while training or during a recovery (``master``),
  nats-server SIGKILLed or SIGSTOPped for 4 s / 10 s (``nats-kill``, ``nats-stop4``,
  ``nats-stop10``) count nothing;
* so the job succeeds with ``recoverCount`` = the counted rounds, its final parameters
  bit-identical (SHA-256) to an undisturbed run of the same training — or, when the rounds
  exceed ``--max-retry`` (drawn now and then), it fails by T11: runner exit 1, phase Failed,
  ``recoverCount`` = max-retry + 1, ``failure`` naming the rank of the last counted round.

Each job must also end within ``--timeout`` (else it is *hung*: stopped, and counted wrong),
show every fault it was given firing, have no invariant violation reported by the
master's runtime monitor (``master/monitor.py``: the model checker's invariants on every
live transition; its count is in the status document's stats), and leave no process behind
(no live process whose command line or environment names the job's dir, checked in
``/proc``).

Usage::

    .venv/bin/python bench/soak.py --seed 1 --jobs 12 --json /tmp/soak.jsonl
    .venv/bin/python bench/soak.py --jobs 8 --kinds crash,master,nats-kill,nats-stop4
    .venv/bin/python bench/soak.py --seed 3 --jobs 6 --plan     # the draw only, no jobs run
    .venv/bin/python bench/soak.py --seed 3 --only 4 --keep     # reproduce job 4 of that draw

A job takes 8-25 s on 2 cores (one undisturbed reference run first, about 5 s). The NATS kinds
need ``aegis-flow run`` to restart a dead nats-server and the master to tell a control-plane
outage from lost workers (T6n/T6b); ``--kinds`` without them leaves them out.

Prints one table (job, kind, faults, expected, got, recoverCount, checksum, seconds, verdict)
and ``N/N jobs correct``; exits 0 only when every job was correct.

``python bench/soak.py train [train_ddp options]`` is the training command of every job (and
of the undisturbed reference run): ``examples/train_ddp.py`` with two hooks — rank 0 prints
``SOAK_PARAMS_SHA256 <hex>`` of its final parameters, and ``$AEGIS_SOAK_CUDA_ERROR``
(``RANK:EPOCH:AFTER``) makes that rank print a CUDA error traceback and exit 1 in that epoch.

Side effects live in ``run_soak``, ``run_job``, ``reference_sha`` and the ``Job`` class (start
processes, signal the processes of the jobs they started, write under the work dir), ``main``
(prints, writes ``--json``) and ``train_main`` (trains; its CUDA hook ends the process). Drawing,
expectations, judging and the table are pure. Standard library only (torch is needed by the
training command, not by the harness).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_ddp.py"
SOAK = Path(__file__).resolve()
WORKERS = 2
TAG_ENV = "AEGIS_SOAK_JOB"  # in every job process's environment: finds what a job left behind
CUDA_ENV = "AEGIS_SOAK_CUDA_ERROR"
#: the zygote preloads torch (as the recovery e2e tests run it): fast in-place restarts
PRELOAD = "torch,torch._dynamo,torch.nn.parallel,torch.distributed"
SHA_LINE = "SOAK_PARAMS_SHA256"
CUDA_TRACEBACK = ("Traceback (most recent call last):\n"
                  '  File "soak.py", line 1, in <module>\n'
                  "RuntimeError: CUDA error: unspecified launch failure\n")

#: every kind a job can be drawn with (``--kinds``)
KINDS = ("crash", "exit", "supervisor", "cuda", "twice", "same-round", "die-troubleshoot",
         "master", "nats-kill", "nats-stop4", "nats-stop10")
#: the control-plane outages: they need ``aegis-flow run`` to restart a dead nats-server and
#: the master to tell an outage from lost workers (T6n); ``--kinds`` without them leaves them out
NATS_KINDS = ("nats-kill", "nats-stop4", "nats-stop10")
DEFAULT_KINDS = KINDS
#: single counted faults a second fault may be drawn from
SECOND_KINDS = ("crash", "exit", "supervisor", "master")
EXIT_CODES = (1, 2, 3, 42)
MAX_RETRY = 3
FAIL_CHANCE = 0.3  # a job with only counted faults gets max-retry = rounds - 1 this often
MASTER_LINE = re.compile(r"^\[aegis-flow master\] (T5s?|T6|T14s?)\b")  # a recovery begins
TRANSITION = re.compile(r"^\[aegis-flow master\] (T\d+\w*|B\d)\b")


# -- the draw (pure) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    """One fault. ``action`` is what is done: ``crash``/``exit``/``die`` (``--inject``),
    ``cuda`` (the training hook), ``supervisor``/``master``/``nats-kill``/``nats-stop`` (this
    harness sends the signal). ``trigger``: ``inject`` (the injected fault times itself),
    ``train`` (``after`` seconds after the first step of run epoch ``epoch``), ``recovery``
    (``after`` seconds after the master logs the first recovery)."""

    action: str
    rank: int = -1  # -1: not a rank's (the master, nats-server)
    epoch: int = 0  # the run epoch (AEGIS_RESTART_COUNT) it lands in
    after: float = 0.0
    counted: bool = False
    trigger: str = "inject"
    code: int = 0  # exit: the exit code
    pause: float = 0.0  # nats-stop: seconds stopped

    def label(self) -> str:
        who = f" r{self.rank}" if self.rank >= 0 else ""
        what = {"exit": f"exit{self.code}", "nats-stop": f"nats-stop{self.pause:g}s",
                "die": "die@troubleshoot"}.get(self.action, self.action)
        when = {"inject": f"@e{self.epoch}+{self.after:.1f}s",
                "train": f"@e{self.epoch}+{self.after:.1f}s",
                "recovery": f"@recovery+{self.after:.1f}s"}[self.trigger]
        return f"{what}{who}{'' if self.action == 'die' else when}"

    def inject_spec(self) -> str | None:
        """The ``--inject`` spec, or None when this harness or the training hook does it."""
        if self.action == "crash":
            return f"crash:rank={self.rank}:after={self.after:.2f}s:epoch={self.epoch}"
        if self.action == "exit":
            return (f"exit:rank={self.rank}:code={self.code}:after={self.after:.2f}s:"
                    f"epoch={self.epoch}")
        if self.action == "die":
            return f"die:rank={self.rank}:order=troubleshoot"
        return None


@dataclass(frozen=True)
class JobPlan:
    index: int
    kind: str
    faults: tuple[Fault, ...]
    max_retry: int

    def label(self) -> str:
        return ", ".join(f.label() for f in self.faults)


@dataclass(frozen=True)
class Expectation:
    phase: str  # Succeed | Failed
    recover_count: int
    rc: int  # aegis-flow run's exit code
    failed_ranks: tuple[int, ...] = ()  # Failed: the rank(s) T11 may name
    rounds: int = 0  # counted rounds the job goes through (the last one fails it, if Failed)

    def label(self) -> str:
        return f"{self.phase} {self.recover_count}"


def _when(rng: random.Random) -> float:
    """Seconds into a run: late enough that the ranks train, early enough that an epoch of
    the default training (60 steps of 0.1 s, resumed from its last checkpoint) is still on."""
    return round(rng.uniform(1.0, 2.5), 2)


def _counted(kind: str, rng: random.Random, rank: int, epoch: int,
             codes: Sequence[int] = ()) -> Fault:
    """A fault that costs a retry, in run epoch ``epoch`` (exit codes not in ``codes``)."""
    if kind == "crash":
        return Fault("crash", rank, epoch, _when(rng), counted=True)
    if kind == "exit":
        code = rng.choice([c for c in EXIT_CODES if c not in codes])
        return Fault("exit", rank, epoch, _when(rng), counted=True, code=code)
    if kind == "cuda":
        return Fault("cuda", rank, epoch, _when(rng), counted=True)
    if kind == "supervisor":
        return Fault("supervisor", rank, epoch, round(rng.uniform(0.5, 2.0), 2), counted=True,
                     trigger="train")
    raise ValueError(f"not a counted fault kind: {kind!r}")


def _scenario(kind: str, rng: random.Random) -> list[Fault]:
    """The fault(s) of a job of ``kind``."""
    rank = rng.randrange(WORKERS)
    if kind in ("crash", "exit", "supervisor", "cuda"):
        return [_counted(kind, rng, rank, 0)]
    if kind == "twice":  # the same rank fails in two epochs
        first = _counted(rng.choice(("crash", "exit", "supervisor")), rng, rank, 0)
        return [first, _counted(rng.choice(("crash", "exit", "supervisor")), rng, rank, 1,
                                (first.code,))]
    if kind == "same-round":  # both ranks fail in epoch 0: one recovery, one retry
        # The second fault fires only if it beats the first one's effects (its process is
        # stopped by the recovery, or dies of the peer symptom first); an injection bound to
        # an epoch can never fire in a later round, which keeps the count exact. (A peer
        # supervisor SIGKILLed "as the recovery begins" cannot: an L1 troubleshoot takes
        # ~0.2 s, and a kill that lands after T9 is a new, counted, round.)
        crash = _counted("crash", rng, rank, 0)
        return [crash, Fault("exit", 1 - rank, 0, round(crash.after + rng.uniform(-0.1, 0.1), 2),
                             counted=True, code=rng.choice(EXIT_CODES))]
    if kind == "die-troubleshoot":  # needs a troubleshoot: a counted fault first
        first = _counted(rng.choice(("crash", "exit")), rng, rank, 0)
        return [first, Fault("die", rng.randrange(WORKERS), trigger="inject")]
    if kind == "master":  # while training, or in the troubleshoot / restart of a recovery
        if rng.random() < 0.5:
            first = _counted(rng.choice(("crash", "exit", "supervisor")), rng, rank, 0)
            return [first, Fault("master", after=round(rng.uniform(0.0, 0.4), 2),
                                 trigger="recovery")]
        return [Fault("master", after=round(rng.uniform(0.3, 2.0), 2), trigger="train")]
    if kind == "nats-kill":
        return [Fault("nats-kill", after=round(rng.uniform(0.3, 2.0), 2), trigger="train")]
    if kind in ("nats-stop4", "nats-stop10"):
        return [Fault("nats-stop", after=round(rng.uniform(0.3, 2.0), 2), trigger="train",
                      pause=float(kind.removeprefix("nats-stop")))]
    raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(KINDS)})")


def _rounds(faults: Sequence[Fault]) -> list[int]:
    """The run epochs that end in a counted failure, in order."""
    return sorted({f.epoch for f in faults if f.counted})


def _second(rng: random.Random, faults: list[Fault], kinds: Sequence[str]) -> list[Fault]:
    """Now and then a second fault after a single one: a counted fault in the next epoch, or
    the master killed while some epoch trains."""
    pool = [k for k in SECOND_KINDS if k in kinds]
    if len(faults) != 1 or not pool or rng.random() >= 0.5:
        return faults
    kind = rng.choice(pool)
    rounds = len(_rounds(faults))
    if kind == "master":
        return [*faults, Fault("master", epoch=rng.randrange(rounds + 1),
                               after=round(rng.uniform(0.3, 1.5), 2), trigger="train")]
    return [*faults, _counted(kind, rng, rng.randrange(WORKERS), rounds, (faults[0].code,))]


def draw_job(seed: int, index: int, kinds: Sequence[str]) -> JobPlan:
    """Job ``index``'s faults and max-retry, from ``random.Random(seed + index)``; its first
    fault kind is ``kinds[index % len(kinds)]``."""
    rng = random.Random(seed + index)
    kind = kinds[index % len(kinds)]
    faults = _second(rng, _scenario(kind, rng), kinds)
    rounds = len(_rounds(faults))
    only_counted = all(f.counted for f in faults)
    fail = rounds >= 1 and only_counted and rng.random() < FAIL_CHANCE
    return JobPlan(index, kind, tuple(faults), rounds - 1 if fail else MAX_RETRY)


def draw_plan(seed: int, jobs: int, kinds: Sequence[str]) -> list[JobPlan]:
    return [draw_job(seed, i, kinds) for i in range(jobs)]


def expect(plan: JobPlan) -> Expectation:
    """The exact outcome. A counted round costs one retry (T5/T6 count the first failure of a
    run; later reports of that run are stale); nothing else counts (T7 during a recovery, a
    restarted master resumes the stored status, NATS outages). More rounds than max-retry: the
    round number max-retry+1 fails the job (T11), recoverCount = max-retry + 1."""
    rounds = _rounds(plan.faults)
    if len(rounds) <= plan.max_retry:
        return Expectation("Succeed", len(rounds), 0, rounds=len(rounds))
    last = rounds[plan.max_retry]
    ranks = tuple(sorted({f.rank for f in plan.faults if f.counted and f.epoch == last}))
    return Expectation("Failed", plan.max_retry + 1, 1, ranks, rounds=plan.max_retry + 1)


def required(plan: JobPlan, exp: Expectation) -> list[list[int]]:
    """Groups of faults (indices) of which at least one must have fired: one group per counted
    round the job reaches (in a same-round pair the second may never fire: its process is
    stopped first), and each uncounted fault on its own."""
    reached = _rounds(plan.faults)[:exp.rounds]
    faults = list(enumerate(plan.faults))
    groups = [[i for i, f in faults if f.counted and f.epoch == e] for e in reached]
    return groups + [[i] for i, f in faults if not f.counted]


# -- the training command (side effects: trains; the CUDA hook ends the process) ---------------

def params_sha256(model: Any) -> str:
    """SHA-256 of every parameter's name, shape and float32 values (exact)."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        values = param.detach().float().reshape(-1).tolist()
        digest.update(f"{name}{tuple(param.shape)}".encode())
        digest.update(struct.pack(f"<{len(values)}f", *values))
    return digest.hexdigest()


def _arm_cuda_error(spec: str) -> None:
    """``RANK:EPOCH:AFTER``: on that rank in that epoch, AFTER seconds in, print a CUDA error
    traceback and exit 1 (a daemon timer thread)."""
    if not spec:
        return
    rank, epoch, after = spec.split(":")
    if os.environ.get("RANK") != rank or os.environ.get("AEGIS_RESTART_COUNT", "0") != epoch:
        return

    def fire() -> None:
        sys.stdout.flush()
        sys.stderr.write(CUDA_TRACEBACK)
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(float(after), fire)
    timer.daemon = True
    timer.start()


def train_main(argv: list[str]) -> int:
    """Run examples/train_ddp.py's ``main(argv)``; rank 0 also prints its parameters' SHA-256
    where train_ddp prints its checksum."""
    spec = importlib.util.spec_from_file_location("train_ddp", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_ddp"] = module
    spec.loader.exec_module(module)
    names = vars(module)
    checksum: Callable[[Any], float] = names["checksum"]

    def checksum_and_sha(model: Any) -> float:
        print(f"{SHA_LINE} {params_sha256(model)}", flush=True)
        return checksum(model)

    names["checksum"] = checksum_and_sha  # main() looks it up in the module at the end
    _arm_cuda_error(os.environ.get(CUDA_ENV, ""))
    return int(names["main"](argv))


# -- processes (side effects) -----------------------------------------------------------------

def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    """Live and not a zombie."""
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    return bool(stat) and stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def processes_of(job_dir: Path) -> list[int]:
    """Live processes (not zombies, not this one) whose command line names ``job_dir`` or whose
    environment carries this job's tag — training processes forked from the pre-warmed
    interpreter keep its command line, but inherit the tag."""
    text, tag = str(job_dir), f"{TAG_ENV}={job_dir}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        if (text in _cmdline(pid) or tag in _read(f"/proc/{pid}/environ")) and _alive(pid):
            found.append(pid)
    return found


def _kill(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_command(steps: int, step_time: float, checkpoint_dir: Path) -> list[str]:
    return [sys.executable, str(SOAK), "train", "--steps", str(steps), "--step-time",
            str(step_time), "--checkpoint-every", "10", "--checkpoint-dir", str(checkpoint_dir)]


def reference_sha(steps: int, work_dir: Path, timeout: float = 120.0) -> str:
    """SHA-256 of the final parameters of an undisturbed run: both ranks started bare (no
    aegis-flow), no sleep per step. Side effects: two processes, files under ``work_dir``."""
    ck = work_dir / "reference-ck"
    shutil.rmtree(ck, ignore_errors=True)  # a checkpoint left there would be resumed
    port = free_port()
    procs = []
    for rank in range(WORKERS):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "AEGIS_TIMING": "1", "RANK": str(rank),
               "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(WORKERS), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "AEGIS_RESTART_COUNT": "0"}
        env.pop(CUDA_ENV, None)
        procs.append(subprocess.Popen(train_command(steps, 0.0, ck), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        outs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    shutil.rmtree(ck, ignore_errors=True)
    for line in outs[0].splitlines():
        if line.startswith(SHA_LINE + " "):
            return line.split()[1]
    raise RuntimeError(f"the reference run printed no {SHA_LINE}:\n{outs[0]}\n{outs[1]}")


@dataclass
class Fired:
    """What this harness did for one external fault (or why it did not)."""

    at: float = 0.0  # seconds since the job started; 0: not done
    detail: str = ""


class Job:
    """``aegis-flow run`` of one plan in ``job_dir``; its output collected line by line with
    the time each line arrived. Side effects: starts the runner (and so everything under it),
    reads its output in a thread, signals processes of this job (``external``; ``wait`` stops
    a runner that outlived its timeout)."""

    def __init__(self, plan: JobPlan, job_dir: Path, steps: int, step_time: float) -> None:
        self.plan = plan
        self.dir = job_dir
        self.name = f"soak{plan.index}"
        self.state = job_dir / "state"
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        self.started = time.monotonic()
        self.ended = threading.Event()
        injects = [a for f in plan.faults if (s := f.inject_spec()) for a in ("--inject", s)]
        argv = [sys.executable, "-m", "aegis_flow.cli", "run", "--state-dir", str(self.state),
                "--job", self.name, "--workers", str(WORKERS), "--max-retry",
                str(plan.max_retry), "--quiet", *injects, "--",
                *train_command(steps, step_time, job_dir / "ck")]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "AEGIS_TIMING": "1", "AEGIS_PRELOAD": PRELOAD,
               TAG_ENV: str(job_dir)}
        env.pop(CUDA_ENV, None)
        for f in plan.faults:
            if f.action == "cuda":
                env[CUDA_ENV] = f"{f.rank}:{f.epoch}:{f.after}"
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, cwd=str(job_dir))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self.cond:
                self.lines.append((time.monotonic() - self.started,
                                   raw.decode(errors="replace").rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.ended.set()
            self.cond.notify_all()

    def wait_line(self, match: Callable[[str], bool], deadline: float) -> bool:
        """Until a line matches (True), or the output ends or the deadline passes (False)."""
        seen = 0
        with self.cond:
            while True:
                if any(match(text) for _, text in self.lines[seen:]):
                    return True
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or self.ended.is_set():
                    return False
                self.cond.wait(min(left, 0.5))

    def output(self) -> str:
        with self.cond:
            return "\n".join(f"{t:7.2f} {text}" for t, text in self.lines)

    def texts(self) -> list[str]:
        with self.cond:
            return [text for _, text in self.lines]

    def pids(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.state / self.name / "pids.json").read_text())
        except (OSError, ValueError):
            return {}
        return data

    def nats_pid(self) -> int | None:
        """nats-server's pid: from pids.json when the runner writes it there, else the process
        named nats-server whose command line names this job's store."""
        pid = self.pids().get("nats")
        if isinstance(pid, int) and "nats-server" in _cmdline(pid) and _alive(pid):
            return pid
        for candidate in processes_of(self.dir):
            argv0 = _cmdline(candidate).split(" ", 1)[0]
            if os.path.basename(argv0) == "nats-server":
                return candidate
        return None

    def external(self, fault: Fault, fired: Fired, deadline: float) -> None:
        """Wait for the fault's trigger line, then ``after`` seconds, then do it (in a thread).
        A job that ends first leaves ``fired`` empty, with why."""
        if fault.trigger == "recovery":
            def match(text: str) -> bool:
                return bool(MASTER_LINE.match(text))
        else:
            rank = max(fault.rank, 0)
            first_step = f"[rank {rank}] AEGIS_FIRST_STEP_INFO rank {rank} restart {fault.epoch} "

            def match(text: str) -> bool:
                return text.startswith(first_step)
        if not self.wait_line(match, deadline):
            fired.detail = "trigger never seen"
            self.note(f"{fault.label()}: {fired.detail}")
            return
        if self.ended.wait(fault.after):
            fired.detail = "the job ended first"
            self.note(f"{fault.label()}: {fired.detail}")
            return
        at = time.monotonic() - self.started
        last = [m.group(1) for t in self.texts() if (m := TRANSITION.match(t))][-1:]
        self.note(f"{fault.label()}: now")
        done, fired.detail = self._do(fault)
        fired.at = at if done else 0.0
        fired.detail += f" (after {last[0] if last else 'no transition'})"
        self.note(f"{fault.label()}: {fired.detail}")

    def note(self, text: str) -> None:
        """A line of this harness among the job's output (``[soak] …``)."""
        with self.cond:
            self.lines.append((time.monotonic() - self.started, f"[soak] {text}"))
            self.cond.notify_all()

    def _do(self, fault: Fault) -> tuple[bool, str]:
        """Send the fault's signal(s): (done, what was done or why not)."""
        if fault.action in ("supervisor", "master"):
            pids = self.pids()
            pid = pids.get("workers", {}).get(str(fault.rank)) if fault.action == "supervisor" \
                else pids.get("master")
            module = "aegis_flow.supervisor" if fault.action == "supervisor" else \
                "aegis_flow.master"
            if not isinstance(pid, int) or module not in _cmdline(pid):
                return False, f"no {fault.action} process (pids.json: {pids})"
            _kill([pid])
            return True, f"SIGKILL {fault.action} pid {pid}"
        nats = self.nats_pid()
        if nats is None:
            return False, "no nats-server process"
        if fault.action == "nats-kill":
            _kill([nats])
            return True, f"SIGKILL nats-server pid {nats}"
        _kill([nats], signal.SIGSTOP)
        try:
            time.sleep(fault.pause)
        finally:
            _kill([nats], signal.SIGCONT)
        return True, f"SIGSTOP nats-server pid {nats} for {fault.pause:g} s, then SIGCONT"

    def wait(self, timeout: float) -> int | None:
        """The runner's exit code, or None when it was still running after ``timeout``
        seconds from the start (then it is stopped: SIGTERM, 20 s, SIGKILL)."""
        try:
            return self.proc.wait(timeout=max(0.0, self.started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            return None
        finally:
            self.reader.join(timeout=10)
            self.ended.set()

    def status(self) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads(
                (self.state / self.name / "status.json").read_text())
        except (OSError, ValueError):
            return {}
        return doc


# -- observing and judging ---------------------------------------------------------------------

@dataclass
class Result:
    plan: JobPlan
    expected: Expectation
    rc: int | None  # None: hung (stopped by the soak)
    phase: str
    recover_count: int | None
    failure: str
    retries: list[int]
    sha: str
    reference: str
    fired: list[str]  # per fault: what shows it fired ("" not seen)
    orphans: list[str]
    seconds: float
    violations: int = 0  # invariant violations the master's runtime monitor counted
    problems: list[str] = field(default_factory=list)
    job_dir: str = ""

    @property
    def correct(self) -> bool:
        return not self.problems

    def record(self) -> dict[str, Any]:
        """The JSON line of this job."""
        out = asdict(self)
        out["plan"] = {"index": self.plan.index, "kind": self.plan.kind,
                       "max_retry": self.plan.max_retry,
                       "faults": [{**asdict(f), "label": f.label(),
                                   "inject": f.inject_spec()} for f in self.plan.faults]}
        out["correct"] = self.correct
        return out


def _evidence(fault: Fault) -> str:
    """The start of the output line that shows an injected fault fired ("" for none)."""
    if fault.action == "crash":
        return f"[aegis-flow inject] AEGIS_KILLED rank {fault.rank} "
    if fault.action == "exit":
        return f"[rank {fault.rank}] [aegis-flow inject] exiting with code {fault.code}"
    if fault.action == "cuda":
        return f"[rank {fault.rank}] RuntimeError: CUDA error: unspecified launch failure"
    if fault.action == "die":
        return "[aegis-flow worker] injected fault: this supervisor dies on order 'troubleshoot'"
    return ""


def fired_evidence(plan: JobPlan, texts: Sequence[str],
                   external: dict[int, Fired]) -> list[str]:
    """Per fault, what shows it fired ("" when nothing does): the n-th fault with one evidence
    line (in epoch order) is matched with the n-th such line."""
    used: dict[str, int] = {}
    out = []
    for i, fault in enumerate(plan.faults):
        if i in external:
            fired = external[i]
            out.append(f"{fired.detail} at {fired.at:.1f}s" if fired.at else "")
            continue
        prefix = _evidence(fault)
        hits = [t for t in texts if t.startswith(prefix)]
        n = used.get(prefix, 0)
        used[prefix] = n + 1
        out.append(hits[n] if n < len(hits) else "")
    return out


def judge(result: Result) -> list[str]:
    """Every way the job differs from its expectation."""
    exp, problems = result.expected, []
    if result.rc is None:
        return [f"hung: still running after the timeout ({result.seconds:.0f} s); stopped"]
    got = (result.rc, result.phase, result.recover_count)
    want = (exp.rc, exp.phase, exp.recover_count)
    if got != want:
        problems.append(f"expected exit {want[0]}, {want[1]}, recoverCount {want[2]}; "
                        f"got exit {got[0]}, {got[1] or 'no status.json'}, "
                        f"recoverCount {got[2]}")
    if exp.phase == "Succeed" and result.sha != result.reference:
        problems.append(f"final parameters {result.sha[:12] or 'not printed'} != reference "
                        f"{result.reference[:12]}")
    if exp.phase == "Failed":
        why = [f"rank {r} failed {exp.recover_count} times, more than max-retry "
               f"{result.plan.max_retry}" for r in exp.failed_ranks]
        if not any(result.failure.startswith(w) for w in why):
            problems.append(f"failure {result.failure!r} does not start with "
                            f"{' or '.join(map(repr, why))}")
    faults = result.plan.faults
    for group in required(result.plan, exp):
        if not any(result.fired[i] for i in group):
            problems.append(f"did not fire: {' / '.join(faults[i].label() for i in group)}")
    if result.orphans:
        problems.append(f"left behind: {'; '.join(result.orphans)}")
    if result.violations:
        problems.append(f"the master's invariant monitor reported {result.violations} "
                        "violation(s) (INVARIANT lines in output.log)")
    return problems


def _sha(texts: Sequence[str]) -> str:
    shas = [t.split()[-1] for t in texts if t.startswith(f"[rank 0] {SHA_LINE} ")]
    return shas[-1] if shas else ""


def _orphans(job_dir: Path, grace: float = 10.0) -> list[str]:
    """What is still running of the job ``grace`` seconds after it ended (then SIGKILLed)."""
    deadline = time.monotonic() + grace
    while (left := processes_of(job_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    found = [f"pid {pid} {_cmdline(pid)[:120]!r}" for pid in left]
    _kill(left)
    return found


def run_job(plan: JobPlan, work_dir: Path, reference: str, *, steps: int, step_time: float,
            timeout: float) -> Result:
    """Run one job to its end (or the timeout) and judge it. Side effects: the job's processes,
    its external faults, ``work_dir/job-NNN/`` (``output.log`` is written there)."""
    job_dir = work_dir / f"job-{plan.index:03d}"
    shutil.rmtree(job_dir, ignore_errors=True)  # an old checkpoint or state would be resumed
    job_dir.mkdir(parents=True)
    exp = expect(plan)
    job = Job(plan, job_dir, steps, step_time)
    deadline = job.started + timeout
    external = {i: Fired() for i, f in enumerate(plan.faults) if f.inject_spec() is None
                and f.action != "cuda"}
    threads = [threading.Thread(target=job.external, args=(plan.faults[i], fired, deadline),
                                daemon=True) for i, fired in external.items()]
    for t in threads:
        t.start()
    rc = job.wait(timeout)
    seconds = time.monotonic() - job.started
    for t in threads:
        t.join(timeout=15)
    orphans = _orphans(job_dir)
    doc = job.status()
    status = doc.get("status", {})
    texts = job.texts()
    (job_dir / "output.log").write_text(
        f"$ {' '.join(job.argv)}\n{job.output()}\n[soak] exit code {rc}\n")
    result = Result(plan, exp, rc, str(status.get("phase", "")), status.get("recover_count"),
                    str(status.get("failure", "")),
                    [int(w.get("retries", -1)) for w in status.get("workers", [])], _sha(texts),
                    reference, fired_evidence(plan, texts, external), orphans, seconds,
                    violations=int((doc.get("stats") or {}).get("invariant_violations", 0))
                    + sum("INVARIANT " in t for t in texts),
                    job_dir=str(job_dir))
    result.problems = judge(result)
    return result


# -- the table (pure) --------------------------------------------------------------------------

def _got(r: Result) -> str:
    if r.rc is None:
        return "HUNG"
    return f"{r.phase or '-'} (exit {r.rc})"


def render_table(results: Sequence[Result]) -> str:
    """One row per job, the problems of wrong ones under it, and the total line."""
    head = ("job", "kind", "faults", "max", "expected", "got", "recoverCount", "checksum", "s",
            "verdict")
    rows = []
    for r in results:
        checksum = ("-" if r.expected.phase != "Succeed" else
                    "ok" if r.sha and r.sha == r.reference else "BAD")
        rows.append((str(r.plan.index), r.plan.kind, r.plan.label(), str(r.plan.max_retry),
                     r.expected.label(), _got(r),
                     f"{'-' if r.recover_count is None else r.recover_count}"
                     f"/{r.expected.recover_count}", checksum, f"{r.seconds:.1f}",
                     "ok" if r.correct else "WRONG"))
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        lines += [f"job {r.plan.index}: {p}" for p in r.problems]
        if r.problems:
            lines.append(f"job {r.plan.index}: output in {r.job_dir}/output.log")
    correct = sum(r.correct for r in results)
    lines.append(f"{correct}/{len(results)} jobs correct")
    return "\n".join(lines)


def render_plan(plans: Sequence[JobPlan]) -> str:
    return "\n".join(f"{p.index:>3}  {p.kind:<16} max-retry {p.max_retry}  "
                     f"expect {expect(p).label():<10} {p.label()}" for p in plans)


# -- the soak ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SoakConfig:
    seed: int = 1
    jobs: int = 12
    kinds: tuple[str, ...] = DEFAULT_KINDS
    steps: int = 60
    step_time: float = 0.1
    timeout: float = 180.0
    work_dir: Path | None = None  # None: a new temporary dir (removed when every job was right)
    keep: bool = False  # keep the dirs of correct jobs too
    only: tuple[int, ...] = ()  # run only these job indices of the draw (reproduce one)


def run_soak(cfg: SoakConfig, on_result: Callable[[Result], None] = lambda _r: None
             ) -> list[Result]:
    """Every job of the plan, one after the other. Side effects: processes, the work dir (the
    dirs of wrong jobs are kept, with ``output.log``), ``on_result`` after each job."""
    work_dir = cfg.work_dir or Path(tempfile.mkdtemp(prefix="aegis-soak-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    reference = reference_sha(cfg.steps, work_dir)
    results = []
    plans = draw_plan(cfg.seed, max([cfg.jobs, *(i + 1 for i in cfg.only)]), cfg.kinds)
    for plan in [p for p in plans if p.index in cfg.only] if cfg.only else plans:
        result = run_job(plan, work_dir, reference, steps=cfg.steps, step_time=cfg.step_time,
                         timeout=cfg.timeout)
        if result.correct and not cfg.keep:
            shutil.rmtree(result.job_dir, ignore_errors=True)
        results.append(result)
        on_result(result)
    if cfg.work_dir is None and not cfg.keep and all(r.correct for r in results):
        shutil.rmtree(work_dir, ignore_errors=True)
    return results


def _kinds(text: str) -> tuple[str, ...]:
    names = tuple(k.strip() for k in text.split(",") if k.strip())
    if text.strip() == "all":
        return KINDS
    unknown = [k for k in names if k not in KINDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown kind(s) {unknown or text!r}; known: {', '.join(KINDS)} (or 'all')")
    return names


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--kinds", type=_kinds, default=DEFAULT_KINDS,
                    help=f"comma-separated fault kinds, job i gets kinds[i %% len] "
                         f"(default 'all': {','.join(DEFAULT_KINDS)})")
    ap.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    ap.add_argument("--step-time", type=float, default=0.1, help="seconds a step sleeps")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds a job may take")
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="where the jobs run (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep every job's dir")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT.jsonl",
                    help="one JSON line per job")
    ap.add_argument("--plan", action="store_true", help="print the draw only; run nothing")
    ap.add_argument("--only", type=lambda t: tuple(int(i) for i in t.split(",")), default=(),
                    metavar="I,J", help="run only these jobs of the draw (to reproduce one)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["train"]:
        return train_main(args_list[1:])
    args = parse_args(args_list)
    if args.plan:
        print(render_plan(draw_plan(args.seed, args.jobs, args.kinds)))
        return 0
    cfg = SoakConfig(seed=args.seed, jobs=args.jobs, kinds=args.kinds, steps=args.steps,
                     step_time=args.step_time, timeout=args.timeout, work_dir=args.work_dir,
                     keep=args.keep, only=args.only)
    with _json_out(args.json) as write:
        def report(r: Result) -> None:
            print(f"[soak] job {r.plan.index} {r.plan.kind}: {r.plan.label()} -> {_got(r)}, "
                  f"recoverCount {r.recover_count}/{r.expected.recover_count}, "
                  f"{r.seconds:.1f} s: {'ok' if r.correct else 'WRONG'}", flush=True)
            write(r)

        results = run_soak(cfg, report)
    print(render_table(results))
    return 0 if all(r.correct for r in results) else 1


@contextlib.contextmanager
def _json_out(path: Path | None) -> Iterator[Callable[[Result], None]]:
    """A writer of one JSON line per job (flushed at once), or one that writes nothing."""
    if path is None:
        yield lambda _r: None
        return
    with path.open("w") as fh:
        def write(r: Result) -> None:
            fh.write(json.dumps(r.record(), sort_keys=True) + "\n")
            fh.flush()

        yield write


if __name__ == "__main__":
    sys.exit(main())
