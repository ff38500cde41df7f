"""``python -m aegis_flow.master``: run one job's master (used by ``aegis-flow run`` and Argo).

Side effects: those of ``runtime.Master.run`` (NATS, the KV store, log output).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from aegis_flow.argtypes import port, positive_seconds
from aegis_flow.master.endpoints import DEFAULT_METRICS_PORT
from aegis_flow.master.model import RDZV_SPAN
from aegis_flow.master.placement import Placement
from aegis_flow.master.runtime import Master, MasterConfig
from aegis_flow.settings import MASTER, ConfigError, check_master, report


def _placement(a: argparse.Namespace, nodes: object, security: object) -> Placement | None:
    """Where each rank really runs (placement.py): the runner's file locally; on Kubernetes
    (nodes patched, credentials served) the pod behind each credential exchange; else none,
    and the heartbeats' claims stand (only a master that can quarantine needs more)."""
    from aegis_flow.master import placement as pl

    if a.node_file:
        return pl.RunnerFile(a.node_file)
    if nodes is not None and security is not None:
        where = pl.PodsByAddress(pl.KubePods(nodes, a.namespace), a.workflow)
        security.placement = where  # type: ignore[attr-defined]
        return where
    return None


def _help(name: str) -> str:
    """A master setting's help text with its default (settings.MASTER)."""
    import dataclasses

    fld = next(f for f in dataclasses.fields(MASTER) if f.name == name)
    default = getattr(MASTER, name)
    return f"{fld.metadata.get('meaning', '')} (default {default})"


