"""Breadth-first explicit-state exploration of the real ``aegis_flow.master.machine.step``.

PURE computation: no I/O, no clock reads except ``time.perf_counter`` for the reported duration.
``explore(config)`` returns an ``Exploration``: the number of states, the edges the liveness
checks need (as flat integer arrays), the first violation of every state and transition
invariant, and parent pointers from which ``trace`` rebuilds a shortest counterexample by
replaying ``step`` from the initial status.

The visited set is keyed by a COMPACT encoding of each status: every worker becomes a small
interned integer, and the status one Python int. The encoding drops what no decision of the
machine reads (sound, see docs/verification.md):

* ``last_reason`` (written, never read by a decision), ``updated``/``pod_ip`` (constant here);
* ``finish_seq``/``error_seq`` become "equals the master's seq": a Finish/Error whose seq is not
  the current one is rejected as stale or future before dedup looks at them, and the master's
  seq never decreases (MasterSeqNumMonotonic and StaleFinishRejected check both);
* ``error_nodes`` and ``stop_reason``: the quarantine set is written by T3/T10 and read by no
  decision of ``step`` (only the runtime acts on its Quarantine effect), and ``stop_reason`` is
  set only on the way into Failed;
* a terminal status keeps only what the invariants and the dump read (see ``Encoder``).

With ``symmetry`` the key also forgets which worker is which (the per-worker codes are sorted) and
which incarnation name a worker carries ("0"/"1" are compared only for equality), keeping only
whether it has acked. Statuses are kept only for the frontier.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import le

from aegis_flow.master.machine import (
    TERMINAL_PHASES,
    Effect,
    Event,
    Phase,
    PodInfo,
    Status,
    initial_status,
    step,
)

from .environment import Kind, events

#: A state invariant: name and predicate (True = holds).
StateCheck = tuple[str, Callable[[Status], bool]]
#: A transition invariant: name and predicate over (kind, event, old, new, effects).
EdgeCheck = tuple[str, Callable[[Kind, Event, Status, Status, list[Effect]], bool]]

_RECOVERY_PHASES = frozenset({Phase.BOOTCHECKING, Phase.RESTARTING, Phase.TROUBLESHOOTING})
_POD_BITS = 24  # room for 16M distinct worker codes


class StateLimitExceeded(RuntimeError):
    """More states than ``max_states``: the run was abandoned (retrying cannot help)."""


@dataclass(frozen=True)
class Config:
    """One model: the job's size and how much of the environment to model."""

    workers: int = 3
    max_retry: int = 2
    flap_limit: int = 3
    message_layer: bool = False
    seq_bound: int = 4
    symmetry: bool = False
    exact: bool = False  # keep every worker's reported seq in the key (what a dump needs)
    max_states: int = 5_000_000

    def initial(self) -> Status:
        nodes = tuple(f"n{r}" for r in range(self.workers))
        return initial_status(self.workers, self.max_retry, flap_limit=self.flap_limit,
                              nodes=nodes)


class Encoder:
    """Status → compact int key, interning each worker's tuple as a small integer.

    Live and terminal statuses are keyed differently. A live status keeps everything a decision
    of ``step`` or of the environment reads. A terminal status has no future: only what the
    state invariants and the canonical dump read is kept (phases, finished, retries, restarting,
    seqs, recoverCount, shouldQuit), so the many Failed statuses that differ only in flap
    counters, exit codes or hang marks are one state. Live and terminal tuples have different
    lengths, so their codes never collide.
    """

    def __init__(self, *, symmetry: bool, exact: bool = True) -> None:
        self.symmetry = symmetry
        self.exact = exact
        self._pods: dict[tuple[object, ...], int] = {}
        self._heads: dict[tuple[object, ...], int] = {}

    def pod_code(self, pod: PodInfo, seq: int) -> int:
        t = (pod.phase._value_, pod.finished, pod.retries, pod.restarting,
             pod.incarnation is None, pod.seq if self.exact else -1,
             pod.finish_seq == seq, pod.error_seq == seq, pod.flaps, pod.hanging,
             pod.exit_code)
        return self._intern(t)

    def _intern(self, t: tuple[object, ...]) -> int:
        code = self._pods.get(t)
        if code is None:
            code = self._pods[t] = len(self._pods)
            if code >= 1 << _POD_BITS:
                raise StateLimitExceeded("more than 16M distinct worker states")
        return code

    def key(self, status: Status, codes: Sequence[int]) -> int:
        """The key of a live status from its workers' ``codes`` (see ``codes``)."""
        h = (status.phase._value_, status.seq, status.recover_count, status.should_quit,
             status.ran, status.checkpoint_step)
        return self._join(h, codes)

    def _join(self, h: tuple[object, ...], codes: Sequence[int]) -> int:
        k = self._heads.get(h)
        if k is None:
            k = self._heads[h] = len(self._heads)
        for c in sorted(codes) if self.symmetry else codes:
            k = (k << _POD_BITS) | c
        return k

    def terminal_key(self, status: Status) -> int:
        h = (status.phase._value_, status.seq, status.recover_count, status.should_quit)
        exact = self.exact
        return self._join(h, [self._intern((p.phase._value_, p.finished, p.retries,
                                            p.restarting, p.seq if exact else -1))
                              for p in status.workers])

    def codes(self, status: Status) -> list[int]:
        seq = status.seq
        return [self.pod_code(p, seq) for p in status.workers]

    def encode(self, status: Status) -> int:
        if status.phase in TERMINAL_PHASES:
            return self.terminal_key(status)
        return self.key(status, self.codes(status))


