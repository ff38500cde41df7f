"""The properties the model checker proves of ``master.machine.step`` (DESIGN.md §2, Invariants)
and of its recovery policy (``master/policy.py``, rules B1–B4, V1–V3, R1).

PURE computation, no I/O. Three kinds:

* state invariants, checked on every reachable state (``INVARIANTS``): the article's P0 five plus
  WorkerSeqNumBound;
* transition invariants, checked on every explored edge (``TRANSITION_INVARIANTS``):
  MasterSeqNumMonotonic, NoFinishDoubleProcessed, StaleFinishRejected, BlameIsEvidence and
  OrdersAreStable;
* liveness over the explored graph (``evaluate``): NoDeadlock, TerminationReachable,
  NoEndlessRecovery, FlakyRankRecovers and NoEndlessReplacement. Stop edges never count as
  progress (an operator is not a way out), and an edge cut by the seq bound is neither a
  deadlock nor a failure to terminate: the states whose only ways out cross the bound are
  reported as "beyond the bound".

FlakyRankRecovers and NoEndlessReplacement walk the *cooperative* subgraph: the edges a world
without further faults produces (environment kinds COOPERATIVE and HEARTBEAT: a round of checks
passes, workers ack and heartbeat, a worker being replaced comes back).

Every violation comes with the shortest counterexample the breadth-first search knows.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

from aegis_flow.master import machine, policy
from aegis_flow.master.machine import (
    Ack,
    Broadcast,
    CheckpointDone,
    ControlPlaneBack,
    Effect,
    Error,
    Event,
    ExitCode,
    ExitWorker,
    Finish,
    HangWithQuit,
    Ignored,
    Log,
    Lost,
    Order,
    Phase,
    Quarantine,
    Send,
    Slow,
    Status,
    current_order,
    evolve,
    step,
)

from .environment import COOPERATIVE, SYMPTOM_CODES, Kind, events
from .explorer import (
    EdgeCheck,
    Exploration,
    StateCheck,
    TraceStep,
    extend,
    marked_key,
    path_to,
    policy_replacement,
    trace,
)

_PHASES = frozenset(Phase)


# --------------------------------------------------------------------------- state invariants


def valid_phase(s: Status) -> bool:
    return isinstance(s.phase, Phase) and s.phase in _PHASES


def valid_inner_phase(s: Status) -> bool:
    """Every inner phase is a known phase, Succeed and Failed included."""
    return all(isinstance(p.phase, Phase) and p.phase in _PHASES for p in s.workers)


def recover_count_bound(s: Status) -> bool:
    return 0 <= s.recover_count <= s.max_retry + 1


def retries_bound(s: Status) -> bool:
    return all(0 <= p.retries <= s.max_retry + 1 for p in s.workers)


def phase_consistency(s: Status) -> bool:
    """A worker neither finished nor restarting is in the global phase (not in Restarting)."""
    if s.phase is Phase.RESTARTING:
        return True
    return all(p.finished or p.restarting or p.phase is s.phase for p in s.workers)


def worker_seq_bound(s: Status) -> bool:
    return all(p.seq <= s.seq for p in s.workers)


def keepalive_changes_nothing(s: Status) -> bool:
    """KeepAliveChangesNothing: for every rank whose keep-alive the runtime would take without
    ``step`` (``beat_changes_nothing``), ``step`` with that heartbeat returns the very status
    and no effect: skipping it loses no decision."""
    for pod in s.workers:
        if pod.incarnation is None or not machine.beat_changes_nothing(
                s, pod.rank, pod.incarnation, s.seq):
            continue
        new, effects = step(s, Ack(pod.rank, pod.incarnation, s.seq, node=pod.node,
                                   pod_ip=pod.pod_ip))
        if new is not s or effects:
            return False
    return True


INVARIANTS: tuple[StateCheck, ...] = (
    ("ValidPhase", valid_phase),
    ("ValidInnerPhase", valid_inner_phase),
    ("RecoverCountBound", recover_count_bound),
    ("RetriesBound", retries_bound),
    ("PhaseConsistency", phase_consistency),
    ("WorkerSeqNumBound", worker_seq_bound),
    ("KeepAliveChangesNothing", keepalive_changes_nothing),
)

#: The invariants that read what the explorer's key may drop (each worker's reported seq): the
#: explorer checks them on every successor status, not only on the first of each key.
SEQ_INVARIANTS: tuple[StateCheck, ...] = (("WorkerSeqNumBound", worker_seq_bound),)

# --------------------------------------------------------------------------- transition invariants


def _ignored(old: Status, new: Status, effects: list[Effect], why: Ignored) -> bool:
    """Unchanged status and a single Log that says the event was ignored, and why."""
    return (new is old or new == old) and len(effects) == 1 and isinstance(effects[0], Log) \
        and effects[0].ignored is why


def master_seq_monotonic(kind: Kind, event: Event, old: Status, new: Status,
                         effects: list[Effect]) -> bool:
    return new.seq >= old.seq


def no_finish_double_processed(kind: Kind, event: Event, old: Status, new: Status,
                               effects: list[Effect]) -> bool:
    """A Finish/Error already processed (same worker, seq and type) is ignored, idempotently,
    and recognised as a duplicate (the Log says so): not merely turned away by a later check."""
    return kind is not Kind.DUPLICATE or _ignored(old, new, effects, Ignored.DUPLICATE)


def stale_finish_rejected(kind: Kind, event: Event, old: Status, new: Status,
                          effects: list[Effect]) -> bool:
    """A Finish/Error with a seq older than the master's is rejected with a Log saying stale."""
    return kind is not Kind.STALE or _ignored(old, new, effects, Ignored.STALE)


