"""A worker whose exit order is lost while it reconnects still leaves, and is replaced.

Real processes: a nats-server in operator mode, a master serving credentials over gRPC, two
supervisors that got theirs from ``worker-init``. Rank 1's bootcheck reports a hardware fault
(``checkfail``), so the master quarantines its node, orders it to exit 70 and evicts it.
Rank 1 reaches NATS through a fault proxy that drops exactly that exit order and then cuts the
connection for a while — the pod was reconnecting (a loaded NATS, a network blip) when the
order went out. This is how the GPU-lost scenario on the local Argo executor once hung: the
master revoked the key one second after the order, the worker could never hear it again,
and the pod never exited, so Argo never recreated it.

Two cases:

* the cut is shorter than the master's revoke grace: the worker reconnects, its heartbeat
  shows an older seq, the master re-sends the exit order, the worker exits 70;
* the cut outlasts the grace (the key is revoked while the worker is away): NATS refuses it
  on reconnect, and after the lockout grace the idle worker exits 71 so the pod is recreated.

Either way the test then plays the workflow: a new rank 1 (new ``worker-init``, new key)
joins, the master revokes the predecessor's key at once, and the job succeeds.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from aegis_flow.local.natsserver import EmbeddedNats
from aegis_flow.security import operator
from aegis_flow.supervisor import creds as cf
from aegis_flow.supervisor.agent import LOCKOUT_GRACE
from tests.jobs import Proc, assert_nothing_left

pytestmark = pytest.mark.e2e

TOKEN = "bootstrap-token-for-lockout-0123456789"
JOB = "lockout"


class OrderEater:
    """A TCP proxy in front of nats-server (its own thread and event loop). Armed, it drops the
    first message to ``subject`` whose payload names the exit order, closes that connection
    and refuses new ones for ``cut`` seconds."""

    def __init__(self, upstream_port: int, subject: str, cut: float) -> None:
        self.upstream_port, self.subject, self.cut = upstream_port, subject.encode(), cut
        self.eaten: list[bytes] = []
        self.cut_until = 0.0
        self.refused = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _client(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        if time.monotonic() < self.cut_until:  # the "network" is down
            self.refused += 1
            down_w.close()
            return
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def upward() -> None:
            while data := await down_r.read(65536):
                up_w.write(data)
                await up_w.drain()

        async def downward() -> None:
            buf = b""
            while chunk := await up_r.read(65536):
                buf += chunk
                out = b""
                while b"\r\n" in buf:
                    line, rest = buf.split(b"\r\n", 1)
                    if not line.startswith((b"MSG ", b"HMSG ")):
                        out, buf = out + line + b"\r\n", rest
                        continue
                    size = int(line.split()[-1])
                    if len(rest) < size + 2:
                        break  # the payload is not all here yet
                    payload, buf = rest[:size], rest[size + 2:]
                    if not self.eaten and line.split()[1] == self.subject \
                            and b'"exit"' in payload:
                        self.eaten.append(payload)
                        self.cut_until = time.monotonic() + self.cut
                        down_w.write(out)
                        raise ConnectionResetError("cut right after eating the exit order")
                    out += line + b"\r\n" + payload + b"\r\n"
                down_w.write(out)
                await down_w.drain()

        tasks = [asyncio.ensure_future(upward()), asyncio.ensure_future(downward())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (up_w, down_w):
            writer.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(env: dict[str, str], work: Path, grpc: int, nats_url: str, rank: int, name: str,
            *extra: str) -> tuple[Proc, Path]:
    """worker-init (real gRPC, a fresh key), then a supervisor with those credentials."""
    creds = work / f"{name}.creds"
    init = Proc([sys.executable, "-m", "aegis_flow.cli", "worker-init", "--master",
                 f"127.0.0.1:{grpc}", "--job", JOB, "--namespace", "default",
                 "--worker", str(rank), "--token-env", "TOKEN", "--out", str(creds)],
                env, work, label=f"{name} worker-init")
    assert init.wait(60) == 0, init.output
    wdir = work / name
    wdir.mkdir()
    sup = Proc([sys.executable, "-m", "aegis_flow.supervisor", "--job", JOB, "--rank",
                str(rank), "--world-size", "2", "--nats-url", nats_url, "--creds", str(creds),
                "--node", f"node-{name}", "--work-dir", str(wdir), "--no-prewarm", *extra, "--",
                sys.executable, "-c", "print('trained', flush=True)"], env, work, label=name)
    return sup, creds


@pytest.mark.parametrize(("grace", "cut", "code"), [(30.0, 3.0, 70), (1.0, 6.0, 71)],
                         ids=["back-within-the-revoke-grace", "revoked-while-away"])
def test_a_lost_exit_order_still_ends_the_pod(tmp_path: Path, grace: float, cut: float,
                                               code: int) -> None:
    auth = operator.bootstrap(tmp_path / "auth")
    work = tmp_path / "work"
    work.mkdir()
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AEGIS_PRELOAD": "", "TOKEN": TOKEN,
           "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    grpc = _free_port()
    procs: list[Proc] = []
    with EmbeddedNats(tmp_path / "nats", config_file=auth.write_server_config()) as nats:
        eater = OrderEater(int(nats.url.rsplit(":", 1)[1]), f"aegis.default.{JOB}.worker.1",
                           cut)
        try:
            master = Proc([sys.executable, "-m", "aegis_flow.master", "--job", JOB,
                           "--workers", "2", "--nats-url", nats.url, "--auth-dir",
                           str(auth.path), "--token-env", "TOKEN", "--grpc-listen",
                           f"127.0.0.1:{grpc}", "--revoke-grace", str(grace),
                           "--replace-timeout", "120", "--metrics-port", "0",
                           "--metrics-addr", "127.0.0.1",
                           "--decision-dir", str(work / "decision")],
                          env, work, label="master")
            procs.append(master)
            master.wait_for("credentials: gRPC on port", timeout=60)
            rank0, _ = _worker(env, work, grpc, nats.url, 0, "rank0")
            rank1, old_creds = _worker(env, work, grpc, eater.url, 1, "rank1",
                                       "--inject", "checkfail:rank=1:order=bootcheck")
            procs += [rank0, rank1]

            # the master quarantines rank 1's node and orders it out; the order is eaten
            master.wait_for("quarantined", timeout=90)
            rank1_code = rank1.wait(cut + LOCKOUT_GRACE + 30)
            assert eater.eaten, "the proxy never saw the exit order"
            assert eater.refused > 0, "the worker never tried to reconnect during the cut"
            assert rank1_code == code, rank1.output
            if code == 71:
                assert "NATS refuses this worker's credentials" in rank1.output
            else:
                assert "refuses" not in rank1.output

            # the workflow recreates the pod: a new incarnation with a new key
            old_key = cf.read(old_creds).public_key
            rank1b, new_creds = _worker(env, work, grpc, nats.url, 1, "rank1b")
            procs.append(rank1b)
            assert cf.read(new_creds).public_key != old_key
            assert rank0.wait(120) == 0, rank0.output
            assert rank1b.wait(30) == 0, rank1b.output
            assert master.wait(30) == 0, master.output
            decision = work / "decision"
            assert (decision / "verdict").read_text().strip() == "succeeded"
            assert json.loads((decision / "quarantined").read_text()) == ["node-rank1"]
            # the predecessor's key is on the account's revocation list
            assert old_key in operator.read_revocations(auth.path)
            assert_nothing_left(str(work))
        finally:
            eater.close()
            for p in procs:
                p.kill()