@dataclass
class Exploration:
    """What one exploration found. State ids are BFS order: 0 is the initial status."""

    config: Config
    states: int = 0
    transitions: int = 0  # step() calls, i.e. explored edges (cut ones included)
    max_depth: int = 0
    cut_edges: int = 0  # edges to live states beyond the seq bound (not explored)
    seconds: float = 0.0  # wall clock
    cpu_seconds: float = 0.0  # this process's CPU time (steadier on a shared machine)
    exceeded: bool = False
    keys: list[int] = field(default_factory=list)
    parent: array[int] = field(default_factory=lambda: array("i"))
    depth: array[int] = field(default_factory=lambda: array("i"))
    terminal: bytearray = field(default_factory=bytearray)
    expanded: bytearray = field(default_factory=bytearray)  # 0: violates an invariant
    has_cut: bytearray = field(default_factory=bytearray)
    has_progress: bytearray = field(default_factory=bytearray)  # a non-Stop, non-loop edge
    # progress edges (no Stop, no self-loop, no cut), deduplicated per source
    edge_src: array[int] = field(default_factory=lambda: array("i"))
    edge_dst: array[int] = field(default_factory=lambda: array("i"))
    # the NoEndlessRecovery subgraph: recovery → recovery, state changes, no retries grow
    rec_src: array[int] = field(default_factory=lambda: array("i"))
    rec_dst: array[int] = field(default_factory=lambda: array("i"))
    # first violation of each invariant: state id / (source id, event) for transitions
    state_violations: dict[str, int] = field(default_factory=dict)
    edge_violations: dict[str, tuple[int, Kind, Event]] = field(default_factory=dict)
    canonical_states: set[str] | None = None
    encoder: Encoder = field(default_factory=lambda: Encoder(symmetry=False))


def explore(
    config: Config,
    *,
    invariants: Sequence[StateCheck] = (),
    transition_invariants: Sequence[EdgeCheck] = (),
    every_successor: Sequence[StateCheck] = (),
    dump: bool = False,
    project: Callable[[Status], str] | None = None,
) -> Exploration:
    """Explore every state reachable from ``config.initial()``; see the module docstring.

    A state that violates an invariant is recorded and not expanded. Live states whose master
    seq exceeds ``config.seq_bound`` are not entered (cut edges); terminal states always are.
    Unless ``config.exact`` (or ``dump``), the key drops each worker's reported seq: the
    ``every_successor`` invariants, which read it, are then checked on every successor status
    ``step`` returns, not only on the first status of each key; a violation is reported as a
    transition (the state before and the event).
    """
    if dump and config.symmetry:
        raise ValueError("a state dump needs every concrete state: turn symmetry off")
    to_line = project if project is not None else canonical
    start, cpu = time.perf_counter(), time.process_time()
    ex = Exploration(config=config)
    exact = config.exact or dump
    enc = ex.encoder = Encoder(symmetry=config.symmetry, exact=exact)
    seq_checks = () if exact else tuple(every_successor)
    ml, bound = config.message_layer, config.seq_bound
    if dump:
        ex.canonical_states = set()
    index: dict[int, int] = {}
    frontier: deque[tuple[Status, int]] = deque()

    def add(status: Status, key: int, parent: int) -> int:
        sid = len(ex.keys)
        index[key] = sid
        ex.keys.append(key)
        ex.parent.append(parent)
        d = ex.depth[parent] + 1 if parent >= 0 else 0
        ex.depth.append(d)
        ex.max_depth = max(ex.max_depth, d)
        term = status.phase.terminal
        ex.terminal.append(term)
        ex.has_cut.append(0)
        ex.has_progress.append(0)
        ok = True
        for name, check in invariants:
            if not check(status):
                ok = False
                ex.state_violations.setdefault(name, sid)
        ex.expanded.append(ok and not term)
        if ex.canonical_states is not None:
            ex.canonical_states.add(to_line(status))
        if ok and not term:
            frontier.append((status, sid))
        if sid + 1 > config.max_states:
            raise StateLimitExceeded(f"more than {config.max_states} states")
        return sid

    s0 = config.initial()
    try:
        add(s0, enc.encode(s0), -1)
        while frontier:
            status, sid = frontier.popleft()
            _expand(ex, enc, index, add, status, sid, ml, bound, transition_invariants,
                    seq_checks)
    except StateLimitExceeded:
        ex.exceeded = True
    ex.states = len(ex.keys)
    ex.seconds = time.perf_counter() - start
    ex.cpu_seconds = time.process_time() - cpu
    return ex


