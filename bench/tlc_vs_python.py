"""TLC on spec/AegisFlow.tla vs our Python checker on the real ``step``: states per second.

Side effects: runs TLC (Java subprocesses, temporary directories) and the Python checker in
this process; prints a table to stdout (``--markdown`` for docs/benchmarks.md). Not a test.

Both sides get the same constants and check the same properties where they overlap: TLC the
spec's invariants (the P0 five, WorkerSeqNumBound, NoDeadlock, with the message layer also
NoFinishDoubleProcessed and StaleFinishRejected) and MasterSeqNumMonotonic; the Python checker
all of its properties (the same plus TerminationReachable and NoEndlessRecovery over the graph).
TLC runs with one worker thread; its time includes starting the JVM and parsing the spec.
Medians of ``--repeat`` runs, the two sides interleaved; "cpu s" is TLC's JVM CPU time (user +
system of the child) and the Python process's CPU time. The state counts differ: TLC counts
every state of the spec, the Python checker its compact keys (which merge statuses that no
decision tells apart, terminal ones by what the invariants read), so the last column, the time
each needs to check the same model, is the like-for-like comparison.

    python bench/tlc_vs_python.py                   # the default cases, 3 runs each
    python bench/tlc_vs_python.py --case 3 2 0 4 1  # W R message-layer seq-bound symmetry
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import tables  # bench/tables.py (this script's folder is on sys.path)
from verify_bench import Case

from aegis_flow.verify import Config, verify
from aegis_flow.verify.tlc import SPEC_DIR, SPEC_NAME, render_cfg, run_tlc

HEADER = ("workers", "max_retry", "message layer", "seq bound", "symmetry", "TLC states",
          "TLC s", "TLC cpu s", "TLC states/s", "Python states", "Python s", "Python cpu s",
          "Python states/s", "TLC s / Python s")

P0 = ("ValidPhase", "ValidInnerPhase", "RecoverCountBound", "RetriesBound", "PhaseConsistency",
      "WorkerSeqNumBound", "NoDeadlock")
P1 = P0 + ("NoFinishDoubleProcessed", "StaleFinishRejected")




@dataclass(frozen=True)
class Sample:
    states: int
    seconds: float
    cpu: float


DEFAULT_CASES = [Case(2, 1, False, 4, False), Case(2, 1, True, 4, False),
                 Case(3, 2, False, 4, True)]


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_tlc_case(case: Case) -> Sample:
    cfg = render_cfg(workers=case.workers, max_retry=case.max_retry,
                     message_layer=case.message_layer, seq_bound=case.seq_bound,
                     invariants=P1 if case.message_layer else P0,
                     properties=("MasterSeqNumMonotonic",), symmetry=case.symmetry)
    cpu = _children_cpu()
    result = run_tlc(SPEC_DIR / f"{SPEC_NAME}.tla", cfg, timeout=3600)
    if not result.ok or result.distinct is None:
        raise SystemExit(f"TLC failed on {case}:\n{result.output[-3000:]}")
    return Sample(result.distinct, result.seconds, _children_cpu() - cpu)


def python_config(case: Case) -> Config:
    # the exact key (each worker's reported seq kept) is closest to the state TLC counts
    return Config(workers=case.workers, max_retry=case.max_retry,
                  message_layer=case.message_layer, seq_bound=case.seq_bound,
                  symmetry=case.symmetry, exact=True, max_states=50_000_000)


def run_python_case(case: Case) -> Sample:
    start, cpu = time.perf_counter(), time.process_time()
    report = verify(python_config(case))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if not report.ok:
        raise SystemExit(f"the Python checker did not pass {case}")
    return Sample(report.exploration.states, seconds, cpu)


def median(samples: list[Sample]) -> Sample:
    return Sample(samples[0].states, statistics.median(s.seconds for s in samples),
                  statistics.median(s.cpu for s in samples))


def row(case: Case, tlc: Sample, py: Sample) -> tuple[str, ...]:
    tlc_rate, py_rate = tlc.states / tlc.seconds, py.states / py.seconds
    return (str(case.workers), str(case.max_retry), "on" if case.message_layer else "off",
            str(case.seq_bound), "on" if case.symmetry else "off",
            f"{tlc.states:,}", f"{tlc.seconds:.1f}", f"{tlc.cpu:.1f}", f"{tlc_rate:,.0f}",
            f"{py.states:,}", f"{py.seconds:.1f}", f"{py.cpu:.1f}", f"{py_rate:,.0f}",
            f"{tlc.seconds / py.seconds:.2f}")


def table(rows: Sequence[tuple[str, ...]], *, markdown: bool) -> str:
    return tables.render(HEADER, rows, markdown=markdown)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--case", nargs=5, type=int, metavar=("W", "R", "ML", "SEQ", "SYM"),
                   action="append", help="one case (repeatable)")
    p.add_argument("--repeat", type=int, default=3, help="runs per side and case (median)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = p.parse_args(argv)
    cases = ([Case(w, r, bool(ml), seq, bool(sym)) for w, r, ml, seq, sym in args.case]
             if args.case else DEFAULT_CASES)
    rows = []
    for case in cases:
        tlc, py = [], []
        for _ in range(args.repeat):  # interleaved: both sides see the same machine load
            tlc.append(run_tlc_case(case))
            py.append(run_python_case(case))
        rows.append(row(case, median(tlc), median(py)))
        print(table(rows[-1:], markdown=False).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
