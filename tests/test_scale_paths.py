"""The per-report paths of the master stay O(changed), not O(N), at any job size.

A report (an ack, a FINISH) changes one rank. At 4,096 ranks, one walk of every pod per report
made a round O(N²): the core counted the finished ranks on every FINISH (1.3 s of a round), the
observer looked for the touched ranks and recounted the gpu types on every first ack. These
tests pin the cheap paths and prove that what they return is what the walk would return.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from aegis_flow import protocol as p
from aegis_flow.master import model
from aegis_flow.master.machine import Ack, Error, Finish, Phase, Status, initial_status, step
from aegis_flow.master.observer import Observer


class CountingWorkers(model.Workers):
    """A Workers that counts every walk over it (``iter``: loops, generators, ``map``,
    ``list``); tuple comparison and indexing do not walk."""

    walks = 0

    def __iter__(self) -> Any:
        CountingWorkers.walks += 1
        return super().__iter__()


def _running_round(n: int) -> Status:
    status = initial_status(n, 3)
    for r in range(n):
        status, _ = step(status, Ack(r, f"i{r}", 0, f"n{r}"))
    assert status.phase is Phase.BOOTCHECKING
    return status


def test_a_finish_of_a_round_walks_the_workers_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every FINISH but the last of a 64-rank round: one walk (the copy of the tuple with the
    new pod), not one per question the core asks (all finished? any held?)."""
    monkeypatch.setattr(model, "Workers", CountingWorkers)
    status = _running_round(64)
    for r in range(63):
        CountingWorkers.walks = 0
        status, _ = step(status, Finish(r, status.seq, True))
        assert CountingWorkers.walks <= 1, f"FINISH of rank {r} walked the workers " \
                                           f"{CountingWorkers.walks} times"
    assert status.phase is Phase.BOOTCHECKING
    status, _ = step(status, Finish(63, status.seq, True))
    assert status.phase is Phase.RUNCOMMAND


def test_the_cheap_answers_are_the_walks_answers() -> None:
    """``touched`` equals ``replaced`` and ``counts`` equals counting, over random reports of a
    job that runs, fails and recovers; a tuple made from another one is never taken for one
    step away from it."""
    rng = random.Random(7)
    status = _running_round(16)
    for _ in range(400):
        rank = rng.randrange(16)
        kind = rng.random()
        event = (Finish(rank, status.seq, kind > 0.1) if kind < 0.7 else
                 Error(rank, status.seq) if kind < 0.75 else
                 Ack(rank, f"i{rank}" if kind < 0.97 else f"i{rank}-new", status.seq))
        before = status
        status, _ = step(status, event)
        assert model.touched(before.workers, status.workers) == \
            model.replaced(before.workers, status.workers)
        w = status.workers
        assert model.counts(w) == (sum(q.incarnation is not None for q in w),
                                   sum(q.finished for q in w), sum(bool(q.shared) for q in w))
    # a tuple two steps from ``base``: its origin is the tuple in between, so the walk decides
    base = status.workers
    one = model.with_pod(base, model.evolve(base[3], last_reason="a"))
    two = model.with_pod(one, model.evolve(base[5], last_reason="b"))
    assert model.touched(base, two) == [3, 5]
    assert model.touched(base, one) == [3]
    assert model.touched(one, one) == []


def _beat(rank: int, gpu: str) -> tuple[p.Message, Ack]:
    raw = p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}",
                    type=p.MsgType.ACK, rank=rank, seq=0, incarnation=f"i{rank}",
                    data={"gpu_type": gpu}, timestamp=time.time()).encode()
    msg = p.decode(raw)
    event = p.to_event(msg)
    assert isinstance(event, Ack)
    return msg, event


def test_the_gpu_label_is_the_most_common_type_as_types_change() -> None:
    """The gpu label (metrics, fault log) is the type most ranks report, kept per type as each
    rank's first report arrives and as a rank's type changes; "unknown" before any report."""
    obs = Observer(job="j", namespace="default", workers=4)
    assert obs.gpu_type == "unknown"
    for rank, gpu in ((0, "A800"), (1, "A800"), (2, "H100")):
        obs.message(*_beat(rank, gpu), now=1.0)
    assert obs.gpu_type == "A800"
    for rank in (0, 3):
        obs.message(*_beat(rank, "H100"), now=2.0)
    assert obs.gpu_type == "H100"
    assert dict(obs._gpu_counts) == {"A800": 1, "H100": 3}
    assert obs.gpu_type == max({v.gpu_type for v in obs.views},
                               key=[v.gpu_type for v in obs.views].count)
