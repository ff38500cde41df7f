"""The credential issuer of one job: who may get a NATS user JWT, for which subjects, until when.

PURE apart from signing (``nkeys``): time is an argument, no I/O. The master's shell
(``master/creds.py``) feeds it gRPC requests and NATS renewal requests and carries out the
revocations it returns.

Rules:
* the bootstrap token is per job and compared in constant time; a wrong one mints nothing;
* the job and namespace must be this issuer's; the worker is a rank of the job; the public key
  a valid NATS *user* key (the worker made it; its seed never leaves the worker);
* a job that ended mints nothing more, whatever the token (a replayed token is refused);
* a revoked key is never renewed; when a new key is registered for a rank, the rank's older
  keys are revoked (a replaced worker's predecessor is locked out);
* a worker may publish only to its own rank's report subject (``master.<rank>``: the master
  takes the subject as the sender's rank) and its own renewal subject, and subscribe only to
  the broadcast, its own order subject and its own inbox prefix — all under
  ``aegis.<namespace>.<job>.``: never ``_INBOX.>``, ``$JS.API.>`` or another job's subjects.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field

import nkeys

from aegis_flow import protocol as p
from aegis_flow.security import natsjwt as nj

MIN_LIFETIME = 2.0


class Code(enum.Enum):
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"  # not now: ask again later (worker-init retries it)


#: new keys one rank may register within one JWT lifetime: every restart of a pod is one, and
#: each new key revokes the last; past this a token holder is minting in a loop (review F6:
#: 1,499 revocations in 30 s grew the account's shared list without bound)
MAX_NEW_KEYS_PER_RANK = 16


class Refused(Exception):
    """A request the issuer will not serve; ``code`` maps onto a gRPC status."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Request:
    job: str
    namespace: str
    worker: str
    public_key: str
    token: str


@dataclass(frozen=True)
class Grant:
    jwt: str
    nats_urls: tuple[str, ...]
    pub: tuple[str, ...]
    sub: tuple[str, ...]
    inbox_prefix: str
    renew_subject: str
    expires_at: int


def shown(text: str, most: int = 40) -> str:
    """Attacker-supplied text as it may appear in a message or a log line: quoted, at most
    ``most`` characters (a 4 MB field must not become a 4 MB log line)."""
    cut = text[:most]
    return repr(cut) + (f"… ({len(text)} characters)" if len(text) > most else "")


def renew_subject(subjects: p.Subjects, rank: int) -> str:
    return f"{subjects.prefix}.creds.{rank}"


def inbox_prefix(subjects: p.Subjects, rank: int) -> str:
    return f"{subjects.prefix}.inbox.{rank}"


def worker_permissions(subjects: p.Subjects, rank: int) -> nj.Permissions:
    return nj.Permissions(
        pub=(subjects.master(rank), renew_subject(subjects, rank)),
        sub=(subjects.broadcast, subjects.worker(rank), f"{inbox_prefix(subjects, rank)}.>"),
        resp=True)


def master_permissions(subjects: p.Subjects) -> nj.Permissions:
    """The master's own user: its job's subjects, the JetStream API of its own KV bucket only
    (what nats-py's key-value calls use: stream info/create/delete/purge, direct and message
    get, consumers for watches), its bucket's keys, and replies. Never ``$JS.API.>``: even a
    master tricked into publishing somewhere (review F2) cannot touch another job's stream."""
    stream = f"KV_{subjects.kv_bucket}"
    api = "$JS.API"
    return nj.Permissions(
        pub=(f"{subjects.prefix}.>", f"{api}.INFO",
             *(f"{api}.STREAM.{verb}.{stream}"
               for verb in ("INFO", "CREATE", "UPDATE", "DELETE", "PURGE", "MSG.GET")),
             f"{api}.DIRECT.GET.{stream}", f"{api}.DIRECT.GET.{stream}.>",
             f"{api}.CONSUMER.CREATE.{stream}", f"{api}.CONSUMER.CREATE.{stream}.>",
             f"{api}.CONSUMER.DELETE.{stream}.>", f"{api}.CONSUMER.INFO.{stream}.>",
             f"$KV.{subjects.kv_bucket}.>"),
        sub=(f"{subjects.prefix}.>", "_INBOX.>"))


