"""The recovery policy in the pure core (``master/policy.py`` as ``machine.step`` applies it).

Each test names the review finding it guards against (../shared/reviews/fault-injection.md B2,
B6, B9; code-review.md §1.2a). Pure: ``step`` over statuses, no processes.
"""

from __future__ import annotations

import pytest
from machine_helpers import exits, finish_all, inc, nodes_for, running, transitions

from aegis_flow.master import policy
from aegis_flow.master.machine import (
    Ack,
    CauseClass,
    Error,
    ExitCode,
    FaultClass,
    Finish,
    Hang,
    HangWithQuit,
    Lost,
    Order,
    Phase,
    PodInfo,
    Status,
    current_order,
    evolve,
    initial_status,
    step,
)
from aegis_flow.master.store import status_from_dict, status_to_dict

SIGKILL = Error(0, 0, "killed by SIGKILL")  # a template: rank and seq are replaced below
RESET = dict(code="connection_reset", klass=CauseClass.TRANSIENT)


def crash(status: Status, rank: int, **kw: object) -> Status:
    """Rank ``rank``'s process dies (a real cause); returns the Troubleshooting status."""
    status, effects = step(status, Error(rank, status.seq, **kw))  # type: ignore[arg-type]
    assert status.phase is Phase.TROUBLESHOOTING, effects
    return status


def come_back(status: Status, rank: int, generation: int) -> Status:
    """The replacement of ``rank`` acks (a new container); T8 when it is the last one."""
    status, _ = step(status, Ack(rank, inc(rank, generation), seq=0, node=f"node-{rank}"))
    return status


# ------------------------------------------------------------------ the L2 loop (B2)


def test_a_rank_that_fails_twice_recovers_twice_and_the_command_runs_again() -> None:
    """B2: after the container restart the replaced worker was diagnosed again from the stale
    cause and count: T10c → exit 71 → T8 → T10c … until the job failed."""
    status = running(2, 3)
    status = crash(status, 1, cause="SIGKILL")
    status, effects = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND and transitions(effects) == ["T9"]  # L1
    status = crash(status, 1, cause="SIGKILL")
    status, effects = finish_all(status)  # the 2nd failure on its node: L2 (escalation)
    assert transitions(effects) == ["T10c"]
    assert exits(effects)[0].code is ExitCode.CONTAINER_RESTART
    status = come_back(status, 1, 1)
    assert status.phase is Phase.TROUBLESHOOTING and status.replaced
    assert "env" in status.plan and "health" in status.plan  # a new container passes both
    status, effects = finish_all(status)  # the new container is healthy: run, not T10c again
    assert status.phase is Phase.RUNCOMMAND, transitions(effects)
    assert status.recover_count == 2 and status.worker(1).failures == 2
    assert status.worker(0).failures == 0


def test_a_one_off_container_error_costs_one_container_restart() -> None:
    """B2 (7b): one `CUDA error` line made every later troubleshoot replace the container."""
    status = running(2, 3)
    status = crash(status, 1, cause="exit 1 (cuda_error)", code="cuda_error",
                   klass=CauseClass.CONTAINER)
    status, effects = finish_all(status)
    assert transitions(effects) == ["T10c"]
    status = come_back(status, 1, 1)
    status, effects = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND and transitions(effects) == ["T9"]
    assert status.recover_count == 1


def test_a_hardware_cause_is_not_cured_by_a_container_restart() -> None:
    """V3: a container restart answers a container cause, never a hardware one (ECC)."""
    status = running(2, 3)
    status = crash(status, 1, code="ecc_error", klass=CauseClass.HARDWARE)
    status, effects = finish_all(status)
    assert transitions(effects) == ["T10"] and exits(effects)[0].code is ExitCode.NODE_FAULT
    assert "node-1" in status.error_nodes
    status = come_back(status, 1, 1)  # on a new node: a clean history
    assert status.worker(1).failures == 0 and not status.worker(1).cause
    status, effects = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND


def test_a_lost_worker_that_comes_back_as_a_new_pod_is_not_replaced_again() -> None:
    status = running(2, 3)
    status, _ = step(status, Lost(1))  # T6: counted
    assert status.phase is Phase.RESTARTING and status.worker(1).failures == 1
    status = come_back(status, 1, 1)
    status, effects = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND, transitions(effects)


# ------------------------------------------------------------------ blame (B6)


