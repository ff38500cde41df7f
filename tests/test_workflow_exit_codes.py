"""The exit-code contract (docs/exit-codes.md): for each way a worker pod can end, which retry
expression and which ``when`` guards of the rendered workflow hold — evaluated by
substituting the outcome into the expression strings we generate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aegis_flow.argo.expr import evaluate, substitute
from aegis_flow.jobspec import JobSpec
from aegis_flow.master.model import ExitCode
from aegis_flow.templates import contract
from aegis_flow.workflow import render

MAX_RETRY = 3
WF = render(JobSpec(image="img:1", command=("python", "train.py"), workers=3,
                    max_retry=MAX_RETRY))
TEMPLATES = {t["name"]: t for t in WF["spec"]["templates"]}
ATTEMPT = {s["name"]: s for g in TEMPLATES["attempt"]["steps"] for s in g}
BRANCHES = ("troubleshoot", "quarantine", "resume", "give-up")
DOC = Path(__file__).resolve().parent.parent / "docs" / "exit-codes.md"
LOST = "lost"  # the pod vanished: Argo reports status Error and no exit code


def pod_retried(template: str, code: int | str) -> bool:
    status = "Error" if code == LOST else "Failed"
    exit_code = "-1" if code == LOST else str(code)
    return evaluate(TEMPLATES[template]["retryStrategy"]["expression"],
                    {"lastRetry": {"status": status, "exitCode": exit_code}})


def branches(outcome: str, attempt: int) -> set[str]:
    """The attempt's branches that run when one rank ends with ``outcome`` (others succeed)."""
    v = contract.verdict(["succeeded", outcome, "succeeded"], ["n0", "n1", "n2"], [])
    values = {"steps.verdict.outputs.parameters.verdict": v["verdict"],
              "inputs.parameters.attempt": str(attempt),
              "workflow.parameters.max-retry": str(MAX_RETRY)}
    return {b for b in BRANCHES if evaluate(substitute(ATTEMPT[b]["when"], values))}


ESCALATE_Q = ({"troubleshoot", "quarantine", "resume"}, {"troubleshoot", "quarantine", "give-up"})
# code → (worker pod recreated?, master recreated?, outcome, branches at attempt 0, at max-retry)
CONTRACT: dict[int | str, tuple[bool, bool, str, set[str], set[str]]] = {
    0: (False, False, "succeeded", set(), set()),
    70: (True, True, "node-fault", *ESCALATE_Q),
    71: (True, True, "container-restart", {"resume"}, {"give-up"}),
    72: (False, True, "slow-node", *ESCALATE_Q),
    73: (False, False, "job-failed", {"give-up"}, {"give-up"}),
    74: (False, False, "stopped", {"give-up"}, {"give-up"}),
    1: (False, True, "failed", {"resume"}, {"give-up"}),  # RunIndependent: the child's code
    137: (False, True, "failed", {"resume"}, {"give-up"}),
    LOST: (True, True, contract.UNKNOWN, {"resume"}, {"give-up"}),
}


def test_every_exit_code_is_in_the_contract() -> None:
    assert {int(c) for c in ExitCode} <= set(CONTRACT)
    assert all(70 <= int(c) <= 79 for c in ExitCode)


@pytest.mark.parametrize("code", list(CONTRACT), ids=str)
def test_branch_each_ending_drives(code: int | str) -> None:
    worker, master, outcome, first, last = CONTRACT[code]
    assert pod_retried("worker", code) is worker
    assert pod_retried("master", code) is master
    if code != LOST:
        assert contract.outcome_of(int(code)) == outcome
    assert branches(outcome, 0) == first
    assert branches(outcome, MAX_RETRY) == last


def test_resume_and_give_up_never_both_hold() -> None:
    for outcome in [*contract.OUTCOME_BY_CODE.values(), "failed", contract.UNKNOWN]:
        for attempt in range(MAX_RETRY + 1):
            assert not {"resume", "give-up"} <= branches(outcome, attempt)


def table(path: Path) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(r"\d+|other|lost", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_docs_table_matches_the_contract() -> None:
    rows = table(DOC)
    for code, (worker, _, outcome, first, _last) in CONTRACT.items():
        key = "other" if code in (1, 137) else str(code)
        assert key in rows, f"docs/exit-codes.md has no row for {key}"
        cells = rows[key]
        assert cells[1] == outcome, (key, cells)
        assert cells[2].startswith("yes" if worker else "no"), (key, cells)
        assert set(re.findall(r"[a-z-]+", cells[3])) & set(BRANCHES) == first or (
            not first and cells[3].startswith("none")), (key, cells)


def test_evaluator_refuses_what_we_never_generate() -> None:
    with pytest.raises(ValueError):
        evaluate("__import__('os').system('true')")
    with pytest.raises(ValueError):
        evaluate("[1][0] == 1")
