"""Proof that the model checker bites: each test breaks one rule of the real machine (through
``monkeypatch`` on a module-level helper of ``aegis_flow.master.machine`` or a function of
``aegis_flow.master.policy``, which ``step`` calls through the modules' globals) and expects the
matching property to be VIOLATED with a shortest counterexample that replays concretely and
whose last state (or edge, or path) really violates it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import aegis_flow.master.machine as machine
from aegis_flow.master import policy
from aegis_flow.master.machine import (
    CauseClass,
    Error,
    ExitCode,
    FaultClass,
    HangWithQuit,
    Log,
    Order,
    Phase,
    PodInfo,
    Slow,
    Status,
)
from aegis_flow.verify import Config, Kind, Report, TraceStep, Verdict, verify
from aegis_flow.verify.environment import COOPERATIVE, SYMPTOM_CODES
from aegis_flow.verify.explorer import policy_replacement
from aegis_flow.verify.properties import (
    INVARIANTS,
    TRANSITION_INVARIANTS,
)
from aegis_flow.verify.report import render_text
from aegis_flow.vocab import PHASE_OF_ORDER

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
    original = machine._replace_worker

    def replace_never_counted(status: Status, rank: int, cause: str, row: str,
                              **kwargs: Any) -> machine.Result:
        """The real replacement, with a flap limit it never reaches (flaps still saturate)."""
        limit = status.flap_limit
        new, effects = original(replace(status, flap_limit=10**9), rank, cause, row, **kwargs)
        workers = tuple(p if p.flaps <= limit else replace(p, flaps=limit)
                        for p in new.workers)
        return replace(new, flap_limit=limit, workers=workers), effects

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


# --------------------------------------------------------------------------- the recovery policy
# Each test breaks one rule of ``master/policy.py`` (which ``step`` calls through the module) or
# the machine's use of it, and expects the policy property that states the rule to fail.

POLICY_MODEL = Config(workers=2, max_retry=2, seq_bound=4, symmetry=True)


def _replacements(steps: list[TraceStep]) -> list[tuple[int, int]]:
    """(step index, rank) of every policy-ordered replacement along a trace: a passing Finish
    whose step told its sender to exit."""
    out = []
    for before, after in zip(steps, steps[1:], strict=False):
        assert after.event is not None
        _, effects = machine.step(before.status, after.event)
        rank = policy_replacement(after.event, effects)
        if rank is not None:
            out.append((after.index, rank))
    return out


def test_an_unanswered_failure_loops_through_l2_until_the_job_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """V3 removed (``answered`` keeps the open failure): the old "L2 loop". A rank whose run
    died with a container cause is restarted (T10c), comes back as a new container still
    carrying the cause, is judged L2 again... until the flap guard counts and T11 fails the
    job, although the world cooperated after the one failure."""
    monkeypatch.setattr(policy, "answered", lambda pod, *, new_node: pod)
    report = verify(POLICY_MODEL)
    verdict = violated(report, "FlakyRankRecovers")
    last = verdict.trace[-1].status
    assert last.phase is Phase.FAILED
    # one counted failure (a container cause), then only cooperative events
    faults = [st for st in verdict.trace[1:] if st.kind not in COOPERATIVE]
    assert len(faults) == 1 and isinstance(faults[-1].event, Error)
    assert faults[-1].event.klass is CauseClass.CONTAINER
    ranks = {rank for _, rank in _replacements(verdict.trace)}
    assert len(ranks) == 1 and len(_replacements(verdict.trace)) > report.config.flap_limit
    # the same mutant replaces that rank twice without a run in between
    twice = violated(report, "NoEndlessReplacement")
    _assert_replaced_twice(twice)


def _assert_replaced_twice(verdict: Verdict) -> None:
    hits = _replacements(verdict.trace)
    assert len(hits) >= 2 and hits[-1][1] == hits[-2][1]
    between = verdict.trace[hits[-2][0]:hits[-1][0]]
    assert all(st.status.phase is not Phase.RUNCOMMAND for st in between)
    assert all(st.kind in COOPERATIVE for st in verdict.trace[hits[-2][0]:])


def test_the_real_policy_answers_a_failure_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the same model with the real policy."""
    report = verify(POLICY_MODEL)
    for name in ("FlakyRankRecovers", "NoEndlessReplacement", "BlameIsEvidence",
                 "OrdersAreStable"):
        assert report.verdict(name).holds is True, render_text(report)
    assert "cooperative closure" in report.verdict("FlakyRankRecovers").note


