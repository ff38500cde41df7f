"""``aegis-flow check`` and ``aegis-flow explain``: thin, over :func:`run_checks`.

Side effects: those of the checks each command runs (a scratch file for io, NVML for gpu, torch
for runtime/env, sysfs reads for rdma), and printing to stdout. Heavy modules load inside the
checks. ``add_parsers(sub)`` adds both commands to the main parser (each sets ``handler``);
``python -m aegis_flow.steps.cli`` runs them standalone.

The collective checks need every rank: standalone, without ``--world-size/--rank/--rendezvous``,
they report ``not_applicable``; with them, ``check allreduce``/``check all`` call
``aegis_flow.steps.collective.check_allreduce(world_size=, rank=, rendezvous=, budgets=)``
(returning a list of CheckResult) when that module exists. ``hang`` watches a running training
process, so standalone it is always ``not_applicable``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aegis_flow.argtypes import non_negative_int
from aegis_flow.settings import env_value
from aegis_flow.steps.base import (
    CHECK_TYPES,
    CheckResult,
    CheckStatus,
    all_ok,
    not_applicable,
    parse_budget,
    resolve_budgets,
)

CHOICES = ("env", "io", "gpu", "runtime", "rdma", "allreduce", "hang", "health", "all")
#: the node's sysfs root for the rdma check (a container may mount the host's elsewhere)
SYSFS_ROOT_ENV = "AEGIS_SYSFS_ROOT"


def _which(text: str) -> str:
    """One check, ``all``, or a comma list of checks (the supervisor passes a plan)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    aliases = {"allreduce_connection": "allreduce", "allreduce_performance": "allreduce"}
    names = [aliases.get(n, n) for n in names]
    bad = [n for n in names if n not in CHOICES]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"unknown check {', '.join(bad) or repr(text)}: choose from {', '.join(CHOICES)} "
            "(or a comma list)")
    return ",".join(dict.fromkeys(names))


@dataclass(frozen=True)
class CheckOptions:
    directory: str = "."
    budgets: dict[str, float] = field(default_factory=resolve_budgets)
    sysfs_root: str = "/sys"
    expect_gpus: int | None = None
    io_size_mib: float = 8.0
    max_temp_c: float = 90.0
    world_size: int | None = None
    rank: int | None = None
    rendezvous: str | None = None


def _collective(opts: CheckOptions) -> list[CheckResult]:
    names = ("allreduce_connection", "allreduce_performance")
    if opts.world_size is None or opts.rank is None or opts.rendezvous is None:
        why = ("needs every rank of a job: run inside a job (aegis-flow run / the troubleshoot "
               "step), or pass --world-size, --rank and --rendezvous on every rank")
        return [not_applicable(n, f"{n}: {why}", budget=opts.budgets.get(n)) for n in names]
    try:
        module = importlib.import_module("aegis_flow.steps.collective")
        run = module.check_allreduce
    except (ImportError, AttributeError) as exc:
        return [not_applicable(n, f"{n}: the collective checks are not available in this "
                               f"build ({exc})", budget=opts.budgets.get(n)) for n in names]
    results: list[CheckResult] = run(world_size=opts.world_size, rank=opts.rank,
                                     rendezvous=opts.rendezvous, budgets=opts.budgets)
    return results


def _health(opts: CheckOptions) -> CheckResult:
    """Bootcheck's health check: a verified all_reduce and all_gather among every rank."""
    budget = opts.budgets.get("health")
    if opts.world_size is None or opts.rank is None or opts.rendezvous is None:
        return not_applicable("health", "health: needs every rank of a job (pass --world-size,"
                              " --rank and --rendezvous on every rank)", budget=budget)
    try:
        module = importlib.import_module("aegis_flow.steps.collective")
        result: CheckResult = module.check_health(
            world_size=opts.world_size, rank=opts.rank, rendezvous=opts.rendezvous,
            budget=budget)
    except (ImportError, AttributeError) as exc:
        return not_applicable("health", f"health: not available in this build ({exc})",
                              budget=budget)
    return result


