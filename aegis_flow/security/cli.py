"""``aegis-flow nats-bootstrap``: make the NATS operator, system account and aegis account for a
cluster (or any external nats-server) and write its operator-mode config.

Thin: parse, call ``security.operator``. Side effects: those of :func:`operator.bootstrap`
(a 0700 directory of 0600 keys) and the config file written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

MASTER_FILES = ("public.json", "operator.jwt", "system.jwt", "account-signing.seed",
                "operator-signing.seed", "system-user.jwt", "system-user.seed")
OFFLINE_FILES = ("operator.seed", "system.seed", "account.seed")


def add_parsers(sub: Any) -> None:
    b = sub.add_parser(
        "nats-bootstrap", help="create NATS operator-mode keys and the server config",
        description="Create (once; existing keys are kept) the operator, the system account "
        "and the aegis account under DIR with mode 0600, and write the nats-server config "
        "(memory resolver). Masters need only the files it lists for them; keep the rest "
        "offline.")
    b.add_argument("dir", type=Path, help="where the keys live (created with mode 0700)")
    b.add_argument("--config", type=Path, help="write the server config here "
                   "(default DIR/nats.conf)")
    b.set_defaults(handler=_bootstrap)


def _bootstrap(a: argparse.Namespace) -> int:
    from aegis_flow.security.operator import AuthDirError, bootstrap

    try:
        auth = bootstrap(a.dir)
        conf = auth.write_server_config(a.config)
    except (OSError, AuthDirError) as exc:
        print(f"aegis-flow nats-bootstrap: {exc}", file=sys.stderr)
        return 2
    print(f"operator {auth.keys.operator}\naccount  {auth.keys.account} (aegis)\n"
          f"system   {auth.keys.system}\nserver config: {conf}  (nats-server -c {conf} -js)\n"
          f"for the masters' Secret: {', '.join(MASTER_FILES)}\n"
          f"keep offline: {', '.join(OFFLINE_FILES)}")
    return 0
