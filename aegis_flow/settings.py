"""One table of defaults per process, the rules between settings, and every ``AEGIS_*`` variable.

The master, the worker supervisor and the local runner take their dataclass defaults *and*
their command-line defaults from ``MASTER``, ``WORKER`` and ``LOCAL`` below, so each default is
written once. ``check_master``/``check_worker``/``check_local`` reject a bad combination with a
:class:`ConfigError` whose one-line message names the bad value and the fix; the CLIs print it
as ``aegis-flow: error: MESSAGE`` and exit 2 (:func:`report`).

``ENV`` lists every ``AEGIS_*`` environment variable the package mentions (a test greps for
them): who reads it, what it means, how it is parsed, who sets it. :func:`env_value` reads one
through the table and fails with a clear message on a malformed value.

Standard library only: the supervisor imports this module and is PID 1 in the user's image
(DESIGN.md §3). Pure, except :func:`env_value` (reads ``os.environ``), :func:`report` (writes
stderr) and ``python -m aegis_flow.settings`` (prints the tables of docs/configuration.md).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TextIO, TypeVar

T = TypeVar("T", str, int, float, bool)


class ConfigError(ValueError):
    """A setting is out of range or contradicts another; the message names it and the fix.

    Permanent: retrying with the same settings fails the same way.
    """


def _doc(flag: str, meaning: str) -> dict[str, str]:
    return {"flag": flag, "meaning": meaning}


# ---------------------------------------------------------------------------------- defaults


@dataclass(frozen=True)
class MasterDefaults:
    """``python -m aegis_flow.master`` / ``runtime.MasterConfig``."""

    namespace: str = field(default="default", metadata=_doc("--namespace", "the job's namespace"))
    nats_url: str = field(default="nats://127.0.0.1:4222",
                          metadata=_doc("--nats-url", "the NATS server"))
    max_retry: int = field(default=3, metadata=_doc(
        "--max-retry", "failures the job may recover from; one more fails it"))
    flap_limit: int = field(default=3, metadata=_doc(
        "--flap-limit", "uncounted replacements of a worker between two runs"))
    connect_timeout: float = field(default=60.0, metadata=_doc(
        "--connect-timeout", "seconds for every worker to connect; then all of them run "
        "without fault tolerance (Pending → Independent, T15)"))
    lost_timeout: float = field(default=3.0, metadata=_doc(
        "--lost-timeout", "seconds without a heartbeat before a worker is lost"))
    outage_limit: float = field(default=60.0, metadata=_doc(
        "--outage-limit", "seconds every worker may stay silent while the master reaches NATS "
        "before the silence is the workers' own, not a control-plane outage (T6n)"))
    replace_timeout: float = field(default=120.0, metadata=_doc(
        "--replace-timeout", "seconds a lost worker may take to come back (Restarting → Stop, "
        "T12)"))
    finish_lag: float = field(default=300.0, metadata=_doc(
        "--finish-lag", "seconds the last rank may still run after the first one finished; "
        "past it, a rank still running is treated as hung (T14: troubleshoot, restart from the "
        "checkpoint), so a process stuck at exit cannot hold a finished job forever"))
    linger: float = field(default=5.0, metadata=_doc(
        "--linger", "seconds the master keeps re-sending its final order to laggards"))
    keepalives: bool = field(default=True, metadata=_doc(
        "--keepalives", "workers send a heartbeat that says nothing new as a short keep-alive, "
        "with a full heartbeat (resources, node, activity) at least every 5 s (15 s for the "
        "largest jobs); --no-keepalives sends every heartbeat in full"))
    jwt_lifetime: float = field(default=3600.0, metadata=_doc(
        "--jwt-lifetime", "seconds a worker's NATS credentials live (renewed between 1/2 "
        "and 3/4 of it, spread over the job's workers)"))
    revoke_grace: float = field(default=30.0, metadata=_doc(
        "--revoke-grace", "seconds an evicted worker keeps its NATS access, so one that was "
        "reconnecting when its exit order went out still gets it (its successor's "
        "registration revokes it at once)"))
    slow_window: float = field(default=60.0, metadata=_doc(
        "--slow-window", "seconds a rank's forwards must take more than twice its peers' "
        "median, in a row, before it is marked slow (T13s); it is evicted right after the "
        "next checkpoint (T13e, exit 72)"))
    slow_evict_within: float = field(default=1800.0, metadata=_doc(
        "--slow-evict-within", "seconds after a slow mark with no checkpoint before the master "
        "says so (training goes on: a slow node is better than lost progress)"))
    give_up_on_repeat: bool = field(default=True, metadata=_doc(
        "--give-up-on-repeat", "the same exception at the same step twice in a row on one rank "
        "ends the job (a deterministic error, T16) instead of using up the retries"))
    l2_after: int = field(default=2, metadata=_doc(
        "--l2-after", "a rank with this many failures on its node restarts its container (L2)"))
    l3_after: int = field(default=3, metadata=_doc(
        "--l3-after", "a rank with this many failures on its node moves to another node (L3)"))


MASTER = MasterDefaults()


@dataclass(frozen=True)
class WorkerDefaults:
    """``aegis-flow worker`` (the supervisor) / ``agent.WorkerConfig``."""

    namespace: str = MASTER.namespace
    nats_url: str = MASTER.nats_url
    pod_ip: str = field(default="127.0.0.1", metadata=_doc(
        "--pod-ip", "this pod's address (env POD_IP)"))
    connect_timeout: float = field(default=10.0, metadata=_doc(
        "--connect-timeout", "seconds to reach NATS before running CMD without fault tolerance"))
    # Must exceed MASTER.connect_timeout (60 s; check_worker): a worker that has not heard from
    # the master within its connect timeout must not fall back to running alone while the
    # master may still be waiting for a slow peer and would then start the job without it.
    # 90 (the CLI's value) rather than the old dataclass's 60, which broke that rule.
    master_timeout: float = field(default=90.0, metadata=_doc(
        "--master-timeout", "seconds to wait for the master's first order before running CMD "
        "without fault tolerance; more than the master's connect timeout"))
    # Sized so a master restart fits (the local runner restarts a dead master in seconds; a
    # daemon step on Argo in about a minute); more than the master's lost timeout (check_worker).
    orphan_timeout: float = field(default=120.0, metadata=_doc(
        "--orphan-timeout", "seconds with no master (after its first order) before a worker "
        "stops waiting for one: a running CMD runs to completion and its exit code becomes the "
        "worker's; more than the master's lost timeout"))
    heartbeat_interval: float = field(default=0.5, metadata=_doc(
        "--heartbeat", "seconds between heartbeats; at most half the master's lost timeout"))
    grace: float = field(default=5.0, metadata=_doc(
        "--grace", "seconds between SIGTERM and SIGKILL when stopping CMD"))
    work_dir: str = field(default=".", metadata=_doc(
        "--work-dir", "the directory the io check writes to (the checkpoint directory)"))
    hang_after: float = field(default=300.0, metadata=_doc(
        "--hang-after", "no progress for this long: report a hang, keep running (T13)"))
    hang_quit_after: float = field(default=900.0, metadata=_doc(
        "--hang-quit-after", "no progress for this long: the job is restarted (HangWithQuit, "
        "T14); longer than --hang-after"))


WORKER = WorkerDefaults()


@dataclass(frozen=True)
class LocalDefaults:
    """``aegis-flow run`` / ``local.runner.RunConfig`` (the rest comes from MASTER and WORKER)."""

    job: str = field(default="job", metadata=_doc("--job", "the job's name"))
    state_dir: str = field(default=".aegis", metadata=_doc(
        "--state-dir", "the NATS store, work dir, pids.json and status.json"))
    metrics_port: int = field(default=0, metadata=_doc(
        "--metrics-port", "the master's /metrics port (0: a free one, in metrics.port)"))
    max_process_restarts: int = field(default=20, metadata=_doc(
        "", "processes (master, supervisors) the runner restarts before it gives up"))
    progress_every: float = field(default=5.0, metadata=_doc(
        "", "seconds between two progress lines on stderr (see --quiet)"))


LOCAL = LocalDefaults()


def master_timeout_for(connect_timeout: float) -> float:
    """The workers' master timeout for a master with this connect timeout: the same margin as
    between the defaults (WORKER.master_timeout - MASTER.connect_timeout)."""
    return connect_timeout + (WORKER.master_timeout - MASTER.connect_timeout)


# ---------------------------------------------------------------------------------- rules


class MasterSettings(Protocol):
    @property
    def workers(self) -> int: ...
    @property
    def max_retry(self) -> int: ...
    @property
    def flap_limit(self) -> int: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def lost_timeout(self) -> float: ...
    @property
    def replace_timeout(self) -> float: ...
    @property
    def linger(self) -> float: ...


class WorkerSettings(Protocol):
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def master_timeout(self) -> float: ...
    @property
    def orphan_timeout(self) -> float: ...
    @property
    def heartbeat_interval(self) -> float: ...
    @property
    def grace(self) -> float: ...
    @property
    def hang_after(self) -> float: ...
    @property
    def hang_quit_after(self) -> float: ...


class LocalSettings(Protocol):
    @property
    def workers(self) -> int: ...
    @property
    def max_retry(self) -> int: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def lost_timeout(self) -> float: ...
    @property
    def heartbeat(self) -> float: ...
    @property
    def grace(self) -> float: ...
    @property
    def jwt_lifetime(self) -> float: ...
    @property
    def hang_after(self) -> float | None: ...
    @property
    def hang_quit_after(self) -> float | None: ...
    @property
    def max_process_restarts(self) -> int: ...


def _at_least(what: str, value: int, minimum: int, flag: str) -> None:
    if value < minimum:
        raise ConfigError(f"{what} ({value}) must be at least {minimum}: pass {flag} "
                          f"{minimum} or more")


def _seconds(what: str, value: float, flag: str, *, zero_ok: bool = False) -> None:
    bound = "0 or more" if zero_ok else "more than 0"
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{what} ({value:g} s) must be {bound} seconds"
                          f"{'' if math.isfinite(value) else ', and finite'}: pass {flag} "
                          f"with {'such a' if zero_ok else 'a positive'} number of seconds")


def _heartbeat_vs_lost(heartbeat: float, lost_timeout: float, *, worker: bool = False) -> None:
    if lost_timeout < 2 * heartbeat:
        fix = (f"lower --heartbeat to {lost_timeout / 2:g} or less" if worker else
               f"raise --lost-timeout to {2 * heartbeat:g} or more")
        raise ConfigError(
            f"the master's lost timeout ({lost_timeout:g} s) must be at least twice the workers' "
            f"heartbeat interval ({heartbeat:g} s), or one late heartbeat loses a worker: {fix}")


def _hang(hang_after: float, hang_quit_after: float, *, defaulted: str = "") -> None:
    _seconds("hang-after", hang_after, "--hang-after")
    _seconds("hang-quit-after", hang_quit_after, "--hang-quit-after")
    if not hang_after < hang_quit_after:
        after = ", the default" if defaulted == "hang_after" else ""
        quit_ = ", the default" if defaulted == "hang_quit_after" else ""
        raise ConfigError(
            f"hang-after ({hang_after:g} s{after}) must be shorter than hang-quit-after "
            f"({hang_quit_after:g} s{quit_}): raise --hang-quit-after above {hang_after:g} "
            "or lower --hang-after")


def check_master(cfg: MasterSettings, *, heartbeat: float = WORKER.heartbeat_interval) -> None:
    """The master's settings, alone and against the workers' heartbeat interval."""
    _at_least("workers", cfg.workers, 1, "--workers")
    _at_least("max-retry", cfg.max_retry, 0, "--max-retry")
    _at_least("flap-limit", cfg.flap_limit, 0, "--flap-limit")
    _seconds("the connect timeout", cfg.connect_timeout, "--connect-timeout")
    _seconds("the lost timeout", cfg.lost_timeout, "--lost-timeout")
    _seconds("the replace timeout", cfg.replace_timeout, "--replace-timeout")
    _seconds("the finish lag", getattr(cfg, "finish_lag", MASTER.finish_lag), "--finish-lag")
    _seconds("the slow window", getattr(cfg, "slow_window", MASTER.slow_window), "--slow-window",
             zero_ok=True)
    _seconds("the slow eviction bound", getattr(cfg, "slow_evict_within",
                                                 MASTER.slow_evict_within), "--slow-evict-within")
    outage = getattr(cfg, "outage_limit", MASTER.outage_limit)
    _seconds("the outage limit", outage, "--outage-limit")
    if outage <= cfg.lost_timeout:
        raise ConfigError(f"the outage limit ({outage:g} s) must be longer than the lost "
                          f"timeout ({cfg.lost_timeout:g} s): raise --outage-limit")
    _seconds("linger", cfg.linger, "--linger", zero_ok=True)
    _heartbeat_vs_lost(heartbeat, cfg.lost_timeout)
    l2, l3 = getattr(cfg, "l2_after", MASTER.l2_after), getattr(cfg, "l3_after", MASTER.l3_after)
    if not 1 <= l2 <= l3:
        raise ConfigError(f"escalation thresholds must satisfy 1 <= l2-after <= l3-after, got "
                          f"--l2-after {l2} and --l3-after {l3}")


def check_worker(cfg: WorkerSettings, *, master_connect_timeout: float = MASTER.connect_timeout,
                 master_lost_timeout: float = MASTER.lost_timeout) -> None:
    """A supervisor's settings, alone and against the master's (by default, its defaults)."""
    _at_least("world size", cfg.world_size, 1, "--world-size")
    if not 0 <= cfg.rank < cfg.world_size:
        raise ConfigError(f"rank ({cfg.rank}) must be within 0..{cfg.world_size - 1} (world "
                          f"size {cfg.world_size}): pass --rank (or set RANK) in that range")
    _seconds("the NATS connect timeout", cfg.connect_timeout, "--connect-timeout")
    _seconds("the master timeout", cfg.master_timeout, "--master-timeout")
    _seconds("the orphan timeout", cfg.orphan_timeout, "--orphan-timeout")
    _seconds("the heartbeat interval", cfg.heartbeat_interval, "--heartbeat")
    _seconds("grace", cfg.grace, "--grace", zero_ok=True)
    _hang(cfg.hang_after, cfg.hang_quit_after)
    if not cfg.master_timeout > master_connect_timeout:
        raise ConfigError(
            f"a worker's master timeout ({cfg.master_timeout:g} s) must exceed the master's "
            f"connect timeout ({master_connect_timeout:g} s), or it runs alone while the master "
            f"still waits for its peers: raise --master-timeout above {master_connect_timeout:g}")
    _heartbeat_vs_lost(cfg.heartbeat_interval, master_lost_timeout, worker=True)
    if not cfg.orphan_timeout > master_lost_timeout:
        raise ConfigError(
            f"a worker's orphan timeout ({cfg.orphan_timeout:g} s) must exceed the master's lost "
            f"timeout ({master_lost_timeout:g} s), or a pause the master forgives ends the "
            f"worker: raise --orphan-timeout above {master_lost_timeout:g}")


def hang_thresholds(hang_after: float | None, hang_quit_after: float | None) -> tuple[float, float]:
    """``aegis-flow run``'s hang thresholds, None meaning the supervisor's default; checked."""
    resolved = (WORKER.hang_after if hang_after is None else hang_after,
                WORKER.hang_quit_after if hang_quit_after is None else hang_quit_after)
    defaulted = ("hang_after" if hang_after is None else
                 "hang_quit_after" if hang_quit_after is None else "")
    _hang(*resolved, defaulted=defaulted)
    return resolved


def check_local(cfg: LocalSettings) -> None:
    """``aegis-flow run``: the master's rules and the workers' rules with the values it passes
    on (its workers' master timeout is ``master_timeout_for(connect_timeout)``)."""
    _at_least("workers", cfg.workers, 1, "--workers")
    _at_least("max-retry", cfg.max_retry, 0, "--max-retry")
    _seconds("the connect timeout", cfg.connect_timeout, "--connect-timeout")
    _seconds("the lost timeout", cfg.lost_timeout, "--lost-timeout")
    _seconds("the finish lag", getattr(cfg, "finish_lag", MASTER.finish_lag), "--finish-lag")
    _seconds("the slow window", getattr(cfg, "slow_window", MASTER.slow_window), "--slow-window",
             zero_ok=True)
    _seconds("the heartbeat interval", cfg.heartbeat, "RunConfig.heartbeat")
    _seconds("grace", cfg.grace, "RunConfig.grace", zero_ok=True)
    _seconds("the JWT lifetime", cfg.jwt_lifetime, "--jwt-lifetime")
    _at_least("max_process_restarts", cfg.max_process_restarts, 0,
              "RunConfig.max_process_restarts")
    _heartbeat_vs_lost(cfg.heartbeat, cfg.lost_timeout)
    hang_thresholds(cfg.hang_after, cfg.hang_quit_after)


def report(exc: ConfigError, stream: TextIO | None = None) -> int:
    """Print ``aegis-flow: error: MESSAGE`` (one line, no traceback); the exit code, 2."""
    (sys.stderr if stream is None else stream).write(f"aegis-flow: error: {exc}\n")
    return 2


# ---------------------------------------------------------------------------------- environment


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/true/yes/on or 0/false/no/off")


def parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected a whole number") from None


def parse_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


def parse_str(text: str) -> str:
    return text


@dataclass(frozen=True)
class EnvVar:
    name: str
    parse: Callable[[str], bool | int | float | str]  # parse_bool/_int/_float/_str
    reader: str  # which process reads it
    meaning: str
    set_by: str = "the user"
    test_only: bool = False  # a test or benchmark hook; never set it in production

    @property
    def kind(self) -> str:
        return self.parse.__name__.removeprefix("parse_")


_SUP = "supervisor"
ENV_VARS: tuple[EnvVar, ...] = (
    # the worker side
    EnvVar("AEGIS_JOB", parse_str, f"{_SUP}, worker-init, `nodes quarantine --by`, the command",
           "the job's name (default of --job)", "the supervisor, for its command"),
    EnvVar("AEGIS_NAMESPACE", parse_str, f"{_SUP}, worker-init",
           "the job's namespace (default of --namespace)", "templates/common.py (Argo)"),
    EnvVar("AEGIS_NATS_URL", parse_str, _SUP, "the NATS server (default of --nats-url)"),
    EnvVar("AEGIS_NODE", parse_str, _SUP, "this node's name (default of --node, else the host "
           "name)", "templates (Argo: spec.nodeName)"),
    EnvVar("AEGIS_NODE_IP", parse_str, _SUP, "this node's IP in the environment report (else "
           "--pod-ip)", "nothing yet"),
    EnvVar("AEGIS_WORK_DIR", parse_str, f"{_SUP}, `aegis-flow check`, the command",
           "the checkpoint directory the io check writes in (default of --work-dir/--dir)",
           "the supervisor, for its command"),
    EnvVar("AEGIS_OUTCOME_DIR", parse_str, f"{_SUP}, the Argo verdict step",
           "where the outcome word and node name are written at exit",
           "templates/common.py (Argo)"),
    EnvVar("AEGIS_NATS_CREDS", parse_str, _SUP, "NATS credentials file (default of --creds)"),
    EnvVar("AEGIS_NATS_NKEY_SEED", parse_str, _SUP,
           "NATS nkey seed file (default of --nkey-seed)"),
    EnvVar("AEGIS_GPU_TYPE", parse_str, _SUP,
           "the gpu_type metrics label, instead of the NVIDIA driver's model name"),
    EnvVar("AEGIS_PRELOAD", parse_str, "the pre-warmed interpreter (zygote.py)",
           "modules imported before forking, comma-separated (unset: torch and the checks; "
           "empty: none)", "the user (the tests: empty)"),
    EnvVar("AEGIS_ZYGOTE_FD", parse_int, "the pre-warmed interpreter (zygote.py)",
           "file descriptor of its socket to the supervisor", "the supervisor (prewarm.py)"),
    EnvVar("AEGIS_INJECT_EXIT", parse_str, "the command (sitecustomize.py, zygote.py)",
           "CODE:AFTER, an --inject exit fault: exit with CODE after AFTER seconds",
           "the supervisor (inject.py)"),
    EnvVar("AEGIS_INJECT_MARKER", parse_str, "the command (sitecustomize.py, zygote.py)",
           "the file an --inject exit fault creates when it fires (aegis-flow run warns about "
           "one that never did)", "the supervisor (inject.py)"),
    EnvVar("AEGIS_RESTART_COUNT", parse_int, "the command",
           "the restart epoch, 0 for the first run", "the supervisor"),
    EnvVar("AEGIS_PROGRESS_SOCKET", parse_str, "the command (aegis_flow.progress)",
           "the Unix socket progress.step() reports to", "the supervisor"),
    EnvVar("AEGIS_BUNDLE", parse_str, "nothing in aegis_flow (informational)",
           "the path of the running supervisor bundle (.pyz)", "bundle/boot.py"),
    EnvVar("AEGIS_BUNDLE_CACHE", parse_str, "the bundle's bootstrap (bundle/boot.py)",
           "where the bundle unpacks its native libraries"),
    EnvVar("AEGIS_POD_RETRY", parse_int, "nothing in aegis_flow (informational)",
           "the Argo retry number of this worker pod", "templates/run.py (Argo)"),
    # the checks
    EnvVar("AEGIS_SYSFS_ROOT", parse_str, "`aegis-flow check` (rdma)",
           "the sysfs root, e.g. where a container mounts the host's (default of --sysfs-root)",
           "the user, `aegis-flow run --node-env`"),
    EnvVar("AEGIS_CHECK_BUDGETS", parse_str, "the checks (steps/base.py)",
           "CHECK=SECONDS,... budget overrides", "`aegis-flow run --check-budget`"),
    EnvVar("AEGIS_EXPECT_GPUS", parse_int, "the gpu check (steps/gpu.py)",
           "GPUs this node must have (unset: any)"),
    EnvVar("AEGIS_MAX_RETRY", parse_str, "the supervisor (agent.py: Argo progress)",
           "the job's max-retry, the M of the pod's self-reported progress N/M",
           "the worker template ({{workflow.parameters.max-retry}})"),
    EnvVar("AEGIS_CHECKPOINT_DIR", parse_str, f"{_SUP} (default of --checkpoint-dir); the "
           "training script (examples/train_ddp.py)",
           "the checkpoint directory every rank shares: watched for completed checkpoints and "
           "gated before every run",
           "the worker template (JobSpec.checkpoint_dir, with checkpoint_claim); the "
           "supervisor, for the command, with --checkpoint-dir"),
    EnvVar("AEGIS_SAVE_REQUEST", parse_str, "the training script and the saver "
           "(aegis_flow.checkpoint.requested())",
           "a file holding the run id of the fault-tolerance checkpoint round the master asks "
           "for before it evicts a slow rank (absent: none asked for)", "the supervisor"),
    EnvVar("AEGIS_WORKER_RANK", parse_str, "nothing in aegis_flow (informational)",
           "the worker (node) a rank belongs to when workers run several ranks "
           "(--nproc-per-node; GROUP_RANK and NODE_RANK say the same)",
           "the supervisor, with --nproc-per-node"),
    EnvVar("AEGIS_SAMPLE_PCIE", parse_bool, f"{_SUP} (resources.py)",
           "also sample each GPU's PCIe throughput (NVML; about 20 ms per GPU and direction "
           "in the driver, in the sampling thread)", "the user"),
    EnvVar("AEGIS_CAUSES", parse_str, f"{_SUP} (default of --causes)",
           "your cause table (TOML): extends the log classifier's and live trigger's rules",
           "the user; `aegis-flow run --causes` passes --causes"),
    EnvVar("AEGIS_RESUME_FROM", parse_str, "the training script (examples/train_ddp.py)",
           "DIR/aegis-resume: the newest checkpoint the integrity gate found good (load it "
           "when it exists)", "the supervisor, with --checkpoint-dir"),
    # the master and worker-init
    EnvVar("AEGIS_POD_NAME", parse_str, "master (fault log)", "the master's pod name",
           "nothing yet (templates/master.py sets POD_IP)"),
    EnvVar("AEGIS_POD_IP", parse_str, "master (fault log)", "the master's pod IP",
           "nothing yet (templates/master.py sets POD_IP)"),
    EnvVar("AEGIS_NODE_NAME", parse_str, "master (fault log)", "the master's node name",
           "nothing yet"),
    EnvVar("AEGIS_BOOTSTRAP_TOKEN", parse_str, "master, worker-init",
           "the job's bootstrap token, a secret (default of --token-env)",
           "templates/inject.py (a Secret)"),
    EnvVar("AEGIS_MASTER_ADDR", parse_str, "worker-init",
           "the master's gRPC HOST:PORT (default of --master)"),
    EnvVar("AEGIS_CREDS", parse_str, "worker-init",
           "where to write the creds file (default of --out)"),
    EnvVar("AEGIS_ARGO_SCHEMA", parse_str, "the Argo schema check (argo/schema.py: lint, "
           "render, submit)", "the path of Argo's JSON schema"),
    # test and benchmark hooks
    EnvVar("AEGIS_TEST_DROP", parse_str, _SUP, "FRACTION[:SEED]: drop that share of NATS "
           "messages both ways", "tests/test_local_e2e.py", test_only=True),
    EnvVar("AEGIS_TEST_SLOW_RANK", parse_str, "the allreduce_performance check",
           "R:SECONDS: rank R sleeps that long in each send", "tests", test_only=True),
    EnvVar("AEGIS_AUTO_PROGRESS", parse_bool, "the pre-warmed interpreter (supervisor/zygote.py)",
           "0: do not count optimizer steps and forwards in the training process (hang "
           "detection then uses progress.step() or output; default 1)", "the user"),
    EnvVar("AEGIS_FOLD_TRACEBACKS", parse_bool, _SUP,
           "0: print a healthy rank's traceback from a failed peer in full instead of one line "
           "(default 1)", "the user"),
    EnvVar("AEGIS_TIMING", parse_bool, "master; examples/train_ddp.py",
           "log an AEGIS_APPLIED line per applied event; the example prints its "
           "AEGIS_FIRST_STEP* and AEGIS_RATE markers", "bench/, the recovery tests",
           test_only=True),
)
ENV: dict[str, EnvVar] = {v.name: v for v in ENV_VARS}

#: ``AEGIS_*`` words in the code that are log markers for benchmarks, not variables
LOG_MARKERS = frozenset({"AEGIS_APPLIED", "AEGIS_KILLED"})


def env_value(name: str, default: T, *, environ: Mapping[str, str] | None = None) -> T:
    """``$NAME`` parsed as the table says, or ``default`` when unset (or blank, except for a
    string). ConfigError on a malformed value; KeyError for a name missing from the table."""
    var = ENV.get(name)
    if var is None:
        raise KeyError(f"{name} is not in aegis_flow.settings.ENV_VARS: add it there")
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or (var.parse is not parse_str and not raw.strip()):
        return default
    try:
        value = var.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r}: {exc} ({var.meaning}): fix it or unset it") from None
    if type(value) is not type(default):
        raise TypeError(f"{name} is parsed as {var.kind}; the default {default!r} is not one")
    return value


