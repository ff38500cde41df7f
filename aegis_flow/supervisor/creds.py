"""The worker's NATS credentials file: written once by ``worker-init``, read by the supervisor,
renewed over NATS before the JWT expires.

Standard library and ``nkeys`` only (the supervisor imports it). Side effects: :func:`write`
creates a file with mode 0600; :class:`Session` signs the server's nonce, requests renewals
over its NATS connection, rewrites the file and reconnects.

File format (mode 0600): the standard NATS ``.creds`` layout — so ``nats --creds FILE`` works
for debugging — plus an aegis metadata block that NATS clients ignore::

    -----BEGIN NATS USER JWT-----
    eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ...
    ------END NATS USER JWT------
    ...
    -----BEGIN USER NKEY SEED-----
    SUA...
    ------END USER NKEY SEED------
    ...
    -----BEGIN AEGIS METADATA-----
    {"nats_urls": [...], "inbox_prefix": "aegis.<ns>.<job>.inbox.<rank>", "renew_subject": ...}
    ------END AEGIS METADATA------

A file without the metadata block (made by other tools) works too, without renewal.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import nkeys

# A worker renews once a share of its JWT's lifetime in [RENEW_FROM, RENEW_TO) has passed,
# the share fixed by its key: a job's workers are granted within seconds of each other, and
# renewing at one share (it was 2/3) made all of them request and reconnect in those seconds
# (at 4,096 workers the reconnects took 5-7 s and the master judged a rank lost, measured
# with bench/scale.py --creds); spread over a quarter of the lifetime (15 min of 1 h) they
# come a few a second.
RENEW_FROM, RENEW_TO = 0.5, 0.75


def renew_share(public_key: str) -> float:
    """The share of the lifetime after which the JWT of ``public_key`` is renewed: uniform in
    [RENEW_FROM, RENEW_TO) over keys, the same for one key (pure)."""
    digest = hashlib.sha256(public_key.encode()).digest()
    return RENEW_FROM + (RENEW_TO - RENEW_FROM) * int.from_bytes(digest[:8], "big") / 2**64


class CredsError(RuntimeError):
    """The creds file is missing, unreadable, malformed or not private."""


@dataclass(frozen=True)
class Creds:
    jwt: str
    seed: str
    nats_urls: tuple[str, ...]
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    inbox_prefix: str
    renew_subject: str
    expires_at: int
    issued_at: int
    job: str
    namespace: str
    worker: str

    @property
    def public_key(self) -> str:
        return str(nkeys.from_seed(bytearray(self.seed.encode())).public_key.decode())

    def renew_due(self) -> float:
        """The unix time at which to ask for a fresh JWT (see :func:`renew_share`)."""
        share = renew_share(self.public_key)
        return self.issued_at + share * max(0, self.expires_at - self.issued_at)


def jwt_times(jwt: str) -> tuple[int, int]:
    """(iat, exp) of a JWT, read without verifying it (the server verifies)."""
    try:
        part = jwt.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        return int(claims["iat"]), int(claims.get("exp") or 0)
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise CredsError(f"not a NATS JWT: {exc!r}") from None


_JWT, _SEED, _META = "NATS USER JWT", "USER NKEY SEED", "AEGIS METADATA"


def _block(name: str, body: str) -> str:
    return f"-----BEGIN {name}-----\n{body}\n------END {name}------\n"


def render(creds: Creds) -> str:
    meta = {k: v for k, v in asdict(creds).items() if k not in ("jwt", "seed")}
    return "".join([
        _block(_JWT, creds.jwt), "\n",
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n",
        _block(_SEED, creds.seed), "\n",
        "*************************************************************\n\n",
        _block(_META, json.dumps(meta, sort_keys=True)),
    ])


def _between(text: str, name: str) -> str | None:
    start = text.find(f"-----BEGIN {name}-----")
    if start < 0:
        return None
    start = text.index("\n", start) + 1
    end = text.find(f"------END {name}------", start)
    return text[start:end].strip() if end >= 0 else None


def write(path: str | os.PathLike[str], creds: Creds) -> Path:
    """Write atomically with mode 0600 (the seed is a secret)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(render(creds))
    os.chmod(tmp, 0o600)
    os.replace(tmp, target)
    return target