def run_checks(which: str, opts: CheckOptions | None = None) -> list[CheckResult]:
    """Run one check (or ``all``) standalone; results in :data:`CHECK_TYPES` order."""
    from aegis_flow.steps.env import check_env
    from aegis_flow.steps.gpu import check_gpu
    from aegis_flow.steps.io import check_io
    from aegis_flow.steps.rdma import check_rdma
    from aegis_flow.steps.runtime import check_runtime

    o = opts or CheckOptions()
    b = o.budgets
    wanted = set(which.split(","))
    if not wanted <= set(CHOICES):
        raise ValueError(f"unknown check {which!r}: choose one of {', '.join(CHOICES)}")
    if "all" in wanted:
        wanted |= {"env", "io", "gpu", "runtime", "rdma", "allreduce", "hang"}
    out: list[CheckResult] = []
    if "runtime" in wanted:  # first: in a cold process it times torch's import itself
        out.append(check_runtime(budget=b.get("runtime")))
    if "env" in wanted:
        out.append(check_env(budget=b.get("env")))
    if "io" in wanted:
        out.append(check_io(o.directory, size_mib=o.io_size_mib, budget=b.get("io")))
    if "gpu" in wanted:
        out.append(check_gpu(expected_gpus=o.expect_gpus, max_temp_c=o.max_temp_c,
                             budget=b.get("gpu")))
    if "rdma" in wanted:
        out.append(check_rdma(sysfs_root=o.sysfs_root, budget=b.get("rdma")))
    if "allreduce" in wanted:
        out += _collective(o)
    if "hang" in wanted:
        out.append(not_applicable("hang", "hang: the watchdog watches a running training "
                                  "process: run inside a job (aegis-flow run / worker)"))
    if "health" in wanted:
        out.append(_health(o))
    order = {name: i for i, name in enumerate(CHECK_TYPES)}
    return sorted(out, key=lambda r: order.get(r.check_type, len(order)))


def _format(results: Sequence[CheckResult]) -> str:
    lines = []
    for r in results:
        took = f"{r.duration * 1000:.0f} ms" if r.duration < 10 else f"{r.duration:.1f} s"
        budget = "" if r.budget is None else f"/{r.budget:g} s"
        lines.append(f"{r.status.value.upper():<14} {r.check_type:<22} {took:>8}{budget:<8} "
                     f"{r.detail}")
    return "\n".join(lines)


def brief(results: Sequence[CheckResult]) -> str:
    """One line for a round that needs no reading, plus the full row of every check that did
    not pass (what a rank prints during bootcheck and troubleshoot). Pure."""
    passed = [r for r in results if r.status is CheckStatus.PASS]
    idle = [r for r in results if r.status is CheckStatus.NOT_APPLICABLE]
    rest = [r for r in results if r not in passed and r not in idle]
    took = sum(r.duration for r in results)
    parts = [f"{len(passed)} passed"]
    if idle:
        parts.append(f"{len(idle)} not applicable ({', '.join(r.check_type for r in idle)})")
    if rest:
        parts.append(f"{len(rest)} did not pass ({', '.join(r.check_type for r in rest)})")
    line = f"{len(results)} checks in {took:.1f} s: {', '.join(parts)}"
    return "\n".join([_format(rest), line] if rest else [line])


def _budget(text: str) -> tuple[str, float]:
    try:
        return parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None




