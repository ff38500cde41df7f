"""Breadth-first explicit-state exploration of the real ``aegis_flow.master.machine.step``.

PURE computation: no I/O, no clock reads except ``time.perf_counter`` for the reported duration.
``explore(config)`` returns an ``Exploration``: the number of states, the edges the liveness
checks need (as flat integer arrays), the first violation of every state and transition
invariant, and parent pointers from which ``trace`` rebuilds a shortest counterexample by
replaying ``step`` from the initial status.

The visited set is keyed by a COMPACT encoding of each status: every worker becomes a small
interned integer, and the status one Python int. The key keeps every field a decision of the
machine, of its policy (``master/policy.py``) or of the environment reads, and drops only what
none of them reads (sound, see docs/verification.md):

* ``last_reason`` (written, and copied into the text of a charge, never tested),
  ``updated``/``pod_ip``/``node`` and the status's ``sent_at`` (constant here: ``now`` is 0);
* ``finish_seq``/``error_seq`` become "equals the master's seq" and "equals ``run_seq``": a
  Finish/Error whose seq is neither is rejected as stale or future before dedup looks at them
  (the one exception to "stale", late evidence of B2, answers exactly ``run_seq``), the
  environment offers late evidence only to a rank whose results do not answer ``run_seq``, and
  the master's seq never decreases (MasterSeqNumMonotonic and StaleFinishRejected check both);
* ``run_seq`` itself, and the "equals ``run_seq``" bits, only while a suspect is pending
  (``blame >= 0``): nothing else reads them, a suspect is named only in RunCommand, and entering
  RunCommand overwrites ``run_seq`` with the new seq (newer than every result) — without a
  suspect their values are dead until overwritten (``Encoder.key``);
* each worker's last reported seq unless ``exact`` (read only to choose re-sends, effects; and
  by WorkerSeqNumBound, which is then checked on every successor: see ``explore``);
* ``error_nodes`` and ``stop_reason``: the quarantine set is written by T3/T10 and read by no
  decision of ``step`` (only the runtime acts on its Quarantine effect), and ``stop_reason`` is
  set only on the way into Failed;
* ``checkpoint_step``: written by CheckpointDone and read by no decision of ``step`` (T13e
  evicts on the event, not on the value; the runtime and the display read it);
* ``blame`` and ``culprit`` (ranks) become a bit of the worker they name, so that symmetry can
  permute workers without losing who is suspected or charged;
* a terminal status keeps only what the invariants and the dump read (see ``Encoder``).

Everything else is kept as it is: per worker its phase, finished, retries, restarting, whether
it acked, flaps, hang marks (``hanging``, ``waiting``), the exit it was told to make, failures,
the open cause (code and class) and the signature; per status phase, seq, recoverCount,
shouldQuit, ran, ``replaced``, ``plan``, ``epoch`` and the policy's settings.
``tests/test_verify.py`` shows on concrete runs that each dropped field merges exactly the
states it should (same verdicts, and the finer exploration re-keyed gives the coarser one).

With ``symmetry`` the key also forgets which worker is which (the per-worker codes are sorted) and
which incarnation name a worker carries ("0"/"1" are compared only for equality), keeping only
whether it has acked. That is exact as long as ``step`` treats ranks alike; its one rank-order
tie-break (T14: of two ranks marked hung, the lower is charged) separates no permutations within
the bounds ``tests/test_verify.py`` checks (docs/verification.md). Statuses are kept only for the
frontier.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aegis_flow.master.machine import (
    TERMINAL_PHASES,
    Ack,
    CauseClass,
    Effect,
    Event,
    ExitCode,
    ExitWorker,
    Finish,
    Phase,
    PodInfo,
    Status,
    evolve,
    initial_status,
    step,
)

from .environment import COOPERATIVE, SYMPTOM_CODES, Kind, events, other_incarnation

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
    """One model: the job's size, the policy's settings and how much of the environment to
    model."""

    workers: int = 3
    max_retry: int = 2
    flap_limit: int = 3
    message_layer: bool = False
    seq_bound: int = 4
    symmetry: bool = False
    exact: bool = False  # keep every worker's reported seq in the key (what a dump needs)
    max_states: int = 5_000_000
    resume: bool = True  # offer the operator's resume (T8r) in every live phase but Pending
    # the recovery policy's settings (``initial_status``; their defaults)
    give_up_on_repeat: bool = True
    l2_after: int = 2
    l3_after: int = 3
    collective_after: int = 2

    def initial(self) -> Status:
        nodes = tuple(f"n{r}" for r in range(self.workers))
        return initial_status(self.workers, self.max_retry, flap_limit=self.flap_limit,
                              nodes=nodes, give_up_on_repeat=self.give_up_on_repeat,
                              l2_after=self.l2_after, l3_after=self.l3_after,
                              collective_after=self.collective_after)


class Encoder:
    """Status → compact int key, interning each worker's tuple as a small integer.

    Live and terminal statuses are keyed differently. A live status keeps everything a decision
    of ``step`` (its policy included) or of the environment reads. A terminal status has no
    future: only what the state invariants and the canonical dump read is kept (phases,
    finished, retries, restarting, seqs, recoverCount, shouldQuit; with ``exact``, for the
    dump, every variable of ``canonical``), so the many Failed statuses that differ only in flap
    counters, exit codes, hang marks or failure history are one state. Live and terminal tuples have
    different lengths, so their codes never collide.
    """

    def __init__(self, *, symmetry: bool, exact: bool = True) -> None:
        self.symmetry = symmetry
        self.exact = exact
        self._pods: dict[tuple[object, ...], int] = {}
        self._heads: dict[tuple[object, ...], int] = {}

    def pod_code(self, pod: PodInfo, status: Status) -> int:
        seq, blame = status.seq, status.blame
        fs, es, r = pod.finish_seq, pod.error_seq, pod.rank
        # answers the last run order: read only while a suspect is pending (see ``key``)
        run = status.run_seq if blame >= 0 else -2
        t = (pod.phase._value_, pod.finished, pod.retries, pod.restarting,
             pod.incarnation is None, pod.seq if self.exact else -1,
             fs == seq, fs == run, es == seq, es == run, pod.flaps, pod.hanging, pod.waiting,
             pod.exit_code, pod.failures, pod.cause, pod.cause_class, pod.signature,
             r == blame, r == status.culprit, pod.shared if fs == seq else "", pod.slow)
        return self._intern(t)

    def mark(self, code: int) -> int:
        """The code of a worker ``code`` that carries a mark (NoEndlessReplacement's tracked
        rank): a distinct code, so the mark survives the sorting of symmetry."""
        return self._intern(("marked", code))

    def _intern(self, t: tuple[object, ...]) -> int:
        code = self._pods.get(t)
        if code is None:
            code = self._pods[t] = len(self._pods)
            if code >= 1 << _POD_BITS:
                raise StateLimitExceeded("more than 16M distinct worker states")
        return code

    def key(self, status: Status, codes: Sequence[int]) -> int:
        """The key of a live status from its workers' ``codes`` (see ``codes``).

        ``run_seq`` (and whether a worker's results answer it) is kept only while a suspect is
        pending: it is read only then (late evidence, B2), a suspect is named only in
        RunCommand, and entering RunCommand overwrites ``run_seq`` with the new seq, newer than
        every result: without a suspect its value is dead until it is overwritten.
        ``checkpoint_step`` is left out: no decision reads it (only the runtime and the
        display do), so statuses that differ in it alone behave alike."""
        s = status
        h = (s.phase._value_, s.seq, s.recover_count, s.should_quit, s.ran,
             s.run_seq if s.blame >= 0 else -2, s.replaced, s.plan, s.epoch,
             s.give_up_on_repeat, s.l2_after, s.l3_after, s.collective_after, s.rdzv_addr,
             s.rdzv_base, s.outage)
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
        if not self.exact:
            return self._join(h, [self._intern((p.phase._value_, p.finished, p.retries,
                                                p.restarting)) for p in status.workers])
        blame, culprit = status.blame, status.culprit
        return self._join(h, [self._intern((p.phase._value_, p.finished, p.retries,
                                            p.restarting, p.seq, p.exit_code, p.flaps,
                                            p.hanging, p.waiting, p.failures, p.cause,
                                            p.cause_class, p.signature, p.rank == blame,
                                            p.rank == culprit, p.slow))
                              for p in status.workers])

    def codes(self, status: Status) -> list[int]:
        return [self.pod_code(p, status) for p in status.workers]

    def encode(self, status: Status) -> int:
        if status.phase in TERMINAL_PHASES:
            return self.terminal_key(status)
        return self.key(status, self.codes(status))


@dataclass(frozen=True)
class Replacement:
    """A policy-ordered replacement (NoEndlessReplacement's seed): from state ``src`` the
    cooperative event ``event`` (a passing Finish of ``rank``) made the machine tell ``rank`` to
    exit; ``status`` is the status it led to."""

    src: int
    kind: Kind
    event: Event
    rank: int
    status: Status


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
    running: bytearray = field(default_factory=bytearray)  # phase RunCommand
    failed: bytearray = field(default_factory=bytearray)  # phase Failed
    expanded: bytearray = field(default_factory=bytearray)  # 0: violates an invariant
    has_cut: bytearray = field(default_factory=bytearray)
    has_progress: bytearray = field(default_factory=bytearray)  # a non-Stop, non-loop edge
    # progress edges (no Stop, no self-loop, no cut), deduplicated per source
    edge_src: array[int] = field(default_factory=lambda: array("i"))
    edge_dst: array[int] = field(default_factory=lambda: array("i"))
    # the NoEndlessRecovery subgraph: recovery → recovery, state changes, no retries grow
    rec_src: array[int] = field(default_factory=lambda: array("i"))
    rec_dst: array[int] = field(default_factory=lambda: array("i"))
    # FlakyRankRecovers' start states: right after a counted failure (``flaky_start``), one
    # status per state id
    flaky_starts: list[tuple[int, Status]] = field(default_factory=list)
    # NoEndlessReplacement's seeds: one per distinct (status, replaced rank) class
    replacements: list[Replacement] = field(default_factory=list)
    # first violation of each invariant: state id / (source id, event) for transitions
    state_violations: dict[str, int] = field(default_factory=dict)
    edge_violations: dict[str, tuple[int, Kind, Event, Status]] = field(default_factory=dict)
    canonical_states: set[str] | None = None
    encoder: Encoder = field(default_factory=lambda: Encoder(symmetry=False))
    closure: object | None = None  # properties.cooperative_closure's result, once computed


def flaky_start(old: Status, new: Status) -> bool:
    """Whether ``new``, reached from ``old``, is a start of FlakyRankRecovers: live, not
    running, a counted failure just happened (some rank's retries grew) and no rank with an open
    failure has spent its flap allowance (each may still be replaced once uncounted: the policy
    needs at most one replacement per rank to answer its failure)."""
    if new.phase in TERMINAL_PHASES or new.phase is Phase.RUNCOMMAND:
        return False
    if not any(p.retries > q.retries for p, q in zip(new.workers, old.workers, strict=True)):
        return False
    return all(p.flaps < new.flap_limit for p in new.workers if p.cause)


def policy_replacement(event: Event, effects: Sequence[Effect]) -> int | None:
    """The rank a passing Finish made the machine replace (its ExitWorker), else None."""
    if not isinstance(event, Finish) or not event.ok:
        return None
    for e in effects:
        if isinstance(e, ExitWorker) and e.rank == event.rank:
            return e.rank
    return None


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
        phase = status.phase
        term = phase.terminal
        ex.terminal.append(term)
        ex.running.append(phase is Phase.RUNCOMMAND)
        ex.failed.append(phase is Phase.FAILED)
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
    ctx = _Context(ex, enc, index, add, config, transition_invariants, seq_checks)
    try:
        add(s0, enc.encode(s0), -1)
        while frontier:
            status, sid = frontier.popleft()
            _expand(ctx, status, sid)
    except StateLimitExceeded:
        ex.exceeded = True
    ex.states = len(ex.keys)
    ex.seconds = time.perf_counter() - start
    ex.cpu_seconds = time.process_time() - cpu
    return ex


@dataclass
class _Context:
    ex: Exploration
    enc: Encoder
    index: dict[int, int]
    add: Callable[[Status, int, int], int]
    config: Config
    transition_invariants: Sequence[EdgeCheck]
    seq_checks: Sequence[StateCheck]
    seeds: set[int] = field(default_factory=set)  # marked keys of the replacement seeds
    starts: set[int] = field(default_factory=set)  # state ids of the flaky starts


#: edges that are the world's or an operator's doing, not the job's progress: explored (their
#: targets are states like any other) but not counted by the liveness properties
_NOT_PROGRESS = frozenset({Kind.STOP, Kind.RESUME, Kind.OUTAGE})


def _expand(ctx: _Context, status: Status, sid: int) -> None:
    """Apply every environment event to ``status`` (state ``sid``) and record the edges."""
    ex, enc, index, add = ctx.ex, ctx.enc, ctx.index, ctx.add
    bound = ctx.config.seq_bound
    seq, run, blame, culprit, pods = (status.seq, status.run_seq, status.blame, status.culprit,
                                      status.workers)
    codes = enc.codes(status)
    own_key = ex.keys[sid]
    retries = status.retries
    in_recovery = status.phase in _RECOVERY_PHASES
    coop_source = status.phase is not Phase.RUNCOMMAND
    checks = [(n, c) for n, c in ctx.transition_invariants if n not in ex.edge_violations]
    succ: set[int] = set()
    rec: set[int] = set()
    evs = events(status, message_layer=ctx.config.message_layer, resume=ctx.config.resume)
    ex.transitions += len(evs)
    for kind, event in evs:
        new, effects = step(status, event)
        for name, check in checks:
            if not check(kind, event, status, new, effects):
                ex.edge_violations.setdefault(name, (sid, kind, event, status))
        if new is status:
            continue
        for name, inv in ctx.seq_checks:
            if not inv(new) and name not in ex.edge_violations:
                ex.edge_violations[name] = (sid, kind, event, status)
        if coop_source and kind in COOPERATIVE:
            rank = policy_replacement(event, effects)
            if rank is not None:
                _seed(ctx, sid, kind, event, rank, new)
        term = new.phase in TERMINAL_PHASES
        if term:
            key = enc.terminal_key(new)
        else:
            if (new.seq == seq and new.run_seq == run and new.blame == blame
                    and new.culprit == culprit):
                ncodes = [c if p is q else enc.pod_code(p, new)
                          for p, q, c in zip(new.workers, pods, codes, strict=True)]
            else:
                ncodes = enc.codes(new)
            key = enc.key(new, ncodes)
            if key == own_key:
                continue
        if not term and new.seq > bound:
            if kind not in _NOT_PROGRESS:
                ex.cut_edges += 1
                ex.has_cut[sid] = 1
            continue
        nid = index.get(key)
        if nid is None:
            nid = add(new, key, sid)
        if kind in _NOT_PROGRESS:
            continue
        succ.add(nid)
        if not term:
            nret = new.retries
            if nret != retries:
                if nid not in ctx.starts and flaky_start(status, new):
                    ctx.starts.add(nid)
                    ex.flaky_starts.append((nid, new))
            elif in_recovery and new.phase in _RECOVERY_PHASES and not (
                    kind in (Kind.OUTAGE, Kind.RESUME) or new.outage != status.outage):
                # a flapping control plane or an operator's resume is the world's doing, like
                # Stop: not a recovery that fails to progress (Outage/ResumeCountsNothing)
                rec.add(nid)
    if succ:
        ex.has_progress[sid] = 1
        for nid in succ:
            ex.edge_src.append(sid)
            ex.edge_dst.append(nid)
        for nid in rec:
            ex.rec_src.append(sid)
            ex.rec_dst.append(nid)


def marked_key(enc: Encoder, status: Status, rank: int) -> int:
    """The key of ``status`` with worker ``rank`` marked (symmetry keeps the mark on it)."""
    if status.phase in TERMINAL_PHASES:
        return -1
    codes = enc.codes(status)
    codes[rank] = enc.mark(codes[rank])
    return enc.key(status, codes)


def _seed(ctx: _Context, sid: int, kind: Kind, event: Event, rank: int, new: Status) -> None:
    """Record a policy-ordered replacement once per (status class, replaced rank), wherever
    it leads (NoEndlessReplacement follows it beyond the seq bound)."""
    if new.phase in TERMINAL_PHASES:
        return  # the job is over
    key = marked_key(ctx.enc, new, rank)
    if key not in ctx.seeds:
        ctx.seeds.add(key)
        ctx.ex.replacements.append(Replacement(sid, kind, event, rank, new))


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
          last: tuple[Kind, Event] | tuple[Kind, Event, Status] | None = None,
          ) -> list[TraceStep]:
    """Replay ``step`` along state ids (a path from state 0), then ``last`` if given.

    Each hop takes the first environment event whose result has the next id's key, so the trace
    is concrete even under symmetry reduction (where ids name classes of states).
    ``last`` is (kind, event) or (kind, event, the status it was applied to during the
    exploration): with that status, under symmetry, the event is renamed onto the replayed
    status's ranks.
    """
    cfg, enc = ex.config, ex.encoder
    cur = cfg.initial()
    out = [TraceStep(0, None, None, cur)]
    for target in ids[1:]:
        want = ex.keys[target]
        for kind, event in events(cur, message_layer=cfg.message_layer, resume=cfg.resume):
            new, _ = step(cur, event)
            if enc.encode(new) == want:
                cur = new
                out.append(TraceStep(len(out), kind, event, cur))
                break
        else:  # pragma: no cover - the graph came from these very events
            raise AssertionError(f"cannot replay the edge to state {target}")
    if last is not None:
        kind, event = last[0], last[1]
        if len(last) == 3 and enc.symmetry:
            event = rename(enc, last[2], cur, event)
        out.append(TraceStep(len(out), kind, event, step(cur, event)[0]))
    return out


def rank_map(enc: Encoder, source: Status, target: Status) -> list[int]:
    """A renaming of ranks (source rank → target rank) under which two statuses with the same
    key have the same workers: equal worker codes matched in rank order."""
    free: dict[int, list[int]] = {}
    for p in target.workers:
        free.setdefault(enc.pod_code(p, target), []).append(p.rank)
    return [free[enc.pod_code(p, source)].pop(0) for p in source.workers]


def rename(enc: Encoder, source: Status, target: Status, event: Event) -> Event:
    """``event``, that applied to ``source``, renamed onto the ranks of ``target``."""
    rank = getattr(event, "rank", None)
    if rank is None or source == target:
        return event
    to = rank_map(enc, source, target)[rank]
    if isinstance(event, Ack):  # incarnations by meaning: the same pod, or the other one
        same = event.incarnation == source.workers[rank].incarnation
        mine = target.workers[to].incarnation
        return evolve(event, rank=to, incarnation=mine if same and mine is not None
                      else other_incarnation(mine))
    return evolve(event, rank=to)


def extend(steps: list[TraceStep], kind: Kind, event: Event) -> Status:
    """Append one concrete step to a trace; returns the new status."""
    new, _ = step(steps[-1].status, event)
    steps.append(TraceStep(len(steps), kind, event, new))
    return new


def _b(flag: bool) -> str:
    return "TRUE" if flag else "FALSE"


#: the exit a worker was told to make, as the spec names it
EXITS = {None: "none", ExitCode.NODE_FAULT: "node-fault",
         ExitCode.CONTAINER_RESTART: "container-restart",
         ExitCode.SLOW_NODE_EVICTED: "slow-evicted"}


def cause_kind(pod: PodInfo) -> str:
    """A worker's open cause as the policy tells causes apart (``policy.judge``) and the TLA+
    spec models it (``CauseKinds``): none, hardware, container (by class), hang, symptom (a peer
    symptom code), else error (an unknown cause, a lost or replaced pod, a failed check's
    text: transient, escalated by repetition)."""
    if not pod.cause:
        return "none"
    if pod.cause_class is CauseClass.HARDWARE:
        return "hardware"
    if pod.cause_class is CauseClass.CONTAINER:
        return "container"
    if pod.cause == "hang":  # policy.HANG_CAUSE
        return "hang"
    return "symptom" if pod.cause in SYMPTOM_CODES else "error"


def canonical(status: Status) -> str:
    """One line over the variables a TLA+ spec shares with the machine, in TLA+ syntax.

    phase, shouldQuit, recoverCount, the master's seq, then per worker (by rank) the inner
    phase, finished, retries, the worker's seq, whether it is being replaced, the exit it was
    told to make, its flap counter and hang marks; then the recovery policy's: per worker its
    failures on its node, the kind of its open cause (``cause_kind``) and whether its last
    charged failure had a signature; the suspect and the culprit (ranks, -1 for none).
    """
    pods = status.workers
    return (
        f"phase={status.phase.value} shouldQuit={_b(status.should_quit)} "
        f"recoverCount={status.recover_count} seq={status.seq} "
        f"inner=<<{','.join(p.phase.value for p in pods)}>> "
        f"finished=<<{','.join(_b(p.finished) for p in pods)}>> "
        f"retries=<<{','.join(str(p.retries) for p in pods)}>> "
        f"wseq=<<{','.join(str(p.seq) for p in pods)}>> "
        f"restarting=<<{','.join(_b(p.restarting) for p in pods)}>> "
        f"exit=<<{','.join(EXITS[p.exit_code] for p in pods)}>> "
        f"flaps=<<{','.join(str(p.flaps) for p in pods)}>> "
        f"hanging=<<{','.join(_b(p.hanging) for p in pods)}>> "
        f"waiting=<<{','.join(_b(p.waiting) for p in pods)}>> "
        f"failures=<<{','.join(str(p.failures) for p in pods)}>> "
        f"cause=<<{','.join(cause_kind(p) for p in pods)}>> "
        f"sig=<<{','.join(_b(bool(p.signature)) for p in pods)}>> "
        f"slow=<<{','.join(_b(p.slow) for p in pods)}>> "
        f"blame={status.blame} culprit={status.culprit}"
    )


def dump_lines(ex: Exploration) -> list[str]:
    """The sorted, unique canonical lines of every reachable state (``explore(dump=True)``)."""
    if ex.canonical_states is None:
        raise ValueError("this exploration kept no canonical states: run it with dump=True")
    return sorted(ex.canonical_states)