def test_a_verdict_that_forgets_the_answer_replaces_a_rank_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """V2 broken: any rank that ever failed on its node is judged L2, answered or not."""
    real = policy.verdict

    def always_container(status: Status, pod: PodInfo,
                         checks: FaultClass | None) -> FaultClass | None:
        return FaultClass.CONTAINER if pod.failures >= 1 else real(status, pod, checks)

    monkeypatch.setattr(policy, "verdict", always_container)
    verdict = violated(verify(POLICY_MODEL), "NoEndlessReplacement")
    _assert_replaced_twice(verdict)


def test_a_symptom_taken_for_a_cause_charges_the_wrong_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """B1 removed: a surviving rank that saw a connection reset is charged for its peer."""
    monkeypatch.setattr(policy, "is_symptom", lambda code: False)
    verdict = violated(verify(POLICY_MODEL), "BlameIsEvidence")
    before, after = verdict.trace[-2], verdict.trace[-1]
    assert after.kind is Kind.SYMPTOM and isinstance(after.event, Error)
    assert after.event.code in SYMPTOM_CODES
    assert sum(after.status.retries) > sum(before.status.retries)
    assert_last_edge_violates(verdict)


def test_a_late_symptom_is_never_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    """B2 broken: the late report of the last run is charged even when it is a symptom."""
    real = machine._on_evidence

    def evidence_of_anything(status: Status, ev: Error | HangWithQuit) -> machine.Result:
        if isinstance(ev, HangWithQuit):
            ev = replace(ev, waiting=False)
        else:
            ev = replace(ev, code="")
        return real(status, ev)

    monkeypatch.setattr(machine, "_on_evidence", evidence_of_anything)
    verdict = violated(verify(POLICY_MODEL), "BlameIsEvidence")
    assert verdict.trace[-1].kind is Kind.SYMPTOM
    assert verdict.trace[-2].status.blame >= 0  # a suspect was pending
    assert_last_edge_violates(verdict)


def _order_changed_within_a_seq(verdict: Verdict) -> None:
    before, after = verdict.trace[-2].status, verdict.trace[-1].status
    assert before.seq == after.seq
    order, _ = machine.current_order(before)
    assert order is not None
    assert policy.order_data(after, order, before.seq) != policy.order_data(before, order,
                                                                             before.seq)
    assert_last_edge_violates(verdict)


def test_an_order_that_reads_the_live_recover_count_is_not_stable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``restart_count`` from recoverCount instead of the epoch the order was made in: a
    counted failure within the same seq (B2 evidence, a counted flap) changes a re-send."""
    real = policy.order_data

    def live_count(status: Status, order: Order, seq: int) -> dict[str, object]:
        return {**real(status, order, seq), "restart_count": status.recover_count}

    monkeypatch.setattr(policy, "order_data", live_count)
    _order_changed_within_a_seq(violated(verify(POLICY_MODEL), "OrdersAreStable"))


def test_an_order_whose_plan_is_recomputed_is_not_stable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks of a round recomputed from the live status instead of the stored plan: B2
    settles the blame within the seq, the collective checks disappear from a re-send."""
    real = policy.order_data

    def live_plan(status: Status, order: Order, seq: int) -> dict[str, object]:
        data = real(status, order, seq)
        if "checks" in data:
            data["checks"] = list(policy.plan(status, PHASE_OF_ORDER[order]))
        return data

    monkeypatch.setattr(policy, "order_data", live_plan)
    verdict = violated(verify(POLICY_MODEL), "OrdersAreStable")
    _order_changed_within_a_seq(verdict)
    assert verdict.trace[-2].status.blame >= 0 > verdict.trace[-1].status.blame


# --------------------------------------------------------------------------- (h) T6n removed