def test_a_peer_reset_is_a_symptom_and_the_dead_rank_is_charged() -> None:
    """B6: rank 0's `connection reset` arrived first and rank 0 was charged."""
    status = running(2, 3)
    run_seq = status.seq
    status, effects = step(status, Error(0, run_seq, "exit 1 (connection_reset)", **RESET))
    assert status.phase is Phase.TROUBLESHOOTING and transitions(effects) == ["T5s"]
    assert status.retries == (0, 0) and status.blame == 0
    assert "allreduce_connection" in status.plan  # the network is suspect: collectives
    # rank 1's own report of the run that just stopped arrives after it: the evidence
    status, effects = step(status, Error(1, run_seq, "killed by SIGKILL"))
    assert transitions(effects) == ["B2"]
    assert status.retries == (0, 1) and status.blame == -1 and status.culprit == 1
    assert status.worker(0).failures == 0 and status.worker(1).failures == 1
    status, _ = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND and status.recover_count == 1


def test_a_dead_supervisor_is_the_evidence_when_only_a_peer_symptom_arrived() -> None:
    """5c: the dead rank never reports; its loss (or its new pod) names it."""
    status = running(2, 3)
    status, _ = step(status, Error(0, status.seq, "reset", **RESET))
    status, effects = step(status, Ack(1, inc(1, 1), seq=0))  # the runner restarted it
    assert "B2" in transitions(effects) and "T7" in transitions(effects)
    assert status.worker(1).failures == 1 and status.worker(0).failures == 0
    assert status.retries == (0, 1)


def test_only_symptoms_charge_the_first_reporter_when_the_round_passes() -> None:
    status = running(2, 3)
    status, _ = step(status, Error(0, status.seq, "reset", **RESET))
    status, effects = finish_all(status)
    assert transitions(effects) == ["B3", "T9"]
    assert status.phase is Phase.RUNCOMMAND and status.recover_count == 1


def test_a_late_symptom_is_no_evidence() -> None:
    status = running(3, 3)
    run_seq = status.seq
    status, _ = step(status, Error(0, run_seq, "reset", **RESET))
    before = status
    status, effects = step(status, Error(2, run_seq, "reset", **RESET))
    assert status is before and effects[0].ignored is not None  # type: ignore[union-attr]


def test_a_hang_is_charged_to_the_rank_that_is_not_waiting() -> None:
    """B6 (hang): the first HangWithQuit came from the rank waiting for its hung peer."""
    status = running(2, 3)
    seq = status.seq
    status, _ = step(status, Hang(1, seq, waiting=False))  # the stuck one: running / stopped
    status, _ = step(status, Hang(0, seq, waiting=True))  # its peer: asleep in a collective
    status, effects = step(status, HangWithQuit(0, seq, waiting=True))
    assert transitions(effects) == ["T14"] and status.retries == (0, 1)
    assert status.worker(1).cause == policy.HANG_CAUSE


def test_a_waiting_hang_with_no_other_evidence_defers_the_blame() -> None:
    status = running(2, 3)
    run_seq = status.seq
    status, effects = step(status, HangWithQuit(0, run_seq, waiting=True))
    assert transitions(effects) == ["T14s"] and status.retries == (0, 0)
    status, effects = step(status, HangWithQuit(1, run_seq, waiting=False))
    assert transitions(effects) == ["B2"] and status.retries == (0, 1)


# ------------------------------------------------------------------ repeated user errors


def user_error(status: Status, rank: int) -> Status:
    status, _ = step(status, Error(rank, status.seq, "exit 1: KeyError: 'x'",
                                   signature="KeyError: 'x' at step 23 (bug.py:40 in main)"))
    return status


def test_the_same_exception_at_the_same_step_twice_ends_the_job() -> None:
    status = running(2, 3)
    status = user_error(status, 1)
    status, _ = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND
    status, effects = step(status, Error(1, status.seq, "exit 1: KeyError: 'x'",
                                         signature="KeyError: 'x' at step 23 (bug.py:40 in main)"))
    assert status.phase is Phase.FAILED and transitions(effects) == ["T16"]
    assert "KeyError: 'x' at step 23" in status.failure
    assert status.recover_count == 1  # the repeat is not restarted: one restart happened


def test_give_up_on_repeat_can_be_turned_off() -> None:
    status = evolve(running(2, 3), give_up_on_repeat=False)
    for _ in range(3):
        status = user_error(status, 1)
        status, _ = finish_all(status)
        if status.phase is Phase.RESTARTING:  # escalated to a container restart
            status = come_back(status, 1, status.worker(1).failures)
            status, _ = finish_all(status)
    assert status.phase is Phase.RUNCOMMAND and status.recover_count == 3


def test_different_steps_are_not_a_repeat() -> None:
    status = running(2, 3)
    status, _ = step(status, Error(1, status.seq, signature="KeyError: 'x' at step 3"))
    status, _ = finish_all(status)
    status, _ = step(status, Error(1, status.seq, signature="KeyError: 'x' at step 4"))
    assert status.phase is Phase.TROUBLESHOOTING


