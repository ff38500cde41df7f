"""Golden files: ``workflows/*.yaml`` rendered from ``workflows/*.py``.

Side effects: imports the example modules by path; ``--write`` writes the YAML files (run it
by hand after changing a builder, never in CI); ``--check`` (the default) only compares.
``python -m aegis_flow.templates.golden [--write] [--dir workflows]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "workflows"


def render_example(path: Path) -> str:
    """The YAML a ``workflows/NAME.py`` module's ``build()`` renders to."""
    from aegis_flow.workflow import to_yaml

    spec = importlib.util.spec_from_file_location(f"aegis_example_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    header = (f"# GENERATED from workflows/{path.name} by "
              "`python -m aegis_flow.templates.golden --write`; do not edit.\n")
    return header + to_yaml(*module.build())


def examples(directory: Path = DEFAULT_DIR) -> list[Path]:
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aegis_flow.templates.golden")
    ap.add_argument("--write", action="store_true", help="rewrite the YAML files")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    a = ap.parse_args(argv)
    stale = []
    for py in examples(a.dir):
        text, target = render_example(py), py.with_suffix(".yaml")
        if a.write:
            target.write_text(text)
            print(f"wrote {target}")
        elif not target.exists() or target.read_text() != text:
            stale.append(target.name)
    if stale:
        print(f"stale golden files: {', '.join(stale)}: run python -m "
              "aegis_flow.templates.golden --write", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
