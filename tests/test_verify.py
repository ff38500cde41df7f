"""The model checker over the real master.machine.step: verdicts, dumps, symmetry and the CLI.

Sizes are chosen so the whole file runs in seconds; docs/verification.md has the large runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aegis_flow.cli import main
from aegis_flow.master.machine import (
    Ack,
    CauseClass,
    Error,
    ExitCode,
    Finish,
    Hang,
    HangWithQuit,
    Phase,
    PodInfo,
    Status,
    Stop,
    initial_status,
    step,
)
from aegis_flow.verify import Config, Kind, Report, canonical, events, verify
from aegis_flow.verify.environment import FIRST, SYMPTOM_CODES
from aegis_flow.verify.explorer import Encoder, explore
from aegis_flow.verify.report import PROPERTY_NAMES, render_text
from aegis_flow.vocab import Check

ALL_PROPERTIES = set(PROPERTY_NAMES)


@cache
def checked(config: Config, dump: bool = False) -> Report:
    return verify(config, dump=dump)


def assert_all_hold(report: Report) -> None:
    bad = {v.name: render_text(report) for v in report.verdicts if v.holds is not True}
    assert not bad, next(iter(bad.values()))
    assert {v.name for v in report.verdicts} == ALL_PROPERTIES
    assert report.exit_code() == 0


# --------------------------------------------------------------------------- the real machine


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(Config(workers=2, max_retry=1, seq_bound=4), id="P0-W2-R1"),
        pytest.param(Config(workers=3, max_retry=2, seq_bound=4, symmetry=True), id="P0-W3-R2"),
        pytest.param(Config(workers=3, max_retry=2, message_layer=True, seq_bound=3,
                            symmetry=True), id="P1-W3-R2-seq3"),
        pytest.param(Config(workers=2, max_retry=1, message_layer=True, seq_bound=3,
                            exact=True), id="P1-W2-R1-seq3-exact"),
    ],
)
def test_the_real_machine_satisfies_every_property(config: Config) -> None:
    report = checked(config)
    assert_all_hold(report)
    ex = report.exploration
    assert ex.states > 500 and ex.transitions > 5 * ex.states
    assert ex.cut_edges > 0  # the bound really cut something: the counts are bounded runs
    assert not ex.exceeded


def test_t11_and_success_are_reachable_within_the_bound() -> None:
    """The bounded run is not vacuous: both ends of the job are in the explored space."""
    lines = checked(Config(workers=2, max_retry=1, seq_bound=3), dump=True).dump()
    assert any(x.startswith("phase=Failed") and "recoverCount=2 " in x and "retries=<<2," in x
               for x in lines)  # T11: recoverCount = maxRetry + 1
    assert any(x.startswith("phase=Succeed") for x in lines)
    assert any(x.startswith("phase=Independent") for x in lines)


def test_message_layer_produces_every_kind_of_redelivery() -> None:
    config = Config(workers=2, max_retry=1, message_layer=True)
    s = config.initial()
    for event in (Ack(0, "0"), Ack(1, "0"), Finish(0, 1, True)):
        s, _ = step(s, event)
    kinds = {kind for kind, _ in events(s, message_layer=True)}
    assert kinds == {Kind.NORMAL, Kind.COOPERATIVE, Kind.HEARTBEAT, Kind.DUPLICATE, Kind.STALE,
                     Kind.STOP, Kind.OUTAGE, Kind.RESUME}
    assert {kind for kind, _ in events(s, message_layer=False)} == {
        Kind.NORMAL, Kind.COOPERATIVE, Kind.STOP, Kind.OUTAGE, Kind.RESUME}


def test_without_message_layer_every_worker_message_carries_the_current_seq() -> None:
    config = Config(workers=2, max_retry=1)
    s = config.initial()
    for event in (Ack(0, "0"), Ack(1, "0"), Finish(0, 1, True), Finish(1, 1, True)):
        s, _ = step(s, event)
    assert s.phase is Phase.RUNCOMMAND
    evs = [e for _, e in events(s, message_layer=False)]
    assert any(isinstance(e, Hang) for e in evs) and any(isinstance(e, Error) for e in evs)
    for e in evs:
        if isinstance(e, (Ack, Finish, Error, Hang, HangWithQuit)):
            assert e.seq == s.seq
    assert Stop("operator") in evs


def test_terminal_states_produce_no_events() -> None:
    s, _ = step(Config(workers=2, max_retry=1).initial(), Stop("operator"))
    assert s.phase is Phase.FAILED
    assert events(s, message_layer=True) == []


def test_counterexample_free_runs_report_their_numbers() -> None:
    text = render_text(checked(Config(workers=2, max_retry=1, seq_bound=4)))
    for word in ("distinct states", "transitions", "max depth", "cut edges", "states/s"):
        assert word in text
    assert "VIOLATED" not in text


# --------------------------------------------------------------------------- symmetry


def test_symmetry_gives_fewer_states_and_the_same_verdict() -> None:
    plain = checked(Config(workers=2, max_retry=1, seq_bound=4))
    sym = checked(Config(workers=2, max_retry=1, seq_bound=4, symmetry=True))
    assert sym.exploration.states < plain.exploration.states
    assert [(v.name, v.holds) for v in sym.verdicts] == [(v.name, v.holds) for v in plain.verdicts]


# --------------------------------------------------------------------------- the seq-free key


@pytest.mark.parametrize("message_layer", [False, True])
def test_dropping_worker_seqs_from_the_key_merges_exactly_those_states(
        message_layer: bool) -> None:
    """The default key drops each worker's reported seq (no decision reads it). Soundness, shown
    on a concrete run: the exact exploration's states, re-keyed without the worker seqs, are
    exactly as many as the default exploration finds, and every verdict is the same."""
    config = Config(workers=2, max_retry=1, message_layer=message_layer, seq_bound=3)
    coarse = Encoder(symmetry=False, exact=False)
    exact = explore(replace(config, exact=True), dump=True,
                    project=lambda s: str(coarse.encode(s)))
    default = checked(config)
    assert exact.canonical_states is not None
    assert len(exact.canonical_states) == default.exploration.states < exact.states
    exact_report = checked(replace(config, exact=True))
    assert exact_report.exploration.states == exact.states
    assert [(v.name, v.holds) for v in exact_report.verdicts] == [
        (v.name, v.holds) for v in default.verdicts]


def test_the_message_layer_adds_no_decision_state() -> None:
    """What the message layer adds (heartbeats over old seqs, duplicates, stale results) is
    ignored or moves only a worker's reported seq: the seq-free state space is the same with and
    without it, while the transitions (the re-deliveries) are many more."""
    p0 = checked(Config(workers=2, max_retry=1, seq_bound=3))
    p1 = checked(Config(workers=2, max_retry=1, seq_bound=3, message_layer=True))
    assert p1.exploration.states == p0.exploration.states
    # (first deliveries grew with the slow-rank and B5 events: the re-deliveries still add
    # more than half as many transitions again)
    assert 2 * p1.exploration.transitions > 3 * p0.exploration.transitions


def test_dump_refuses_symmetry() -> None:
    with pytest.raises(ValueError, match="symmetry"):
        verify(Config(workers=2, max_retry=1, symmetry=True), dump=True)


# --------------------------------------------------------------------------- canonical dump


def test_canonical_line_of_the_initial_state() -> None:
    assert canonical(Config(workers=2, max_retry=1).initial()) == (
        "phase=Pending shouldQuit=FALSE recoverCount=0 seq=0 inner=<<Pending,Pending>> "
        "finished=<<FALSE,FALSE>> retries=<<0,0>> wseq=<<0,0>> restarting=<<FALSE,FALSE>> "
        "exit=<<none,none>> flaps=<<0,0>> hanging=<<FALSE,FALSE>> waiting=<<FALSE,FALSE>> "
        "failures=<<0,0>> cause=<<none,none>> sig=<<FALSE,FALSE>> slow=<<FALSE,FALSE>> "
              "blame=-1 culprit=-1")


def test_dump_is_deterministic_sorted_and_unique() -> None:
    config = Config(workers=2, max_retry=1, seq_bound=3)
    first = checked(config, dump=True).dump()
    second = verify(config, dump=True).dump()
    assert first == second
    assert first == sorted(set(first))
    assert canonical(config.initial()) in first
    assert all(line.startswith("phase=") for line in first)
    # the projection merges concrete states (incarnations, which results answer which seq...
    # are not in the line) ...
    assert len(first) < verify(replace(config, exact=True)).exploration.states
    # ... but keeps the worker seqs the default key drops: more lines than default states
    assert len(first) > verify(config).exploration.states


# --------------------------------------------------------------------------- CLI


def test_cli_exit_code_zero_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--workers", "2", "--max-retry", "1", "--seq-bound", "2"]) == 0
    out = capsys.readouterr().out
    assert "distinct states" in out and "NoEndlessRecovery" in out and "OK" in out


def test_cli_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", "--workers", "2", "--max-retry", "1", "--seq-bound", "2",
                 "--message-layer", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"config", "states", "transitions", "max_depth", "cut_edges", "seconds",
                         "states_per_second", "properties", "ok", "exit_code"}
    assert data["config"]["message_layer"] is True and data["config"]["seq_bound"] == 2
    assert set(data["properties"]) == ALL_PROPERTIES
    assert all(p["holds"] is True and p["trace"] is None for p in data["properties"].values())
    assert data["ok"] is True and data["exit_code"] == 0


def test_cli_state_limit_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--workers", "2", "--max-retry", "1", "--max-states", "50"]) == 2
    out = capsys.readouterr().out
    assert "STATE LIMIT" in out and "UNKNOWN" in out


def test_cli_dump_with_symmetry_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "states.txt"
    assert main(["verify", "--workers", "2", "--symmetry", "--dump", str(target)]) == 2
    assert "--symmetry" in capsys.readouterr().err
    assert not target.exists()


def test_cli_dump_writes_sorted_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "states.txt"
    assert main(["verify", "--workers", "2", "--max-retry", "1", "--seq-bound", "2",
                 "--dump", str(target)]) == 0
    lines = target.read_text(encoding="utf-8").splitlines()
    assert lines == sorted(set(lines)) and len(lines) > 10
    assert f"{len(lines):,} canonical states" in capsys.readouterr().out


def test_cli_json_reports_a_violation_with_exit_1(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import aegis_flow.master.machine as machine

    monkeypatch.setattr(machine, "_is_stale", lambda status, seq: False)
    code = main(["verify", "--workers", "2", "--max-retry", "1", "--seq-bound", "2",
                 "--message-layer", "--json"])
    assert code == 1
    prop = json.loads(capsys.readouterr().out)["properties"]["StaleFinishRejected"]
    assert prop["holds"] is False and prop["trace"][-1]["kind"] == "stale"


# --------------------------------------------------------------------------- graph helpers


def test_cycle_finder_is_iterative_and_exact() -> None:
    from array import array

    from aegis_flow.verify.properties import _find_cycle

    def edges(pairs: list[tuple[int, int]]) -> tuple[array[int], array[int]]:
        return array("i", [a for a, _ in pairs]), array("i", [b for _, b in pairs])

    assert _find_cycle(5, *edges([(0, 1), (1, 2), (0, 2), (2, 3)])) is None
    assert _find_cycle(6, *edges([(0, 1), (1, 2), (2, 3), (3, 1), (3, 4)])) == [1, 2, 3, 1]
    n = 20_000  # a long chain closing on itself: recursion would overflow the stack
    cycle = _find_cycle(n, *edges([(i, (i + 1) % n) for i in range(n)]))
    assert cycle is not None and cycle[0] == cycle[-1] == 0 and len(cycle) == n + 1


def test_cli_symmetry_is_on_by_default_and_off_for_dumps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["verify", "--workers", "2", "--max-retry", "1", "--seq-bound", "2", "--json"]
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["config"]["symmetry"] is True
    assert main([*base, "--no-symmetry"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["config"]["symmetry"] is False
    assert main([*base, "--dump", str(tmp_path / "s.txt")]) == 0
    dumped = json.loads(capsys.readouterr().out)
    assert dumped["config"]["symmetry"] is False and dumped["config"]["exact"] is True
    assert dumped["states"] > plain["states"]  # a dump keys by the exact state: more of them


# --------------------------------------------------------------------------- the policy's state


def test_the_environment_offers_every_cause_and_the_late_evidence() -> None:
    config = Config(workers=3, max_retry=2)
    s = config.initial()
    for event in (Ack(0, "0"), Ack(1, "0"), Ack(2, "0"), Finish(0, 1, True), Finish(1, 1, True),
                  Finish(2, 1, True)):
        s, _ = step(s, event)
    assert s.phase is Phase.RUNCOMMAND
    offered = events(s, message_layer=False)
    errors = {(e.code, e.klass, e.signature) for _, e in offered
              if isinstance(e, Error) and e.rank == 0}
    assert errors == {("", None, ""), ("", None, "E@1"), ("cuda_error", CauseClass.CONTAINER, ""),
                      ("ecc_error", CauseClass.HARDWARE, ""),
                      ("connection_reset", CauseClass.TRANSIENT, "")}
    hangs = {(type(e).__name__, e.waiting, k) for k, e in offered
             if isinstance(e, Hang | HangWithQuit) and e.rank == 0}
    assert hangs == {("Hang", False, Kind.NORMAL), ("Hang", True, Kind.SYMPTOM),
                     ("HangWithQuit", False, Kind.NORMAL), ("HangWithQuit", True, Kind.SYMPTOM)}
    assert all(k is Kind.SYMPTOM for k, e in offered
               if isinstance(e, Error) and e.code in SYMPTOM_CODES)
    assert not any(e.seq != s.seq for _, e in offered if isinstance(e, Error))  # no suspect yet
    # rank 0 sees a connection reset: T5s, it is the suspect; ranks 1 and 2 may report late
    run = s.seq
    s, _ = step(s, Error(0, run, "connection_reset", code="connection_reset",
                         klass=CauseClass.TRANSIENT))
    assert s.phase is Phase.TROUBLESHOOTING and s.blame == 0 and s.run_seq == run < s.seq
    late = [(k, e) for k, e in events(s, message_layer=False)
            if isinstance(e, Error | HangWithQuit) and e.seq == run]
    assert {e.rank for _, e in late} == {1, 2}
    assert {k for k, e in late if isinstance(e, Error) and e.code == "cuda_error"} == {
        Kind.NORMAL}
    # rank 1's late report settles the blame (B2): no more late evidence is offered
    s, _ = step(s, Error(1, run, "error"))
    assert s.blame < 0 and s.culprit == 1 and s.retries == (0, 1, 0)
    assert not any(e.seq == run for k, e in events(s, message_layer=True)
                   if isinstance(e, Error | HangWithQuit) and k in FIRST)


def test_the_policy_properties_are_reported_with_their_kinds() -> None:
    report = checked(Config(workers=2, max_retry=2, seq_bound=4))
    kinds = {v.name: v.kind for v in report.verdicts}
    assert kinds["BlameIsEvidence"] == kinds["OrdersAreStable"] == "transition"
    assert kinds["FlakyRankRecovers"] == kinds["NoEndlessReplacement"] == "liveness"
    # the cooperative closure is followed beyond the seq bound (rounds after a replacement)
    note = report.verdict("FlakyRankRecovers").note
    deepest = int(note.rsplit("seq up to ", 1)[1].rstrip(")"))
    assert deepest > report.config.seq_bound
    assert report.exploration.replacements  # policy-ordered replacements were met


class _RunSeqAlwaysKept(Encoder):
    """The explorer's key with ``run_seq`` (and which results answer it) kept even without a
    suspect: the finer key the default one must agree with."""

    def pod_code(self, pod: PodInfo, status: Status) -> int:
        run = status.run_seq
        return self._intern((super().pod_code(pod, status), pod.finish_seq == run,
                             pod.error_seq == run))

    def key(self, status: Status, codes: Sequence[int]) -> int:
        return self._join((status.run_seq, super().key(status, codes)), codes)


def test_forgetting_run_seq_without_a_suspect_merges_exactly_those_states(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_seq`` is read only while a suspect is pending, and entering RunCommand — the only
    place a suspect is named — overwrites it: the default key forgets it otherwise. Exactness,
    shown on a concrete run: the exploration with the finer key, re-keyed with the default one,
    has exactly the default exploration's states, and the same verdicts."""
    import aegis_flow.verify.explorer as explorer_module

    config = Config(workers=2, max_retry=2, seq_bound=4)
    default = checked(config)
    coarse = Encoder(symmetry=False, exact=False)
    monkeypatch.setattr(explorer_module, "Encoder", _RunSeqAlwaysKept)
    fine = verify(config)
    lines = explore(replace(config, exact=True), dump=True,
                    project=lambda s: str(coarse.encode(s)))
    assert fine.exploration.states > default.exploration.states
    assert lines.canonical_states is not None
    assert len(lines.canonical_states) == default.exploration.states
    assert [(v.name, v.holds) for v in fine.verdicts] == [
        (v.name, v.holds) for v in default.verdicts]


