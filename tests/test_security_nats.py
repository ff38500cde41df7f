"""Credentials against a real nats-server in operator mode and a real gRPC server.

One nats-server (memory resolver, JetStream) serves the module; every test gets its own job
names, so tests never see each other. Permission violations arrive asynchronously in nats-py's
``error_cb`` (they do not raise from ``subscribe``/``publish``), so the tests listen there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nats
import pytest

from aegis_flow import protocol as p
from aegis_flow.local.natsserver import EmbeddedNats
from aegis_flow.master.creds import CredsService, SecurityConfig
from aegis_flow.security import natsjwt as nj
from aegis_flow.security import operator
from aegis_flow.security.worker_init import InitConfig, InitError, fetch
from aegis_flow.supervisor import creds as cf

TOKEN = "bootstrap-token-for-tests-0123456789"


@dataclass
class Server:
    url: str
    auth: operator.AuthDir


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("secure-nats")
    auth = operator.bootstrap(root / "auth")
    with EmbeddedNats(root / "store", config_file=auth.write_server_config()) as srv:
        yield Server(srv.url, auth)


NATS_210 = Path(__file__).resolve().parent.parent / ".venv" / "nats-2.10" / "nats-server"


@pytest.fixture(scope="module")
def server_210(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """nats-server 2.10, the cluster image's server (the review found it accepted a reply-
    subject attack that 2.15's strict JSON refused by luck); make test fetches it."""
    if not NATS_210.is_file():
        pytest.fail(f"no nats-server 2.10 at {NATS_210}: run make test, or "
                    "python tests/tools/fetch_nats_210.py .venv/nats-2.10")
    root = tmp_path_factory.mktemp("secure-nats-210")
    auth = operator.bootstrap(root / "auth")
    with EmbeddedNats(root / "store", config_file=auth.write_server_config(),
                      binary=NATS_210) as srv:
        yield Server(srv.url, auth)


@pytest.fixture(params=["2.15", "2.10"])
def both(request: pytest.FixtureRequest) -> Server:
    """The same attack against both servers."""
    name = "server" if request.param == "2.15" else "server_210"
    served: Server = request.getfixturevalue(name)
    return served


