"""The outcome files the worker pod leaves for the workflow's guards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aegis_flow.outcome import NODE_NAME, OUTCOME_NAME, RESTARTS_NAME, outcome_of, write_outcome
from aegis_flow.templates import contract


@pytest.mark.parametrize(("code", "word"), [(0, "succeeded"), (70, "node-fault"),
                                            (71, "container-restart"), (73, "job-failed"),
                                            (1, "failed"), (137, "failed")])
def test_write_outcome_writes_the_word_and_node(tmp_path: Path, code: int, word: str) -> None:
    where = tmp_path / "deep" / "dir"  # created if missing
    assert write_outcome(str(where), code, "gpu-node-7") == word
    assert (where / OUTCOME_NAME).read_text() == word == outcome_of(code)
    assert (where / NODE_NAME).read_text() == "gpu-node-7"
    assert sorted(os.listdir(where)) == [NODE_NAME, OUTCOME_NAME, RESTARTS_NAME]  # no temporaries


def test_rewriting_replaces_the_word_whole(tmp_path: Path) -> None:
    write_outcome(str(tmp_path), 71, "n1")
    write_outcome(str(tmp_path), 0, "n2")
    assert (tmp_path / OUTCOME_NAME).read_text() == "succeeded"


def test_the_paths_the_supervisor_writes_are_the_ones_the_template_reads() -> None:
    assert contract.OUTCOME_FILE == f"{contract.OUTCOME_DIR}/{OUTCOME_NAME}"
    assert contract.NODE_FILE == f"{contract.OUTCOME_DIR}/{NODE_NAME}"


def test_the_supervisor_writes_its_outcome_at_exit(tmp_path: Path) -> None:
    """No NATS: RunIndependent passes the command's code through, and the word follows it."""
    env = {**os.environ, "AEGIS_OUTCOME_DIR": str(tmp_path / "o"), "AEGIS_NODE": "n-3"}
    out = subprocess.run(
        [sys.executable, "-m", "aegis_flow.supervisor", "--job", "j", "--rank", "0",
         "--world-size", "1", "--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "1",
         "--no-prewarm", "--", "sh", "-c", "exit 70"],
        capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 70, out.stderr
    assert (tmp_path / "o" / OUTCOME_NAME).read_text() == "node-fault"
    assert (tmp_path / "o" / NODE_NAME).read_text() == "n-3"
    assert "outcome node-fault (exit 70)" in out.stderr