def _symptom(kind: Kind, event: Event) -> bool:
    """A peer symptom, as the environment produced it (not as the policy judges it)."""
    if kind is Kind.SYMPTOM:
        return True
    if isinstance(event, Error):
        return event.code in SYMPTOM_CODES
    return isinstance(event, HangWithQuit) and event.waiting


def _behind_all(rank: int, activity: tuple[tuple[int, int, int], ...]) -> bool:
    """``rank``'s (steps, forwards) are less than every other rank's (at least one other)."""
    mine = [(s, f) for r, s, f in activity if r == rank]
    others = [(s, f) for r, s, f in activity if r != rank]
    return bool(mine) and bool(others) and all(mine[0] < o for o in others)


def _evidence_against(rank: int, kind: Kind, event: Event, old: Status, new: Status) -> bool:
    """Whether this edge carries evidence that ``rank`` failed (BlameIsEvidence)."""
    pod = old.workers[rank]
    if getattr(event, "rank", None) == rank:
        alone = not any(p.rank != rank and not p.finished for p in old.workers)
        if isinstance(event, Error | HangWithQuit) and (  # B4; B1: no live peer, its own
                not _symptom(kind, event) or (alone and old.phase is Phase.RUNCOMMAND
                                              and event.seq == old.seq)):
            return True
        if isinstance(event, Lost):  # its loss
            return True
        if isinstance(event, Ack):  # its new pod
            return pod.incarnation is not None and event.incarnation != pod.incarnation
        if isinstance(event, Finish) and (not event.ok or pod.cause or pod.failures):
            return True  # its failed check: by its result, or by its history (V2)
    if isinstance(event, Finish) and pod.shared and pod.finish_seq == old.seq:
        return True  # its failed storage check, held for the others' (T3j), judged now
    if isinstance(event, CheckpointDone) and pod.slow:
        return True  # T13e: evicted at the safe point it waited for (its slow mark)
    if isinstance(event, HangWithQuit) and old.phase is Phase.RUNCOMMAND and _behind_all(
            rank, event.activity):
        return True  # B5: its progress counts are behind every peer's: it stopped first
    if isinstance(event, HangWithQuit) and event.waiting and old.phase is Phase.RUNCOMMAND:
        return pod.hanging and not pod.waiting and not pod.finished  # B2 by the T13 marks
    # B3: the round of checks completes with the blame still on ``rank``
    return isinstance(event, Finish) and old.blame == rank and new.blame < 0 and \
        new.phase in (Phase.RUNCOMMAND, Phase.FAILED)