@dataclass
class Client:
    """A NATS connection that records violations, messages and its closing."""

    nc: Any = None
    errors: list[str] = field(default_factory=list)
    got: list[tuple[str, bytes]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def connect(self, url: str, **opts: Any) -> Client:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        async def on_closed() -> None:
            self.closed.set()

        # reconnects on: a renewal reconnects with the new JWT (as the supervisor does)
        self.nc = await nats.connect(url, error_cb=on_error, closed_cb=on_closed,
                                     max_reconnect_attempts=3, reconnect_time_wait=0.2,
                                     connect_timeout=3, **opts)
        return self

    async def listen(self, subject: str) -> None:
        async def record(msg: Any) -> None:
            self.got.append((msg.subject, msg.data))

        await self.nc.subscribe(subject, cb=record)
        await self.nc.flush()  # the server has the subscription before anyone publishes

    async def violations(self, count: int, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len([e for e in self.errors if "permissions violation" in e]) < count:
            assert time.monotonic() < deadline, f"expected {count} violations, got {self.errors}"
            await asyncio.sleep(0.05)
        return self.errors


@contextlib.asynccontextmanager
async def master(server: Server, job: str, *, workers: int = 2, lifetime: float = 600.0,
                 **tls: str) -> AsyncIterator[tuple[CredsService, Client]]:
    """A job's credential service, on the master's own (scoped) NATS user."""
    svc = CredsService(SecurityConfig(auth_dir=str(server.auth.path), token=TOKEN,
                                      jwt_lifetime=lifetime, revoke_grace=0.0, **tls),
                       job=job, namespace="default", workers=workers, nats_url=server.url)
    client = await Client().connect(server.url, **svc.connect_options())
    await svc.start(client.nc)
    try:
        yield svc, client
    finally:
        await svc.stop()
        await client.nc.close()


def init_config(svc: CredsService, job: str, worker: str, tmp: Path, **kw: Any) -> InitConfig:
    kw = {"deadline": 5.0, "retries": 1, **kw}
    return InitConfig(master=f"127.0.0.1:{svc.port}", job=job, namespace="default",
                      worker=worker, token=TOKEN, out=tmp / f"{job}-{worker}.creds", **kw)


async def worker(svc: CredsService, job: str, rank: int, tmp: Path,
                 **kw: Any) -> tuple[Client, cf.Session]:
    """worker-init over real gRPC, then a NATS connection with the creds, as the supervisor."""
    cfg = init_config(svc, job, str(rank), tmp, **kw)
    creds = await asyncio.get_running_loop().run_in_executor(None, fetch, cfg)
    cf.write(cfg.out, creds)
    session = cf.Session(cf.read(cfg.out), cfg.out)
    client = await Client().connect(creds.nats_urls[0], **session.connect_options())
    return client, session


def test_a_worker_cannot_touch_another_jobs_subjects(server: Server, tmp_path: Path) -> None:
    async def go() -> None:
        async with master(server, "job-a") as (svc_a, _), master(server, "job-b") as (_, mb):
            await mb.listen("aegis.default.job-b.>")  # job B's master hears its whole job
            wa, _ = await worker(svc_a, "job-a", 0, tmp_path)
            await wa.listen(p.Subjects("default", "job-a").worker(0))  # allowed
            await wa.nc.subscribe("aegis.default.job-b.broadcast")
            await wa.nc.subscribe("aegis.default.job-b.>")
            await wa.nc.publish("aegis.default.job-b.master.0", b"forged")
            await wa.nc.publish("aegis.default.job-b.worker.0", b"forged")
            errors = await wa.violations(4)
            assert any('subscription to "aegis.default.job-b.broadcast"' in e for e in errors)
            assert any('publish to "aegis.default.job-b.master.0"' in e for e in errors)
            await mb.nc.flush()
            await asyncio.sleep(0.3)
            assert mb.got == []  # not a byte of it reached job B
            assert wa.nc.is_connected  # a violation is refused, not fatal

    asyncio.run(go())


def test_a_worker_reports_only_on_its_own_ranks_subject(server: Server, tmp_path: Path) -> None:
    """Rank 0 cannot publish on rank 1's report subject (nor on a shared one): the server
    refuses it, so the master may take a report's subject as its sender's rank."""
    async def go() -> None:
        async with master(server, "job-r") as (svc, m):
            s = p.Subjects("default", "job-r")
            await m.listen(s.masters)
            w0, _ = await worker(svc, "job-r", 0, tmp_path)
            await w0.nc.publish(s.master(1), b"forged: claims rank 1")
            await w0.nc.publish(f"{s.prefix}.master", b"forged: the old shared subject")
            await w0.nc.publish(s.master(0), b"rank 0 on its own subject")
            errors = await w0.violations(2)
            assert any(f'publish to "{s.master(1)}"' in e for e in errors), errors
            assert any(f'publish to "{s.prefix}.master"' in e for e in errors), errors
            deadline = time.monotonic() + 10
            while not m.got:
                assert time.monotonic() < deadline, "rank 0's own report did not arrive"
                await asyncio.sleep(0.05)
            await w0.nc.flush()
            await asyncio.sleep(0.3)  # a forged message that got through would be here by now
            assert m.got == [(s.master(0), b"rank 0 on its own subject")]
            assert w0.nc.is_connected

    asyncio.run(go())


def test_wildcards_the_inbox_and_jetstream_are_refused(server: Server, tmp_path: Path) -> None:
    async def go() -> None:
        async with master(server, "job-c") as (svc, _):
            w, _ = await worker(svc, "job-c", 1, tmp_path)
            await w.nc.subscribe(">")
            await w.nc.subscribe("_INBOX.>")
            await w.nc.subscribe("$JS.API.>")
            await w.nc.subscribe("aegis.default.job-c.worker.0")  # another rank's orders
            await w.nc.publish("$JS.API.INFO", b"")
            await w.nc.publish("$KV.aegis_default_job_c.status", b"{}")
            await w.nc.publish("aegis.default.job-c.broadcast", b"forged order")  # master only
            errors = await w.violations(7)
            for subject in (">", "_INBOX.>", "$JS.API.>", "aegis.default.job-c.worker.0"):
                assert any(f'subscription to "{subject.lower()}"' in e for e in errors), errors
            with pytest.raises(Exception):  # noqa: B017 - JetStream is out of reach entirely
                await w.nc.jetstream().account_info(timeout=2)

    asyncio.run(go())


def test_the_masters_own_user_reaches_its_jetstream_kv(server: Server) -> None:
    async def go() -> None:
        from aegis_flow.master.store import KVStore

        async with master(server, "job-kv") as (_, m):
            store = await KVStore.open(m.nc, p.Subjects("default", "job-kv").kv_bucket)
            rev = await store.save(b'{"x": 1}', 0)
            assert await store.load() == (b'{"x": 1}', rev)

    asyncio.run(go())


@pytest.mark.parametrize("fault", ["expired", "foreign-signed", "unknown-account"])
def test_bad_jwts_are_refused_at_connect(server: Server, fault: str) -> None:
    user = nj.new_key("user")
    signer = server.auth.seed("account-signing")
    account = server.auth.keys.account
    now = time.time()
    expires = now + 600
    if fault == "expired":
        now, expires = now - 600, now - 300
    elif fault == "foreign-signed":
        signer = nj.new_key("account")  # a key nobody registered with the account
    else:
        signer = nj.new_key("account")
        account = nj.public(signer)
    perms = nj.Permissions(pub=("aegis.default.x.>",), sub=("aegis.default.x.>",))
    jwt = nj.encode(nj.user_claims(nj.public(user), name="bad", account=account, perms=perms,
                                   now=now, expires=expires), signer)

    async def go() -> None:
        with pytest.raises(Exception) as err:
            await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                               connect_timeout=3, user_jwt_cb=lambda: jwt.encode(),
                               signature_cb=lambda n: base64.b64encode(user.sign(n.encode())))
        assert "authorization violation" in str(err.value).lower() or \
            "expired" in str(err.value).lower(), err.value

    asyncio.run(go())


def test_wrong_token_is_unauthenticated_and_mints_nothing(server: Server,
                                                          tmp_path: Path) -> None:
    async def go() -> None:
        async with master(server, "job-d") as (svc, _):
            cfg = replace(init_config(svc, "job-d", "0", tmp_path), token="w" * 40)
            with pytest.raises(InitError, match="UNAUTHENTICATED") as err:
                await asyncio.get_running_loop().run_in_executor(None, fetch, cfg)
            assert err.value.refused
            assert svc.issuer.minted == 0 and svc.issuer.keys == {}

    asyncio.run(go())


def test_a_revoked_worker_is_dropped_and_cannot_come_back(server: Server,
                                                          tmp_path: Path) -> None:
    async def go() -> None:
        async with master(server, "job-e") as (svc, _):
            w0, s0 = await worker(svc, "job-e", 0, tmp_path)
            w1, _ = await worker(svc, "job-e", 1, tmp_path)
            svc.evict(0)  # quarantined / evicted
            await asyncio.wait_for(w0.closed.wait(), 10)
            assert not w1.closed.is_set() and w1.nc.is_connected  # the others stay
            with pytest.raises(Exception):  # noqa: B017 - its JWT is on the revocation list
                await Client().connect(server.url, **s0.connect_options())
            revoked = operator.read_revocations(server.auth.path)
            assert s0.creds.public_key in revoked
            # a replacement for rank 0 gets fresh credentials and connects
            w0b, s0b = await worker(svc, "job-e", 0, tmp_path)
            assert w0b.nc.is_connected and s0b.creds.public_key != s0.creds.public_key

    asyncio.run(go())


def test_a_replacement_locks_out_its_predecessor(server: Server, tmp_path: Path) -> None:
    async def go() -> None:
        async with master(server, "job-f") as (svc, _):
            old, _ = await worker(svc, "job-f", 1, tmp_path)
            await worker(svc, "job-f", 1, tmp_path)  # a new incarnation of rank 1
            await asyncio.wait_for(old.closed.wait(), 10)

    asyncio.run(go())


def test_an_api_that_never_says_which_pod_asked_delays_an_exchange_only_so_long(
        server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """On Kubernetes the master asks the API which pod made a credential exchange (F1). An API
    server that accepts and never answers (the real client, its own 15 s read bound) holds the
    exchange PLACEMENT_WAIT s, no longer: the worker gets its credentials, the rank has no
    trusted node, and the log says why."""
    from aegis_flow.k8s.client import KubeNodeApi
    from aegis_flow.master.creds import PLACEMENT_WAIT
    from aegis_flow.master.placement import KubePods, PodsByAddress
    from tests.http_recorder import black_hole

    async def go(url: str) -> float:
        async with master(server, "job-p") as (svc, _):
            svc.placement = PodsByAddress(KubePods(KubeNodeApi.from_host(url), "default"),
                                          "wf")
            started = time.monotonic()
            await worker(svc, "job-p", 1, tmp_path, deadline=PLACEMENT_WAIT + 10)
            took = time.monotonic() - started
            assert svc.placement.node_of(1) is None
            return took

    with black_hole() as hole, caplog.at_level("WARNING", logger="aegis_flow.master.creds"):
        took = asyncio.run(go(hole.url))
        assert hole.accepted.is_set()  # the lookup was asked, and held
    assert PLACEMENT_WAIT - 0.5 < took < PLACEMENT_WAIT + 5, took
    assert f"rank 1: the API did not say within {PLACEMENT_WAIT:g} s which pod is at" \
        in caplog.text


def test_two_jobs_side_by_side_never_see_each_other(server: Server, tmp_path: Path) -> None:
    async def go() -> None:
        async with master(server, "side-a") as (sa, ma), master(server, "side-b") as (sb, mb):
            jobs = {"side-a": (sa, ma), "side-b": (sb, mb)}
            workers: dict[str, list[Client]] = {}
            for job, (svc, m) in jobs.items():
                s = p.Subjects("default", job)
                await m.listen(s.masters)
                workers[job] = []
                for rank in (0, 1):
                    w, _ = await worker(svc, job, rank, tmp_path)
                    await w.listen(s.broadcast)
                    await w.listen(s.worker(rank))
                    workers[job].append(w)
            for job, (_, m) in jobs.items():
                s = p.Subjects("default", job)
                for rank, w in enumerate(workers[job]):
                    await w.nc.publish(s.master(rank), f"{job}:{rank}".encode())
                await m.nc.publish(s.broadcast, f"{job}:order".encode())
                await m.nc.publish(s.worker(0), f"{job}:to-0".encode())
            for c in [ma, mb, *workers["side-a"], *workers["side-b"]]:
                await c.nc.flush()
            want = {id(ma): 2, id(mb): 2, **{id(w): 2 - r for ws in workers.values()
                                            for r, w in enumerate(ws)}}
            deadline = time.monotonic() + 10  # generous: a loaded machine delivers late
            while any(len(c.got) < want[id(c)] for c in [ma, mb, *workers["side-a"],
                                                          *workers["side-b"]]):
                assert time.monotonic() < deadline, "expected messages did not arrive"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # anything extra (the other job's) would be here by now
            for job, (_, m) in jobs.items():
                assert sorted(d for _, d in m.got) == [f"{job}:0".encode(), f"{job}:1".encode()]
                for rank, w in enumerate(workers[job]):
                    expect = [f"{job}:order"] + ([f"{job}:to-0"] if rank == 0 else [])
                    assert sorted(d.decode() for _, d in w.got) == sorted(expect)
                    assert all(subj.startswith(f"aegis.default.{job}.") for subj, _ in w.got)
                    assert w.errors == []

    asyncio.run(go())


def test_renewal_over_the_workers_own_subject_outlives_the_jwt(server: Server,
                                                               tmp_path: Path) -> None:
    """A connected client is dropped when its JWT expires; renewing keeps it connected."""
    async def go() -> None:
        async with master(server, "job-g", lifetime=2.0) as (svc, m):
            s = p.Subjects("default", "job-g")
            await m.listen(s.masters)
            w, session = await worker(svc, "job-g", 0, tmp_path)
            notes: list[str] = []
            renewer = asyncio.ensure_future(session.renew_loop(w.nc, notes.append))
            first_exp = session.creds.expires_at
            for i in range(10):  # 5 s: two and a half lifetimes
                await w.nc.publish(s.master(0), f"beat {i}".encode())
                await asyncio.sleep(0.5)
            renewer.cancel()
            assert session.renewals >= 2, notes
            assert session.creds.expires_at > first_exp
            assert cf.read(session.path or "").jwt == session.creds.jwt  # file kept current
            # a renewal ends with a reconnect (the new JWT counts from the next CONNECT): the
            # last one may still be under way on a busy machine, so wait for it, bounded
            deadline = time.monotonic() + 5
            while not w.nc.is_connected:
                assert not w.closed.is_set(), w.errors
                assert time.monotonic() < deadline, f"not reconnected after renewal: {notes}"
                await asyncio.sleep(0.05)
            assert not w.closed.is_set()
            deadline = time.monotonic() + 10
            while not any(d == b"beat 9" for _, d in m.got):  # the last beat got through
                assert time.monotonic() < deadline, m.got
                await asyncio.sleep(0.05)
            # without renewal the server drops the connection at expiry
            lone, _ = await worker(svc, "job-g", 1, tmp_path)
            await asyncio.wait_for(lone.closed.wait(), 8)

    asyncio.run(go())


def test_a_token_replayed_after_the_job_ended_is_refused(server: Server,
                                                         tmp_path: Path) -> None:
    """The real master: the job ends (an operator stop), the master lingers, and the same
    bootstrap token no longer mints anything."""
    from aegis_flow.master.runtime import Master, MasterConfig

    async def go() -> None:
        svc = CredsService(SecurityConfig(auth_dir=str(server.auth.path), token=TOKEN),
                           job="job-h", namespace="default", workers=1, nats_url=server.url)
        cfg = MasterConfig(job="job-h", workers=1, nats_url=server.url, linger=30.0,
                           connect_timeout=60.0, observe=False)
        mst = Master(cfg, security=svc)
        run = asyncio.ensure_future(mst.run())
        while not svc.port:
            await asyncio.sleep(0.05)
        ok = await asyncio.get_running_loop().run_in_executor(
            None, fetch, init_config(svc, "job-h", "0", tmp_path))
        assert ok.jwt and svc.issuer.minted == 1
        subjects = p.Subjects("default", "job-h")
        # rank 0 heartbeats with its credentials, so the master lingers after the end
        w = await Client().connect(server.url, **cf.Session(ok).connect_options())

        async def beat() -> None:
            while True:
                ack = p.Message(job="job-h", namespace="default", pod_name="w0",
                                type=p.MsgType.ACK, rank=0, incarnation="i0",
                                timestamp=time.time())
                await w.nc.publish(subjects.master(0), ack.encode())
                await asyncio.sleep(0.2)

        beating = asyncio.ensure_future(beat())
        while 0 not in mst.last_seen:  # the master hears rank 0 before the job ends
            await asyncio.sleep(0.05)
        op = await Client().connect(server.url, **operator.user_options(
            server.auth, nj.Permissions(pub=(subjects.control,), sub=()), name="op",
            now=time.time()))
        stop = p.Message(job="job-h", namespace="default", pod_name="operator",
                         type=p.MsgType.STOP, data={"reason": "test"}, timestamp=time.time())
        await op.nc.publish(subjects.control, stop.encode())
        await op.nc.flush()
        while not svc.issuer.ended:
            await asyncio.sleep(0.05)
        with pytest.raises(InitError, match="FAILED_PRECONDITION") as err:
            await asyncio.get_running_loop().run_in_executor(
                None, fetch, init_config(svc, "job-h", "0", tmp_path))
        assert err.value.refused and svc.issuer.minted == 1
        assert w.errors == []  # the worker's reports were within its permissions
        beating.cancel()
        await w.nc.close()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await svc.stop()
        await op.nc.close()

    asyncio.run(go())


# -- TLS --------------------------------------------------------------------------------------

def self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for ``name`` (and 127.0.0.1), made on the spot."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_and_mutual_tls(server: Server, tmp_path: Path) -> None:
    pytest.importorskip("cryptography", reason="the cryptography package makes the test certs")
    cert, key = self_signed(tmp_path, "master")
    client_cert, client_key = self_signed(tmp_path, "worker")
    other, _ = self_signed(tmp_path, "impostor")

    async def go() -> None:
        tls = dict(tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(client_cert))
        async with master(server, "job-tls", **tls) as (svc, _):
            run = asyncio.get_running_loop().run_in_executor
            good = init_config(svc, "job-tls", "0", tmp_path, tls_ca=str(cert),
                               tls_cert=str(client_cert), tls_key=str(client_key))
            assert (await run(None, fetch, good)).jwt
            for bad in (replace(good, tls_ca=str(other)),  # the master is not who we trust
                        replace(good, tls_cert="", tls_key=""),  # no client certificate
                        replace(good, tls_ca="", tls_cert="", tls_key="")):  # plaintext
                with pytest.raises(InitError) as err:
                    await run(None, fetch, replace(bad, deadline=1.0, retries=0))
                assert not err.value.refused  # the handshake fails: unreachable, not refused
            assert svc.issuer.minted == 1

    asyncio.run(go())


# -- the commands ------------------------------------------------------------------------------

def test_worker_init_without_a_master_exits_0_and_the_worker_runs_plainly(tmp_path: Path) -> None:
    """Unreachable master → no creds → the supervisor's RunIndependent fallback."""
    from aegis_flow.master.runtime import free_port

    token = tmp_path / "token"
    token.write_text(TOKEN)
    out = tmp_path / "w.creds"
    cmd = [sys.executable, "-m", "aegis_flow.cli", "worker-init", "--master",
           f"127.0.0.1:{free_port()}", "--job", "j", "--worker", "0", "--token-file",
           str(token), "--out", str(out), "--deadline", "0.5", "--retries", "1", "--exec", "--",
           sys.executable, "-m", "aegis_flow.cli", "worker", "--creds", str(out), "--job", "j",
           "--rank", "0", "--world-size", "1", "--no-prewarm", "--",
           sys.executable, "-c", "import sys; print('plain run'); sys.exit(5)"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 5, res.stderr
    assert "unreachable" in res.stderr and "FAULT TOLERANCE IS OFF" in res.stderr
    assert "plain run" in res.stdout and not out.exists()
    assert "Traceback" not in res.stderr


def test_worker_init_bad_arguments_are_clear(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "aegis_flow.cli", "worker-init"]
    res = subprocess.run([*base, "--job", "j"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "--master" in res.stderr
    res = subprocess.run([*base, "--master", "h:1", "--job", "j", "--worker", "0", "--out",
                          str(tmp_path / "c"), "--token-env", "AEGIS_NO_SUCH_TOKEN"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "AEGIS_NO_SUCH_TOKEN" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_revocation_written_to_the_config_takes_effect_on_reload(tmp_path: Path) -> None:
    """The other path to revocation: the account revocation list in nats.conf + a server
    reload (and so it also survives a server restart)."""
    auth = operator.bootstrap(tmp_path / "auth")

    async def go(srv: EmbeddedNats) -> None:
        async with master(Server(srv.url, auth), "job-r") as (svc, _):
            w, session = await worker(svc, "job-r", 0, tmp_path)
            other, _ = await worker(svc, "job-r", 1, tmp_path)
            operator.record_revocations(auth, [session.creds.public_key], now=time.time())
            await asyncio.sleep(0.2)
            assert not w.closed.is_set()  # nothing pushed: the server does not know yet
            srv.reload()
            await asyncio.wait_for(w.closed.wait(), 10)
            assert other.nc.is_connected

    with EmbeddedNats(tmp_path / "store", config_file=auth.write_server_config()) as srv:
        asyncio.run(go(srv))


def test_workers_renew_with_a_restarted_master(server: Server, tmp_path: Path) -> None:
    """A master restarted mid-run knows no keys; its workers' renewals still succeed (their
    current JWT proves the grant), so nobody is dropped at expiry."""
    async def go() -> None:
        async with master(server, "job-m") as (first, _):
            w, session = await worker(first, "job-m", 1, tmp_path)
        async with master(server, "job-m") as (second, m2):
            assert second.issuer.keys == {}
            # the supervisor's renew_loop retries a failed renewal every few seconds; so does
            # this test, for a 'no responders' alone (seen once in CI on a loaded machine,
            # with the new master subscribed and flushed), and only within 5 s
            deadline = time.monotonic() + 5
            while True:
                try:
                    await session.renew(w.nc)
                    break
                except nats.errors.NoRespondersError:
                    assert time.monotonic() < deadline, (
                        "no responders for 5 s", w.nc.is_connected, m2.nc.is_connected,
                        w.errors, m2.errors)
                    await asyncio.sleep(0.2)
            assert second.issuer.minted == 1 and session.renewals == 1
            assert second.issuer.keys == {1: [session.creds.public_key]}
            deadline = time.monotonic() + 10
            while not w.nc.is_connected:  # the renewal reconnects with the new JWT
                assert time.monotonic() < deadline and not w.closed.is_set()
                await asyncio.sleep(0.05)
            await w.nc.flush(timeout=5)

    asyncio.run(go())


def test_a_supervisor_with_expired_credentials_says_so_and_runs_plainly(tmp_path: Path) -> None:
    from tests.test_security import creds_fixture

    path = cf.write(tmp_path / "old.creds",
                    replace(creds_fixture(), expires_at=int(time.time()) - 60))
    cmd = [sys.executable, "-m", "aegis_flow.cli", "worker", "--creds", str(path), "--job", "j",
           "--rank", "0", "--world-size", "1", "--no-prewarm", "--",
           sys.executable, "-c", "print('plain run')"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "expired" in res.stderr and "worker-init" in res.stderr
    assert "FAULT TOLERANCE IS OFF" in res.stderr and "plain run" in res.stdout


# ---------------------------------------------------------------- attacks by a worker (issue 17)


def test_f2_a_renewal_answers_only_into_the_askers_own_inbox(both: Server,
                                                            tmp_path: Path) -> None:
    """Review F2: a worker set its renewal's reply subject to a JetStream API subject and the
    master, with its own rights, purged a status stream. The master now answers only inside
    the asking rank's inbox: the purge of its own job's KV, another job's stream purge,
    delete and update, a reply into another rank's inbox and onto the order subject are all
    ignored (and counted); a proper renewal still works."""
    async def go() -> None:
        from aegis_flow.master.store import KVStore

        async with master(both, "job-f2") as (svc, m), master(both, "job-f2-other") as (
                _, other):
            s = p.Subjects("default", "job-f2")
            store = await KVStore.open(m.nc, s.kv_bucket)
            await store.save(b'{"keep": true}', 0)
            theirs = p.Subjects("default", "job-f2-other").kv_bucket
            victim = await KVStore.open(other.nc, theirs)
            await victim.save(b'{"theirs": true}', 0)
            w0, s0 = await worker(svc, "job-f2", 0, tmp_path)
            body = json.dumps({"public_key": s0.creds.public_key, "jwt": s0.creds.jwt}).encode()
            rank1_inbox = f"{s.prefix}.inbox.1.stolen"
            w1 = await Client().connect(both.url, **svc.connect_options())  # master's rights
            await w1.listen(rank1_inbox)
            tricks = (f"$JS.API.STREAM.PURGE.KV_{s.kv_bucket}", rank1_inbox,
                      f"{s.prefix}.broadcast", f"{s.prefix}.worker.1",
                      *(f"$JS.API.STREAM.{verb}.KV_{theirs}"
                        for verb in ("PURGE", "DELETE", "UPDATE")))
            for reply in tricks:
                await w0.nc.publish(s0.creds.renew_subject, body, reply=reply)
            await w0.nc.flush()
            deadline = time.monotonic() + 10
            while svc.foreign_replies < len(tricks):
                assert time.monotonic() < deadline, svc.foreign_replies
                await asyncio.sleep(0.05)
            assert await store.load() is not None  # not purged
            assert (await store.load())[0] == b'{"keep": true}'  # type: ignore[index]
            assert (await victim.load())[0] == b'{"theirs": true}'  # type: ignore[index]
            assert w1.got == []  # nothing was sent into rank 1's inbox
            await s0.renew(w0.nc)  # the real thing, into its own inbox
            assert s0.renewals == 1

    asyncio.run(go())


def test_f3_an_oversized_request_is_refused_before_it_is_logged(
        server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review F3: a wrong-token request with a 4 MB field was logged in full (82 MB of log in
    1.2 s). The gRPC server now refuses a request over 64 KiB unread; a small wrong request
    is logged with its fields cut to 40 characters."""
    async def go() -> None:
        async with master(server, "job-f3") as (svc, _):
            huge = replace(init_config(svc, "job-f3", "0", tmp_path), token="w" * (4 << 20))
            with pytest.raises(InitError, match="RESOURCE_EXHAUSTED"):
                await asyncio.get_running_loop().run_in_executor(None, fetch, huge)
            long_worker = replace(init_config(svc, "job-f3", "9" * 5000, tmp_path))
            with pytest.raises(InitError, match="INVALID_ARGUMENT") as err:
                await asyncio.get_running_loop().run_in_executor(None, fetch, long_worker)
            assert "9" * 41 not in str(err.value)  # the answer does not echo it either
            assert svc.issuer.minted == 0

    with caplog.at_level("WARNING", logger="aegis_flow.master.creds"):
        asyncio.run(go())
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "9" * 41 not in logged and "(5000 characters)" in logged
    assert len(logged) < 2000, len(logged)


@pytest.mark.parametrize("worker", ["01", "+1", " 1", "1.0", "\u00b9"])
def test_only_canonical_ranks_get_credentials(server: Server, tmp_path: Path,
                                              worker: str) -> None:
    """Review: rank '01' was accepted as rank 1, a second name for one rank."""
    async def go() -> None:
        async with master(server, "job-canon") as (svc, _):
            cfg = init_config(svc, "job-canon", worker, tmp_path)
            with pytest.raises(InitError, match="INVALID_ARGUMENT"):
                await asyncio.get_running_loop().run_in_executor(None, fetch, cfg)
            assert svc.issuer.minted == 0

    asyncio.run(go())


def test_f6_a_token_holder_cannot_grow_the_revocation_list_without_bound(
        server: Server, tmp_path: Path) -> None:
    """Review F6: 1,500 mints for one rank in 30 s put 1,499 keys on the shared account's
    revocation list (kept 7 days; past ~11k the claims update exceeds NATS's max payload and
    revocation stops for every job). Now one rank registers at most MAX_NEW_KEYS_PER_RANK keys
    per JWT lifetime (then RESOURCE_EXHAUSTED, counted), and the list is pruned after the JWT
    lifetime (plus a margin), not 7 days."""
    from aegis_flow.master.creds import REVOCATION_MARGIN
    from aegis_flow.security.issuer import MAX_NEW_KEYS_PER_RANK

    async def go() -> None:
        async with master(server, "job-f6") as (svc, _):
            cfg = init_config(svc, "job-f6", "0", tmp_path)
            loop = asyncio.get_running_loop()
            for _ in range(MAX_NEW_KEYS_PER_RANK):
                await loop.run_in_executor(None, fetch, cfg)
            with pytest.raises(InitError, match="RESOURCE_EXHAUSTED"):
                await loop.run_in_executor(None, fetch, cfg)
            # worker-init retries RESOURCE_EXHAUSTED once: each try is refused and counted
            assert svc.issuer.refused_new_keys == cfg.retries + 1
            assert svc.counters()["new_keys"] == cfg.retries + 1
            await worker(svc, "job-f6", 1, tmp_path)  # other ranks are not held up
            deadline = time.monotonic() + 10
            while svc.revocations < MAX_NEW_KEYS_PER_RANK - 1:  # the pushes are async
                assert time.monotonic() < deadline, svc.revocations
                await asyncio.sleep(0.05)

    asyncio.run(go())
    revoked = operator.read_revocations(server.auth.path)
    ours = len(revoked)
    assert ours >= MAX_NEW_KEYS_PER_RANK - 1
    # a later push prunes what is older than the JWT lifetime (600 s here) plus the margin
    later = time.time() + 600 + REVOCATION_MARGIN + 1
    pruned = operator.record_revocations(server.auth, ["UNEWKEY"], now=later,
                                         keep=600 + REVOCATION_MARGIN)
    assert pruned == {"UNEWKEY": int(later)}


def test_f2_the_masters_own_user_reaches_only_its_own_bucket(both: Server) -> None:
    """Defence in depth for F2: the master's NATS user may use the JetStream API of its own
    job's KV bucket only, so even a master tricked into publishing cannot purge, delete or
    read another job's stored status."""
    async def go() -> None:
        from aegis_flow.master.store import KVStore

        async with master(both, "job-own") as (_, mine), master(both, "job-theirs") as (
                _, theirs):
            victim = await KVStore.open(theirs.nc, p.Subjects("default", "job-theirs").kv_bucket)
            await victim.save(b'{"theirs": 1}', 0)
            ours = await KVStore.open(mine.nc, p.Subjects("default", "job-own").kv_bucket)
            await ours.save(b'{"ours": 1}', 0)  # its own bucket: create, write, read
            assert (await ours.load())[0] == b'{"ours": 1}'
            stream = f"KV_{p.Subjects('default', 'job-theirs').kv_bucket}"
            for verb in ("PURGE", "DELETE", "INFO", "MSG.GET"):
                await mine.nc.publish(f"$JS.API.STREAM.{verb}.{stream}", b"{}")
            await mine.nc.publish(f"$KV.{p.Subjects('default', 'job-theirs').kv_bucket}.status",
                                  b"{}")
            errors = await mine.violations(5)
            assert all("permissions violation" in e for e in errors[-5:]), errors
            assert (await victim.load())[0] == b'{"theirs": 1}'  # untouched

    asyncio.run(go())


def test_f4_no_new_key_for_a_rank_whose_worker_is_alive(server: Server, tmp_path: Path) -> None:
    """Review F4: a re-mint for a live rank silently took it over (the real rank was revoked
    and the job failed). While the master hears rank 1's worker, a new key for rank 1 is
    refused with UNAVAILABLE (worker-init asks again with backoff); once the worker counts as
    lost or replaced, the same request is granted and the predecessor is locked out."""
    async def go() -> None:
        async with master(server, "job-f4") as (svc, _):
            old, _ = await worker(svc, "job-f4", 1, tmp_path)
            heard: dict[int, float | None] = {1: 0.4}
            svc.alive = heard.get  # the master's view: rank 1 heard 0.4 s ago
            cfg = init_config(svc, "job-f4", "1", tmp_path)
            with pytest.raises(InitError, match="UNAVAILABLE.*rank 1 is alive") as err:
                await asyncio.get_running_loop().run_in_executor(None, fetch, cfg)
            assert not err.value.refused  # a "not now", asked again, not a final no
            assert old.nc.is_connected and not old.closed.is_set()
            await worker(svc, "job-f4", 0, tmp_path)  # a rank with no live worker: granted
            heard[1] = None  # lost or being replaced
            await worker(svc, "job-f4", 1, tmp_path)
            await asyncio.wait_for(old.closed.wait(), 10)  # the predecessor is out

    asyncio.run(go())
