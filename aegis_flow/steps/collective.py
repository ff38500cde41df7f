"""The collective checks: allreduce connection, allreduce performance, and bootcheck's health check.

Side effects: every check imports torch (outside its budget: a cold import takes seconds),
opens a TCP rendezvous store (rank 0 listens on the rendezvous port, the other ranks connect to
it), creates the default ``torch.distributed`` process group, moves tensors between the ranks
(gloo on CPU, NCCL when CUDA is available: ``backend="auto"``), reads ``$LOCAL_RANK`` (NCCL: which
GPU) and ``$AEGIS_TEST_SLOW_RANK`` (a test hook), sleeps when that hook says so, and destroys
the process group and the store at the end, so the same process can run the training afterwards.
Importing this module loads the standard library only.

**Rendezvous.** ``rendezvous`` is ``host:port`` (``tcp://host:port`` and ``[v6]:port`` also
accepted); rank 0 runs the store on that port (the other ranks poll the port with plain sockets
first: TCPStore's own connect retries overrun their timeout). Each rank writes a "joined" key;
rank 0 answers ``go`` once every rank has joined, or at the deadline ``abort`` with the missing
ranks, which every joined rank reports alike (``data["missing_ranks"]``); then
``init_process_group`` runs over that same store. Every wait is bounded: the port poll, the
store connect, the join and ``init_process_group`` all get the time left before
``budget - margin`` (margin = min(2 s, 20 % of the budget)), so a missing rank makes every other
rank report ``timeout`` within the budget. The port may be reused by the next call at once: a
rank that finishes early can reach rank 0's previous store while rank 0 is still closing it, but
rank 0 deletes its ``go`` as soon as every rank is past it, so that rank waits, sees the store
close and rejoins the new one (``data["rejoins"]``).

**If torch blocks anyway** (a peer dies in the middle of a collective, a driver hangs), the
budget runner abandons the probe thread and the result says ``timeout`` with
``data["abandoned_thread"]``. That thread still sits inside torch with the process group alive,
so such a process cannot run training afterwards and may not even exit cleanly: the caller must
end it after reporting (``aegis-flow check`` prints its results, then the process exits;
``os._exit`` is the safe way).

**Performance and per-rank attribution.** ``allreduce_performance`` first times ``iters``
all_reduces of ``size_mib`` MiB (after ``warmup`` untimed ones) and reports the algorithm
bandwidth (bytes / time) and the bus bandwidth (algbw × 2(n−1)/n), in GB/s (10⁹ B/s). In an
all_reduce every rank waits for the slowest, so those numbers are the same on every rank and
cannot say *which* rank is slow. For that, each rank then measures its own **send** bandwidth in
point-to-point transfers of the same size: every rank sends to its ring successor and (n > 2) its
predecessor, in rounds where no rank takes part in two transfers (:func:`ring_schedule`, at most
7 rounds whatever n), with an all_reduce barrier between rounds. The receiver is always already
waiting, so a sender's time is its own: its host, its device, its egress and the link. A rank's
number is the *best* of its sends: per peer the median of ``iters`` sends, then the faster
peer, so one slow peer on the receiving end cannot make it look slow;
``data["rank_bandwidth_gbps"]`` (the raw send times are in ``data["send_s"]``). The ranks all_gather
those numbers and apply :func:`~aegis_flow.steps.slow.flag_slow` (below ``slow_fraction`` × the
peers' median): a flagged rank's own result fails (the diagnosis marks it slow), the others'
pass, and every result lists ``data["slow_ranks"]``.
Limits: a rank whose *receiving* side alone is slow (ingress) is not detected (each of its two
senders has a fast other peer); with two ranks both sends of a rank go to the same peer, so a
slow receiver can make its sender look slow; a single rank has no link to measure (its all_reduce
algbw is reported instead, and it is never slow); the transfers are sequential in rounds, so they
do not load the network the way a real all_reduce does (that is what algbw/busbw are for).

**Test hook.** ``AEGIS_TEST_SLOW_RANK=R:SECONDS`` makes rank R sleep SECONDS inside each of its
timed sends of the performance measurement (warm-up sends included) and nowhere else.

**Health** (bootcheck): :func:`check_health` runs a real all_reduce (a sum of rank-dependent
integer tensors; every rank compares the exact expected sum) and a real all_gather (every rank
checks that slot j holds rank j's tensor).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from aegis_flow.steps.base import (
    DEFAULT_BUDGETS,
    CheckResult,
    CheckStatus,
    Outcome,
    not_applicable,
    run_with_budget,
)
from aegis_flow.steps.slow import DEFAULT_SLOW_FRACTION, flag_slow, peer_median
from aegis_flow.vocab import Check

__all__ = [
    "BACKENDS", "DEFAULT_ITERS", "DEFAULT_SIZE_MIB", "DEFAULT_WARMUP", "SLOW_RANK_ENV",
    "check_allreduce", "check_health", "flag_slow", "parse_rendezvous", "parse_slow_rank",
    "ring_schedule",
]

#: the test hook: ``R:SECONDS`` slows rank R's sends in the performance measurement
SLOW_RANK_ENV = "AEGIS_TEST_SLOW_RANK"
BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_SIZE_MIB = 64.0
DEFAULT_ITERS = 5
DEFAULT_WARMUP = 2
#: elements per rank in the health check's tensors
HEALTH_NUMEL = 4096
GB = 1e9
CONNECTION, PERFORMANCE, HEALTH = (Check.ALLREDUCE_CONNECTION.value,
                                   Check.ALLREDUCE_PERFORMANCE.value, Check.HEALTH.value)


# --- pure helpers -------------------------------------------------------------------------------

def parse_rendezvous(text: str) -> tuple[str, int]:
    """``'host:port'`` (or ``'tcp://host:port'``, ``'[::1]:port'``) → ``(host, port)``."""
    raw = text.strip()
    if raw.startswith("tcp://"):
        raw = raw[len("tcp://"):]
    raw = raw.rstrip("/")
    if raw.startswith("["):
        host, closed, rest = raw[1:].partition("]")
        sep, port_text = rest[:1], rest[1:]
        if not closed:
            sep = ""
    else:
        host, sep, port_text = raw.rpartition(":")
    if not sep or not host:
        raise ValueError(f"rendezvous must be HOST:PORT (or tcp://HOST:PORT), got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"rendezvous port must be a number, got {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"rendezvous port must be in 1..65535, got {port} in {text!r}")
    return host, port


def parse_slow_rank(text: str | None) -> tuple[int, float] | None:
    """``$AEGIS_TEST_SLOW_RANK`` (``'R:SECONDS'``) → ``(R, SECONDS)``; None when unset/empty."""
    if text is None or not text.strip():
        return None
    rank_text, sep, seconds_text = text.strip().partition(":")
    try:
        rank, seconds = int(rank_text), float(seconds_text)
    except ValueError:
        rank, seconds = -1, -1.0
    if not sep or rank < 0 or not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"{SLOW_RANK_ENV} must be RANK:SECONDS (e.g. 1:0.2), got {text!r}")
    return rank, seconds


def ring_schedule(world_size: int) -> list[list[tuple[int, int]]]:
    """Rounds of ``(sender, receiver)`` transfers: every rank sends to its ring successor and,
    with more than two ranks, to its predecessor; no rank appears twice in a round.

    Greedy edge colouring, deterministic, so every rank computes the same schedule; each rank
    has at most four transfers, so there are at most seven rounds whatever the world size.
    """
    n = world_size
    edges = [(r, (r + 1) % n) for r in range(n)] if n > 1 else []
    if n > 2:
        edges += [(r, (r - 1) % n) for r in range(n)]
    rounds: list[list[tuple[int, int]]] = []
    busy: list[set[int]] = []
    for src, dst in edges:
        for i, used in enumerate(busy):
            if src not in used and dst not in used:
                rounds[i].append((src, dst))
                used.update((src, dst))
                break
        else:
            rounds.append([(src, dst)])
            busy.append({src, dst})
    return rounds


def _margin(budget: float) -> float:
    return min(2.0, 0.2 * budget)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "…"


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


# --- the session: one rendezvous, one process group ---------------------------------------------

class _Failed(Exception):
    """A probe's verdict raised from deep inside it (status, detail, data)."""

    def __init__(self, status: CheckStatus, detail: str, data: Mapping[str, Any] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.data = status, detail, dict(data or {})


@dataclass
class _Session:
    name: str  # key namespace in the store: allreduce | health
    world_size: int
    rank: int
    host: str
    port: int
    backend: str  # gloo | nccl
    torch: Any
    dist: Any
    device: Any
    join_timeout: float  # rendezvous + init_process_group, seconds
    op_timeout: float  # the process group's collective timeout afterwards
    grace: float  # rank 0 lingers this long past the join timeout to hand out its verdict
    store: Any = None
    owns_pg: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    def outcome(self, status: CheckStatus, detail: str, **extra: Any) -> Outcome:
        return Outcome(status, detail, {**self.data, **extra})


def _open(name: str, check: str, *, world_size: int, rank: int, rendezvous: str, backend: str,
          join_timeout: float, op_timeout: float, grace: float) -> _Session:
    """Import torch, resolve the backend and device, parse the rendezvous (no network yet)."""
    base = {"world_size": world_size, "rank": rank, "rendezvous": rendezvous}
    try:
        host, port = parse_rendezvous(rendezvous)
    except ValueError as exc:
        raise _Failed(CheckStatus.FAIL, f"{check}: {exc}", base) from None
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise _Failed(CheckStatus.NOT_APPLICABLE,
                      f"{check}: torch is not importable here ({exc})", base) from None
    if not dist.is_available():
        raise _Failed(CheckStatus.FAIL, f"{check}: this torch build has no torch.distributed",
                      base)
    cuda = bool(torch.cuda.is_available()) and bool(dist.is_nccl_available())
    chosen = ("nccl" if cuda else "gloo") if backend == "auto" else backend
    if chosen == "nccl" and not cuda:
        raise _Failed(CheckStatus.FAIL, f"{check}: backend nccl was asked for, but CUDA or NCCL "
                      "is not available here", {**base, "backend": chosen})
    if chosen == "gloo" and not dist.is_gloo_available():
        raise _Failed(CheckStatus.FAIL, f"{check}: this torch build has no gloo backend",
                      {**base, "backend": chosen})
    if chosen == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    session = _Session(name, world_size, rank, host, port, chosen, torch, dist, device,
                       join_timeout, op_timeout, grace)
    session.data.update(base, backend=chosen, device=str(device))
    return session


def _join(s: _Session, check: str) -> None:
    """Rendezvous (naming missing ranks), init the default process group, all within
    ``s.join_timeout`` from now."""
    dist = s.dist
    t0 = time.monotonic()
    deadline = t0 + s.join_timeout

    def left() -> timedelta:
        return timedelta(seconds=max(0.1, deadline - time.monotonic()))

    if dist.is_initialized():
        raise _Failed(CheckStatus.FAIL, f"{check}: a default process group already exists in "
                      "this process; run the check in a fresh process or after "
                      "destroy_process_group()", s.data)
    where = f"{s.host}:{s.port}"
    while True:  # a client whose store connection breaks (rank 0's previous store closing) rejoins
        try:
            _connect_store(s, check, deadline, t0)
        except _Failed as f:
            if s.rank != 0 and f.status is CheckStatus.FAIL and _rejoin(s, deadline):
                continue
            raise
        try:
            _await_peers(s, deadline)
            break
        except _Failed as f:
            raise _Failed(f.status, f"{check}: {f.detail} within {time.monotonic() - t0:.1f} s "
                          f"(rendezvous {where}, {s.world_size} ranks)", {**s.data, **f.data}
                          ) from None
        except Exception as exc:
            s.store = None
            if s.rank != 0 and not _is_timeout(exc) and _rejoin(s, deadline):
                continue
            status = CheckStatus.TIMEOUT if _is_timeout(exc) else CheckStatus.FAIL
            raise _Failed(status, f"{check}: rank {s.rank}: the rendezvous at {where} broke "
                          f"off after {time.monotonic() - t0:.1f} s: {_first_line(exc)}",
                          {**s.data, "exception": type(exc).__name__}) from None
    s.data["rendezvous_s"] = round(time.monotonic() - t0, 4)
    t1 = time.monotonic()
    if s.backend == "nccl":
        s.torch.cuda.set_device(s.device)
    s.owns_pg = True  # none existed (checked above): whatever init leaves behind is ours
    dist.init_process_group(s.backend, store=dist.PrefixStore(f"aegis/{s.name}/pg", s.store),
                            rank=s.rank, world_size=s.world_size, timeout=left(),
                            device_id=s.device if s.backend == "nccl" else None)
    s.data["init_s"] = round(time.monotonic() - t1, 4)
    if s.rank == 0:  # every rank is past "go" now: a stale "go" must never greet a next call
        with contextlib.suppress(Exception):
            s.store.delete_key(f"aegis/{s.name}/go")
    if s.op_timeout > s.join_timeout:  # collectives may take longer than joining did
        try:
            from torch.distributed.distributed_c10d import _set_pg_timeout

            _set_pg_timeout(timedelta(seconds=s.op_timeout))
        except (ImportError, AttributeError, RuntimeError):
            pass  # a private API: without it, collectives keep the join timeout


def _rejoin(s: _Session, deadline: float) -> bool:
    """Whether a client may try the rendezvous again (time is left); counts the tries."""
    if time.monotonic() >= deadline - 0.2:
        return False
    s.data["rejoins"] = int(s.data.get("rejoins", 0)) + 1
    time.sleep(0.1)
    return True


def _connect_store(s: _Session, check: str, deadline: float, t0: float) -> None:
    """Rank 0: open the store (the server); the others: wait for the port, then connect."""
    if s.rank != 0:
        _await_port(s, check, deadline, t0)
    try:
        s.store = s.dist.TCPStore(s.host, s.port, s.world_size, s.rank == 0,
                                  timeout=timedelta(seconds=max(0.1, deadline - time.monotonic())),
                                  wait_for_workers=False)
    except Exception as exc:
        what = (f"open the rendezvous store on port {s.port}" if s.rank == 0 else
                f"reach the rendezvous store at {s.host}:{s.port} (rank 0)")
        status = CheckStatus.TIMEOUT if _is_timeout(exc) else CheckStatus.FAIL
        gone = [0] if s.rank != 0 and status is CheckStatus.TIMEOUT else []
        raise _Failed(status, f"{check}: rank {s.rank} could not {what} within "
                      f"{time.monotonic() - t0:.1f} s: {_first_line(exc)}",
                      {**s.data, "missing_ranks": gone, "exception": type(exc).__name__}
                      ) from None


def _await_port(s: _Session, check: str, deadline: float, t0: float) -> None:
    """Wait, bounded by ``deadline``, until rank 0's store accepts connections.

    TCPStore's own client retries with a back-off that can overrun its timeout by seconds (and
    logs a stack trace per try); a plain socket poll ends on time, quietly.
    """
    last: OSError | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            with socket.create_connection((s.host, s.port), timeout=min(1.0, remaining)):
                return
        except OSError as exc:
            last = exc
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    why = f"{type(last).__name__}: {last}" if last is not None else "no time left"
    raise _Failed(CheckStatus.TIMEOUT, f"{check}: rank {s.rank} could not reach the rendezvous "
                  f"store at {s.host}:{s.port} (rank 0) within {time.monotonic() - t0:.1f} s "
                  f"({why})", {**s.data, "missing_ranks": [0], "joined_ranks": []})


def _await_peers(s: _Session, deadline: float) -> None:
    """Every rank writes its "joined" key; rank 0 decides: ``go`` once all have joined, or at
    the deadline ``abort`` with the missing ranks, which every joined rank then reports the
    same way. Polls with ``check`` (quiet, never blocks long); bounded by ``deadline`` (rank 0
    lingers up to ``s.grace`` past it, within the budget's margin, so that the others can read
    its verdict)."""
    store, n = s.store, s.world_size
    prefix = f"aegis/{s.name}"
    joined = [f"{prefix}/joined/{r}" for r in range(n)]
    go, abort = f"{prefix}/go", f"{prefix}/abort"
    interval = 0.05 if n <= 16 else 0.25
    store.set(joined[s.rank], str(os.getpid()))

    def missing() -> list[int]:
        return [r for r in range(n) if not store.check([joined[r]])]

    def verdict(gone: list[int], by: str) -> _Failed:
        who = ", ".join(map(str, gone)) if gone else "?"
        return _Failed(CheckStatus.TIMEOUT, f"rank(s) {who} did not join ({by})",
                       {"missing_ranks": gone,
                        "joined_ranks": sorted(set(range(n)) - set(gone))})

    while True:
        if s.rank == 0:
            if store.check(joined):
                store.set(go, "1")
                return
        else:
            if store.check([go]):
                return
            if store.check([abort]):
                gone = [int(r) for r in json.loads(store.get(abort).decode())]
                store.set(f"{prefix}/ack/{s.rank}", "1")
                raise verdict(gone, "rank 0's verdict")
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    gone = missing()
    if s.rank != 0:
        store.set(f"{prefix}/ack/{s.rank}", "1")  # rank 0 need not linger for this one
    else:
        store.set(abort, json.dumps(gone))
        present = [f"{prefix}/ack/{r}" for r in range(1, n) if r not in gone]
        linger = time.monotonic() + s.grace
        while present and not store.check(present) and time.monotonic() < linger:
            time.sleep(interval)
        with contextlib.suppress(Exception):  # a stale verdict must not greet a next call
            store.delete_key(abort)
    raise verdict(gone, "rank 0's verdict" if s.rank == 0 else f"seen by rank {s.rank}")


def _teardown(s: _Session) -> None:
    """Destroy the process group this session created, and drop the store (rank 0: the server)."""
    try:
        if s.owns_pg and s.dist.is_initialized():
            s.dist.destroy_process_group()
    finally:
        s.owns_pg = False
        s.store = None


def _device_sync(s: _Session) -> None:
    if s.device.type == "cuda":
        s.torch.cuda.synchronize(s.device)


def _barrier(s: _Session) -> None:
    t = s.torch.zeros(1, device=s.device)
    s.dist.all_reduce(t)
    _device_sync(s)


def _guarded(s: _Session, check: str, body: Callable[[], Outcome], *,
             keep_on_pass: bool = False) -> Outcome:
    """Run ``body``; turn its failures into outcomes; tear down unless it passed and the
    process group is kept for the next probe."""
    keep = False
    try:
        outcome = body()
        keep = keep_on_pass and outcome.status is CheckStatus.PASS
        return outcome
    except _Failed as f:
        return Outcome(f.status, f.detail, f.data)
    except Exception as exc:
        status = CheckStatus.TIMEOUT if _is_timeout(exc) else CheckStatus.FAIL
        return s.outcome(status, f"{check}: rank {s.rank}: {type(exc).__name__}: "
                         f"{_first_line(exc)}", exception=type(exc).__name__)
    finally:
        if not keep:
            _teardown(s)


# --- allreduce connection -----------------------------------------------------------------------

def _connection(s: _Session) -> Outcome:
    _join(s, CONNECTION)
    torch, n = s.torch, s.world_size
    t0 = time.monotonic()
    value = torch.tensor([float(s.rank + 1)], dtype=torch.float64, device=s.device)
    s.dist.all_reduce(value)
    got, expected = float(value.item()), n * (n + 1) / 2
    s.data["allreduce_s"] = round(time.monotonic() - t0, 4)
    if got != expected:
        return s.outcome(CheckStatus.FAIL, f"{CONNECTION}: rank {s.rank}: the all_reduce of "
                         f"rank+1 over {n} ranks returned {got:g}, expected {expected:g}",
                         got=got, expected=expected)
    return s.outcome(CheckStatus.PASS, f"{CONNECTION} ok: {n} ranks joined at "
                     f"{s.host}:{s.port} ({s.backend}) and a verified all_reduce returned "
                     f"{got:g}", missing_ranks=[])


# --- allreduce performance ----------------------------------------------------------------------

def _timed_sends(s: _Session, buf: Any, dst: int, rounds: int, delay: float) -> list[float]:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if delay:
            time.sleep(delay)  # the AEGIS_TEST_SLOW_RANK hook: inside this rank's send only
        s.dist.send(buf, dst=dst)
        _device_sync(s)
        times.append(time.perf_counter() - t0)
    return times


def _performance(s: _Session, size_mib: float, iters: int, warmup: int,
                 fraction: float) -> Outcome:
    torch, dist, n, rank = s.torch, s.dist, s.world_size, s.rank
    hook = parse_slow_rank(os.environ.get(SLOW_RANK_ENV))
    delay = hook[1] if hook is not None and hook[0] == rank else 0.0
    numel = max(1, int(size_mib * 2**20) // 4)
    nbytes = numel * 4
    buf = torch.zeros(numel, dtype=torch.float32, device=s.device)  # zeros: sums stay finite
    for _ in range(warmup):
        dist.all_reduce(buf)
    _barrier(s)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _device_sync(s)
    per_iter = (time.perf_counter() - t0) / iters
    algbw = nbytes / per_iter / GB
    busbw = algbw * 2 * (n - 1) / n
    send_gbps: dict[int, float] = {}
    send_s: dict[str, list[float]] = {}
    if n > 1:
        p2p_warm = max(1, warmup)  # the first transfer of a pair may set up its channel
        recv = torch.empty_like(buf)
        for transfers in ring_schedule(n):
            _barrier(s)
            for src, dst in transfers:
                if src == rank:
                    times = _timed_sends(s, buf, dst, p2p_warm + iters, delay)[p2p_warm:]
                    send_gbps[dst] = nbytes / statistics.median(times) / GB
                    send_s[str(dst)] = [round(t, 6) for t in times]
                elif dst == rank:
                    for _ in range(p2p_warm + iters):
                        dist.recv(recv, src=src)
                    _device_sync(s)
        _barrier(s)
    mine = max(send_gbps.values()) if send_gbps else algbw
    slot = torch.tensor([mine], dtype=torch.float64, device=s.device)
    slots = [torch.zeros_like(slot) for _ in range(n)]
    dist.all_gather(slots, slot)
    every = [float(t.item()) for t in slots]
    by_rank = dict(enumerate(every))
    slow = flag_slow(by_rank, fraction)
    median = peer_median(by_rank, rank)
    data = {"size_mib": size_mib, "bytes": nbytes, "iters": iters, "warmup": warmup,
            "allreduce_iter_s": per_iter, "algbw_gbps": algbw, "busbw_gbps": busbw,
            "rank_bandwidth_gbps": mine, "send_gbps": {str(d): v for d, v in send_gbps.items()},
            "send_s": send_s,
            "all_rank_bandwidth_gbps": every, "peer_median_gbps": median,
            "slow_ranks": slow, "slow_fraction": fraction,
            "method": "p2p-send" if n > 1 else "single-rank-allreduce",
            "slow_hook_s": delay}
    head = (f"{PERFORMANCE}: {size_mib:g} MiB x {iters} over {n} ranks ({s.backend}): algbw "
            f"{algbw:.3f} GB/s, busbw {busbw:.3f} GB/s; rank {rank} sends at {mine:.3f} GB/s")
    if median is None:
        return s.outcome(CheckStatus.PASS, f"{head} (single rank: no peers to compare)", **data)
    if rank in slow:
        return s.outcome(CheckStatus.FAIL, f"{head}: rank {rank} is slow, below {fraction:g} x "
                         f"the peers' median {median:.3f} GB/s", **data)
    tail = f"; slow rank(s): {', '.join(map(str, slow))}" if slow else ""
    return s.outcome(CheckStatus.PASS, f"{head} (peers' median {median:.3f} GB/s){tail}",
                     **data)


# --- public API ---------------------------------------------------------------------------------

def _validate(world_size: int, rank: int, backend: str) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be 1 or more, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def check_allreduce(*, world_size: int, rank: int, rendezvous: str,
                    budgets: Mapping[str, float] | None = None, backend: str = "auto",
                    size_mib: float = DEFAULT_SIZE_MIB, iters: int = DEFAULT_ITERS,
                    warmup: int = DEFAULT_WARMUP,
                    slow_fraction: float = DEFAULT_SLOW_FRACTION) -> list[CheckResult]:
    """``[allreduce_connection, allreduce_performance]`` for this rank; call on every rank.

    ``budgets`` maps check type → seconds (``resolve_budgets()``; missing keys take
    DESIGN.md's 122 s / 182 s). Performance runs only after the connection passed; otherwise it
    is ``not_applicable`` (not measured). The process group is destroyed before returning —
    unless a probe was abandoned past its budget, in which case the caller must end the process
    (see the module docstring). Raises ValueError for bad arguments, never for a failed check.
    """
    _validate(world_size, rank, backend)
    if not (math.isfinite(size_mib) and size_mib > 0):
        raise ValueError(f"size_mib must be more than 0, got {size_mib}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be 1 or more and warmup 0 or more, got {iters}, {warmup}")
    if not 0 < slow_fraction <= 1:
        raise ValueError(f"slow_fraction must be in (0, 1], got {slow_fraction}")
    b = DEFAULT_BUDGETS if budgets is None else budgets
    conn_budget = b.get(CONNECTION, DEFAULT_BUDGETS[CONNECTION])
    perf_budget = b.get(PERFORMANCE, DEFAULT_BUDGETS[PERFORMANCE])
    join_timeout = conn_budget - _margin(conn_budget)
    try:
        s = _open("allreduce", CONNECTION, world_size=world_size, rank=rank,
                  rendezvous=rendezvous, backend=backend, join_timeout=join_timeout,
                  op_timeout=max(join_timeout, perf_budget - _margin(perf_budget)),
                  grace=min(1.0, _margin(conn_budget) / 2))
    except _Failed as f:
        conn = CheckResult.make(CONNECTION, f.status, f.detail, budget=conn_budget,
                                timestamp=time.time(), data=f.data)
        return [conn, _not_measured(conn, perf_budget)]
    conn = run_with_budget(CONNECTION, lambda: _guarded(s, CONNECTION, lambda: _connection(s),
                                                        keep_on_pass=True), conn_budget)
    if conn.status is not CheckStatus.PASS:
        return [conn, _not_measured(conn, perf_budget)]
    perf = run_with_budget(PERFORMANCE, lambda: _guarded(
        s, PERFORMANCE, lambda: _performance(s, size_mib, iters, warmup, slow_fraction)),
        perf_budget)
    return [conn, perf]


def _not_measured(conn: CheckResult, budget: float) -> CheckResult:
    abandoned = bool(conn.data.get("abandoned_thread"))
    note = ("; the connection probe was abandoned inside torch: end this process after "
            "reporting" if abandoned else "")
    return not_applicable(PERFORMANCE, f"{PERFORMANCE}: not measured: {CONNECTION} did not "
                          f"pass ({conn.status.value}){note}", budget=budget,
                          data={"connection_status": conn.status.value,
                                "abandoned_connection": abandoned})


def _health(s: _Session, numel: int) -> Outcome:
    _join(s, HEALTH)
    torch, dist, n, rank = s.torch, s.dist, s.world_size, s.rank
    base = torch.arange(numel, dtype=torch.int64)
    # all_reduce: rank r contributes base*(r+1) + r; the sum is base*n(n+1)/2 + n(n-1)/2
    t = (base * (rank + 1) + rank).to(s.device)
    dist.all_reduce(t)
    expected = base * (n * (n + 1) // 2) + n * (n - 1) // 2
    got = t.cpu()
    if not torch.equal(got, expected):
        i = int((got != expected).nonzero()[0].item())
        return s.outcome(CheckStatus.FAIL, f"{HEALTH}: rank {rank}: all_reduce over {n} ranks "
                         f"returned a wrong sum: element {i} is {int(got[i])}, expected "
                         f"{int(expected[i])}", op="all_reduce", index=i)
    # all_gather: slot j must hold rank j's tensor, base + j*numel
    mine = (base + rank * numel).to(s.device)
    slots = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(slots, mine)
    wrong = [j for j, slot in enumerate(slots) if not torch.equal(slot.cpu(), base + j * numel)]
    if wrong:
        return s.outcome(CheckStatus.FAIL, f"{HEALTH}: rank {rank}: all_gather over {n} ranks "
                         f"returned wrong data in slot(s) {', '.join(map(str, wrong))}",
                         op="all_gather", wrong_slots=wrong)
    return s.outcome(CheckStatus.PASS, f"{HEALTH} ok: all_reduce and all_gather over {n} ranks "
                     f"({s.backend}), {numel} elements each, verified on rank {rank}",
                     numel=numel, missing_ranks=[])


def check_health(*, world_size: int, rank: int, rendezvous: str,
                 budget: float | None = DEFAULT_BUDGETS[CONNECTION], backend: str = "auto",
                 numel: int = HEALTH_NUMEL) -> CheckResult:
    """Bootcheck's health check (check_type ``health``): a real all_reduce and all_gather, each
    rank verifying every value it received; call on every rank. ``budget=None`` runs unbounded
    (the waits then use the 122 s connection default). The process group is destroyed before
    returning (unless the probe was abandoned: then end the process, see the module docstring).
    """
    _validate(world_size, rank, backend)
    if numel < 1:
        raise ValueError(f"numel must be 1 or more, got {numel}")
    limit = DEFAULT_BUDGETS[CONNECTION] if budget is None else budget
    try:
        s = _open("health", HEALTH, world_size=world_size, rank=rank, rendezvous=rendezvous,
                  backend=backend, join_timeout=limit - _margin(limit),
                  op_timeout=limit - _margin(limit), grace=min(1.0, _margin(limit) / 2))
    except _Failed as f:
        return CheckResult.make(HEALTH, f.status, f.detail, budget=budget,
                                timestamp=time.time(), data=f.data)
    return run_with_budget(HEALTH, lambda: _guarded(s, HEALTH, lambda: _health(s, numel)),
                           budget)