def blame_is_evidence(kind: Kind, event: Event, old: Status, new: Status,
                      effects: list[Effect]) -> bool:
    """A rank's ``failures`` or ``retries`` grows only on evidence against it: it sent a
    non-symptom report (an Error, a HangWithQuit of a process that does not sleep; a symptom
    too when every other rank has finished its run: no peer can have caused it), it was lost
    or replaced by a new pod, its check failed (by its result or its history, or a storage
    check held until the others answered, T3j); or its progress counts in a HangWithQuit are
    behind every peer's (B5); or it is marked
    hung and not waiting when a waiting rank reports HangWithQuit (B2); or the round completes
    with the blame on it (B3). T9's alignment of ``retries`` to recoverCount is the one other
    way ``retries`` grows. In particular a peer symptom never raises anyone's count."""
    if new is old:
        return True
    for p, q in zip(new.workers, old.workers, strict=True):
        more_failures, more_retries = p.failures > q.failures, p.retries > q.retries
        if not (more_failures or more_retries):
            continue
        if _evidence_against(p.rank, kind, event, old, new):
            continue
        aligned = (old.phase is Phase.TROUBLESHOOTING and new.phase is Phase.RUNCOMMAND
                   and p.retries == new.recover_count)
        if more_retries and not more_failures and aligned:  # T9
            continue
        return False
    return True


def _orders(status: Status) -> list[Order]:
    order, _ = current_order(status)
    out = [order] if order is not None else []
    if any(p.exit_code is not None for p in status.workers):
        out.append(Order.EXIT)
    return out


def orders_are_stable(kind: Kind, event: Event, old: Status, new: Status,
                      effects: list[Effect]) -> bool:
    """Within one seq the payload of every order the master may (re-)send is the same:
    ``policy.order_data(new, order, seq) == policy.order_data(old, order, seq)`` for the
    current order (and the exit order of a worker being replaced). A re-send is then the order
    first sent, byte for byte, whatever happened in between (DESIGN §4; the stored status
    itself round-trips through ``master/store.py``: ``tests/test_verify.py``)."""
    if new is old or new.seq != old.seq or new.phase.terminal:
        return True
    # looked up now, so a monkeypatched policy is seen
    order_data = policy.order_data
    seq = old.seq
    return all(order_data(new, order, seq) == order_data(old, order, seq)
               for order in _orders(old))


def outage_counts_nothing(kind: Kind, event: Event, old: Status, new: Status,
                          effects: list[Effect]) -> bool:
    """T6n/T6b: the control plane going out (every live worker silent at once, or the master
    cut off from NATS) and coming back change nothing but the outage mark: no count, no
    failure charged, no order, no phase change; while it is out, a loss is ignored unless it
    outlasted the outage bound with the master reaching NATS."""
    if new is old:
        return True
    if kind is Kind.OUTAGE or isinstance(event, ControlPlaneBack) or (
            old.outage and isinstance(event, Lost)
            and not (event.outlasted and event.nats_ok)):
        return evolve(new, outage=old.outage) == old and not any(
            isinstance(e, Broadcast | Send | ExitWorker | Quarantine) for e in effects)
    return True


def resume_counts_nothing(kind: Kind, event: Event, old: Status, new: Status,
                          effects: list[Effect]) -> bool:
    """T8r: resuming an interrupted job restarts every worker and charges nobody: no count,
    no failure, no replacement order; the job waits in Restarting for every worker."""
    if kind is not Kind.RESUME or new is old:
        return True
    same = all(p.retries == q.retries and p.failures == q.failures
               for p, q in zip(new.workers, old.workers, strict=True))
    return same and new.recover_count == old.recover_count and new.phase is Phase.RESTARTING \
        and all(p.restarting for p in new.workers) and not any(
            isinstance(e, ExitWorker | Quarantine) for e in effects)


