"""Benchmark of the model checker (``aegis-flow verify``): states, transitions and time.

Side effects: prints a table to stdout (and, with ``--markdown``, the same rows as Markdown).
Not a timed test: run it by hand or with ``make bench``. Times are wall clock and this
process's CPU time of the exploration (on a shared machine the CPU column is the steadier one),
then the wall clock of the liveness checks that follow it ("checks s": NoDeadlock ...
NoEndlessReplacement, which search the cooperative closure beyond the seq bound).

    python bench/verify_bench.py             # W=3 R=2, both layers: default key, symmetry, exact
    python bench/verify_bench.py --grid      # W in {2,3,4} x R in {1,2,3}, both layers
    python bench/verify_bench.py --case 3 2 1 4 0 0   # W R message-layer seq-bound sym exact

"exact" keeps each worker's reported seq in the state key (the concrete graph a dump lists); the
default key drops it (no decision reads it) and checks WorkerSeqNumBound on every edge.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import tables  # bench/tables.py (this script's folder is on sys.path)

from aegis_flow.verify import Config, verify

HEADER = ("workers", "max_retry", "message layer", "seq bound", "symmetry", "exact", "states",
          "transitions", "seconds", "cpu s", "states/s", "checks s", "verdict")


@dataclass(frozen=True)
class Case:
    workers: int
    max_retry: int
    message_layer: bool
    seq_bound: int
    symmetry: bool
    exact: bool = False


def default_cases() -> list[Case]:
    """W=3 R=2 seq<=4: the default key with and without symmetry, then the exact key (for the
    message layer only up to seq 3 and with symmetry: the exact graph is far larger)."""
    return [Case(3, 2, False, 4, False), Case(3, 2, False, 4, True),
            Case(3, 2, False, 4, False, True),
            Case(3, 2, True, 4, False), Case(3, 2, True, 4, True), Case(3, 2, True, 3, True, True)]


def grid_cases(symmetric_from: int) -> list[Case]:
    """Workers 2..4 x MaxRetry 1..3, both layers, seq bound 4; symmetry from that many workers
    (the unreduced W=4 runs take far longer than the rest together)."""
    return [Case(w, r, ml, 4, w >= symmetric_from)
            for ml in (False, True) for w in (2, 3, 4) for r in (1, 2, 3)]


def run(case: Case, max_states: int) -> tuple[str, ...]:
    report = verify(Config(workers=case.workers, max_retry=case.max_retry,
                           message_layer=case.message_layer, seq_bound=case.seq_bound,
                           symmetry=case.symmetry, exact=case.exact, max_states=max_states))
    ex = report.exploration
    verdict = {0: "all hold", 1: "VIOLATED", 2: "state limit"}[report.exit_code()]
    rate = ex.states / ex.seconds if ex.seconds else 0.0
    return (str(case.workers), str(case.max_retry), "on" if case.message_layer else "off",
            str(case.seq_bound), "on" if case.symmetry else "off",
            "on" if case.exact else "off", f"{ex.states:,}",
            f"{ex.transitions:,}", f"{ex.seconds:.1f}", f"{ex.cpu_seconds:.1f}", f"{rate:,.0f}",
            f"{report.evaluate_seconds:.1f}", verdict)


def table(rows: Sequence[tuple[str, ...]], *, markdown: bool) -> str:
    return tables.render(HEADER, rows, markdown=markdown)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--grid", action="store_true", help="the docs/verification.md grid")
    p.add_argument("--symmetric-from", type=int, default=4,
                   help="with --grid: use symmetry from this many workers on (default 4)")
    p.add_argument("--case", nargs=6, type=int, metavar=("W", "R", "ML", "SEQ", "SYM", "EXACT"),
                   action="append", help="one case (repeatable)")
    p.add_argument("--max-states", type=int, default=20_000_000)
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = p.parse_args(argv)
    if args.case:
        cases = [Case(w, r, bool(ml), seq, bool(sym), bool(ex))
                 for w, r, ml, seq, sym, ex in args.case]
    elif args.grid:
        cases = grid_cases(args.symmetric_from)
    else:
        cases = default_cases()
    rows = []
    for case in cases:
        rows.append(run(case, args.max_states))
        print(table(rows[-1:], markdown=False).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