def test_an_outage_taken_for_lost_workers_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without T6n every worker silent at once (a NATS pause) is N lost workers: a retry is
    counted and every rank restarted with nothing wrong (the 4 s pause of the review)."""
    monkeypatch.setattr(machine, "_outage", lambda status, ev: False)
    verdict = violated(verify(Config(workers=2, max_retry=1, seq_bound=3)),
                       "OutageCountsNothing")
    assert verdict.trace[-1].kind is Kind.OUTAGE
    assert verdict.trace[-1].status.recover_count > verdict.trace[-2].status.recover_count or \
        verdict.trace[-1].status.phase is not verdict.trace[-2].status.phase
    assert_last_edge_violates(verdict)


def test_the_real_core_forgives_an_outage() -> None:
    report = verify(Config(workers=2, max_retry=1, seq_bound=3))
    assert report.verdict("OutageCountsNothing").holds is True
    assert report.verdict("NoEndlessRecovery").holds is True


# --------------------------------------------------------------------------- (i) T3j removed


def test_a_full_shared_disk_taken_for_node_faults_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without T3j every rank's io check failing on one full filesystem quarantined node after
    node (fault-injection 9a: 8 "nodes" on one tmpfs)."""
    monkeypatch.setattr(machine, "_hold_shared", lambda status, ev: machine._release(
        machine._set(status, replace(status.workers[ev.rank], last_reason=ev.detail)),
        ev.rank))
    verdict = violated(verify(Config(workers=2, max_retry=1, seq_bound=3)),
                       "StorageFaultIsTheJobs")
    assert verdict.trace[-1].event.shared  # type: ignore[union-attr]
    assert_last_edge_violates(verdict)


def test_the_real_core_fails_the_job_for_its_storage() -> None:
    report = verify(Config(workers=2, max_retry=1, seq_bound=3))
    assert report.verdict("StorageFaultIsTheJobs").holds is True


# ------------------------------------------------------------- (k) hang blame, slow eviction


def test_blaming_the_rank_ahead_in_a_hang_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """B5 inverted: the rank whose counts are *ahead* (a peer waiting on the stuck one) is
    charged."""
    def ahead(activity: tuple[tuple[int, int, int], ...]) -> int | None:
        counts = {r: (s, f) for r, s, f in activity}
        return max(counts, key=counts.__getitem__) if len(counts) > 1 else None

    monkeypatch.setattr(policy, "stopped_first", ahead)
    verdict = violated(verify(POLICY_MODEL), "BlameIsEvidence")
    last = verdict.trace[-1]
    assert isinstance(last.event, HangWithQuit) and last.event.activity
    assert_last_edge_violates(verdict)


def test_evicting_a_slow_rank_when_it_is_marked_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """T13e moved to the mark: the slow rank is evicted before any checkpoint (the progress
    since the last one would be lost)."""
    def evict_now(status: Status, ev: Slow) -> Any:
        return machine._replace_worker(status, ev.rank, "slow", "T13e",
                                       exit_code=ExitCode.SLOW_NODE_EVICTED)

    monkeypatch.setattr(machine, "_on_slow", evict_now)
    verdict = violated(verify(POLICY_MODEL), "EvictionOnlyAtCheckpoint")
    assert isinstance(verdict.trace[-1].event, Slow)
    assert_last_edge_violates(verdict)


def test_the_real_core_evicts_only_at_a_checkpoint() -> None:
    report = verify(POLICY_MODEL)
    assert report.verdict("EvictionOnlyAtCheckpoint").holds is True
    assert report.verdict("BlameIsEvidence").holds is True


# --------------------------------------------------------------------------- keep-alives


def test_a_keepalive_shortcut_that_skips_a_replaced_workers_beat_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime takes a keep-alive without ``step`` when ``beat_changes_nothing`` says so.
    Without its ``restarting`` clause, the old pod of a rank being replaced would never be
    re-sent its exit order (the Ack that asks for it would be skipped)."""
    def careless(status: Status, rank: int, incarnation: str, seq: int) -> bool:
        pod = status.workers[rank]
        return (seq == status.seq == pod.seq and incarnation == pod.incarnation
                and status.phase is not Phase.PENDING)

    monkeypatch.setattr(machine, "beat_changes_nothing", careless)
    verdict = violated(verify(Config(workers=2, max_retry=1, seq_bound=4)),
                       "KeepAliveChangesNothing")
    assert_last_state_violates(verdict)
    assert any(p.restarting for p in verdict.trace[-1].status.workers)


def test_the_real_keepalive_shortcut_holds() -> None:
    assert verify(Config(workers=2, max_retry=1, seq_bound=4)).verdict(
        "KeepAliveChangesNothing").holds is True