def test_symmetry_merges_exactly_the_permutations() -> None:
    """Symmetry reduction is exact only if ``step`` treats ranks alike. It nearly does: the one
    rank-order tie-break (T14 with two ranks marked hung: the lower rank is charged) never
    separates two permutations within this bound. Shown concretely: the unreduced exploration's
    states fall into exactly as many classes as the symmetric exploration finds."""
    config = Config(workers=3, max_retry=1, seq_bound=3)
    sym = Encoder(symmetry=True, exact=False)
    classes: set[int] = set()
    plain = explore(config, invariants=[("collect", lambda s: classes.add(sym.encode(s)) or True)])
    reduced = checked(replace(config, symmetry=True))
    assert plain.states > 4 * reduced.exploration.states
    assert len(classes) == reduced.exploration.states


def _explored_statuses(config: Config) -> list[Status]:
    seen: list[Status] = []
    explore(config, invariants=[("collect", lambda s: seen.append(s) or True)])
    return seen


def test_every_explored_status_round_trips_through_the_store() -> None:
    """OrdersAreStable's other half: a restarted master re-sends from the status it loads, so
    the stored document must give back exactly the status that was saved."""
    from aegis_flow.master.store import decode_doc, encode_doc

    statuses = _explored_statuses(Config(workers=2, max_retry=2, seq_bound=4, exact=True))
    assert len(statuses) > 1000
    assert any(s.blame >= 0 for s in statuses) and any(s.signature for st in statuses
                                                        for s in st.workers)
    for status in statuses:
        assert decode_doc(encode_doc(status))[0] == status


