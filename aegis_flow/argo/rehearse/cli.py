"""``aegis-flow rehearse``: parse, call ``run.rehearse``, print (thin CLI).

Side effects: those of ``run.rehearse`` (pods as processes in namespaces); writes the picture
(``--svg``) and the status (``--json``) where asked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from aegis_flow.argtypes import positive_seconds

DESCRIPTION = """\
Run an Argo Workflow document on this machine, the way Argo's controller would: every pod is a
set of real local processes in its own network namespace (own IP, own 127.0.0.1, own hostname),
scheduled onto fake nodes with labels, taints and resources; container images are not pulled
(commands run from this checkout's venv and PATH; argoproj/argosay runs a local stand-in).
Argo's rules (steps, DAGs with dependencies/depends, loops, when, retries with backoff and
maxDuration, continueOn, outputs and their aggregation, daemons, recursion, onExit, deadlines,
templateRef to WorkflowTemplates) follow its controller source; see docs/argo.md for the list
and what is refused. Needs root (namespaces).

Exit status: 0 Succeeded, 1 Failed or Error, 2 bad input or unsupported, 3 cannot run here."""


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("rehearse", help="run an Argo Workflow locally, pods in namespaces",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workflow", metavar="WF.yaml", help="a Workflow document (kind: Workflow)")
    p.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
                   help="override a workflow parameter (repeatable), like argo submit -p")
    p.add_argument("--scenario", metavar="FILE",
                   help="nodes, Secrets, RBAC and faults for this run (see docs/argo.md)")
    p.add_argument("--templates", action="append", default=[], metavar="FILE",
                   help="WorkflowTemplates that templateRef may name (YAML, several documents "
                        "allowed; repeatable; added to the scenario's workflowTemplates)")
    p.add_argument("--secrets", type=Path, metavar="DIR",
                   help="the namespace's Secrets: DIR/<secret>/<key> files")
    p.add_argument("--json", action="store_true",
                   help="print the final Workflow status with Argo's field names")
    p.add_argument("--svg", type=Path, metavar="FILE", help="write the node tree as a picture")
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="keep pods' logs, volumes and specs in DIR (default: removed)")
    p.add_argument("--timeout", type=positive_seconds, metavar="S",
                   help="give up after S seconds (default: the scenario's, else 600)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from aegis_flow.argo.rehearse import scenario as scenario_mod
    from aegis_flow.argo.rehearse import view
    from aegis_flow.argo.rehearse.run import (
        RehearseError,
        load_templates,
        load_workflow,
        rehearse,
    )

    params: dict[str, str] = {}
    for item in args.parameter:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"aegis-flow rehearse: -p {item!r}: expected NAME=VALUE", file=sys.stderr)
            return 2
        params[name] = value
    try:
        wf = load_workflow(args.workflow)
        sc = scenario_mod.load(args.scenario) if args.scenario else None
        templates = [wt for path in args.templates for wt in load_templates(path)]
    except (RehearseError, scenario_mod.ScenarioError) as exc:
        print(f"aegis-flow rehearse: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()

    def event(line: str) -> None:
        if not args.quiet:
            print(f"[{time.monotonic() - t0:6.1f}s] {line}", file=sys.stderr, flush=True)

    try:
        result = rehearse(wf, scenario=sc, params=params, secrets_dir=args.secrets,
                          keep=args.keep, timeout=args.timeout, on_event=event,
                          templates=templates)
    except RehearseError as exc:
        print(f"aegis-flow rehearse: {exc}", file=sys.stderr)
        return 3 if "cannot rehearse here" in str(exc) else 2
    except KeyboardInterrupt:
        print("aegis-flow rehearse: interrupted; every pod was stopped", file=sys.stderr)
        return 130
    if args.svg is not None:
        view.write_svg(result.name, result.status, args.svg)
    if args.json:
        print(json.dumps(result.status, indent=1, sort_keys=True))
    else:
        print(view.tree_text(result.name, result.status))
    return 0 if result.phase == "Succeeded" else 1
