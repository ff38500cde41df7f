"""``python -m aegis_flow.master``: run one job's master (used by ``aegis-flow run`` and Argo).

Side effects: those of ``runtime.Master.run`` (NATS, the KV store, log output).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from aegis_flow.argtypes import port
from aegis_flow.master.endpoints import DEFAULT_METRICS_PORT
from aegis_flow.master.runtime import Master, MasterConfig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="aegis-flow master", description=__doc__)
    ap.add_argument("--job", required=True)
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--max-retry", type=int, default=3)
    ap.add_argument("--flap-limit", type=int, default=3)
    ap.add_argument("--nats-url", required=True)
    ap.add_argument("--connect-timeout", type=float, default=60.0)
    ap.add_argument("--lost-timeout", type=float, default=3.0)
    ap.add_argument("--replace-timeout", type=float, default=120.0)
    ap.add_argument("--linger", type=float, default=5.0)
    ap.add_argument("--status-file", default="", help="write the final status here too")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--metrics-port", type=port, default=DEFAULT_METRICS_PORT,
                    help="serve /metrics, /healthz, /readyz here (0 = a free port; default "
                    f"{DEFAULT_METRICS_PORT})")
    ap.add_argument("--metrics-addr", default="0.0.0.0", help="address to serve metrics on")
    ap.add_argument("--port-file", default="", help="write the metrics port to this file")
    ap.add_argument("--log-dir", default="", help="write the fault log (JSON lines) here")
    ap.add_argument("--gpu-type", default="", help="gpu_type label of the metrics (default: "
                    "what the workers report)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="[aegis-flow master] %(message)s")
    cfg = MasterConfig(job=a.job, namespace=a.namespace, workers=a.workers,
                       max_retry=a.max_retry, flap_limit=a.flap_limit, nats_url=a.nats_url,
                       connect_timeout=a.connect_timeout, lost_timeout=a.lost_timeout,
                       replace_timeout=a.replace_timeout, linger=a.linger,
                       status_file=a.status_file, metrics_port=a.metrics_port,
                       metrics_addr=a.metrics_addr, port_file=a.port_file, log_dir=a.log_dir,
                       gpu_type=a.gpu_type)
    try:
        return asyncio.run(Master(cfg).run())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
