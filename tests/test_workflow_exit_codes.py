"""The exit-code contract (docs/exit-codes.md): for each way a worker pod can end, whether the
retry expression we generate recreates it; for each way the master pod can end, whether it is
recreated; and for each decision of the master, which branches' ``when`` guards hold —
evaluated by substituting into the expression strings we generate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aegis_flow import phases
from aegis_flow.argo.expr import evaluate, substitute
from aegis_flow.jobspec import JobSpec
from aegis_flow.master.model import ExitCode
from aegis_flow.templates import contract
from aegis_flow.workflow import render

WF = render(JobSpec(image="img:1", command=("python", "train.py"), workers=3, max_retry=3))
TEMPLATES = {t["name"]: t for t in WF["spec"]["templates"]}
MAIN = {s["name"]: s for g in TEMPLATES["main"]["steps"] for s in g}
BRANCHES = ("quarantine", "give-up")
DOC = Path(__file__).resolve().parent.parent / "docs" / "exit-codes.md"
LOST = "lost"  # the pod vanished: Argo reports status Error and no exit code


def pod_retried(template: str, code: int | str) -> bool:
    status = "Error" if code == LOST else "Failed"
    exit_code = "-1" if code == LOST else str(code)
    return evaluate(TEMPLATES[template]["retryStrategy"]["expression"],
                    {"lastRetry": {"status": status, "exitCode": exit_code}})


def branches(verdict: str, quarantined: list[str], master: str = "Succeeded") -> set[str]:
    """The branches that run after the master step ended ``master`` with this decision."""
    values = {"steps.master.status": master,
              "steps.master.outputs.parameters.verdict": verdict,
              "steps.master.outputs.parameters.quarantined": json.dumps(quarantined)}
    out = set()
    for b in BRANCHES:
        if "withParam" in MAIN[b] and not json.loads(substitute(MAIN[b]["withParam"], values)):
            continue
        if evaluate(substitute(MAIN[b]["when"], values)):
            out.add(b)
    return out


# worker exit code → (its pod recreated?, the outcome word it writes)
CONTRACT: dict[int | str, tuple[bool, str]] = {
    0: (False, "succeeded"),
    70: (True, "node-fault"),
    71: (True, "container-restart"),
    72: (True, "slow-node"),
    73: (False, "job-failed"),
    74: (False, "stopped"),
    1: (False, "failed"),  # RunIndependent: the child's code
    137: (False, "failed"),
    LOST: (True, contract.UNKNOWN),
}


def test_every_exit_code_is_in_the_contract() -> None:
    assert {int(c) for c in ExitCode} <= set(CONTRACT)
    assert all(70 <= int(c) <= 79 for c in ExitCode)


@pytest.mark.parametrize("code", list(CONTRACT), ids=str)
def test_the_pod_each_ending_leaves(code: int | str) -> None:
    worker, outcome = CONTRACT[code]
    assert pod_retried("worker", code) is worker
    if code != LOST:
        assert contract.outcome_of(int(code)) == outcome


@pytest.mark.parametrize(("code", "retried"), [
    (0, False), (1, True), (2, True), (3, True), (4, True), (5, True), (137, True),
    (LOST, True)], ids=str)
def test_the_master_is_recreated_unless_it_decided(code: int | str, retried: bool) -> None:
    """With --decision-dir the master exits 0 on every ending of the job; anything else is a
    master that did not decide (crash 1, conflict 2, NATS 4, damaged store 5, killed)."""
    assert pod_retried("master", code) is retried


@pytest.mark.parametrize(("verdict", "quarantined", "master", "expected"), [
    ("succeeded", [], "Succeeded", set()),
    ("succeeded", ["gpu-2"], "Succeeded", {"quarantine"}),
    ("failed", [], "Succeeded", {"give-up"}),
    ("failed", ["gpu-2"], "Succeeded", {"quarantine", "give-up"}),
    ("stopped", [], "Succeeded", {"give-up"}),
    ("independent", [], "Succeeded", {"give-up"}),
    ("undecided", [], "Failed", {"give-up"}),
    ("failed", ["gpu-2"], "Failed", {"give-up"}),  # a failed step's outputs are not read
])
def test_branches_each_decision_takes(verdict: str, quarantined: list[str], master: str,
                                      expected: set[str]) -> None:
    assert branches(verdict, quarantined, master) == expected
    assert expected == {s for s in BRANCHES if phases.taken(
        s, decided=master == "Succeeded", verdict=verdict, quarantined=bool(quarantined))}


def table(path: Path) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(r"\d+|other|lost", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_docs_table_matches_the_contract() -> None:
    rows = table(DOC)
    for code, (worker, outcome) in CONTRACT.items():
        key = "other" if code in (1, 137) else str(code)
        assert key in rows, f"docs/exit-codes.md has no row for {key}"
        cells = rows[key]
        assert cells[1] == outcome, (key, cells)
        assert cells[2].startswith("yes" if worker else "no"), (key, cells)


def test_evaluator_refuses_what_we_never_generate() -> None:
    with pytest.raises(ValueError):
        evaluate("__import__('os').system('true')")
    with pytest.raises(ValueError):
        evaluate("[1][0] == 1")