PODS = st.builds(
    PodInfo, rank=st.integers(0, 3), phase=st.sampled_from(Phase), finished=st.booleans(),
    retries=st.integers(0, 5), restarting=st.booleans(),
    incarnation=st.none() | st.text(min_size=1, max_size=8), last_reason=st.text(max_size=20),
    node=st.text(max_size=8), seq=st.integers(0, 50), finish_seq=st.integers(-1, 50),
    error_seq=st.integers(-1, 50), flaps=st.integers(0, 5), hanging=st.booleans(),
    waiting=st.booleans(), exit_code=st.none() | st.sampled_from(ExitCode),
    failures=st.integers(0, 5), cause=st.text(max_size=20),
    cause_class=st.none() | st.sampled_from(CauseClass), signature=st.text(max_size=20))


@given(pods=st.lists(PODS, min_size=1, max_size=4), blame=st.integers(-1, 3),
       culprit=st.integers(-1, 3), plan=st.lists(st.sampled_from([c.value for c in Check])),
       epoch=st.integers(0, 9), run_seq=st.integers(-1, 50), replaced=st.booleans(),
       sent_at=st.floats(0, 1e10), failure=st.text(max_size=30),
       nodes=st.frozensets(st.text(max_size=6), max_size=3))
@settings(max_examples=200, deadline=None)
def test_any_status_round_trips_through_the_store(
        pods: list[PodInfo], blame: int, culprit: int, plan: list[str], epoch: int,
        run_seq: int, replaced: bool, sent_at: float, failure: str,
        nodes: frozenset[str]) -> None:
    from aegis_flow.master.store import decode_doc, encode_doc

    status = replace(initial_status(len(pods), 2), workers=tuple(pods), blame=blame,
                     culprit=culprit, plan=tuple(plan), epoch=epoch, run_seq=run_seq,
                     replaced=replaced, sent_at=sent_at, failure=failure, error_nodes=nodes)
    assert decode_doc(encode_doc(status))[0] == status
