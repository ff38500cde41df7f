"""The seeded fault soak (bench/soak.py): its draw and expectations (fast, pure), and a short
soak of real jobs that must all come out exactly as expected (e2e).

The short soak runs 6 jobs one after the other (about 110 s on 2 cores), kinds chosen so that
job i has kind ``SHORT_KINDS[i]`` and the seed so that together they use every fault action
but a nats-server SIGKILL: a training process SIGKILLed and exiting with a code, a supervisor
SIGKILLed while training (once past max-retry: the job fails), a one-off CUDA error (a
container restart), a supervisor dying in the troubleshoot, the master SIGKILLed during a
recovery, nats-server stopped (SIGSTOP) for 10 s, three lost timeouts (fault-injection 4b; the
4 s stop and the SIGKILL are in ``tests/test_nats_outage_e2e.py``).
``test_short_soak_covers_the_fault_actions`` keeps that true if the draw changes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import soak
from bench.soak import Expectation, Fault, JobPlan, Result, draw_plan, expect, judge

SHORT_SEED = 9
SHORT_KINDS = ("twice", "supervisor", "cuda", "die-troubleshoot", "master", "nats-stop10")
SHORT_ACTIONS = {"crash", "exit", "supervisor", "cuda", "die", "master", "nats-stop"}


def crash(rank: int, epoch: int) -> Fault:
    return Fault("crash", rank, epoch, 1.5, counted=True)


def plan(*faults: Fault, max_retry: int = 3) -> JobPlan:
    return JobPlan(0, "test", faults, max_retry)


# -- the draw and the expectations (pure) ------------------------------------------------------

def test_the_draw_is_seeded_and_job_i_has_kind_i_mod_k() -> None:
    first = draw_plan(5, 12, soak.DEFAULT_KINDS)
    assert first == draw_plan(5, 12, soak.DEFAULT_KINDS)
    assert first != draw_plan(6, 12, soak.DEFAULT_KINDS)
    k = len(soak.DEFAULT_KINDS)
    assert [p.kind for p in first] == [soak.DEFAULT_KINDS[i % k] for i in range(12)]
    for p in first:
        assert 1 <= len(p.faults) <= 2, p
        assert sum(f.action == "cuda" for f in p.faults) <= 1, p
        if any(f.action == "die" for f in p.faults):  # it needs a troubleshoot
            assert any(f.counted for f in p.faults), p


def test_short_soak_covers_the_fault_actions() -> None:
    plans = draw_plan(SHORT_SEED, len(SHORT_KINDS), SHORT_KINDS)
    assert {f.action for p in plans for f in p.faults} >= SHORT_ACTIONS, soak.render_plan(plans)
    assert any(f.trigger == "recovery" for p in plans for f in p.faults)  # master in recovery
    assert {expect(p).phase for p in plans} == {"Succeed", "Failed"}, soak.render_plan(plans)


def test_each_counted_round_costs_one_retry() -> None:
    assert expect(plan(crash(1, 0))) == Expectation("Succeed", 1, 0, rounds=1)
    # the same rank in two epochs: two rounds
    assert expect(plan(crash(1, 0), crash(1, 1))) == Expectation("Succeed", 2, 0, rounds=2)
    # two ranks in one epoch: one round
    same = plan(crash(0, 0), Fault("exit", 1, 0, 1.6, counted=True, code=2))
    assert expect(same) == Expectation("Succeed", 1, 0, rounds=1)


def test_uncounted_faults_cost_nothing() -> None:
    master = Fault("master", after=0.2, trigger="recovery")
    die = Fault("die", 0)
    nats = Fault("nats-stop", after=1.0, trigger="train", pause=4.0)
    assert expect(plan(crash(0, 0), master)).recover_count == 1
    assert expect(plan(crash(0, 0), die)).recover_count == 1
    assert expect(plan(nats)) == Expectation("Succeed", 0, 0)


def test_more_rounds_than_max_retry_fail_the_job_naming_the_rank() -> None:
    assert expect(plan(crash(1, 0), crash(1, 1), max_retry=1)) == Expectation(
        "Failed", 2, 1, (1,), rounds=2)
    same = plan(crash(0, 0), Fault("exit", 1, 0, 1.6, counted=True, code=2), max_retry=0)
    assert expect(same) == Expectation("Failed", 1, 1, (0, 1), rounds=1)
    # a same-round pair needs one of the two to fire; an uncounted fault must fire itself
    assert soak.required(same, expect(same)) == [[0, 1]]


def result(p: JobPlan, **kw: object) -> Result:
    exp = expect(p)
    fields: dict[str, object] = dict(
        plan=p, expected=exp, rc=exp.rc, phase=exp.phase, recover_count=exp.recover_count,
        failure="", retries=[], sha="abc", reference="abc", fired=["x"] * len(p.faults),
        orphans=[], seconds=12.0)
    fields.update(kw)
    out = Result(**fields)  # type: ignore[arg-type]
    out.problems = judge(out)
    return out


def test_judge_names_every_difference() -> None:
    p = plan(crash(1, 0), Fault("master", after=0.2, trigger="recovery"))
    assert judge(result(p)) == []
    assert "invariant monitor reported 2" in judge(result(p, violations=2))[0]
    assert "recoverCount 1; got exit 0, Succeed, recoverCount 2" in judge(
        result(p, recover_count=2))[0]
    assert "!= reference" in judge(result(p, sha="abd"))[0]
    assert judge(result(p, fired=["x", ""])) == ["did not fire: master@recovery+0.2s"]
    assert "left behind" in judge(result(p, orphans=["pid 7 'python'"]))[0]
    assert judge(result(p, rc=None))[0].startswith("hung")
    failing = plan(crash(1, 0), max_retry=0)
    good = "rank 1 failed 1 times, more than max-retry 0; last: killed by SIGKILL"
    assert judge(result(failing, failure=good, sha="")) == []
    assert "does not start with" in judge(result(failing, failure="rank 0 failed 1 t"))[0]


def test_the_table_has_a_row_per_job_and_the_total() -> None:
    p = plan(crash(1, 0))
    table = soak.render_table([result(p), result(p, recover_count=2)])
    assert table.splitlines()[-1] == "1/2 jobs correct"
    assert "WRONG" in table and "job 0: expected exit 0" in table


# -- a short soak of real jobs -----------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_short_soak_every_job_correct(tmp_path: Path) -> None:
    cfg = soak.SoakConfig(seed=SHORT_SEED, jobs=len(SHORT_KINDS), kinds=SHORT_KINDS,
                          timeout=150.0, work_dir=tmp_path)
    results = soak.run_soak(cfg)
    table = soak.render_table(results)
    print(table)
    wrong = [r for r in results if not r.correct]
    outputs = "\n".join(Path(r.job_dir, "output.log").read_text() for r in wrong)
    assert not wrong, f"{table}\n\n{outputs}"