def handle_check(args: argparse.Namespace) -> int:
    """``aegis-flow check``: exit 0 when no check failed or timed out, 1 otherwise."""
    try:
        budgets = resolve_budgets(dict(args.budget))
    except ValueError as exc:
        print(f"aegis-flow check: {exc}", file=sys.stderr)
        return 2
    opts = CheckOptions(args.dir, budgets, args.sysfs_root, args.expect_gpus, args.io_size_mib,
                        args.max_temp, args.world_size, args.rank, args.rendezvous)
    results = run_checks(args.which, opts)
    if args.out:
        tmp = f"{args.out}.tmp"
        try:  # a fresh container has no /tmp/aegis: the directory is ours to make
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump([r.to_dict() for r in results], fh, default=str)
            os.replace(tmp, args.out)
        except OSError as exc:  # a full disk: say so in one line, the results stay unsent
            print(f"aegis-flow check: cannot write the results to {args.out}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return 3
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2, default=str))
    elif args.brief:
        print(brief(results))
    else:
        print(_format(results))
    sys.stdout.flush()
    code = 0 if all_ok(results) else 1
    if any(r.check_type.startswith("allreduce") or r.check_type == "health" for r in results):
        os._exit(code)  # a collective may have left a blocked thread behind: leave anyway
    return code


def handle_explain(args: argparse.Namespace) -> int:
    """``aegis-flow explain``: the diagnosis table, escalation, plan and cause table."""
    from aegis_flow.steps.classify import CauseTableError, load_table
    from aegis_flow.steps.diagnose import explain_table

    try:
        table = load_table(args.causes)
    except CauseTableError as exc:
        print(f"aegis-flow explain: {exc}", file=sys.stderr)
        return 2
    causes = [(r.code, r.klass, r.description) for r in
              sorted(table.rules, key=lambda r: -r.priority)]
    print(explain_table(causes=causes))
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``check`` and ``explain`` to an ``add_subparsers()`` object."""
    c = sub.add_parser("check", help="run health checks standalone (the Argo check steps call "
                       "this)", description="Run a check (or all) on this node and print the "
                       "results; exit 1 if any check failed or timed out.")
    c.add_argument("which", type=_which, metavar="{" + ",".join(CHOICES) + "}",
                   help="the check to run, or a comma list of checks")
    c.add_argument("--out", default=None, metavar="FILE",
                   help="also write the JSON results to FILE (atomically)")
    c.add_argument("--json", action="store_true", help="print a JSON list of results")
    c.add_argument("--brief", action="store_true",
                   help="one summary line, plus the full row of each check that did not pass")
    c.add_argument("--dir", default=env_value("AEGIS_WORK_DIR", "."),
                   help="directory the io check writes in (default $AEGIS_WORK_DIR or .)")
    c.add_argument("--budget", action="append", type=_budget, default=[],
                   metavar="CHECK=SECONDS", help="override a check's budget (repeatable; also "
                   "$AEGIS_CHECK_BUDGETS='io=5,gpu=10')")
    c.add_argument("--sysfs-root", default=env_value(SYSFS_ROOT_ENV, "/sys"),
                   help=f"sysfs root for rdma, e.g. where a container mounts the host's sysfs "
                   f"(default ${SYSFS_ROOT_ENV} or /sys)")
    c.add_argument("--expect-gpus", type=non_negative_int, default=None, metavar="N",
                   help="GPUs this node must have (default $AEGIS_EXPECT_GPUS, else any)")
    c.add_argument("--io-size-mib", type=float, default=8.0, help="io check size (default 8)")
    c.add_argument("--max-temp", type=float, default=90.0, help="GPU temperature limit, °C")
    c.add_argument("--world-size", type=non_negative_int, default=None,
                   help="collective checks: ranks")
    c.add_argument("--rank", type=non_negative_int, default=None,
                   help="collective checks: this rank")
    c.add_argument("--rendezvous", default=None, metavar="URL",
                   help="collective checks: rendezvous, e.g. tcp://HOST:PORT")
    c.set_defaults(handler=handle_check)
    e = sub.add_parser("explain", help="print the diagnosis table, escalation and causes",
                       description="Print how a failure is diagnosed and recovered.")
    e.add_argument("--causes", default=None, metavar="FILE",
                   help="a cause table file extending the default one")
    e.set_defaults(handler=handle_explain)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aegis-flow")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
