"""Proof that the model checker bites: each test breaks one rule of the real machine (through
``monkeypatch`` on a module-level helper of ``aegis_flow.master.machine``, which ``step`` calls
through the module's globals) and expects the matching property to be VIOLATED with a shortest
counterexample whose last state really violates it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import aegis_flow.master.machine as machine
from aegis_flow.master.machine import ExitCode, Log, Phase, PodInfo, Status
from aegis_flow.verify import Config, Kind, Report, Verdict, verify
from aegis_flow.verify.properties import (
    INVARIANTS,
    TRANSITION_INVARIANTS,
)
from aegis_flow.verify.report import render_text

STATE_CHECKS = dict(INVARIANTS)
EDGE_CHECKS = dict(TRANSITION_INVARIANTS)


def violated(report: Report, *names: str) -> Verdict:
    """The first of ``names`` that is violated, with a non-empty, replayable trace."""
    assert report.exit_code() == 1, render_text(report)
    hits = [report.verdict(n) for n in names if report.verdict(n).holds is False]
    assert hits, f"none of {names} violated:\n{render_text(report)}"
    verdict = hits[0]
    assert len(verdict.trace) >= 2  # the initial state and at least one event
    assert verdict.trace[0].event is None and all(st.event is not None for st in verdict.trace[1:])
    for before, after in zip(verdict.trace, verdict.trace[1:], strict=False):
        assert after.event is not None
        assert machine.step(before.status, after.event)[0] == after.status  # concrete replay
    return verdict


def assert_last_state_violates(verdict: Verdict) -> None:
    last = verdict.trace[-1].status
    assert not STATE_CHECKS[verdict.name](last)


def assert_last_edge_violates(verdict: Verdict) -> None:
    before, after = verdict.trace[-2], verdict.trace[-1]
    assert after.kind is not None and after.event is not None
    _, effects = machine.step(before.status, after.event)
    assert not EDGE_CHECKS[verdict.name](after.kind, after.event, before.status, after.status,
                                         effects)


# --------------------------------------------------------------------------- (a) T11 removed


def _count_never_fails(status: Status, rank: int, cause: str, row: str) -> Status:
    """The counting rule without T11: retries grow, the job never fails."""
    pod = status.workers[rank]
    status = machine._set(status, replace(pod, retries=pod.retries + 1, last_reason=cause))
    return replace(status, recover_count=max(p.retries for p in status.workers))


def test_without_t11_retries_grow_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_count", _count_never_fails)
    report = verify(Config(workers=2, max_retry=0, seq_bound=3))
    verdict = violated(report, "RetriesBound", "RecoverCountBound")
    assert_last_state_violates(verdict)
    assert max(verdict.trace[-1].status.retries) > 1  # maxRetry + 1


# --------------------------------------------------------------------------- (b) dedup removed


def test_without_dedup_a_duplicate_finish_is_not_recognised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_is_duplicate", lambda pod, event: False)
    report = verify(Config(workers=2, max_retry=1, message_layer=True, seq_bound=2))
    verdict = violated(report, "NoFinishDoubleProcessed")
    assert verdict.trace[-1].kind is Kind.DUPLICATE
    assert_last_edge_violates(verdict)


def test_duplicates_need_the_message_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_is_duplicate", lambda pod, event: False)
    report = verify(Config(workers=2, max_retry=1, seq_bound=2))
    assert report.verdict("NoFinishDoubleProcessed").holds is True


# --------------------------------------------------------------------------- (c) stale accepted


def test_accepting_stale_finishes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_is_stale", lambda status, seq: False)
    report = verify(Config(workers=2, max_retry=1, message_layer=True, seq_bound=2))
    verdict = violated(report, "StaleFinishRejected")
    last = verdict.trace[-1]
    assert last.kind is Kind.STALE and last.status != verdict.trace[-2].status
    assert_last_edge_violates(verdict)


# --------------------------------------------------------------------------- (d) stranded worker


def test_a_worker_that_never_returns_deadlocks_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    def return_but_stay_restarting(status: Status, pod: PodInfo, *,
                                   new_incarnation: bool) -> machine.Result:
        pod = replace(pod, exit_code=None)  # forgets to clear `restarting`
        status = machine._set(status, pod)
        if any(p.restarting for p in status.workers):
            return status, [Log(f"rank {pod.rank} is back")]
        return machine._broadcast(status, Phase.TROUBLESHOOTING, "T8", "T8")  # pragma: no cover

    monkeypatch.setattr(machine, "_return_worker", return_but_stay_restarting)
    report = verify(Config(workers=2, max_retry=1, seq_bound=3))
    verdict = violated(report, "NoDeadlock", "TerminationReachable")
    last = verdict.trace[-1].status
    assert not last.phase.terminal
    # really stuck: nothing but Stop, self-loops or a stranded worker's own return gets it on
    assert any(p.restarting for p in last.workers)
    if verdict.name == "NoDeadlock":
        from aegis_flow.verify import events

        for kind, event in events(last, message_layer=False):
            new, _ = machine.step(last, event)
            if kind is not Kind.STOP:
                assert new.phase is last.phase and [p.restarting for p in new.workers] == [
                    p.restarting for p in last.workers]


# --------------------------------------------------------------------------- (e) flap guard removed


def test_without_the_flap_guard_recovery_can_loop_forever(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def replace_never_counted(status: Status, rank: int, cause: str, row: str, *,
                              exit_code: ExitCode | None = None) -> machine.Result:
        pod = status.workers[rank]
        if exit_code is ExitCode.NODE_FAULT and pod.node:
            status = replace(status, error_nodes=status.error_nodes | {pod.node})
        pod = replace(pod, restarting=True, flaps=min(pod.flaps + 1, status.flap_limit),
                      last_reason=cause, exit_code=exit_code, hanging=False)
        status = machine._set(status, pod)
        if status.phase is Phase.RESTARTING:
            return status, [Log(f"{row}: rank {rank} replaced", transition=row)]
        return machine._broadcast(status, Phase.RESTARTING, row, f"{row}: rank {rank}",
                                  keep_restarting_phase=True)

    monkeypatch.setattr(machine, "_replace_worker", replace_never_counted)
    report = verify(Config(workers=2, max_retry=1, seq_bound=3))
    verdict = violated(report, "NoEndlessRecovery")
    assert verdict.loop_start is not None
    loop = verdict.trace[verdict.loop_start:]
    assert len(loop) >= 3
    enc = report.exploration.encoder
    assert enc.encode(loop[0].status) == enc.encode(loop[-1].status)  # back where it started
    for before, after in zip(loop, loop[1:], strict=False):
        assert after.status.phase in (Phase.BOOTCHECKING, Phase.RESTARTING,
                                      Phase.TROUBLESHOOTING)
        assert after.status != before.status
        assert all(a <= b for a, b in zip(after.status.retries, before.status.retries,
                                          strict=True))


def test_the_real_flap_guard_counts_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for (e): the same model with the real _replace_worker has no such cycle."""
    report = verify(Config(workers=2, max_retry=1, seq_bound=3))
    assert report.verdict("NoEndlessRecovery").holds is True


# --------------------------------------------------------------------------- symmetry traces


def test_counterexamples_are_concrete_under_symmetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under symmetry a state id names a class of states; the trace is still a concrete run."""
    monkeypatch.setattr(machine, "_count", _count_never_fails)
    report = verify(Config(workers=3, max_retry=0, seq_bound=3, symmetry=True))
    verdict = violated(report, "RetriesBound", "RecoverCountBound")
    assert_last_state_violates(verdict)


# --------------------------------------------------------------------------- (f) a worker's seq


def test_a_worker_seq_beyond_the_master_is_caught_without_it_in_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default key drops the workers' reported seqs; WorkerSeqNumBound, which reads them, is
    then checked on every successor. A returning worker recorded one seq ahead is caught."""
    original = machine._return_worker

    def return_ahead(status: Status, pod: PodInfo, *, new_incarnation: bool) -> machine.Result:
        return original(status, replace(pod, seq=status.seq + 1),
                        new_incarnation=new_incarnation)

    monkeypatch.setattr(machine, "_return_worker", return_ahead)
    report = verify(Config(workers=2, max_retry=1, seq_bound=3))
    assert not report.config.exact
    verdict = violated(report, "WorkerSeqNumBound")
    assert_last_state_violates(verdict)