# ---------------------------------------------------------------------------------- docs


def _defaults_table(defaults: Any, skip: frozenset[str] = frozenset()) -> list[str]:
    rows = ["| setting | flag | default | meaning |", "|---|---|---|---|"]
    for f in fields(defaults):
        if f.name in skip or not f.metadata:
            continue
        value = getattr(defaults, f.name)
        shown = f"{value:g}" if isinstance(value, float) else repr(value) if value == "" else value
        flag = f"`{f.metadata['flag']}`" if f.metadata["flag"] else ""
        rows.append(f"| `{f.name}` | {flag} | {shown} | {f.metadata['meaning']} |")
    return rows


def markdown() -> str:
    """The tables of docs/configuration.md (a test keeps the two equal)."""
    env = ["| variable | parsed as | read by | meaning | set by |", "|---|---|---|---|---|"]
    for v in ENV_VARS:
        test = " **(test only)**" if v.test_only else ""
        env.append(f"| `{v.name}` | {v.kind} | {v.reader} | {v.meaning}{test} | {v.set_by} |")
    return "\n".join([
        "### Master (`MASTER`)", "", *_defaults_table(MASTER), "",
        "### Worker supervisor (`WORKER`)", "", *_defaults_table(WORKER), "",
        "### Local runner (`LOCAL`; the rest from `MASTER` and `WORKER`)", "",
        *_defaults_table(LOCAL), "",
        "### Environment variables (`ENV_VARS`)", "", *env, ""])


if __name__ == "__main__":  # pragma: no cover - regenerates the tables of the docs
    print(markdown(), end="")
