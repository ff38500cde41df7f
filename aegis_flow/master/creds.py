"""The master's credential service: the gRPC ``SyncWorkerCreds`` server, renewals over NATS,
revocations pushed to the server. Imports grpcio (masters only; never the supervisor).

Side effects: listens on a TCP port (gRPC, optionally TLS), subscribes to the job's renewal
subjects on the master's NATS connection, reads the auth dir (keys) and writes its revocation
list and server config, opens a system-account NATS connection to push account updates.
Decisions are the issuer's (``security/issuer.py``); this module only carries them out.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aegis_flow.security import issuer as iss
from aegis_flow.security import natsjwt as nj
from aegis_flow.security import operator
from aegis_flow.settings import MASTER

log = logging.getLogger("aegis_flow.master.creds")
MASTER_JWT_LIFETIME = 24 * 3600.0
MAX_REQUEST_BYTES = 64 * 1024  # the largest SyncWorkerCreds request the gRPC server reads
# a revocation outlives the revoked key's JWT by this much (clock skew between the nodes)
REVOCATION_MARGIN = 300.0
#: how long a credential exchange waits for the API to say which pod asked (placement.py);
#: longer, and the exchange goes on with no trusted node for the rank
PLACEMENT_WAIT = 5.0


@dataclass(frozen=True)
class SecurityConfig:
    auth_dir: str
    token: str
    grpc_listen: str = "127.0.0.1:0"
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""  # require client certificates signed by this CA
    jwt_lifetime: float = MASTER.jwt_lifetime
    advertise_nats_urls: tuple[str, ...] = ()  # what workers dial (default: the master's URL)
    # How long an evicted worker keeps its NATS access: long enough that one reconnecting when
    # its exit order went out comes back, heartbeats and gets the order re-sent (the core
    # re-sends it to an old incarnation). Its successor's registration revokes it at once.
    revoke_grace: float = MASTER.revoke_grace


class CredsService:
    def __init__(self, cfg: SecurityConfig, *, job: str, namespace: str, workers: int,
                 nats_url: str) -> None:
        self.cfg = cfg
        self.nats_url = nats_url
        self.auth = operator.load(cfg.auth_dir)
        self.issuer = iss.Issuer(
            job=job, namespace=namespace, workers=workers, token=cfg.token,
            account=self.auth.keys.account, signing_key=self.auth.seed("account-signing"),
            nats_urls=cfg.advertise_nats_urls or (nats_url,), lifetime=cfg.jwt_lifetime)
        # keys revoked by an earlier master of this job (or any master sharing the dir)
        self.issuer.revoked.update(operator.read_revocations(self.auth.path))
        self._key = nj.new_key("user")  # the master's own identity, never written anywhere
        self._jwt = self._mint_own(time.time())
        self.nc: Any = None
        self.port = 0
        self._server: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._evicted: dict[int, list[str]] = {}  # rank → keys whose revocation is pending
        self.foreign_replies = 0  # renewals ignored: their reply subject was not the inbox
        self.revocations = 0  # entries on the revocation list after the last push
        # Kubernetes: where each rank's pod runs, resolved from the address of its credential
        # exchange (placement.PodsByAddress); the master trusts it, not the heartbeats
        self.placement: Any = None
        # seconds since rank R's worker was last heard while it counts as alive, else None
        # (the master's view, set by the runtime): no new key for a live rank (review F4)
        self.alive: Callable[[int], float | None] | None = None
        self._sys: Any = None

    # -- the master's own NATS user ----------------------------------------------------------
    def _mint_own(self, now: float) -> str:
        perms = iss.master_permissions(self.issuer.subjects)
        claims = nj.user_claims(nj.public(self._key), name=f"master.{self.issuer.subjects.prefix}",
                                account=self.auth.keys.account, perms=perms, now=now,
                                expires=now + MASTER_JWT_LIFETIME)
        return nj.encode(claims, self.issuer.signing_key)

    def connect_options(self) -> dict[str, Any]:
        return {"user_jwt_cb": lambda: self._jwt.encode(),
                "signature_cb": lambda nonce: base64.b64encode(self._key.sign(nonce.encode()))}

    async def _renew_own(self) -> None:
        while True:
            await asyncio.sleep(MASTER_JWT_LIFETIME * 2 / 3)
            self._jwt = self._mint_own(time.time())
            await self.nc.force_reconnect()

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, nc: Any) -> int:
        """Serve gRPC and renewals; return the gRPC port."""
        import importlib

        import grpc

        aegis_pb2_grpc: Any = importlib.import_module("aegis_flow.rpc.aegis_pb2_grpc")

        self.nc = nc
        # a SyncWorkerCreds request is a few hundred bytes: refuse anything near a megabyte
        # before it is parsed or logged (review F3: a 4 MB field made 82 MB of log)
        self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES)])
        aegis_pb2_grpc.add_AegisCredsServicer_to_server(_Servicer(self), self._server)
        if self.cfg.tls_cert:
            creds = grpc.ssl_server_credentials(
                [(Path(self.cfg.tls_key).read_bytes(), Path(self.cfg.tls_cert).read_bytes())],
                root_certificates=(Path(self.cfg.tls_client_ca).read_bytes()
                                   if self.cfg.tls_client_ca else None),
                require_client_auth=bool(self.cfg.tls_client_ca))
            self.port = self._server.add_secure_port(self.cfg.grpc_listen, creds)
        else:
            self.port = self._server.add_insecure_port(self.cfg.grpc_listen)
        if not self.port:
            raise OSError(f"cannot listen for gRPC on {self.cfg.grpc_listen}")
        await self._server.start()
        await nc.subscribe(f"{self.issuer.subjects.prefix}.creds.*", cb=self._on_renew)
        await nc.flush()  # renewals are served from here on
        self._spawn(self._renew_own())
        log.info("credentials: gRPC on port %d (%s), JWT lifetime %.0f s", self.port,
                 "TLS" if self.cfg.tls_cert else "plaintext", self.cfg.jwt_lifetime)
        return self.port

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.stop(0.5)
        if self._sys is not None:
            with contextlib.suppress(Exception):
                await self._sys.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def counters(self) -> dict[str, int]:
        """What an outsider tried and was refused, and the revocation list's size."""
        return {"new_keys": self.issuer.refused_new_keys,
                "foreign_reply": self.foreign_replies, "revocations": self.revocations}

    # -- events from the master ---------------------------------------------------------------
    def job_ended(self) -> None:
        self.issuer.end()

    def evict(self, rank: int) -> None:
        """A quarantined or evicted worker: no renewals from now on; its keys are revoked on
        NATS after ``revoke_grace`` seconds, or as soon as its successor registers."""
        keys = self.issuer.evict(rank)
        if keys:
            self._evicted.setdefault(rank, []).extend(keys)
            self._spawn(self._revoke_later(rank, self.cfg.revoke_grace))

    async def _revoke_later(self, rank: int, delay: float) -> None:
        await asyncio.sleep(delay)
        keys = self._evicted.pop(rank, [])
        if keys:
            await self.revoke(keys)

    async def revoke(self, keys: list[str]) -> None:
        """Add ``keys`` to the account's revocation list and push the re-signed account JWT to
        the server over the system account (the server drops their connections)."""
        import nats

        now = time.time()
        try:
            revocations = await asyncio.get_running_loop().run_in_executor(
                None, lambda: operator.record_revocations(
                    self.auth, keys, now=now, keep=self.cfg.jwt_lifetime + REVOCATION_MARGIN))
            self.revocations = len(revocations)
            account_jwt = self.auth.account_jwt(now, revocations)
            if self._sys is None or self._sys.is_closed:
                sys_key = self.auth.seed("system-user")
                sys_jwt = (self.auth.path / "system-user.jwt").read_text().strip()
                self._sys = await nats.connect(
                    self.nats_url, connect_timeout=2, max_reconnect_attempts=2,
                    user_jwt_cb=lambda: sys_jwt.encode(),
                    signature_cb=lambda n: base64.b64encode(sys_key.sign(n.encode())))
            reply = await self._sys.request(
                f"$SYS.REQ.ACCOUNT.{self.auth.keys.account}.CLAIMS.UPDATE",
                account_jwt.encode(), timeout=3)
            answer = json.loads(reply.data)
            if "error" in answer:
                raise RuntimeError(answer["error"])
            log.warning("credentials: revoked %d key(s): %s", len(keys),
                        ", ".join(k[:10] + "..." for k in keys))
        except Exception as exc:  # noqa: BLE001 - the JWT's expiry still bounds the damage
            log.error("credentials: could not push the revocation of %d key(s) (%r); they stay "
                      "valid until their JWTs expire", len(keys), exc)

    # -- requests ----------------------------------------------------------------------------
    def sync(self, req: iss.Request) -> iss.Grant:
        grant, stale = self.issuer.sync(req, now=time.time(), alive=self.alive)
        if req.worker.isdigit():  # a successor: its evicted predecessor goes now
            stale = stale + self._evicted.pop(int(req.worker), [])
        if stale:
            self._spawn(self.revoke(stale))
        return grant

    async def _on_renew(self, msg: Any) -> None:
        if not msg.reply:
            return
        try:
            rank = int(msg.subject.rsplit(".", 1)[1])
        except ValueError:
            return
        inbox = iss.inbox_prefix(self.issuer.subjects, rank) + "."
        if not msg.reply.startswith(inbox):  # no confused deputy (review F2): the answer goes
            self.foreign_replies += 1         # only into the asking rank's own inbox
            if self.foreign_replies & (self.foreign_replies - 1) == 0:  # 1, 2, 4, …: no flood
                log.warning("credentials: ignored a renewal from rank %d whose reply subject "
                            "%s is outside its inbox (%d so far)", rank,
                            iss.shown(msg.reply, 60), self.foreign_replies)
            return
        try:
            data = json.loads(msg.data)
            grant = self.issuer.renew(rank, str(data["public_key"]), now=time.time(),
                                      current=str(data.get("jwt", "")))
            answer: dict[str, Any] = {"jwt": grant.jwt, "expires_at": grant.expires_at}
        except iss.Refused as exc:
            answer = {"error": exc.message}
        except (ValueError, KeyError, TypeError) as exc:
            answer = {"error": f"malformed renewal request: {exc!r}"}
        with contextlib.suppress(Exception):
            await self.nc.publish(msg.reply, json.dumps(answer).encode())