def _expand(
    ex: Exploration,
    enc: Encoder,
    index: dict[int, int],
    add: Callable[[Status, int, int], int],
    status: Status,
    sid: int,
    ml: bool,
    bound: int,
    transition_invariants: Sequence[EdgeCheck],
    seq_checks: Sequence[StateCheck],
) -> None:
    """Apply every environment event to ``status`` (state ``sid``) and record the edges."""
    seq, pods = status.seq, status.workers
    codes = enc.codes(status)
    own_key = ex.keys[sid]
    retries = status.retries
    in_recovery = status.phase in _RECOVERY_PHASES
    checks = [(n, c) for n, c in transition_invariants if n not in ex.edge_violations]
    succ: set[int] = set()
    rec: set[int] = set()
    evs = events(status, message_layer=ml)
    ex.transitions += len(evs)
    for kind, event in evs:
        new, effects = step(status, event)
        for name, check in checks:
            if not check(kind, event, status, new, effects):
                ex.edge_violations.setdefault(name, (sid, kind, event))
        if new is status:
            continue
        for name, inv in seq_checks:
            if not inv(new) and name not in ex.edge_violations:
                ex.edge_violations[name] = (sid, kind, event)
        term = new.phase in TERMINAL_PHASES
        if term:
            key = enc.terminal_key(new)
        else:
            if new.seq == seq:
                ncodes = [c if p is q else enc.pod_code(p, seq)
                          for p, q, c in zip(new.workers, pods, codes, strict=True)]
            else:
                ncodes = enc.codes(new)
            key = enc.key(new, ncodes)
            if key == own_key:
                continue
        if not term and new.seq > bound:
            ex.cut_edges += 1
            ex.has_cut[sid] = 1
            continue
        nid = index.get(key)
        if nid is None:
            nid = add(new, key, sid)
        if kind is Kind.STOP:
            continue
        succ.add(nid)
        if (in_recovery and not term and new.phase in _RECOVERY_PHASES
                and all(map(le, new.retries, retries))):
            rec.add(nid)
    if succ:
        ex.has_progress[sid] = 1
        for nid in succ:
            ex.edge_src.append(sid)
            ex.edge_dst.append(nid)
        for nid in rec:
            ex.rec_src.append(sid)
            ex.rec_dst.append(nid)


@dataclass(frozen=True)
class TraceStep:
    """One row of a counterexample: the event (None for the initial state) and the result."""

    index: int
    kind: Kind | None
    event: Event | None
    status: Status


def path_to(ex: Exploration, sid: int) -> list[int]:
    """State ids from the initial state to ``sid`` along BFS parents (a shortest path)."""
    path = [sid]
    while ex.parent[path[-1]] >= 0:
        path.append(ex.parent[path[-1]])
    return path[::-1]


def trace(ex: Exploration, ids: Sequence[int],
          last: tuple[Kind, Event] | None = None) -> list[TraceStep]:
    """Replay ``step`` along state ids (a path from state 0), then ``last`` if given.

    Each hop takes the first environment event whose result has the next id's key, so the trace
    is concrete even under symmetry reduction (where ids name classes of states).
    """
    cfg, enc = ex.config, ex.encoder
    cur = cfg.initial()
    out = [TraceStep(0, None, None, cur)]
    for target in ids[1:]:
        want = ex.keys[target]
        for kind, event in events(cur, message_layer=cfg.message_layer):
            new, _ = step(cur, event)
            if enc.encode(new) == want:
                cur = new
                out.append(TraceStep(len(out), kind, event, cur))
                break
        else:  # pragma: no cover - the graph came from these very events
            raise AssertionError(f"cannot replay the edge to state {target}")
    if last is not None:
        kind, event = last
        out.append(TraceStep(len(out), kind, event, step(cur, event)[0]))
    return out


def _b(flag: bool) -> str:
    return "TRUE" if flag else "FALSE"


def canonical(status: Status) -> str:
    """One line over the variables a TLA+ spec shares with the machine, in TLA+ syntax.

    phase, shouldQuit, recoverCount, the master's seq, then per worker (by rank) the inner
    phase, finished, retries and the worker's seq.
    """
    pods = status.workers
    return (
        f"phase={status.phase.value} shouldQuit={_b(status.should_quit)} "
        f"recoverCount={status.recover_count} seq={status.seq} "
        f"inner=<<{','.join(p.phase.value for p in pods)}>> "
        f"finished=<<{','.join(_b(p.finished) for p in pods)}>> "
        f"retries=<<{','.join(str(p.retries) for p in pods)}>> "
        f"wseq=<<{','.join(str(p.seq) for p in pods)}>>"
    )


def dump_lines(ex: Exploration) -> list[str]:
    """The sorted, unique canonical lines of every reachable state (``explore(dump=True)``)."""
    if ex.canonical_states is None:
        raise ValueError("this exploration kept no canonical states: run it with dump=True")
    return sorted(ex.canonical_states)
