"""The TLA+ spec and ``machine.step`` reach the same states (projected onto shared variables).

TLC enumerates the spec (``-dump``), the Python checker explores the real ``step``; the sets
of canonical lines must be equal. A patched ``step`` (one transition changed) must make the
comparison fail and name the first differing state with a shortest trace to it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import aegis_flow.master.machine as machine
from aegis_flow.master.machine import Phase, PodInfo, Status
from aegis_flow.verify.conformance import (
    Comparison,
    code_states,
    code_trace,
    compare,
    config_from_cfg,
    line_to_tla,
    render_comparison,
    spec_states,
)
from aegis_flow.verify.explorer import Config
from aegis_flow.verify.tlc import SPEC_DIR

#: P0 without symmetry at a size both tools enumerate in seconds.
P0_SMALL = Config(workers=2, max_retry=1, message_layer=False, seq_bound=4,
                  symmetry=False)


@pytest.fixture(scope="module")
def p0_spec_lines() -> list[str]:
    """TLC's projected states of the small P0 model."""
    lines, result = spec_states(P0_SMALL, timeout=600)
    assert result.ok and result.distinct is not None, result.output[-3000:]
    print(f"spec P0 W2 R1: {result.distinct:,} distinct states, {len(lines):,} projected, "
          f"{result.seconds:.1f} s")
    return lines


def test_p0_spec_and_code_reach_the_same_states(p0_spec_lines: list[str]) -> None:
    cmp = Comparison(P0_SMALL, p0_spec_lines, code_states(P0_SMALL))
    assert cmp.equal, render_comparison(cmp)
    assert any(line.startswith("phase=Succeed") for line in p0_spec_lines)
    assert any("phase=Failed" in line and "recoverCount=2" in line for line in p0_spec_lines)
    assert any(line.startswith("phase=Independent") for line in p0_spec_lines)
    # the policy's variables are really compared: every cause kind, a suspect, a culprit,
    # a repeated signature, escalation by failures
    for word in ("error", "container", "hardware", "hang", "symptom"):
        assert any(f"cause=<<{word}," in line for line in p0_spec_lines), word
    assert any(" blame=0 " in line for line in p0_spec_lines)
    assert any(line.endswith(" culprit=1") for line in p0_spec_lines)
    assert any("sig=<<TRUE," in line for line in p0_spec_lines)
    assert any("failures=<<2," in line for line in p0_spec_lines)


def test_termination_holds_under_fairness() -> None:
    """Termination (every fair behaviour ends or reaches the seq bound) and NoDeadlock, under
    FairSpec, with the whole policy environment. MaxRetry = 0 keeps TLC's liveness check
    short (W=2 R=1 takes over a minute here); the counted failures then end the job at
    once, the policy's rounds (T5s, B2, B3, T10c, T16) are all still there."""
    config = replace(P0_SMALL, max_retry=0, resume=False)  # an operator: no liveness
    lines, result = spec_states(config, timeout=600, liveness=True)
    assert result.ok, result.output[-3000:]
    print(f"Termination W2 R0: {result.distinct:,} distinct states, {result.seconds:.1f} s")
    cmp = Comparison(config, lines, code_states(config))
    assert cmp.equal, render_comparison(cmp)


def test_p1_cfg_holds_and_matches_the_code_with_the_message_layer() -> None:
    """spec/P1.cfg itself: TLC finds no error, and its states are the Python checker's."""
    cfg_text = (SPEC_DIR / "P1.cfg").read_text()
    config = config_from_cfg(cfg_text)
    assert config.message_layer
    cmp = compare(config, cfg_text=cfg_text, timeout=900)
    assert cmp.spec_result is not None and cmp.spec_result.no_error
    assert cmp.spec_result.distinct is not None
    print(f"P1.cfg: {cmp.spec_result.distinct:,} distinct states, "
          f"{cmp.spec_result.seconds:.1f} s; {render_comparison(cmp)}")
    assert cmp.equal, render_comparison(cmp)


# --------------------------------------------------------------------------- it bites


def _t8_always_troubleshoots(status: Status, pod: PodInfo, *,
                             new_incarnation: bool) -> tuple[Status, list[object]]:
    """T8 changed: back from Restarting, always Troubleshooting — even if the command never
    ran (DESIGN.md: such a job must bootcheck). No invariant of the checker notices."""
    pod = machine.evolve(pod, restarting=False, exit_code=None)
    status = machine._set(status, pod)
    if any(p.restarting for p in status.workers):
        return status, []
    return machine._broadcast(status, Phase.TROUBLESHOOTING, "T8", "T8 (patched)")