def read(path: str | os.PathLike[str]) -> Creds:
    """Parse a creds file; CredsError saying what is wrong (missing, not private, malformed)."""
    source = Path(path)
    try:
        st = source.stat()
        text = source.read_text()
    except FileNotFoundError:
        raise CredsError(f"no credentials at {source} (did worker-init run and succeed?)") from None
    except OSError as exc:
        raise CredsError(f"cannot read credentials {source}: {exc}") from None
    if st.st_mode & 0o077:
        raise CredsError(f"credentials {source} are readable by others "
                         f"(mode {st.st_mode & 0o777:o}); they must be 0600")
    jwt, seed, meta_text = _between(text, _JWT), _between(text, _SEED), _between(text, _META)
    if not jwt or not seed:
        raise CredsError(f"credentials {source} lack the user JWT or the nkey seed block")
    iat, exp = jwt_times(jwt)
    try:
        meta = json.loads(meta_text) if meta_text else {}
        return Creds(jwt=jwt, seed=seed, nats_urls=tuple(map(str, meta.get("nats_urls", ()))),
                     publish=tuple(map(str, meta.get("publish", ()))),
                     subscribe=tuple(map(str, meta.get("subscribe", ()))),
                     inbox_prefix=str(meta.get("inbox_prefix", "")),
                     renew_subject=str(meta.get("renew_subject", "")),
                     expires_at=int(meta.get("expires_at", exp)),
                     issued_at=int(meta.get("issued_at", iat)), job=str(meta.get("job", "")),
                     namespace=str(meta.get("namespace", "")), worker=str(meta.get("worker", "")))
    except (TypeError, ValueError, AttributeError) as exc:
        raise CredsError(f"credentials {source}: bad metadata block ({exc})") from None


class Session:
    """A worker's live credentials: the NATS connect options, and renewal before expiry."""

    def __init__(self, creds: Creds, path: str | os.PathLike[str] | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.creds = creds
        self.path = Path(path) if path is not None else None
        self.clock = clock
        self._key = nkeys.from_seed(bytearray(creds.seed.encode()))
        self.renewals = 0

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``: the JWT (read at every (re)connect), nonce
        signing with the worker's own key, and the inbox prefix its permissions allow."""
        opts: dict[str, Any] = {
            "user_jwt_cb": lambda: self.creds.jwt.encode(),
            "signature_cb": lambda nonce: base64.b64encode(self._key.sign(nonce.encode()))}
        if self.creds.inbox_prefix:
            opts["inbox_prefix"] = self.creds.inbox_prefix
        return opts

    async def renew(self, nc: Any, timeout: float = 5.0) -> None:
        """Ask the master for a fresh JWT over the renewal subject, keep it, reconnect with it."""
        body = json.dumps({"public_key": self.creds.public_key, "jwt": self.creds.jwt}).encode()
        reply = await nc.request(self.creds.renew_subject, body, timeout=timeout)
        data = json.loads(reply.data)
        if not isinstance(data, dict) or "jwt" not in data:
            why = data.get("error") if isinstance(data, dict) else data
            raise CredsError(f"renewal refused: {why}")
        iat, exp = jwt_times(str(data["jwt"]))
        self.creds = replace(self.creds, jwt=str(data["jwt"]), issued_at=iat, expires_at=exp)
        self.renewals += 1
        if self.path is not None:
            with contextlib.suppress(OSError):
                write(self.path, self.creds)
        await nc.force_reconnect()  # a live connection keeps its old JWT until it reconnects

    async def renew_loop(self, nc: Any, warn: Callable[[str], None]) -> None:
        """Renew between 1/2 and 3/4 of each JWT's lifetime (its key picks where); retry
        every few seconds until it expires."""
        while True:
            if not self.creds.renew_subject or not self.creds.expires_at:
                return  # a plain creds file: nothing to renew with
            wait = self.creds.renew_due() - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            try:
                await self.renew(nc)
                left = self.creds.expires_at - self.clock()
                warn(f"credentials renewed (expire in {left:.0f} s)")
            except Exception as exc:  # noqa: BLE001 - keep trying until the JWT expires
                left = self.creds.expires_at - self.clock()
                warn(f"credential renewal failed ({exc!r}); {left:.0f} s left on the JWT")
                await asyncio.sleep(max(0.5, min(5.0, left / 4)))
