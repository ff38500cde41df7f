"""The properties the model checker proves of ``master.machine.step`` (DESIGN.md §2, Invariants).

PURE computation, no I/O. Three kinds:

* state invariants, checked on every reachable state (``INVARIANTS``): the article's P0 five plus
  WorkerSeqNumBound;
* transition invariants, checked on every explored edge (``TRANSITION_INVARIANTS``):
  MasterSeqNumMonotonic, NoFinishDoubleProcessed, StaleFinishRejected;
* liveness over the explored graph (``evaluate``): NoDeadlock, TerminationReachable and
  NoEndlessRecovery. Stop edges never count as progress (an operator is not a way out), and an
  edge cut by the seq bound is neither a deadlock nor a failure to terminate: the states whose
  only ways out cross the bound are reported as "beyond the bound".

Every violation comes with the shortest counterexample the breadth-first search knows.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

from aegis_flow.master.machine import (
    Effect,
    Event,
    Ignored,
    Log,
    Phase,
    Status,
)

from .environment import Kind
from .explorer import EdgeCheck, Exploration, StateCheck, TraceStep, path_to, trace

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


INVARIANTS: tuple[StateCheck, ...] = (
    ("ValidPhase", valid_phase),
    ("ValidInnerPhase", valid_inner_phase),
    ("RecoverCountBound", recover_count_bound),
    ("RetriesBound", retries_bound),
    ("PhaseConsistency", phase_consistency),
    ("WorkerSeqNumBound", worker_seq_bound),
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


TRANSITION_INVARIANTS: tuple[EdgeCheck, ...] = (
    ("MasterSeqNumMonotonic", master_seq_monotonic),
    ("NoFinishDoubleProcessed", no_finish_double_processed),
    ("StaleFinishRejected", stale_finish_rejected),
)

LIVENESS = ("NoDeadlock", "TerminationReachable", "NoEndlessRecovery")

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
                               trace(ex, path_to(ex, edge[0]), (edge[1], edge[2]))))
        else:
            out.append(Verdict(name, "state", True))
    for name, _ in TRANSITION_INVARIANTS:
        hit = ex.edge_violations.get(name)
        if hit is None:
            out.append(Verdict(name, "transition", None if ex.exceeded else True))
        else:
            sid, kind, event = hit
            out.append(Verdict(name, "transition", False,
                               trace(ex, path_to(ex, sid), (kind, event))))
    if ex.exceeded:
        out = [v if v.holds is False else Verdict(v.name, v.kind, None, note="state limit hit")
               for v in out]
        out += [Verdict(n, "liveness", None, note="state limit hit") for n in LIVENESS]
        return out
    out += [no_deadlock(ex), termination_reachable(ex), no_endless_recovery(ex)]
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


__all__ = ["INVARIANTS", "LIVENESS", "SEQ_INVARIANTS", "TRANSITION_INVARIANTS", "Verdict",
           "evaluate"]