# ------------------------------------------------------------------ orders are stable


def test_an_order_is_a_function_of_the_stored_status() -> None:
    """code-review §1.2a: a restarted master re-sent a different port and plan for one seq."""
    status = evolve(initial_status(2, 3, nodes=nodes_for(2)), rdzv_base=20000)
    for r in (0, 1):
        status, _ = step(status, Ack(r, inc(r)), now=1.0)
    status, _ = finish_all(status)
    run = policy.order_data(status, Order.RUN, status.seq)
    assert run["rendezvous"] == {"addr": "127.0.0.1", "port": 20000 + status.seq % 64}
    status, _ = step(status, Error(1, status.seq, "reset", **RESET), now=2.0)
    order, _ = current_order(status)
    assert order is Order.TROUBLESHOOT
    first = policy.order_data(status, order, status.seq)
    assert "allreduce_connection" in first["checks"] and "rendezvous" in first
    restored = status_from_dict(status_to_dict(status))  # what a restarted master loads
    assert restored == status
    assert policy.order_data(restored, order, status.seq) == first
    assert restored.sent_at == 2.0
    # evidence within the same seq changes the blame, never the order already sent
    status, _ = step(status, Error(0, status.run_seq, "SIGKILL"), now=3.0)
    assert policy.order_data(status, order, status.seq) == first


def test_every_epoch_gets_its_own_port() -> None:
    status = evolve(running(2, 3), rdzv_base=30000)
    first = policy.rendezvous_port(status, status.seq)
    status = crash(status, 0)
    status, _ = finish_all(status)
    assert policy.rendezvous_port(status, status.seq) != first


# ------------------------------------------------------------------ the judge


@pytest.mark.parametrize(("checks", "cause", "klass", "failures", "want"), [
    (None, "", None, 5, None),  # no open failure: the checks decide
    (FaultClass.HARDWARE, "", None, 0, FaultClass.HARDWARE),
    (None, "ecc_error", CauseClass.HARDWARE, 1, FaultClass.HARDWARE),
    (None, "cuda_error", CauseClass.CONTAINER, 1, FaultClass.CONTAINER),
    (None, "cuda_error", CauseClass.CONTAINER, 3, FaultClass.HARDWARE),
    (None, "oom", CauseClass.USER, 9, None),
    (None, "connection_reset", CauseClass.TRANSIENT, 9, None),
    (None, "SIGKILL", None, 1, None),
    (None, "SIGKILL", None, 2, FaultClass.CONTAINER),
    (None, "SIGKILL", None, 3, FaultClass.HARDWARE),
    (None, "hang", None, 3, FaultClass.SLOW),
    (FaultClass.CONTAINER, "", None, 3, FaultClass.HARDWARE),
])
def test_judge(checks: FaultClass | None, cause: str, klass: CauseClass | None,
               failures: int, want: FaultClass | None) -> None:
    pod = PodInfo(rank=0, failures=failures, cause=cause, cause_class=klass)
    assert policy.judge(pod, checks, l2_after=2, l3_after=3)[0] is want


def test_explain_states_the_rules() -> None:
    text = policy.explain()
    for rule in ("B1", "B2", "B3", "B4", "V1", "V2", "V3", "R1"):
        assert rule in text


def test_a_lone_rank_is_its_own_evidence() -> None:
    """A symptom needs a live peer: a one-rank job, or the last rank running, is charged."""
    status = running(1, 3)
    status, effects = step(status, HangWithQuit(0, status.seq, waiting=True))
    assert transitions(effects) == ["T14"] and status.retries == (1,)
    status = running(2, 3)
    status, _ = step(status, Finish(1, status.seq, ok=True))  # rank 1 is done
    status, effects = step(status, Error(0, status.seq, "reset", **RESET))
    assert transitions(effects) == ["T5"] and status.retries == (1, 0)


def test_a_rank_whose_new_pod_is_its_evidence_is_not_escalated_for_it() -> None:
    """5c: a supervisor killed twice. Its new pod already is a new container: the failure it
    was charged with is answered, so the checks passing mean run, not another replacement."""
    status = running(2, 3)
    for generation in (1, 2):
        status, _ = step(status, Error(0, status.seq, "reset", **RESET))
        status, effects = step(status, Ack(1, inc(1, generation), seq=0))
        assert "B2" in transitions(effects)
        status = come_back(status, 1, generation)  # its next heartbeat: back (T8)
        assert status.phase is Phase.TROUBLESHOOTING
        status, effects = finish_all(status)
        assert status.phase is Phase.RUNCOMMAND, transitions(effects)
    assert status.worker(1).failures == 2 and status.worker(0).failures == 0