def build_parser() -> argparse.ArgumentParser:
    """The master's command line; its defaults come from ``settings.MASTER``."""
    ap = argparse.ArgumentParser(prog="aegis-flow master", description=__doc__)
    ap.add_argument("--job", required=True)
    ap.add_argument("--namespace", default=MASTER.namespace)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--max-retry", type=int, default=MASTER.max_retry)
    ap.add_argument("--flap-limit", type=int, default=MASTER.flap_limit)
    ap.add_argument("--give-up-on-repeat", action=argparse.BooleanOptionalAction,
                    default=MASTER.give_up_on_repeat, help=_help("give_up_on_repeat"))
    ap.add_argument("--l2-after", type=int, default=MASTER.l2_after, help=_help("l2_after"))
    ap.add_argument("--l3-after", type=int, default=MASTER.l3_after, help=_help("l3_after"))
    ap.add_argument("--nats-url", required=True)
    ap.add_argument("--connect-timeout", type=float, default=MASTER.connect_timeout)
    ap.add_argument("--lost-timeout", type=float, default=MASTER.lost_timeout)
    ap.add_argument("--replace-timeout", type=float, default=MASTER.replace_timeout)
    ap.add_argument("--finish-lag", type=positive_seconds, default=MASTER.finish_lag,
                    help=_help("finish_lag"))
    ap.add_argument("--slow-window", type=float, default=MASTER.slow_window,
                    help=_help("slow_window"))
    ap.add_argument("--slow-evict-within", type=positive_seconds,
                    default=MASTER.slow_evict_within, help=_help("slow_evict_within"))
    ap.add_argument("--rendezvous-addr", default="127.0.0.1",
                    help="where rank 0 hosts each epoch's torch rendezvous (MASTER_ADDR of "
                    "every rank; default 127.0.0.1, one machine; 'rank0': the address rank "
                    "0's pod reports, for pods on a cluster)")
    ap.add_argument("--rendezvous-port-base", type=int, default=0,
                    help=f"first port of the job's window of {RDZV_SPAN} rendezvous ports "
                    "(default 0: a free window is picked once per job)")
    ap.add_argument("--resumed", action="store_true",
                    help="an operator resumed this interrupted job: every worker was started "
                    "again; the master waits for all of them and counts nothing (T8r)")
    ap.add_argument("--outage-limit", type=float, default=MASTER.outage_limit,
                    help="seconds every worker may stay silent while the master reaches NATS "
                    "before they count as lost rather than a control-plane outage (default "
                    f"{MASTER.outage_limit:g})")
    ap.add_argument("--linger", type=float, default=MASTER.linger)
    ap.add_argument("--keepalives", action=argparse.BooleanOptionalAction,
                    default=MASTER.keepalives, help=_help("keepalives"))
    ap.add_argument("--status-file", default="", help="write the final status here too")
    ap.add_argument("--decision-dir", default="",
                    help="on Argo: write the job's ending (files verdict, quarantined, message) "
                    "here for the master step's output parameters, and exit 0 once the job has "
                    "ended, whatever the ending (the branches read the decision)")
    ap.add_argument("--progress-file", default=os.environ.get("ARGO_PROGRESS_FILE", ""),
                    help="write 'restarts used/max-retry' here after every change (default: "
                    "$ARGO_PROGRESS_FILE, Argo's self-reported progress)")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--metrics-port", type=port, default=DEFAULT_METRICS_PORT,
                    help="serve /metrics, /healthz, /readyz here (0 = a free port; default "
                    f"{DEFAULT_METRICS_PORT})")
    ap.add_argument("--metrics-addr", default="0.0.0.0", help="address to serve metrics on")
    ap.add_argument("--port-file", default="", help="write the metrics port to this file")
    ap.add_argument("--log-dir", default="", help="write the fault log (JSON lines) here")
    ap.add_argument("--gpu-type", default="", help="gpu_type label of the metrics (default: "
                    "what the workers report)")
    sec = ap.add_argument_group(
        "credentials", "with --auth-dir the master serves gRPC SyncWorkerCreds and mints "
        "per-worker NATS user JWTs (NATS in operator mode); without it, no credentials")
    sec.add_argument("--auth-dir", default="", help="the master's keys (writable: revocations "
                     "are recorded there): public.json, operator.jwt, system.jwt, "
                     "account-signing.seed, operator-signing.seed, system-user.jwt/.seed")
    tok = sec.add_mutually_exclusive_group()
    tok.add_argument("--token-file", default="", help="the job's bootstrap token")
    tok.add_argument("--token-env", default="", help="... or the variable that holds it")
    sec.add_argument("--grpc-listen", default="127.0.0.1:0", help="gRPC address (HOST:PORT)")
    sec.add_argument("--tls-cert", default="", help="serve gRPC over TLS with this certificate")
    sec.add_argument("--tls-key", default="", help="... and this key")
    sec.add_argument("--tls-client-ca", default="",
                     help="require client certificates signed by this CA (mutual TLS)")
    sec.add_argument("--jwt-lifetime", type=positive_seconds, default=MASTER.jwt_lifetime,
                     help="seconds a worker's JWT lives (renewed between 1/2 and 3/4 of it, "
                     f"spread over the job's workers; default {MASTER.jwt_lifetime:g})")
    sec.add_argument("--revoke-grace", type=positive_seconds, default=MASTER.revoke_grace,
                     help=_help("revoke_grace"))
    sec.add_argument("--advertise-nats-url", action="append", default=[],
                     help="NATS URL workers should dial (default: --nats-url); repeatable")
    ap.add_argument("--node-file", default="",
                    help="where each rank runs, as aegis-flow run writes it (nodes.json: rank "
                    "→ node); trusted over the node a heartbeat names")
    ap.add_argument("--workflow", default=os.environ.get("ARGO_WORKFLOW_NAME", ""),
                    help="on Kubernetes: the Argo workflow whose pods may be this job's "
                    "workers (default: $ARGO_WORKFLOW_NAME)")
    ap.add_argument("--quarantine-nodes", action="store_true",
                    help="on Kubernetes: label and taint the node of a hardware fault "
                    "(the kubernetes client; needs nodes get/patch: aegis-flow install)")
    return ap


