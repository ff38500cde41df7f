"""Layers we can state, checked: the pure core imports no I/O; the worker side stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "aegis_flow"
STDLIB = set(sys.stdlib_module_names)

# the supervisor is PID 1 in the user's image: stdlib, nats-py, nkeys and our light modules only
WORKER_SIDE = [*sorted((PKG / "supervisor").glob("*.py")), PKG / "protocol.py",
               PKG / "outcome.py", PKG / "bundle" / "boot.py", PKG / "settings.py"]
# aegis_flow.steps: its modules import only the standard library at import time (torch and
# NVML inside the checks that need them); the real import set is checked below as well
WORKER_OURS = ("aegis_flow.protocol", "aegis_flow.outcome", "aegis_flow.argtypes",
               "aegis_flow.settings", "aegis_flow.vocab",
               "aegis_flow.master.machine",
               "aegis_flow.master.model",
               "aegis_flow.master.policy",
               "aegis_flow.supervisor", "aegis_flow.steps")
CORE_ALLOWED = {"__future__", "enum", "dataclasses", "typing", "collections", "itertools",
                "operator"}


def imports(path: Path) -> list[str]:
    """Every module a file imports, anywhere in it (function bodies included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{a.name}" for a in node.names]
    return sorted(names)


def worker_side_violations(path: Path) -> list[str]:
    bad = []
    for name in imports(path):
        root = name.split(".")[0]
        if root in STDLIB or root in ("nats", "nkeys"):
            continue
        if root == "aegis_flow" and name.startswith(WORKER_OURS) or name == "aegis_flow":
            continue
        bad.append(name)
    return bad


@pytest.mark.parametrize("path", WORKER_SIDE, ids=lambda p: p.name)
def test_worker_side_imports_only_stdlib_nats_and_nkeys(path: Path) -> None:
    assert worker_side_violations(path) == []


def test_the_checker_catches_a_planted_heavy_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import os\ndef f():\n    import pydantic\n    from torch import nn\n"
                       "from aegis_flow.master import runtime\n")
    assert worker_side_violations(planted) == ["aegis_flow.master.runtime", "pydantic",
                                               "torch.nn"]


CORE_OURS = ("aegis_flow.master.model.", "aegis_flow.master.policy", "aegis_flow.vocab.")


@pytest.mark.parametrize("name", ["master/machine.py", "master/model.py", "master/policy.py",
                                  "vocab.py"])
def test_core_imports_no_io(name: str) -> None:
    every = imports(PKG / name)
    assert "__future__.annotations" in every  # the parse saw the file's imports at all
    roots = {n.split(".")[0] for n in every if not n.startswith(CORE_OURS)}
    assert roots <= CORE_ALLOWED, roots - CORE_ALLOWED


def test_verify_uses_only_the_core_and_stdlib() -> None:  # (machine, model, policy)
    for path in (PKG / "verify").glob("*.py"):
        for name in imports(path):
            root = name.split(".")[0]
            assert root in STDLIB or name.startswith((
                "aegis_flow.master.machine", "aegis_flow.master.model",
                "aegis_flow.master.policy", "aegis_flow.verify",
            )), (path, name)


def test_supervisor_process_loads_no_heavy_module() -> None:
    """The real import set of a started supervisor, not just the source text."""
    code = ("import sys; import aegis_flow.supervisor.__main__, aegis_flow.protocol; "
            "heavy = {'pydantic', 'grpc', 'torch', 'prometheus_client', 'hera', 'kubernetes',"
            " 'numpy', 'yaml'}; print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
