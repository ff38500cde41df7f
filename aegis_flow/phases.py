"""The phase graph: one definition of the phases of a job, the master's ending, and the
branches Argo takes on it.

Both backends follow it. The Argo builder (``workflow.main_template``) takes the job's steps,
in order, and every branch step's ``when`` guard from here; the local backend names its phases
with it (``aegis-flow status`` shows the step a master phase belongs to), and
``tests/test_phase_graph.py`` drives the real master state machine and the rendered workflow
through the same scenarios and checks that both walk the same path through this graph.

The shape (DESIGN.md §5, as redesigned against Argo's controller rules)::

    master-service ∥ bootstrap-token   a Service named after the workflow, owned by it: the
                                       master's address for as long as the workflow lives;
                                       the workflow's own bootstrap token, in a Secret it owns
    master ∥ run                       the master (one pod at a time, recreated if it dies,
                                       resuming from its stored status) beside one pod per
                                       rank; the master leads bootcheck, every in-place
                                       recovery, container restarts and node moves inside run
    ending = the master's decision ─┬─ succeeded                          → end
                                    ├─ nodes quarantined                  → quarantine ×node
                                    └─ failed | stopped | independent,
                                       or the master did not decide       → give-up

Every branch reads the master's decision: the output parameters of the master step, which
ends Succeeded whenever it decided (whatever the job's ending), never the outputs of a failed
step (Argo drops those from aggregates: review B1).

PURE: data and functions over it (standard library and the core's data only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aegis_flow.master.model import Phase, Status

# the master's decision at the end of a job (``ending``); give-up takes every one but the first
SUCCEEDED, FAILED, STOPPED, INDEPENDENT = "succeeded", "failed", "stopped", "independent"
VERDICTS = (SUCCEEDED, FAILED, STOPPED, INDEPENDENT)
UNDECIDED = "undecided"  # the master step did not succeed: no decision to read


@dataclass(frozen=True)
class PhaseStep:
    """One step of the job as the Argo UI shows it, and what it is locally."""

    name: str
    local: tuple[Phase, ...] = ()  # the master phases that are this step when run locally
    fan_out: str = ""  # "ranks": one pod per rank; "nodes": one per quarantined node
    branch: bool = False  # taken or skipped on the master's decision (see ``taken``)
    beside: str = ""  # runs in the same step group as this step (in parallel)


JOB: tuple[PhaseStep, ...] = (
    PhaseStep("master-service"),
    PhaseStep("bootstrap-token", beside="master-service"),
    PhaseStep("master"),
    PhaseStep("run", (Phase.PENDING, Phase.BOOTCHECKING, Phase.RUNCOMMAND,
                      Phase.TROUBLESHOOTING, Phase.RESTARTING), fan_out="ranks",
              beside="master"),
    PhaseStep("quarantine", fan_out="nodes", branch=True),
    PhaseStep("give-up", (Phase.FAILED,), branch=True),
)

# where a job ends: Succeed with no step after run, Failed in give-up
END_OF = {Phase.SUCCEED: SUCCEEDED, Phase.FAILED: "give-up"}


@dataclass(frozen=True)
class Ending:
    """The master's decision, as the master step's output parameters carry it."""

    verdict: str
    quarantined: tuple[str, ...]
    message: str

    def outputs(self) -> dict[str, str]:
        return {"verdict": self.verdict, "quarantined": json.dumps(list(self.quarantined)),
                "message": self.message}


def ending(status: Status, summary: str) -> Ending:
    """The decision of a master whose job has ended (``status.phase`` terminal)."""
    if status.phase is Phase.SUCCEED:
        verdict = SUCCEEDED
    elif status.phase is Phase.INDEPENDENT:
        verdict = INDEPENDENT
    elif status.phase is Phase.FAILED:
        verdict = STOPPED if status.stop_reason else FAILED
    else:
        raise ValueError(f"the job has not ended (phase {status.phase.value})")
    return Ending(verdict, tuple(sorted(status.error_nodes)), summary)


def step_names() -> list[str]:
    return [s.name for s in JOB]


def groups() -> list[list[str]]:
    """The steps in their step groups (a step ``beside`` another joins its group)."""
    out: list[list[str]] = []
    for s in JOB:
        if s.beside and out and s.beside in out[-1]:
            out[-1].append(s.name)
        else:
            out.append([s.name])
    return out


def step_of(phase: Phase) -> str:
    """The job step a master phase belongs to (Succeed: the ``succeeded`` end)."""
    if phase is Phase.SUCCEED:
        return SUCCEEDED
    for s in JOB:
        if phase in s.local:
            return s.name
    return str(phase.value).lower()  # Independent: no workflow step (fault tolerance off)


def taken(step: str, *, decided: bool, verdict: str, quarantined: bool) -> bool:
    """Does branch ``step`` run, given whether the master decided and what?"""
    if step == "quarantine":
        return decided and quarantined
    if step == "give-up":
        return not decided or verdict != SUCCEEDED
    raise ValueError(f"step {step!r} is not a branch of the phase graph")


def walk(verdict: str, *, quarantined: bool = False, decided: bool = True) -> list[str]:
    """The steps a job runs when its master ends with ``verdict`` (pure)."""
    if decided and verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}: one of {VERDICTS}")
    path = [s.name for s in JOB if not s.branch]
    path += [s.name for s in JOB if s.branch and taken(
        s.name, decided=decided, verdict=verdict, quarantined=quarantined)]
    return path + ([SUCCEEDED] if decided and verdict == SUCCEEDED else [])


def guard(step: str, status_ref: str, verdict_ref: str) -> str:
    """The Argo ``when`` expression of branch ``step`` (govaluate syntax), from the master
    step's status and its decision. (``quarantine`` is also fanned out over the decision's
    node list, so an empty list skips it before its guard is read.)"""
    decided = f"'{status_ref}' == 'Succeeded'"
    if step == "quarantine":
        return decided
    if step == "give-up":  # short: Argo shows it, substituted, as the skipped node's message
        return f"'{status_ref}' != 'Succeeded' || '{verdict_ref}' != '{SUCCEEDED}'"
    raise ValueError(f"step {step!r} has no branch in the phase graph")
