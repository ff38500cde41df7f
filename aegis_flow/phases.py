"""The phase graph: one definition of the phases of a job and the branches between them.

Both backends follow it. The Argo builder (``workflow.attempt_template``) takes the attempt's
steps, in order, and every step's ``when`` guard from here; the local backend names its
phases with it (``aegis-flow status`` shows the step a master phase belongs to), and
``tests/test_phase_graph.py`` drives the real master state machine and the rendered workflow
through the same scenarios and checks that both walk the same path through this graph.

The shape (DESIGN.md §5)::

    master (daemon, spans every attempt)
    attempt:  bootcheck → run → verdict ─┬─ succeeded                      → end
                                         ├─ failed | stopped               → give-up
                                         ├─ quarantine → troubleshoot → quarantine ─┐
                                         └─ retry ──────────────────────────────────┤
                                             attempt < max-retry → resume (= attempt+1)
                                             otherwise           → give-up

Recovery inside an attempt — restart in place (L1), restart a container or move one pod (L2,
L3 with the pod's retryStrategy) — happens inside ``run``: the master leads it while the
worker pods stay up, which locally are the master's Troubleshooting and Restarting phases.

PURE: data and functions over it (standard library and the core's ``Phase`` only).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aegis_flow.master.model import Phase

# the verdicts of one attempt (contract.verdict reduces the pods' outcomes to one of these)
SUCCEEDED, FAILED, STOPPED, QUARANTINE, RETRY = (
    "succeeded", "failed", "stopped", "quarantine", "retry")
VERDICTS = (SUCCEEDED, FAILED, STOPPED, QUARANTINE, RETRY)
ESCALATE = (QUARANTINE, RETRY)


class Retries(enum.Enum):
    """Whether a branch needs retries left (``attempt < max-retry``)."""

    ANY = "any"
    LEFT = "left"
    EXHAUSTED = "exhausted"


@dataclass(frozen=True)
class Branch:
    """Take ``step`` when the attempt's verdict is one of ``verdicts`` (and ``retries``)."""

    step: str
    verdicts: tuple[str, ...]
    retries: Retries = Retries.ANY


@dataclass(frozen=True)
class PhaseStep:
    """One step of the attempt as the Argo UI shows it, and what it is locally."""

    name: str
    local: tuple[Phase, ...] = ()  # the master phases that are this step when run locally
    fan_out: str = ""  # "ranks": one pod per rank; "bad-nodes": one per node to quarantine
    after_verdict: bool = False  # guarded by the verdict (see BRANCHES)


ATTEMPT: tuple[PhaseStep, ...] = (
    PhaseStep("bootcheck", (Phase.PENDING, Phase.BOOTCHECKING), fan_out="ranks"),
    PhaseStep("run", (Phase.RUNCOMMAND, Phase.TROUBLESHOOTING, Phase.RESTARTING),
              fan_out="ranks"),
    PhaseStep("verdict"),
    PhaseStep("troubleshoot", fan_out="bad-nodes", after_verdict=True),
    PhaseStep("quarantine", fan_out="bad-nodes", after_verdict=True),
    PhaseStep("resume", after_verdict=True),
    PhaseStep("give-up", (Phase.FAILED,), after_verdict=True),
)

BRANCHES: tuple[Branch, ...] = (
    Branch("troubleshoot", (QUARANTINE,)),
    Branch("quarantine", (QUARANTINE,)),
    Branch("resume", ESCALATE, Retries.LEFT),
    Branch("give-up", (FAILED, STOPPED)),
    Branch("give-up", ESCALATE, Retries.EXHAUSTED),
)

# where a job ends: Succeed after a succeeded verdict (no step), Failed in give-up
END_OF = {Phase.SUCCEED: SUCCEEDED, Phase.FAILED: "give-up"}


def step_names() -> list[str]:
    return [s.name for s in ATTEMPT]


def branches_to(step: str) -> list[Branch]:
    return [b for b in BRANCHES if b.step == step]


def step_of(phase: Phase) -> str:
    """The attempt step a master phase belongs to (Succeed: the ``succeeded`` end)."""
    if phase is Phase.SUCCEED:
        return SUCCEEDED
    for s in ATTEMPT:
        if phase in s.local:
            return s.name
    return str(phase.value).lower()  # Independent: no workflow step (fault tolerance off)


def taken(step: str, verdict: str, *, attempt: int, max_retry: int) -> bool:
    """Does ``step`` run after an attempt that ended with ``verdict``?"""
    for b in branches_to(step):
        left = attempt < max_retry
        if verdict in b.verdicts and (b.retries is Retries.ANY or
                                      (b.retries is Retries.LEFT) == left):
            return True
    return False


def walk(verdicts: list[str], *, max_retry: int) -> list[str]:
    """The steps a job runs when its attempts end with ``verdicts`` in turn (pure).

    Stops at the first verdict that ends the job; raises ``ValueError`` when the verdicts
    go on after the job has ended or end before it has.
    """
    path: list[str] = []
    for attempt, verdict in enumerate(verdicts):
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}: one of {VERDICTS}")
        path += [s.name for s in ATTEMPT if not s.after_verdict]
        after = [s.name for s in ATTEMPT if s.after_verdict and taken(
            s.name, verdict, attempt=attempt, max_retry=max_retry)]
        path += after
        if "resume" not in after:
            if attempt != len(verdicts) - 1:
                raise ValueError(f"the job ended after attempt {attempt}; "
                                 f"{len(verdicts) - attempt - 1} verdicts left over")
            return path + ([SUCCEEDED] if verdict == SUCCEEDED else [])
    raise ValueError("the verdicts end with a resume: the job has not ended")


def guard(step: str, verdict_ref: str, attempt_ref: str, max_retry_ref: str) -> str:
    """The Argo ``when`` expression of ``step``: its branches, or-ed (expr syntax)."""
    terms = []
    for b in branches_to(step):
        words = " || ".join(f"'{verdict_ref}' == '{v}'" for v in b.verdicts)
        if b.retries is Retries.ANY:
            terms.append(words)
            continue
        op = "<" if b.retries is Retries.LEFT else ">="
        terms.append(f"({words}) && {attempt_ref} {op} {max_retry_ref}")
    if not terms:
        raise ValueError(f"step {step!r} has no branch in the phase graph")
    return terms[0] if len(terms) == 1 else " || ".join(f"({t})" for t in terms)
