"""Thin command line: parse, validate, call a library function. Heavy imports are lazy.

Side effects: only those of the library function each subcommand calls.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from aegis_flow.argtypes import non_negative_int, positive_int

DESCRIPTION = """\
aegis-flow makes PyTorch distributed training fault tolerant: it detects a failed rank,
diagnoses it and recovers at the cheapest level (restart in place, restart the container,
quarantine the node), locally or on Argo Workflows."""






def _add_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="exhaustively model-check the master's state machine (the real step function)",
        description="Breadth-first exploration of aegis_flow.master.machine.step under an "
        "environment that may finish, restart, lose, fail or hang any worker, stop the job, and "
        "(with --message-layer) lose, duplicate or re-deliver stale messages. Checks the nine "
        "invariants of the design plus deadlock freedom, termination reachability and no "
        "endless recovery. Exits 1 on a violation, printing the shortest counterexample.",
    )
    p.add_argument("--workers", type=positive_int, default=3, help="number of workers (default 3)")
    p.add_argument("--max-retry", type=non_negative_int, default=2, help="max retries (default 2)")
    p.add_argument("--flap-limit", type=non_negative_int, default=3,
                   help="uncounted replacements per worker between runs (default 3)")
    p.add_argument("--message-layer", action="store_true",
                   help="model lost, duplicated and stale messages and sequence numbers")
    p.add_argument("--seq-bound", type=positive_int, default=4,
                   help="explore live states with master seq <= this bound (default 4)")
    p.add_argument("--symmetry", action=argparse.BooleanOptionalAction, default=None,
                   help="reduce by symmetry over interchangeable workers: states that differ only "
                   "by which worker is which are one (default: on, except with --dump, which "
                   "lists concrete states; use --no-symmetry to compare counts with another "
                   "tool)")
    p.add_argument("--exact", action="store_true",
                   help="keep each worker's reported seq in the state key: the concrete state "
                   "graph, as --dump uses (slower; by default no decision reads those seqs, so "
                   "they are dropped from the key and WorkerSeqNumBound is checked on every "
                   "edge instead)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--dump", metavar="FILE",
                   help="write the reachable states in canonical form, one per line")
    p.add_argument("--max-states", type=positive_int, default=5_000_000,
                   help="give up (exit 2) beyond this many states (default 5,000,000)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aegis-flow", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_verify(sub)
    from aegis_flow.argo.rehearse import cli as rehearse_cli
    from aegis_flow.bundle import cli as bundle_cli
    from aegis_flow.k8s import cli as k8s_cli
    from aegis_flow.local import cli as local_cli
    from aegis_flow.local import observe as observe_cli
    from aegis_flow.security import cli as security_cli
    from aegis_flow.steps import cli as steps_cli
    from aegis_flow.templates import cli as argo_cli

    local_cli.add_parsers(sub)
    security_cli.add_parsers(sub)
    observe_cli.add_parsers(sub)
    steps_cli.add_parsers(sub)
    argo_cli.add_parsers(sub)
    bundle_cli.add_parsers(sub)
    k8s_cli.add_parsers(sub)
    rehearse_cli.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["worker"]:  # options and '--' CMD pass straight through
        from aegis_flow.supervisor.__main__ import main as worker_main

        return worker_main(args_list[1:])
    if args_list[:1] == ["worker-init"]:  # its own parser ('--exec -- CMD' passes through)
        from aegis_flow.security.worker_init import main as init_main

        return init_main(args_list[1:])
    if args_list[:1] == ["master"]:
        from aegis_flow.master.__main__ import main as master_main

        return master_main(args_list[1:])
    parser = build_parser()
    argv = args_list
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "verify":
        from aegis_flow.verify.cli import run_verify

        return run_verify(args)
    handler = getattr(args, "handler", None)
    if handler is None:  # pragma: no cover - every subparser sets one
        parser.error(f"unknown command {args.command!r}")
    code: int = handler(args)
    return code


def entry() -> None:
    """Console-script entry: like main(), but a closed pipe (``| head``) is not an error."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