def storage_fault_is_the_jobs(kind: Kind, event: Event, old: Status, new: Status,
                              effects: list[Effect]) -> bool:
    """T3j: a failed check of storage the ranks may share replaces and quarantines nobody
    while no rank has passed the round; when every rank has failed it the same way the job
    fails, charging nobody and quarantining nothing (a full shared disk is not N node faults)."""
    if new is old or not (isinstance(event, Finish) and event.shared and not event.ok
                          and old.phase in (Phase.BOOTCHECKING, Phase.TROUBLESHOOTING)):
        return True
    others = [p for p in old.workers if p.rank != event.rank]
    if any(p.finished for p in others):
        return True
    touched = any(isinstance(e, ExitWorker | Quarantine) for e in effects) or \
        new.retries != old.retries
    if all(p.shared == event.shared and p.finish_seq == old.seq for p in others):
        return new.phase is Phase.FAILED and not touched
    return not touched


def eviction_only_at_checkpoint(kind: Kind, event: Event, old: Status, new: Status,
                                effects: list[Effect]) -> bool:
    """T13e: a slow rank is evicted (exit 72) only on the edge of a completed checkpoint, and
    only a rank marked slow before it; a slow mark itself stops, charges and moves nothing."""
    evicted = [e.rank for e in effects if isinstance(e, ExitWorker)
               and e.code is ExitCode.SLOW_NODE_EVICTED]
    if evicted and not (isinstance(event, CheckpointDone)
                        and all(old.workers[r].slow for r in evicted)):
        return False
    if isinstance(event, Slow) and new is not old:
        return new.phase is old.phase and new.retries == old.retries and not any(
            isinstance(e, ExitWorker | Quarantine | Broadcast) for e in effects)
    return True


TRANSITION_INVARIANTS: tuple[EdgeCheck, ...] = (
    ("MasterSeqNumMonotonic", master_seq_monotonic),
    ("NoFinishDoubleProcessed", no_finish_double_processed),
    ("StaleFinishRejected", stale_finish_rejected),
    ("BlameIsEvidence", blame_is_evidence),
    ("OrdersAreStable", orders_are_stable),
    ("OutageCountsNothing", outage_counts_nothing),
    ("StorageFaultIsTheJobs", storage_fault_is_the_jobs),
    ("ResumeCountsNothing", resume_counts_nothing),
    ("EvictionOnlyAtCheckpoint", eviction_only_at_checkpoint),
)

LIVENESS = ("NoDeadlock", "TerminationReachable", "NoEndlessRecovery", "FlakyRankRecovers",
            "NoEndlessReplacement")

# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    """One property's outcome; ``trace`` is the shortest counterexample when violated.

    For NoEndlessRecovery the trace ends with a cycle: ``trace[loop_start]`` and ``trace[-1]``
    are the same state. ``holds`` is None when the property could not be decided (the run hit
    its state limit).
    """

    name: str
    kind: str  # "state", "transition" or "liveness"
    holds: bool | None
    trace: list[TraceStep] = field(default_factory=list)
    note: str = ""
    loop_start: int | None = None


def evaluate(ex: Exploration) -> list[Verdict]:
    """Every property's verdict, in a fixed order (state, transition, liveness)."""
    out: list[Verdict] = []
    for name, _ in INVARIANTS:
        sid = ex.state_violations.get(name)
        edge = ex.edge_violations.get(name)  # an every-successor check (see SEQ_INVARIANTS)
        if sid is not None:
            out.append(Verdict(name, "state", False, trace(ex, path_to(ex, sid))))
        elif edge is not None:
            out.append(Verdict(name, "state", False,
                               trace(ex, path_to(ex, edge[0]), edge[1:])))
        else:
            out.append(Verdict(name, "state", True))
    for name, _ in TRANSITION_INVARIANTS:
        hit = ex.edge_violations.get(name)
        if hit is None:
            out.append(Verdict(name, "transition", None if ex.exceeded else True))
        else:
            out.append(Verdict(name, "transition", False,
                               trace(ex, path_to(ex, hit[0]), hit[1:])))
    if ex.exceeded:
        out = [v if v.holds is False else Verdict(v.name, v.kind, None, note="state limit hit")
               for v in out]
        out += [Verdict(n, "liveness", None, note="state limit hit") for n in LIVENESS]
        return out
    out += [no_deadlock(ex), termination_reachable(ex), no_endless_recovery(ex),
            flaky_rank_recovers(ex), no_endless_replacement(ex)]
    return out