def test_a_patched_step_makes_the_comparison_fail_with_the_differing_state(
        monkeypatch: pytest.MonkeyPatch, p0_spec_lines: list[str]) -> None:
    monkeypatch.setattr(machine, "_return_worker", _t8_always_troubleshoots)
    cmp = Comparison(P0_SMALL, p0_spec_lines, code_states(P0_SMALL))
    assert not cmp.equal
    assert cmp.only_in_code
    first = code_trace(P0_SMALL, set(cmp.only_in_code))
    assert first is not None
    cmp.differences.append(first)
    text = render_comparison(cmp)
    print(text)
    assert "DIFFERENT" in text and "first differing state" in text and first.line in text
    # the differing state: Troubleshooting before the command ever ran (nobody counted)
    assert first.line.startswith("phase=Troubleshooting") and "retries=<<0,0>>" in first.line
    assert first.line in cmp.only_in_code and first.line not in p0_spec_lines
    # a shortest trace from the initial state: bootcheck fails (T3), the worker returns (T8)
    assert first.trace[0].event == "(initial)"
    assert [r.line.split()[0] for r in first.trace[-3:]] == [
        "phase=BootChecking", "phase=Restarting", "phase=Troubleshooting"]
    assert all(line in p0_spec_lines for line in (r.line for r in first.trace[:-1]))


def test_a_spec_only_state_is_traced_by_tlc() -> None:
    """The other direction: a state only the spec reaches gets TLC's shortest trace."""
    from aegis_flow.verify.conformance import spec_trace

    target = ("phase=BootChecking shouldQuit=FALSE recoverCount=0 seq=1 "
              "inner=<<BootChecking,BootChecking>> finished=<<TRUE,FALSE>> "
              "retries=<<0,0>> wseq=<<1,0>> restarting=<<FALSE,FALSE>> exit=<<none,none>> "
              "flaps=<<0,0>> hanging=<<FALSE,FALSE>> waiting=<<FALSE,FALSE>> "
              "failures=<<0,0>> cause=<<none,none>> sig=<<FALSE,FALSE>> slow=<<FALSE,FALSE>> "
              "blame=-1 culprit=-1")
    assert line_to_tla(target).startswith('<<"BootChecking", FALSE, 0, 1, <<"BootChecking"')
    found = spec_trace(P0_SMALL, [target], timeout=600)
    assert found is not None and found.side == "spec" and found.line == target
    # Ack, Ack (T1), Finish: three steps from the initial state
    assert len(found.trace) == 4 and found.trace[0].line.startswith("phase=Pending")


def _new_node_keeps_its_history(pod: PodInfo, *, new_node: bool) -> PodInfo:
    """V3 changed: a rank moved to a new node keeps its failure count (its open cause is
    answered as before)."""
    return machine.evolve(pod, cause="", cause_class=None) if pod.cause else pod


def test_a_patched_policy_makes_the_comparison_fail(
        monkeypatch: pytest.MonkeyPatch, p0_spec_lines: list[str]) -> None:
    """A policy change no property of the Python checker objects to (a rank moved to a new
    node keeps its failure count: it only escalates sooner) is still a change: the spec's V3
    reaches states the patched code does not, and TLC gives the shortest way to one — a rank
    back from a node-fault exit with its history cleared."""
    from aegis_flow.master import policy
    from aegis_flow.verify import verify
    from aegis_flow.verify.conformance import spec_trace

    monkeypatch.setattr(policy, "answered", _new_node_keeps_its_history)
    assert verify(replace(P0_SMALL, symmetry=True)).ok  # the properties all hold
    code = set(code_states(P0_SMALL))
    only_spec = sorted(set(p0_spec_lines) - code)
    assert only_spec and code <= set(p0_spec_lines)
    found = spec_trace(P0_SMALL, only_spec, timeout=600)
    assert found is not None and found.side == "spec" and found.line in only_spec
    print("\n".join(f"{i:>3}  {r.line}" for i, r in enumerate(found.trace)))
    before, last = found.trace[-2].line, found.trace[-1].line
    assert "node-fault" in before and "failures=<<0," in last and "failures=<<0," not in before