@dataclass
class Issuer:
    job: str
    namespace: str
    workers: int
    token: str
    account: str  # the aegis account's public key
    signing_key: nkeys.KeyPair  # the account signing key
    nats_urls: tuple[str, ...]
    lifetime: float = 3600.0
    ended: bool = False
    minted: int = 0
    keys: dict[int, list[str]] = field(default_factory=dict)  # rank → keys, newest last
    revoked: set[str] = field(default_factory=set)
    registered: dict[int, list[float]] = field(default_factory=dict)  # rank → when, recent
    refused_new_keys: int = 0  # requests over MAX_NEW_KEYS_PER_RANK (a metric)

    def __post_init__(self) -> None:
        if len(self.token) < 16:
            raise ValueError("the bootstrap token must be at least 16 characters")
        if self.lifetime < MIN_LIFETIME:
            raise ValueError(f"a JWT lifetime of {self.lifetime:g} s is too short (at least "
                             f"{MIN_LIFETIME:g} s: expiry is in whole seconds)")
        self.subjects = p.Subjects(self.namespace, self.job)

    # -- requests -----------------------------------------------------------------------------
    def sync(self, req: Request, *, now: float,
             alive: Callable[[int], float | None] | None = None) -> tuple[Grant, list[str]]:
        """Serve SyncWorkerCreds: the grant and the keys to revoke now (the rank's older ones).
        ``alive(rank)``: seconds since the rank's current worker was last heard while it still
        counts as alive, else None; a new key for a live rank is refused (UNAVAILABLE: asked
        again, it is granted once that worker is lost or replaced), so a stolen token cannot
        take over a running worker (review F4). Raises Refused."""
        if not hmac.compare_digest(req.token.encode(), self.token.encode()):
            raise Refused(Code.UNAUTHENTICATED, "wrong bootstrap token")
        if (req.job, req.namespace) != (self.job, self.namespace):
            raise Refused(Code.PERMISSION_DENIED,
                          f"this master serves job {self.namespace}/{self.job}, "
                          f"not {shown(req.namespace)}/{shown(req.job)}")
        if self.ended:
            raise Refused(Code.FAILED_PRECONDITION,
                          f"job {self.namespace}/{self.job} has ended: no new credentials")
        rank = self._rank(req.worker)
        key = self._user_key(req.public_key)
        if key in self.revoked:
            raise Refused(Code.PERMISSION_DENIED, "this key was revoked")
        known = self.keys.setdefault(rank, [])
        live_key = any(k not in self.revoked for k in known)
        heard = alive(rank) if alive is not None and key not in known and live_key else None
        if heard is not None:
            raise Refused(Code.UNAVAILABLE,
                          f"rank {rank} is alive (heard {heard:.1f} s ago): a new key for it is "
                          "granted only once that worker is lost or replaced")
        if key not in known:
            recent = [t for t in self.registered.get(rank, []) if now - t < self.lifetime]
            if len(recent) >= MAX_NEW_KEYS_PER_RANK:
                self.refused_new_keys += 1
                raise Refused(Code.RESOURCE_EXHAUSTED,
                              f"rank {rank} registered {len(recent)} new keys within "
                              f"{self.lifetime:.0f} s; no more until the oldest is that old")
            self.registered[rank] = [*recent, now]
        stale = [k for k in known if k != key and k not in self.revoked]
        if key not in known:
            known.append(key)
        self.revoked.update(stale)
        return self._grant(rank, key, now), stale

    def renew(self, rank: int, public_key: str, *, now: float, current: str = "") -> Grant:
        """A fresh JWT for a key this issuer granted and never revoked — or, after a master
        restart (the issuer starts empty), for a key whose ``current`` JWT this job's signing
        key issued to this rank and that has not expired yet. (Only rank R can publish on its
        renewal subject: the server checks that, so the subject names the sender.)"""
        if self.ended:
            raise Refused(Code.FAILED_PRECONDITION, "the job has ended")
        known = self.keys.get(rank, [])
        if public_key not in self.revoked and public_key not in known and current:
            if self._still_valid(current, rank, public_key, now):
                known.append(public_key)
                self.keys[rank] = known
        if public_key in self.revoked or public_key not in known:
            raise Refused(Code.PERMISSION_DENIED, f"no live credentials for rank {rank} and "
                          "this key")
        return self._grant(rank, public_key, now)

    def _still_valid(self, token: str, rank: int, public_key: str, now: float) -> bool:
        try:
            claims = nj.decode(token, trusted=[nj.public(self.signing_key)], now=now)
        except nj.JwtError:
            return False
        return bool(claims.get("sub") == public_key and claims.get("exp")
                    and claims.get("name") == self._name(rank))

    def _name(self, rank: int) -> str:
        return f"{self.namespace}.{self.job}.{rank}"

    def evict(self, rank: int) -> list[str]:
        """Revoke every live key of ``rank`` (quarantined or evicted); return them."""
        live = [k for k in self.keys.get(rank, []) if k not in self.revoked]
        self.revoked.update(live)
        return live

    def end(self) -> None:
        self.ended = True

    # -- helpers ------------------------------------------------------------------------------
    def _rank(self, worker: str) -> int:
        """A canonical rank of this job (``1``, never ``01`` or ``+1``: one rank, one name)."""
        canonical = (0 < len(worker) <= 9 and worker.isascii() and worker.isdigit()
                     and str(int(worker)) == worker)  # length first: int() of 5,000 digits
        if not canonical or not 0 <= int(worker) < self.workers:  # raises, it does not refuse
            raise Refused(Code.INVALID_ARGUMENT, f"worker {shown(worker)} is not a rank of this "
                          f"job (0..{self.workers - 1})")
        return int(worker)

    @staticmethod
    def _user_key(key: str) -> str:
        try:
            return nj.check_public_key(key, "user")
        except nj.JwtError as exc:
            raise Refused(Code.INVALID_ARGUMENT, f"public key: {exc}") from None

    def _grant(self, rank: int, key: str, now: float) -> Grant:
        perms = worker_permissions(self.subjects, rank)
        expires = int(now + self.lifetime)
        claims = nj.user_claims(key, name=self._name(rank),
                                account=self.account, perms=perms, now=now, expires=expires)
        self.minted += 1
        return Grant(jwt=nj.encode(claims, self.signing_key), nats_urls=self.nats_urls,
                     pub=perms.pub, sub=perms.sub, inbox_prefix=inbox_prefix(self.subjects, rank),
                     renew_subject=renew_subject(self.subjects, rank), expires_at=expires)