# --------------------------------------------------------------------------- liveness


def no_deadlock(ex: Exploration) -> Verdict:
    """Every expanded live state has a way on other than Stop or a self-loop (or a cut edge)."""
    for sid in range(ex.states):
        if ex.expanded[sid] and not ex.has_progress[sid] and not ex.has_cut[sid]:
            return Verdict("NoDeadlock", "liveness", False, trace(ex, path_to(ex, sid)))
    return Verdict("NoDeadlock", "liveness", True)


def _reverse(n: int, src: array[int], dst: array[int]) -> tuple[list[int], array[int]]:
    """Compressed reverse adjacency: predecessors of v are pred[start[v]:start[v+1]]."""
    start = [0] * (n + 1)
    for d in dst:
        start[d + 1] += 1
    for v in range(n):
        start[v + 1] += start[v]
    fill = start[:-1]
    pred = array("i", bytes(4 * len(dst)))
    for s, d in zip(src, dst, strict=True):
        pred[fill[d]] = s
        fill[d] += 1
    return start, pred


def _backward(seeds: list[int], start: list[int], pred: array[int], mark: bytearray) -> None:
    queue = deque(v for v in seeds if not mark[v])
    for v in queue:
        mark[v] = 1
    while queue:
        v = queue.popleft()
        for i in range(start[v], start[v + 1]):
            u = pred[i]
            if not mark[u]:
                mark[u] = 1
                queue.append(u)


def termination_reachable(ex: Exploration) -> Verdict:
    """From every live state a terminal phase is reachable without Stop (reverse BFS)."""
    n = ex.states
    start, pred = _reverse(n, ex.edge_src, ex.edge_dst)
    ends = bytearray(n)
    _backward([v for v in range(n) if ex.terminal[v]], start, pred, ends)
    beyond = bytearray(n)  # can reach a cut edge or an unexplored (violating) state
    _backward([v for v in range(n) if not ends[v] and (ex.has_cut[v] or not (
        ex.expanded[v] or ex.terminal[v]))], start, pred, beyond)
    stuck = [v for v in range(n) if ex.expanded[v] and not ends[v] and not beyond[v]]
    n_beyond = sum(1 for v in range(n) if ex.expanded[v] and not ends[v] and beyond[v])
    note = f"{n_beyond} live states end only beyond the seq bound" if n_beyond else ""
    if stuck:
        return Verdict("TerminationReachable", "liveness", False,
                       trace(ex, path_to(ex, stuck[0])), note)
    return Verdict("TerminationReachable", "liveness", True, note=note)


def no_endless_recovery(ex: Exploration) -> Verdict:
    """No cycle of recovery states (BootChecking, Restarting, Troubleshooting) without a
    counted failure: Tarjan's algorithm, iteratively, on the recovery subgraph."""
    cycle = _find_cycle(ex.states, ex.rec_src, ex.rec_dst)
    if cycle is None:
        return Verdict("NoEndlessRecovery", "liveness", True)
    prefix = path_to(ex, cycle[0])
    steps = trace(ex, prefix + cycle[1:])
    return Verdict("NoEndlessRecovery", "liveness", False, steps, loop_start=len(prefix) - 1)


def _find_cycle(n: int, src: array[int], dst: array[int]) -> list[int] | None:
    """A cycle [v, ..., v] in the graph, through the lowest-numbered (shallowest) vertex of
    any non-trivial strongly connected component; None when the graph is acyclic."""
    if not src:
        return None
    succ: dict[int, list[int]] = {}
    for s, d in zip(src, dst, strict=True):
        succ.setdefault(s, []).append(d)
    comp = _tarjan(succ)
    best: int | None = None
    members: dict[int, list[int]] = {}
    for v, c in comp.items():
        members.setdefault(c, []).append(v)
    for vs in members.values():
        if len(vs) > 1 and (best is None or min(vs) < best):
            best = min(vs)
    if best is None:
        return None
    scc = comp[best]
    # shortest way round: BFS inside the component from best back to best
    parent: dict[int, int] = {}
    queue = deque([best])
    while queue:
        v = queue.popleft()
        for w in succ.get(v, ()):
            if comp.get(w) != scc:
                continue
            if w == best:
                path = [v]
                while path[-1] != best:
                    path.append(parent[path[-1]])
                return [*path[::-1], best]
            if w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError("a strongly connected component without a cycle")  # pragma: no cover


