"""Helpers shared by the state-machine tests (tests/test_machine_*.py). Pure: no I/O.

They drive ``aegis_flow.master.machine.step`` from ``initial_status`` to the phase a test needs
and pick effects out of a result, so each test states only the row it is about.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aegis_flow.master.machine import (
    Ack,
    Broadcast,
    Effect,
    Error,
    Event,
    ExitWorker,
    Finish,
    Ignored,
    Log,
    Lost,
    Persist,
    Phase,
    Quarantine,
    Send,
    Status,
    initial_status,
    step,
)

Result = tuple[Status, list[Effect]]

NODES3: tuple[str, ...] = ("node-0", "node-1", "node-2")


def nodes_for(workers: int) -> tuple[str, ...]:
    return tuple(f"node-{r}" for r in range(workers))


def inc(rank: int, generation: int = 0) -> str:
    """The incarnation id of ``rank``'s ``generation``-th pod."""
    return f"pod-{rank}-g{generation}"


def apply(status: Status, *events: Event) -> Result:
    """Apply events in order; returns the last status and the effects of the LAST step."""
    effects: list[Effect] = []
    for event in events:
        status, effects = step(status, event)
    return status, effects


def apply_all(status: Status, events: Iterable[Event]) -> tuple[Status, list[list[Effect]]]:
    """Apply events in order; returns the last status and the effects of every step."""
    every: list[list[Effect]] = []
    for event in events:
        status, effects = step(status, event)
        every.append(effects)
    return status, every


def pending(workers: int = 3, max_retry: int = 2, *, flap_limit: int = 3) -> Status:
    return initial_status(workers, max_retry, flap_limit=flap_limit, nodes=nodes_for(workers))


def finish_all(status: Status, *, ok: bool = True) -> Result:
    """Every worker that has not finished reports Finish(ok) at the current seq."""
    events = [Finish(p.rank, status.seq, ok) for p in status.workers if not p.finished]
    return apply(status, *events)


def bootchecking(workers: int = 3, max_retry: int = 2, *, flap_limit: int = 3) -> Status:
    """Every worker acked (T1): BootChecking."""
    status = pending(workers, max_retry, flap_limit=flap_limit)
    status, _ = apply(status, *(Ack(r, inc(r)) for r in range(workers)))
    assert status.phase is Phase.BOOTCHECKING
    return status


def running(workers: int = 3, max_retry: int = 2, *, flap_limit: int = 3) -> Status:
    """Bootcheck passed everywhere (T2): RunCommand."""
    status, _ = finish_all(bootchecking(workers, max_retry, flap_limit=flap_limit))
    assert status.phase is Phase.RUNCOMMAND
    return status


def troubleshooting(
    workers: int = 3, max_retry: int = 2, *, flap_limit: int = 3, rank: int = 0
) -> Status:
    """RunCommand, then ``rank``'s command failed (T5): Troubleshooting, retries[rank] = 1."""
    status = running(workers, max_retry, flap_limit=flap_limit)
    status, _ = step(status, Error(rank, status.seq))
    assert status.phase is Phase.TROUBLESHOOTING
    return status


def restarting(
    workers: int = 3, max_retry: int = 2, *, flap_limit: int = 3, rank: int = 1
) -> Status:
    """Troubleshooting, then ``rank`` lost (T7): Restarting, ``rank`` restarting."""
    status = troubleshooting(workers, max_retry, flap_limit=flap_limit)
    status, _ = step(status, Lost(rank))
    assert status.phase is Phase.RESTARTING
    return status


def broadcasts(effects: Sequence[Effect]) -> list[Broadcast]:
    return [e for e in effects if isinstance(e, Broadcast)]


def sends(effects: Sequence[Effect]) -> list[Send]:
    return [e for e in effects if isinstance(e, Send)]


def exits(effects: Sequence[Effect]) -> list[ExitWorker]:
    return [e for e in effects if isinstance(e, ExitWorker)]


def quarantines(effects: Sequence[Effect]) -> list[Quarantine]:
    return [e for e in effects if isinstance(e, Quarantine)]


def logs(effects: Sequence[Effect]) -> list[Log]:
    return [e for e in effects if isinstance(e, Log)]


def transitions(effects: Sequence[Effect]) -> list[str]:
    """The table rows named by the Log effects, e.g. ["T5"]."""
    return [e.transition for e in logs(effects) if e.transition]


def has_persist_first(effects: Sequence[Effect]) -> bool:
    return bool(effects) and isinstance(effects[0], Persist)


def persist_count(effects: Sequence[Effect]) -> int:
    return sum(isinstance(e, Persist) for e in effects)


def assert_ignored(
    before: Status, result: Result, why: Ignored | None = None
) -> Log:
    """The event was ignored: identical status, exactly one Log that says why."""
    after, effects = result
    assert after is before, "an ignored event must return the very same status object"
    assert len(effects) == 1, effects
    (log,) = effects
    assert isinstance(log, Log), effects
    assert log.ignored is not None, log
    assert log.message, "the Log must say why"
    if why is not None:
        assert log.ignored is why, log
    return log


def inner_phases(status: Status) -> tuple[Phase, ...]:
    return tuple(p.phase for p in status.workers)
