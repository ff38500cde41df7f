"""``aegis-flow bundle``: thin, over ``bundle.build``.

Side effects: writes the ``-o`` file; prints a summary to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    b = sub.add_parser(
        "bundle", help="build the self-contained supervisor (.pyz) for the user's image",
        description="Build a zipapp with the supervisor and its pure-Python dependencies "
        "(nats-py, nkeys). Worker pods run it as 'python3 aegis-supervisor.pyz [options] -- "
        "CMD'; the image needs only CPython >= 3.10 on Linux. NATS credentials also need "
        "PyNaCl + cffi, which are compiled per Python version, machine and glibc: the set of "
        "this interpreter is included (unless --no-native-from-env), and --native-wheels adds "
        "one set per cffi wheel found there.")
    b.add_argument("-o", "--output", default="aegis-supervisor.pyz",
                   help="output file (default: aegis-supervisor.pyz)")
    b.add_argument("--native-wheels", type=Path, metavar="DIR",
                   help="directory of PyNaCl (abi3) and cffi (one per CPython) manylinux wheels")
    b.add_argument("--no-native-from-env", dest="native_from_env", action="store_false",
                   help="do not include this interpreter's installed PyNaCl/cffi")
    b.set_defaults(handler=handle_bundle)


def handle_bundle(args: argparse.Namespace) -> int:
    from aegis_flow.bundle.build import BundleError, build

    try:
        result = build(Path(args.output), native_wheels=args.native_wheels,
                       native_from_env=args.native_from_env)
    except (BundleError, OSError) as exc:
        print(f"aegis-flow bundle: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {result.path} ({result.size / 1024:.0f} KiB)", file=sys.stderr)
    print(json.dumps(result.supports, indent=1), file=sys.stderr)
    return 0