def _tarjan(succ: dict[int, list[int]]) -> dict[int, int]:
    """Strongly connected components (vertex → component id), without recursion."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    comp: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    counter = 0
    for root in succ:
        if root in index:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            children = succ.get(v, [])
            recurse = False
            while i < len(children):
                w = children[i]
                i += 1
                if w not in index:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp[w] = v
                    if w == v:
                        break
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comp


# --------------------------------------------------------------------------- the policy's liveness


@dataclass
class Closure:
    """The cooperative closure of FlakyRankRecovers' start states (see there): nodes are
    concrete statuses (one per key), ``parent[v]`` is (node, kind, event) of the hop that found
    ``v`` or (-1 - state id of its start, None, None); ``replacements`` the policy-ordered
    replacements met on the way (NoEndlessReplacement's further seeds)."""

    nodes: list[Status] = field(default_factory=list)
    parent: list[tuple[int, Kind | None, Event | None]] = field(default_factory=list)
    succ: list[list[int]] = field(default_factory=list)
    dist: list[int] = field(default_factory=list)  # steps from the initial state
    replacements: list[tuple[int, Kind, Event, int, Status]] = field(default_factory=list)
    starts: int = 0
    exceeded: bool = False
    failed: int | None = None  # the first terminal node


def cooperative_closure(ex: Exploration) -> Closure:
    """Breadth-first from every start over cooperative events, not cut by the seq bound,
    stopping at RunCommand and terminal phases (computed once per exploration)."""
    if isinstance(ex.closure, Closure):
        return ex.closure
    cfg, enc = ex.config, ex.encoder
    c = Closure()
    ids: dict[int, int] = {}
    queue: deque[int] = deque()

    def node(status: Status, link: tuple[int, Kind | None, Event | None], dist: int) -> int:
        key = enc.encode(status)
        v = ids.get(key)
        if v is None:
            v = ids[key] = len(c.nodes)
            c.nodes.append(status)
            c.parent.append(link)
            c.dist.append(dist)
            c.succ.append([])
            queue.append(v)
        return v

    # the starts join the search at their depth, so every node's path from the initial state
    # (exploration, then closure) is a shortest one, and so is every counterexample
    starts = sorted(ex.flaky_starts, key=lambda s: ex.depth[s[0]])
    i = 0
    while queue or i < len(starts):
        if i < len(starts) and (not queue or ex.depth[starts[i][0]] <= c.dist[queue[0]]):
            sid, status = starts[i]
            i += 1
            node(status, (-1 - sid, None, None), ex.depth[sid])
            continue
        v = queue.popleft()
        status = c.nodes[v]
        if status.phase.terminal:
            if c.failed is None:
                c.failed = v
            continue
        if status.phase is Phase.RUNCOMMAND:
            continue
        if len(c.nodes) >= cfg.max_states:
            c.exceeded = True
            break
        for kind, event in events(status, message_layer=cfg.message_layer, resume=cfg.resume):
            if kind not in COOPERATIVE:
                continue
            new, effects = step(status, event)
            if new is status:
                continue
            rank = policy_replacement(event, effects)
            if rank is not None:
                c.replacements.append((v, kind, event, rank, new))
            w = node(new, (v, kind, event), c.dist[v] + 1)
            if w != v:
                c.succ[v].append(w)
    c.starts = len(starts)
    ex.closure = c
    return c


def flaky_rank_recovers(ex: Exploration) -> Verdict:
    """After a counted failure, a cooperating world gets the job running again.

    Start states: every live state other than RunCommand that the exploration reached by an
    edge on which some rank's retries grew (a counted failure), in which no rank with an open
    failure has spent its flap allowance (``explorer.flaky_start``). From the starts the
    *cooperative closure* is searched (``cooperative_closure``), breadth-first over concrete
    statuses keyed as the exploration keys them: only cooperative events (checks pass, acks and
    heartbeats, replaced workers come back; never an Error, a loss, a hang, a failed check, a
    new pod nobody asked for, Stop or the connect timeout), stopping at RunCommand and at
    terminal phases, and NOT cut by the seq bound (a cooperative path is short: each round
    either passes or replaces a rank, and replacements are bounded by the flap guard and
    max-retry). It holds when (1) no terminal phase is in the closure (the job is not failed —
    by the flap guard, T11 or anything else — before it runs again), and (2) RunCommand is
    reachable, within the closure, from every state of it. A repeated user error (T16) fails
    the job on an Error edge, never a cooperative one, and a node fault always comes back on a
    new node here, so neither needs an exemption.
    """
    name = "FlakyRankRecovers"
    c = cooperative_closure(ex)
    if c.exceeded:
        return Verdict(name, "liveness", None, note="state limit hit in the closure")
    if c.failed is not None:
        return Verdict(name, "liveness", False, _closure_trace(ex, c, c.failed),
                       note=f"{c.nodes[c.failed].phase.value} before RunCommand, the world "
                            "cooperating")
    pred: dict[int, list[int]] = {}
    for v, ws in enumerate(c.succ):
        for w in ws:
            pred.setdefault(w, []).append(v)
    good = bytearray(len(c.nodes))
    _mark_back([v for v, st in enumerate(c.nodes) if st.phase is Phase.RUNCOMMAND], pred, good)
    stuck = [v for v in range(len(c.nodes)) if not good[v]]
    if stuck:
        return Verdict(name, "liveness", False, _closure_trace(ex, c, stuck[0]),
                       note="cannot run again without a new fault")
    deepest = max((st.seq for st in c.nodes), default=0)
    return Verdict(name, "liveness", True,
                   note=f"{c.starts:,} states after a counted failure, {len(c.nodes):,} in "
                        f"their cooperative closure (seq up to {deepest})")


def _mark_back(seeds: list[int], pred: dict[int, list[int]], mark: bytearray) -> None:
    queue = deque(v for v in seeds if not mark[v])
    for v in queue:
        mark[v] = 1
    while queue:
        v = queue.popleft()
        for u in pred.get(v, ()):
            if not mark[u]:
                mark[u] = 1
                queue.append(u)


def _closure_trace(ex: Exploration, c: Closure, v: int) -> list[TraceStep]:
    """A path to the start state, then the cooperative hops from it to node ``v`` (replayed
    by key, so the trace is concrete under symmetry too)."""
    hops: list[int] = [v]
    while c.parent[hops[-1]][0] >= 0:
        hops.append(c.parent[hops[-1]][0])
    hops.reverse()
    steps = trace(ex, path_to(ex, -1 - c.parent[hops[0]][0]))
    for h in hops[1:]:
        _hop(ex, steps, ex.encoder.encode(c.nodes[h]))
    return steps


def _hop(ex: Exploration, steps: list[TraceStep], want: int) -> None:
    """Extend ``steps`` by a cooperative event whose result has key ``want``."""
    enc, cur = ex.encoder, steps[-1].status
    for kind, event in events(cur, message_layer=ex.config.message_layer,
                                     resume=ex.config.resume):
        if kind in COOPERATIVE and enc.encode(step(cur, event)[0]) == want:
            extend(steps, kind, event)
            return
    raise AssertionError("cannot replay a cooperative hop")  # pragma: no cover


def no_endless_replacement(ex: Exploration) -> Verdict:
    """No rank is replaced twice by the policy without the job running in between.

    A *policy-ordered replacement* of rank r is an edge whose event is a passing Finish of r
    and whose effects tell r to exit (``ExitWorker(r)``): its checks passed, its history made
    the policy order L2/L3 (V2). The property: no path of the cooperative subgraph (as for
    FlakyRankRecovers; RunCommand and terminal states end it) contains two policy-ordered
    replacements of the same rank. Computed exactly, symmetry or not: a breadth-first search
    over (status, tracked rank) pairs, seeded with the state after every policy-ordered
    replacement the exploration met (tracking the replaced rank), keyed by the status's key with
    the tracked worker's code marked (sorting keeps the mark on the right worker), following
    cooperative events only, until RunCommand or a terminal phase — not cut by the seq bound,
    as FlakyRankRecovers' closure; a second policy-ordered replacement of the tracked rank is a
    violation.
    """
    name = "NoEndlessReplacement"
    cfg, enc = ex.config, ex.encoder
    ml = cfg.message_layer
    visited: set[int] = set()
    queue: deque[tuple[Status, int, int]] = deque()
    closure = cooperative_closure(ex)
    # (status, replaced rank, steps from the initial state to it), shallowest first
    seeds = [(r.status, r.rank, ex.depth[r.src] + 1) for r in ex.replacements] + [
        (new, rank, closure.dist[v] + 1) for v, _, _, rank, new in closure.replacements]
    order = sorted(range(len(seeds)), key=lambda j: seeds[j][2])
    for i in order:
        status, rank, _ = seeds[i]
        if status.phase.terminal:
            continue
        key = marked_key(enc, status, rank)
        if key not in visited:
            visited.add(key)
            queue.append((status, rank, i))
    while queue:
        status, rank, i = queue.popleft()
        for kind, event in events(status, message_layer=ml):
            if kind not in COOPERATIVE:
                continue
            new, effects = step(status, event)
            if policy_replacement(event, effects) == rank:
                return Verdict(name, "liveness", False, _replacement_trace(ex, closure, i),
                               note=f"rank {rank} replaced twice without running")
            if new is status or new.phase.terminal or new.phase is Phase.RUNCOMMAND:
                continue
            key = marked_key(enc, new, rank)
            if key not in visited:
                if len(visited) >= cfg.max_states:
                    return Verdict(name, "liveness", None, note="state limit hit")
                visited.add(key)
                queue.append((new, rank, i))
    return Verdict(name, "liveness", True,
                   note=f"{len(seeds):,} policy-ordered replacements followed, "
                        f"{len(visited):,} tracked states")


def _replacement_trace(ex: Exploration, closure: Closure, seed: int) -> list[TraceStep]:
    """A path to the state where seed ``seed`` made its replacement (through the exploration,
    then the cooperative closure), then — found again by a breadth-first search from that
    replayed concrete status — a replacement and a second one of the same rank."""
    cfg, enc = ex.config, ex.encoder
    if seed < len(ex.replacements):
        steps = trace(ex, path_to(ex, ex.replacements[seed].src))
    else:
        steps = _closure_trace(ex, closure, closure.replacements[seed - len(ex.replacements)][0])
    start = steps[-1].status
    # nodes: (status, tracked rank or -1); the first cooperative hop must replace someone
    parent: dict[tuple[int, int], tuple[tuple[int, int], Kind, Event] | None] = {}
    root = (enc.encode(start), -1)
    parent[root] = None
    queue: deque[tuple[Status, int, tuple[int, int]]] = deque([(start, -1, root)])
    while queue:
        status, rank, node = queue.popleft()
        for kind, event in events(status, message_layer=cfg.message_layer, resume=cfg.resume):
            if kind not in COOPERATIVE:
                continue
            new, effects = step(status, event)
            hit = policy_replacement(event, effects)
            if rank >= 0 and hit == rank:
                hops: list[tuple[Kind, Event]] = [(kind, event)]
                link = parent[node]
                while link is not None:
                    node, k, e = link
                    hops.append((k, e))
                    link = parent[node]
                for k, e in reversed(hops):
                    extend(steps, k, e)
                return steps
            if rank < 0 and hit is None:
                continue  # the search starts with a replacement
            track = hit if rank < 0 and hit is not None else rank
            if new is status or new.phase.terminal or new.phase is Phase.RUNCOMMAND:
                continue
            nxt = (marked_key(enc, new, track), track)
            if nxt not in parent:
                parent[nxt] = (node, kind, event)
                queue.append((new, track, nxt))
    raise AssertionError("a replacement did not replay")  # pragma: no cover


__all__ = ["INVARIANTS", "LIVENESS", "SEQ_INVARIANTS", "TRANSITION_INVARIANTS", "Verdict",
           "blame_is_evidence", "evaluate", "flaky_rank_recovers", "no_endless_replacement",
           "orders_are_stable"]
