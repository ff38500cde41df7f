#!/usr/bin/env python3
"""Credentials: a worker's start to its authenticated NATS connection, and minting throughput.

Measures, in one run, against real servers:

1. **worker start → authenticated connection**, per worker, over ``--workers`` workers (100):
   a fresh NKey, a fresh gRPC channel and ``SyncWorkerCreds`` call to a real master process
   (which mints the JWT), then ``nats.connect`` with that JWT to a nats-server in operator mode
   until the first PONG. The peer, in the same run: a plain unauthenticated ``nats.connect`` to
   a second nats-server without auth. Python's start and ``import grpc`` are measured apart
   (a worker pays them once, in its init step).
2. **minting throughput** for a ``--job-size`` (1,000) worker job: ``Issuer.sync`` in process
   (the master's cost: checks + ed25519 signature), and ``SyncWorkerCreds`` over gRPC from
   ``--threads`` concurrent clients (key generation and the channel included).

Side effects: starts two nats-servers and a master process in a temporary directory (all
stopped at the end), prints a table, appends nothing anywhere (copy the table to
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aegis_flow.local.natsserver import EmbeddedNats  # noqa: E402
from aegis_flow.master.runtime import free_port  # noqa: E402
from aegis_flow.security import issuer as iss  # noqa: E402
from aegis_flow.security import natsjwt as nj  # noqa: E402
from aegis_flow.security import operator  # noqa: E402
from aegis_flow.security.tokens import new_token, write_token  # noqa: E402
from aegis_flow.security.worker_init import InitConfig, fetch  # noqa: E402
from aegis_flow.supervisor import creds as cf  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def row(name: str, xs: list[float]) -> str:
    return (f"| {name} | {len(xs)} | {statistics.median(xs) * 1e3:.1f} ms | "
            f"{pct(xs, 0.9) * 1e3:.1f} ms | {min(xs) * 1e3:.1f} ms | {max(xs) * 1e3:.1f} ms |")


async def authenticated(url: str, cfg: InitConfig) -> tuple[float, float]:
    """(gRPC fetch, NATS connect) seconds for one worker."""
    t0 = time.perf_counter()
    creds = await asyncio.get_running_loop().run_in_executor(None, fetch, cfg)
    t1 = time.perf_counter()
    session = cf.Session(creds)
    nc = await nats.connect(url, allow_reconnect=False, **session.connect_options())
    await nc.flush()
    t2 = time.perf_counter()
    await nc.close()
    return t1 - t0, t2 - t1


async def plain(url: str) -> float:
    t0 = time.perf_counter()
    nc = await nats.connect(url, allow_reconnect=False)
    await nc.flush()
    t = time.perf_counter() - t0
    await nc.close()
    return t


def startup_cost(runs: int) -> list[float]:
    code = "import grpc, aegis_flow.security.worker_init, aegis_flow.rpc.aegis_pb2_grpc"
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=100)
    ap.add_argument("--job-size", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aegis-bench-creds-"))
    auth = operator.bootstrap(tmp / "auth")
    token = new_token()
    write_token(tmp / "token", token)
    size = a.workers + a.job_size
    with EmbeddedNats(tmp / "secure", config_file=auth.write_server_config()) as secure, \
            EmbeddedNats(tmp / "plain") as open_server:
        port = free_port()
        master = subprocess.Popen(
            [sys.executable, "-m", "aegis_flow.master", "--job", "bench", "--workers", str(size),
             "--nats-url", secure.url, "--auth-dir", str(auth.path), "--token-file",
             str(tmp / "token"), "--grpc-listen", f"127.0.0.1:{port}", "--connect-timeout",
             "3600", "--metrics-port", "0", "--log-level", "WARNING"], cwd=ROOT)
        try:
            def cfg(worker: int) -> InitConfig:
                return InitConfig(master=f"127.0.0.1:{port}", job="bench", namespace="default",
                                  worker=str(worker), token=token, out=tmp / "unused",
                                  deadline=30.0, retries=2)

            fetch(cfg(size - 1))  # wait until the master serves (and warm it up)

            async def latency() -> tuple[list[float], list[float], list[float], list[float]]:
                grpc_t, conn_t, total, peer = [], [], [], []
                for w in range(a.workers):  # interleaved, so load disturbs both alike
                    g, c = await authenticated(secure.url, cfg(w))
                    grpc_t.append(g)
                    conn_t.append(c)
                    total.append(g + c)
                    peer.append(await plain(open_server.url))
                return grpc_t, conn_t, total, peer

            grpc_t, conn_t, total, peer = asyncio.run(latency())

            ranks = range(a.workers, a.workers + a.job_size)
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(a.threads) as pool:
                grants = list(pool.map(lambda r: fetch(cfg(r)), ranks))
            over_grpc = len(grants) / (time.perf_counter() - t0)
        finally:
            master.terminate()
            master.wait(timeout=30)

    issuer = iss.Issuer(job="bench", namespace="default", workers=a.job_size, token=token,
                        account=auth.keys.account, signing_key=auth.seed("account-signing"),
                        nats_urls=("nats://x",))
    keys = [nj.public(nj.new_key("user")) for _ in range(a.job_size)]
    t0 = time.perf_counter()
    for r, k in enumerate(keys):
        issuer.sync(iss.Request("bench", "default", str(r), k, token), now=time.time())
    in_process = a.job_size / (time.perf_counter() - t0)
    start = startup_cost(5)

    p50_auth, p50_peer = statistics.median(total), statistics.median(peer)
    print(f"\nworker start -> authenticated NATS connection ({a.workers} workers)\n")
    print("| path | n | p50 | p90 | min | max |\n|---|---|---|---|---|---|")
    print(row("gRPC SyncWorkerCreds (key + channel + mint)", grpc_t))
    print(row("NATS connect with the JWT (nonce signed)", conn_t))
    print(row("**total: gRPC + mint + connect**", total))
    print(row("peer: plain unauthenticated connect", peer))
    print(row("python start + import grpc (once per worker)", start))
    print(f"\nratio of p50s (authenticated / plain): {p50_auth / p50_peer:.1f}x; "
          f"extra per worker {(p50_auth - p50_peer) * 1e3:.1f} ms")
    print(f"\nminting for a {a.job_size}-worker job\n")
    print("| path | JWTs/s |\n|---|---|")
    print(f"| Issuer.sync in process (checks + ed25519) | {in_process:,.0f} |")
    print(f"| SyncWorkerCreds over gRPC, {a.threads} client threads | {over_grpc:,.0f} |")
    print(f"\n{a.job_size} workers' credentials: {a.job_size / in_process * 1e3:.0f} ms of "
          f"minting; {a.job_size / over_grpc:.1f} s through gRPC from one client machine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
