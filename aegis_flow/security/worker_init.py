"""``aegis-flow worker-init``: a worker's one-time credential fetch (the init step).

Generates the worker's own NKey (the seed never leaves this pod), calls the master's
``SyncWorkerCreds`` over gRPC (deadline per attempt, bounded retries, optional TLS) with the
job's bootstrap token, and writes the creds file (mode 0600) that the supervisor reads.

Side effects: network (gRPC), writes ``--out``; with ``--exec`` it finally replaces itself
with the given command (locally: the supervisor). Exit codes: 0 the creds were written, or the
master could not be reached (no creds file: the supervisor will run the command without fault
tolerance, as when NATS is down); 3 the master refused (wrong token, ended job, bad request);
2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aegis_flow.argtypes import non_negative_int, positive_seconds
from aegis_flow.security import natsjwt as nj
from aegis_flow.settings import MASTER, env_value
from aegis_flow.supervisor import creds as cf

RETRYABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")


@dataclass(frozen=True)
class InitConfig:
    master: str
    job: str
    namespace: str
    worker: str
    token: str
    out: Path
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""
    deadline: float = 5.0
    retries: int = 4


class InitError(RuntimeError):
    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


def _say(text: str) -> None:
    sys.stderr.write(f"[aegis-flow worker-init] {text}\n")
    sys.stderr.flush()


def _channel(cfg: InitConfig) -> Any:
    import grpc

    if not (cfg.tls_ca or cfg.tls_cert):
        return grpc.insecure_channel(cfg.master)
    creds = grpc.ssl_channel_credentials(
        root_certificates=Path(cfg.tls_ca).read_bytes() if cfg.tls_ca else None,
        private_key=Path(cfg.tls_key).read_bytes() if cfg.tls_key else None,
        certificate_chain=Path(cfg.tls_cert).read_bytes() if cfg.tls_cert else None)
    options = [("grpc.ssl_target_name_override", cfg.tls_server_name)] \
        if cfg.tls_server_name else []
    return grpc.secure_channel(cfg.master, creds, options=options)


def fetch(cfg: InitConfig, *, sleep: Any = time.sleep) -> cf.Creds:
    """Generate a key, call SyncWorkerCreds (retrying what is worth retrying), return creds."""
    import importlib

    import grpc

    from aegis_flow.rpc import aegis_pb2

    aegis_pb2_grpc: Any = importlib.import_module("aegis_flow.rpc.aegis_pb2_grpc")  # untyped

    key = nj.new_key("user")
    request = aegis_pb2.SyncWorkerCredsRequest(
        job=cfg.job, namespace=cfg.namespace, worker=cfg.worker, public_key=nj.public(key),
        bootstrap_token=cfg.token)
    last = ""
    with _channel(cfg) as channel:
        stub = aegis_pb2_grpc.AegisCredsStub(channel)
        for attempt in range(cfg.retries + 1):
            try:
                resp = stub.SyncWorkerCreds(request, timeout=cfg.deadline, wait_for_ready=True)
                break
            except grpc.RpcError as exc:
                code = exc.code().name if exc.code() is not None else "UNKNOWN"
                last = f"{code}: {exc.details()}"
                if code not in RETRYABLE:
                    raise InitError(f"the master refused: {last}", refused=True) from None
                if attempt < cfg.retries:
                    sleep(min(4.0, 0.25 * 2 ** attempt))
        else:
            raise InitError(f"master {cfg.master} unreachable after {cfg.retries + 1} attempts "
                            f"of {cfg.deadline:g} s ({last})", refused=False)
    iat, exp = cf.jwt_times(resp.user_jwt)
    return cf.Creds(jwt=resp.user_jwt, seed=nj.seed_of(key), nats_urls=tuple(resp.nats_urls),
                    publish=tuple(resp.publish), subscribe=tuple(resp.subscribe),
                    inbox_prefix=resp.inbox_prefix, renew_subject=resp.renew_subject,
                    expires_at=int(resp.expires_at or exp), issued_at=iat, job=cfg.job,
                    namespace=cfg.namespace, worker=cfg.worker)


def build_parser() -> argparse.ArgumentParser:
    env = env_value
    ap = argparse.ArgumentParser(
        prog="aegis-flow worker-init",
        usage="aegis-flow worker-init --master ADDR --job J --worker RANK "
              "(--token-file F | --token-env VAR) --out PATH [options] [--exec -- CMD ...]",
        description="Fetch this worker's NATS credentials from its job's master (gRPC "
        "SyncWorkerCreds) and write them, mode 0600, to --out for the supervisor. If the "
        "master cannot be reached, write nothing and exit 0: the supervisor then runs the "
        "command without fault tolerance.")
    ap.add_argument("--master", default=env("AEGIS_MASTER_ADDR", ""),
                    help="the master's gRPC address HOST:PORT (env AEGIS_MASTER_ADDR)")
    ap.add_argument("--job", default=env("AEGIS_JOB", ""), help="job name (env AEGIS_JOB)")
    ap.add_argument("--namespace", default=env("AEGIS_NAMESPACE", MASTER.namespace))
    ap.add_argument("--worker", default=os.environ.get("RANK", ""),
                    help="this worker's rank (env RANK)")
    tok = ap.add_mutually_exclusive_group()
    tok.add_argument("--token-file", help="file holding the job's bootstrap token")
    tok.add_argument("--token-env", help="environment variable holding the bootstrap token "
                     "(default AEGIS_BOOTSTRAP_TOKEN when no --token-file)")
    ap.add_argument("--out", default=env("AEGIS_CREDS", ""),
                    help="where to write the creds file (env AEGIS_CREDS)")
    ap.add_argument("--tls-ca", default="", help="CA bundle that signed the master's certificate "
                    "(enables TLS)")
    ap.add_argument("--tls-cert", default="", help="client certificate (mutual TLS)")
    ap.add_argument("--tls-key", default="", help="client key (mutual TLS)")
    ap.add_argument("--tls-server-name", default="",
                    help="expected name in the master's certificate, if not the host dialled")
    ap.add_argument("--deadline", type=positive_seconds, default=5.0,
                    help="seconds per attempt (default 5)")
    ap.add_argument("--retries", type=non_negative_int, default=4,
                    help="retries when the master is unreachable (default 4, with backoff)")
    ap.add_argument("--exec", dest="exec_", action="store_true",
                    help="then replace this process with the command after '--' (whatever "
                    "the outcome)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        i = args.index("--")
        args, command = args[:i], args[i + 1:]
    ap = build_parser()
    a = ap.parse_args(args)
    missing = [f"--{n}" for n in ("master", "job", "worker", "out") if not getattr(a, n)]
    if missing:
        ap.error(f"missing {', '.join(missing)}")
    if a.exec_ and not command:
        ap.error("--exec needs a command after '--'")
    from aegis_flow.security.tokens import read_token

    code = 0
    try:
        token = read_token(path=a.token_file or "",
                           env="" if a.token_file else (a.token_env or "AEGIS_BOOTSTRAP_TOKEN"))
        cfg = InitConfig(master=a.master, job=a.job, namespace=a.namespace, worker=a.worker,
                         token=token, out=Path(a.out), tls_ca=a.tls_ca, tls_cert=a.tls_cert,
                         tls_key=a.tls_key, tls_server_name=a.tls_server_name,
                         deadline=a.deadline, retries=a.retries)
        Path(a.out).unlink(missing_ok=True)  # never leave stale credentials behind
        creds = fetch(cfg)
        cf.write(cfg.out, creds)
        _say(f"credentials for {a.namespace}/{a.job} rank {a.worker} written to {a.out} "
             f"(expire in {creds.expires_at - time.time():.0f} s)")
    except (ValueError, OSError) as exc:
        _say(f"error: {exc}")
        code = 2
    except InitError as exc:
        _say(f"{exc}" + ("" if exc.refused else
                         "; no credentials: the worker will run without fault tolerance"))
        code = 3 if exc.refused else 0
    if a.exec_:
        sys.stdout.flush()
        os.execvp(command[0], command)
    return code


if __name__ == "__main__":
    sys.exit(main())
