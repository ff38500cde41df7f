"""``aegis-flow verify``: model-check the master's state machine from the command line.

Side effects live here only: printing the report to stdout (errors to stderr) and writing the
``--dump`` file. The exploration itself (``report.verify``) is pure computation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from .explorer import Config
from .report import render_text, to_json, verify


def resolve_symmetry(args: argparse.Namespace) -> bool:
    """``--symmetry``/``--no-symmetry`` as given; unset means on, except with ``--dump``."""
    if args.symmetry is None:
        return not args.dump
    return bool(args.symmetry)


def config_from_args(args: argparse.Namespace) -> Config:
    """The model described by the parsed ``verify`` arguments (see ``aegis_flow/cli.py``)."""
    return Config(
        workers=args.workers,
        max_retry=args.max_retry,
        flap_limit=args.flap_limit,
        message_layer=bool(args.message_layer),
        seq_bound=args.seq_bound,
        symmetry=resolve_symmetry(args),
        exact=bool(getattr(args, "exact", False)),
        max_states=args.max_states,
    )


def run_verify(args: argparse.Namespace, *, out: TextIO | None = None,
               err: TextIO | None = None) -> int:
    """Run one verification; 0 all properties hold, 1 a violation, 2 state limit or bad usage."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    dump: str | None = args.dump
    if dump and args.symmetry:
        print("aegis-flow verify: --dump lists every concrete reachable state, but --symmetry "
              "merges states that differ only by worker order; drop one of the two options",
              file=err)
        return 2
    try:
        config = config_from_args(args)
        config.initial()  # validates workers, max-retry and flap-limit with clear messages
    except ValueError as exc:
        print(f"aegis-flow verify: {exc}", file=err)
        return 2
    report = verify(config, dump=bool(dump))
    if args.json:
        print(json.dumps(to_json(report), indent=2), file=out)
    else:
        print(render_text(report), file=out)
    if dump and not report.exceeded:
        lines = report.dump()
        try:
            Path(dump).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        except OSError as exc:
            print(f"aegis-flow verify: cannot write the dump to {dump}: {exc}", file=err)
            return 2
        if not args.json:
            print(f"\nwrote {len(lines):,} canonical states to {dump}", file=out)
    elif dump:
        print(f"aegis-flow verify: no dump written to {dump}: the state limit was hit", file=err)
    return report.exit_code()


__all__ = ["config_from_args", "resolve_symmetry", "run_verify"]