CRASHED = 70  # EX_SOFTWARE: not an outcome of the job (0 succeeded, 1 failed, 2-5: see run)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.rendezvous_port_base and not 1024 <= a.rendezvous_port_base <= 65535 - RDZV_SPAN:
        ap.error(f"--rendezvous-port-base {a.rendezvous_port_base} must lie in "
                 f"1024..{65535 - RDZV_SPAN} (or be 0: pick a free window)")
    cfg = MasterConfig(job=a.job, namespace=a.namespace, workers=a.workers,
                       max_retry=a.max_retry, flap_limit=a.flap_limit, nats_url=a.nats_url,
                       give_up_on_repeat=a.give_up_on_repeat, l2_after=a.l2_after,
                       l3_after=a.l3_after,
                       connect_timeout=a.connect_timeout, lost_timeout=a.lost_timeout,
                       replace_timeout=a.replace_timeout, linger=a.linger,
                       finish_lag=a.finish_lag, slow_window=a.slow_window,
                       slow_evict_within=a.slow_evict_within,
                       outage_limit=a.outage_limit, resumed=a.resumed,
                       rendezvous_addr=a.rendezvous_addr,
                       rendezvous_port_base=a.rendezvous_port_base,
                       status_file=a.status_file, decision_dir=a.decision_dir,
                       progress_file=a.progress_file, metrics_port=a.metrics_port,
                       metrics_addr=a.metrics_addr, port_file=a.port_file, log_dir=a.log_dir,
                       gpu_type=a.gpu_type, keepalives=a.keepalives)
    try:
        check_master(cfg)
    except ConfigError as exc:
        return report(exc)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="[aegis-flow master] %(message)s")
    # the NATS client's own error log is a traceback twice a second while NATS is out; the
    # runtime reports those errors itself (rate-limited)
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    security = None
    if a.auth_dir:
        from aegis_flow.master.creds import CredsService, SecurityConfig
        from aegis_flow.security.operator import AuthDirError
        from aegis_flow.security.tokens import read_token

        if bool(a.tls_cert) != bool(a.tls_key):
            ap.error("--tls-cert and --tls-key go together")
        try:
            token = read_token(path=a.token_file,
                               env=a.token_env or ("" if a.token_file else "AEGIS_BOOTSTRAP_TOKEN"))
            security = CredsService(SecurityConfig(
                auth_dir=a.auth_dir, token=token, grpc_listen=a.grpc_listen,
                tls_cert=a.tls_cert, tls_key=a.tls_key, tls_client_ca=a.tls_client_ca,
                jwt_lifetime=a.jwt_lifetime, revoke_grace=a.revoke_grace,
                advertise_nats_urls=tuple(a.advertise_nats_url)),
                job=a.job, namespace=a.namespace, workers=a.workers, nats_url=a.nats_url)
        except (ValueError, AuthDirError) as exc:
            ap.error(str(exc))
    nodes = None
    if a.quarantine_nodes:
        from aegis_flow.k8s.api import NodeApiError
        from aegis_flow.k8s.client import KubeNodeApi

        try:
            nodes = KubeNodeApi.connect()
        except NodeApiError as exc:
            ap.error(str(exc))
    placement = _placement(a, nodes, security)
    try:
        return asyncio.run(_serve(Master(cfg, security=security, nodes=nodes,
                                         placement=placement)))
    except KeyboardInterrupt:
        return 130
    except Exception:  # noqa: BLE001 - a bug or an unforeseen failure: never "job failed"
        logging.getLogger("aegis_flow.master").exception(
            "the master crashed; a master started again resumes from the stored status")
        return CRASHED


async def _serve(master: Master) -> int:
    """Run the master; SIGTERM/SIGINT end it cleanly (its summary, fault log and status file
    are written; nothing is decided)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, master.request_stop, sig.name)
    return await master.run()


if __name__ == "__main__":
    sys.exit(main())
