"""``python -m aegis_flow.verify.tlc_cli``: run TLC on the spec's configurations by hand.

``make tlc`` calls it with spec/P0.cfg and spec/P1.cfg. With ``--conformance`` it also compares
the reachable states of each configuration without SYMMETRY with the Python checker's.

Side effects: printing, and the TLC runs (``tlc.run_tlc``). Exit codes: 0 every configuration
checked clean (and conforms), 1 TLC found a violation or the states differ, 2 TLC could not run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from .conformance import compare, config_from_cfg, render_comparison
from .tlc import (
    SPEC_DIR,
    SPEC_NAME,
    TlcFailed,
    TlcResult,
    TlcUnavailable,
    has_symmetry,
    project,
    run_tlc,
)

#: Seconds one TLC run may take (P0 without symmetry takes minutes on two cores).
TIMEOUT = 3600.0


def _summary(name: str, result: TlcResult) -> str:
    verdict = "no error" if result.ok else (
        f"VIOLATED {result.violated_invariant or result.violated_property or ''}".rstrip()
        if not result.no_error else f"exit {result.exit_code}")
    distinct = f"{result.distinct:,}" if result.distinct is not None else "?"
    return f"{name}: {verdict}; {distinct} distinct states, {result.seconds:.1f} s"


def check(configs: list[Path], *, conformance: bool, workers: int, timeout: float,
          out: TextIO) -> int:
    """TLC on every configuration; the worst exit code (0, 1)."""
    spec = SPEC_DIR / f"{SPEC_NAME}.tla"
    worst = 0
    for cfg in configs:
        text = cfg.read_text(encoding="utf-8")
        if conformance and not has_symmetry(text):
            cmp = compare(config_from_cfg(text), cfg_text=text, tlc_workers=workers,
                          timeout=timeout)
            assert cmp.spec_result is not None
            print(_summary(cfg.name, cmp.spec_result), file=out)
            print("  " + render_comparison(cmp).replace("\n", "\n  "), file=out)
            worst = max(worst, 0 if cmp.equal else 1)
            continue
        result = run_tlc(spec, cfg, workers=workers, timeout=timeout)
        print(_summary(cfg.name, result), file=out)
        if not result.ok:
            worst = 1
            print(f"  {result.error or result.output[-2000:]}", file=out)
            for i, state in enumerate(result.trace):
                print(f"  {i:>3}  {project(state)}", file=out)
    return worst


def main(argv: list[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    p = argparse.ArgumentParser(prog="python -m aegis_flow.verify.tlc_cli",
                                description="Model-check spec/AegisFlow.tla with TLC.")
    p.add_argument("configs", nargs="*", type=Path,
                   default=[SPEC_DIR / "P0.cfg", SPEC_DIR / "P1.cfg"],
                   help="TLC configurations (default: spec/P0.cfg spec/P1.cfg)")
    p.add_argument("--conformance", action="store_true",
                   help="also compare each configuration without SYMMETRY with the code")
    args = p.parse_args(argv)
    for cfg in args.configs:
        if not cfg.is_file():
            print(f"tlc: no configuration file {cfg}", file=err)
            return 2
    try:
        return check(args.configs, conformance=args.conformance, workers=1,
                     timeout=TIMEOUT, out=out)
    except (TlcUnavailable, TlcFailed) as exc:
        print(f"tlc: {exc}", file=err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
