"""Golden files: workflows/*.yaml are what workflows/*.py render, and they validate."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from aegis_flow.templates.cli import check_documents
from aegis_flow.templates.golden import DEFAULT_DIR, examples, main, render_example

EXAMPLES = examples()


def test_there_are_examples() -> None:
    assert {p.stem for p in EXAMPLES} >= {"training", "aegis_checks", "data_pipeline",
                                          "training_tls"}


@pytest.mark.parametrize("py", EXAMPLES, ids=lambda p: p.stem)
def test_golden_file_is_up_to_date(py: Path) -> None:
    golden = py.with_suffix(".yaml")
    assert golden.exists(), "run python -m aegis_flow.templates.golden --write"
    assert render_example(py) == golden.read_text(), (
        f"{golden.name} is stale: run python -m aegis_flow.templates.golden --write")


def test_golden_files_pass_schema_and_lint_together() -> None:
    docs = [d for p in sorted(DEFAULT_DIR.glob("*.yaml")) for d in yaml.safe_load_all(
        p.read_text())]
    assert len(docs) == 4
    assert check_documents(docs) == []


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    src = DEFAULT_DIR / "aegis_checks.py"
    (tmp_path / src.name).write_text(src.read_text())
    assert main(["--dir", str(tmp_path)]) == 1
    assert main(["--dir", str(tmp_path), "--write"]) == 0
    assert main(["--dir", str(tmp_path)]) == 0
