"""The model checker over the real master.machine.step: verdicts, dumps, symmetry and the CLI.

Sizes are chosen so the whole file runs in seconds; docs/verification.md has the large runs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from aegis_flow.cli import main
from aegis_flow.master.machine import (
    Ack,
    Error,
    Finish,
    Hang,
    HangWithQuit,
    Phase,
    Stop,
    step,
)
from aegis_flow.verify import Config, Kind, Report, canonical, events, verify
from aegis_flow.verify.explorer import Encoder, explore
from aegis_flow.verify.report import PROPERTY_NAMES, render_text

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
        pytest.param(Config(workers=3, max_retry=2, message_layer=True, seq_bound=4,
                            symmetry=True), id="P1-W3-R2-seq4"),
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
    assert kinds == {Kind.NORMAL, Kind.HEARTBEAT, Kind.DUPLICATE, Kind.STALE, Kind.STOP}
    assert {kind for kind, _ in events(s, message_layer=False)} == {Kind.NORMAL, Kind.STOP}


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
    assert p1.exploration.transitions > 2 * p0.exploration.transitions


def test_dump_refuses_symmetry() -> None:
    with pytest.raises(ValueError, match="symmetry"):
        verify(Config(workers=2, max_retry=1, symmetry=True), dump=True)


# --------------------------------------------------------------------------- canonical dump


def test_canonical_line_of_the_initial_state() -> None:
    assert canonical(Config(workers=2, max_retry=1).initial()) == (
        "phase=Pending shouldQuit=FALSE recoverCount=0 seq=0 inner=<<Pending,Pending>> "
        "finished=<<FALSE,FALSE>> retries=<<0,0>> wseq=<<0,0>>")


def test_dump_is_deterministic_sorted_and_unique() -> None:
    config = Config(workers=2, max_retry=1, seq_bound=3)
    first = checked(config, dump=True).dump()
    second = verify(config, dump=True).dump()
    assert first == second
    assert first == sorted(set(first))
    assert canonical(config.initial()) in first
    assert all(line.startswith("phase=") for line in first)
    # the projection merges states (incarnations, flaps... are not shared with TLA+)
    assert len(first) < verify(config).exploration.states


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