class _Servicer:
    """The gRPC face of CredsService (grpc.aio calls ``SyncWorkerCreds``)."""

    def __init__(self, service: CredsService) -> None:
        self.service = service

    async def SyncWorkerCreds(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
        import grpc

        from aegis_flow.rpc import aegis_pb2

        req = iss.Request(job=request.job, namespace=request.namespace, worker=request.worker,
                          public_key=request.public_key, token=request.bootstrap_token)
        try:
            grant = self.service.sync(req)
            placement = self.service.placement
            if placement is not None:  # where this rank's pod runs, from the API (F1)
                peer = context.peer() if hasattr(context, "peer") else ""
                try:  # bounded: the worker's own call has a deadline (worker-init --deadline)
                    node = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                        None, placement.record, int(req.worker), str(peer)), PLACEMENT_WAIT)
                except asyncio.TimeoutError:
                    node = None
                    placement.forget(int(req.worker), (
                        f"rank {req.worker}: the API did not say within {PLACEMENT_WAIT:g} s "
                        f"which pod is at {iss.shown(str(peer), 60)}"))
                if node is None:
                    log.warning("credentials: %s", placement.refused[-1])
        except iss.Refused as exc:
            peer = context.peer() if hasattr(context, "peer") else "?"
            log.warning("credentials: refused %s for worker %s from %s: %s", exc.code.value,
                        iss.shown(request.worker), iss.shown(str(peer), 60), exc.message)
            await context.abort(getattr(grpc.StatusCode, exc.code.value), exc.message)
            raise  # abort raises; this is never reached
        return aegis_pb2.SyncWorkerCredsResponse(
            user_jwt=grant.jwt, nats_urls=list(grant.nats_urls), publish=list(grant.pub),
            subscribe=list(grant.sub), inbox_prefix=grant.inbox_prefix,
            renew_subject=grant.renew_subject, expires_at=grant.expires_at)
