"""Property tests: random event sequences through ``step``; DESIGN.md §2's invariants after
every step.

Sequences are built statefully: each next event is drawn from the *current* status (ranks in
range, seqs near the current one, the worker's own incarnation or a new one), so that they reach
deep phases (Troubleshooting after a replacement, T9, T11) instead of bouncing off as stale.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aegis_flow.master import model
from aegis_flow.master.machine import (
    LIVE_PHASES,
    TERMINAL_PHASES,
    Ack,
    Broadcast,
    CheckpointDone,
    ConnectTimeout,
    Effect,
    Error,
    Event,
    ExitWorker,
    FaultClass,
    Finish,
    Hang,
    HangWithQuit,
    Log,
    Lost,
    Persist,
    Phase,
    Status,
    Stop,
    initial_status,
    step,
)

MAX_EVENTS = 60

# Event kinds, repeated to weight the draw towards progress (Finish ok, Ack) and away from the
# ends (Stop, ConnectTimeout) that would cut most sequences short. Index 0 is what hypothesis
# shrinks towards: a harmless heartbeat.
KINDS: tuple[str, ...] = (
    ("ack",) * 10 + ("ack-new",) * 3 + ("finish-ok",) * 18 + ("finish-not-ok",) * 2
    + ("error",) * 3 + ("lost",) * 3 + ("hang",) * 2 + ("hang-with-quit",) * 2
    + ("checkpoint", "connect-timeout", "stop")
)
FAULTS: tuple[FaultClass | None, ...] = (
    FaultClass.HARDWARE, FaultClass.CONTAINER, FaultClass.TRANSIENT, FaultClass.SLOW, None,
)
RANKS, SEQS, AUX = 4, 7, 5
# One integer per event, decoded as (kind, rank, seq choice, detail choice): each an index taken
# modulo the options that the current status offers. One small draw per event keeps hypothesis
# fast enough to run hundreds of 60-event sequences in a few seconds.
CHOICE = st.integers(0, len(KINDS) * RANKS * SEQS * AUX - 1)


def _candidates(status: Status, kind: str) -> list[int]:
    """The ranks an event of ``kind`` is most useful from (all ranks when none is)."""
    pods = status.workers
    if kind in ("ack", "ack-new") and status.phase is Phase.PENDING:
        useful = [p.rank for p in pods if p.incarnation is None]
    elif kind in ("ack", "ack-new"):
        useful = [p.rank for p in pods if p.restarting]
    elif kind == "lost":
        useful = []
    else:
        useful = [p.rank for p in pods if not p.finished and not p.restarting]
    return useful or [p.rank for p in pods]


class EventMaker:
    """Turns a draw into the next event for the current status; remembers each rank's pod
    generation so that "the same incarnation" and "a new incarnation" both occur."""

    def __init__(self) -> None:
        self.generation: dict[int, int] = {}

    def incarnation(self, rank: int, *, new: bool) -> str:
        if new:
            self.generation[rank] = self.generation.get(rank, 0) + 1
        return f"pod-{rank}-g{self.generation.get(rank, 0)}"

    def __call__(self, status: Status, draw: int) -> Event:
        draw, kind_i = divmod(draw, len(KINDS))
        draw, rank_i = divmod(draw, RANKS)
        aux, seq_i = divmod(draw, SEQS)
        kind = KINDS[kind_i]
        ranks = _candidates(status, kind)
        rank = ranks[rank_i % len(ranks)]
        pod = status.worker(rank)
        # Seqs near the current one: current (weighted), one behind, one ahead, the worker's
        # last finish seq and the last seq it reported.
        near = [status.seq, status.seq, status.seq, status.seq - 1, status.seq + 1,
                pod.finish_seq, pod.seq]
        seq = max(0, near[seq_i % len(near)])
        if kind == "ack":
            return Ack(rank, self.incarnation(rank, new=False), seq=seq)
        if kind == "ack-new":
            return Ack(rank, self.incarnation(rank, new=True), seq=0 if aux % 2 else seq,
                       node=f"node-{rank}-{self.generation[rank]}")
        if kind == "finish-ok":
            return Finish(rank, seq, True)
        if kind == "finish-not-ok":  # one in five a failed check of shared storage (T3j)
            shared = "io /shared 28" if aux % len(FAULTS) == 4 else ""
            return Finish(rank, seq, False, fault=FAULTS[aux % len(FAULTS)], shared=shared)
        if kind == "error":
            return Error(rank, seq)
        if kind == "lost":
            return Lost(rank)
        if kind == "hang":
            return Hang(rank, seq)
        if kind == "hang-with-quit":
            return HangWithQuit(rank, seq)
        if kind == "checkpoint":
            return CheckpointDone(10 * aux)
        if kind == "connect-timeout":
            return ConnectTimeout()
        return Stop("operator")


class History:
    """What the invariants need to remember across steps (message-layer invariants)."""

    def __init__(self) -> None:
        self.processed: set[tuple[str, int, int]] = set()


def check_invariants(status: Status) -> None:
    """P0 of DESIGN.md §2 on one status."""
    assert status.phase in set(Phase)  # ValidPhase
    assert all(p.phase in set(Phase) for p in status.workers)  # ValidInnerPhase
    limit = status.max_retry + 1
    assert status.recover_count <= limit  # RecoverCountBound
    assert all(p.retries <= limit for p in status.workers)  # RetriesBound
    assert all(p.seq <= status.seq for p in status.workers)  # WorkerSeqNumBound
    assert all(p.retries >= 0 for p in status.workers)
    # the counts the core carries with the workers are what counting gives
    assert model.counts(status.workers) == (
        sum(p.incarnation is not None for p in status.workers),
        sum(p.finished for p in status.workers), sum(bool(p.shared) for p in status.workers))
    if status.phase in LIVE_PHASES:
        assert status.recover_count == max(status.retries)
        assert status.recover_count <= status.max_retry
        assert not status.should_quit
        if status.phase is not Phase.RESTARTING:  # PhaseConsistency
            for p in status.workers:
                if not p.finished and not p.restarting:
                    assert p.phase is status.phase, (p, status.phase)
        # A worker is awaited exactly while the job is Restarting.
        assert (status.phase is Phase.RESTARTING) == any(p.restarting for p in status.workers)
        assert all(p.restarting for p in status.workers if p.exit_code is not None)
    else:
        assert all(p.phase is status.phase for p in status.workers)
        assert not any(p.restarting for p in status.workers)
        assert status.should_quit == (status.phase is not Phase.INDEPENDENT)


def check_step(
    before: Status, event: Event, after: Status, effects: list[Effect], history: History
) -> None:
    """Invariants about one step: seq, Persist, ignoring, terminal states, dedup."""
    ignored = [e for e in effects if isinstance(e, Log) and e.ignored is not None]
    if ignored:
        assert after is before, "an ignored event returns the identical status"
        assert effects == ignored[:1]
    if before.phase in TERMINAL_PHASES:
        assert after is before, "once terminal, the status never changes"
    assert after.seq >= before.seq  # MasterSeqNumMonotonic
    broadcasts = [e for e in effects if isinstance(e, Broadcast)]
    if broadcasts:  # every broadcast bumps seq, and only a broadcast does
        assert len(broadcasts) == 1
        assert after.seq == before.seq + 1 == broadcasts[0].seq
    else:
        assert after.seq == before.seq
    assert all(e.seq == after.seq for e in effects if isinstance(e, ExitWorker))
    persists = [i for i, e in enumerate(effects) if isinstance(e, Persist)]
    if after != before:
        assert persists == [0], effects
    else:
        assert persists == [], effects
        assert after is before
    assert after.error_nodes >= before.error_nodes
    assert all(a.retries >= b.retries for a, b in zip(after.workers, before.workers, strict=True))
    if isinstance(event, (Finish, Error)):
        key = (type(event).__name__, event.rank, event.seq)
        if event.seq < before.seq:  # StaleFinishRejected
            assert ignored
        if key in history.processed:  # NoFinishDoubleProcessed
            assert ignored, f"{key} processed twice"
        if after is not before:
            history.processed.add(key)


def run_sequence(status: Status, draws: Iterable[int]) -> list[Phase]:
    """Apply one drawn event per draw, checking every invariant; returns the phases visited."""
    history = History()
    make_event = EventMaker()
    visited = [status.phase]
    check_invariants(status)
    for draw in draws:
        event = make_event(status, draw)
        after, effects = step(status, event)
        check_invariants(after)
        check_step(status, event, after, effects, history)
        status = after
        visited.append(status.phase)
    return visited


def _start(workers: int, max_retry: int, flap_limit: int) -> Status:
    return initial_status(workers, max_retry, flap_limit=flap_limit,
                          nodes=tuple(f"node-{r}" for r in range(workers)))


def _drawn(data: st.DataObject, length: int) -> Iterable[int]:
    """Draws made lazily, one per step: the sequence grows with the status it drives."""
    for _ in range(length):
        yield data.draw(CHOICE)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    workers=st.integers(1, 4),
    max_retry=st.integers(0, 3),
    flap_limit=st.integers(0, 3),
    length=st.integers(1, MAX_EVENTS),
)
def test_invariants_hold_after_every_step(
    data: st.DataObject, workers: int, max_retry: int, flap_limit: int, length: int
) -> None:
    run_sequence(_start(workers, max_retry, flap_limit), _drawn(data, length))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), max_retry=st.integers(0, 2), flap_limit=st.integers(0, 2))
def test_invariants_hold_from_running_jobs(
    data: st.DataObject, max_retry: int, flap_limit: int
) -> None:
    """Same invariants, starting from RunCommand, so every sequence begins deep in the table."""
    status = _start(3, max_retry, flap_limit)
    for rank in range(3):
        status, _ = step(status, Ack(rank, f"pod-{rank}-g0"))
    for rank in range(3):
        status, _ = step(status, Finish(rank, status.seq, True))
    assert status.phase is Phase.RUNCOMMAND
    run_sequence(status, _drawn(data, MAX_EVENTS))


def test_random_walks_reach_every_phase() -> None:
    """The event generator is good enough: seeded walks visit every phase, so the properties
    above do not only check Pending."""
    seen: set[Phase] = set()
    for seed in range(300):
        rng = random.Random(seed)
        status = _start(rng.randint(1, 4), rng.randint(0, 3), rng.randint(0, 3))
        draws = [rng.randrange(len(KINDS) * RANKS * SEQS * AUX) for _ in range(MAX_EVENTS)]
        seen.update(run_sequence(status, draws))
    assert seen == set(Phase)


def test_the_carried_counts_are_checked() -> None:
    """The check above catches counts that drifted from the pods (a planted wrong count), and
    a walk of shared-storage failures really reaches T3j's held and released states."""
    status = _start(3, 1, 1)
    for rank in range(3):
        status, _ = step(status, Ack(rank, f"pod-{rank}-g0"))
    status, _ = step(status, Finish(0, status.seq, False, shared="io /shared 28"))
    assert model.counts(status.workers) == (3, 0, 1)
    check_invariants(status)
    planted = model.Workers(status.workers)
    planted.counts = (3, 1, 1)
    try:
        check_invariants(dataclasses.replace(status, workers=planted))
    except AssertionError:
        pass
    else:
        raise AssertionError("a wrong carried count went unnoticed")
    status, _ = step(status, Finish(1, status.seq, True))  # a rank passed: a node's fault
    check_invariants(status)
    assert model.counts(status.workers)[2] == 0
