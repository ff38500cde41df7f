"""NATS operator mode: the operator, the system account and the aegis account, on disk.

Side effects: :func:`bootstrap` creates a directory (mode 0700) and key files (mode 0600) and
reads them back; :meth:`AuthDir.write_server_config` and :func:`record_revocations` write
files (the latter under an exclusive ``flock``). Everything else is pure.

Layout of an auth dir::

    operator.seed            operator identity (kept by whoever bootstraps; masters need not)
    operator.jwt, system.jwt signed once at bootstrap and reused: a server refuses to reload a
                             config whose operator JWT changed
    operator-signing.seed    signs account JWTs: masters hold it to publish revocations
    system.seed              the system account (signs the system user)
    system-user.jwt/.seed    a system-account user: pushes account updates to the server
    account.seed             the aegis account identity
    account-signing.seed     signs per-worker user JWTs: masters only
    public.json              the public keys (not secret)
    revocations.json         revoked user keys → unix time (account revocation list)

The server runs with the memory resolver: ``nats.conf`` names the operator JWT, the system
account and preloads both account JWTs. Adding a job needs nothing here (a master mints user
JWTs with the account signing key); a revocation re-signs the aegis account JWT.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import nkeys

from aegis_flow.security import natsjwt as nj

OPERATOR_NAME = "aegis-operator"
ACCOUNT_NAME = "aegis"
SYSTEM_NAME = "SYS"
REVOCATIONS = "revocations.json"
REVOCATION_KEEP_S = 7 * 24 * 3600  # longer than any user JWT lives


class AuthDirError(RuntimeError):
    """The auth dir is missing a key, unreadable or inconsistent."""


def _write_secret(path: Path, text: str) -> None:
    """Create ``path`` with mode 0600 (atomically: a temp file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise AuthDirError(f"cannot read {path}: {exc.strerror}; run the NATS bootstrap "
                           "(aegis-flow nats-bootstrap) or fix the mounted secret") from None


@dataclass(frozen=True)
class PublicKeys:
    operator: str
    operator_signing: str
    system: str
    account: str
    account_signing: str


@dataclass(frozen=True)
class AuthDir:
    """An auth dir on disk (only the paths and the public keys are held in memory)."""

    path: Path
    keys: PublicKeys

    def seed(self, name: str) -> nkeys.KeyPair:
        return nj.key_from_seed(_read(self.path / f"{name}.seed"))

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    # -- JWTs (pure given the seeds) ----------------------------------------------------------
    def operator_jwt(self, now: float) -> str:
        claims = nj.operator_claims(self.keys.operator, name=OPERATOR_NAME,
                                    system_account=self.keys.system,
                                    signing_keys=[self.keys.operator_signing], now=now)
        return nj.encode(claims, self.seed("operator"))

    def system_jwt(self, now: float) -> str:
        claims = nj.account_claims(self.keys.system, name=SYSTEM_NAME, now=now, jetstream=False)
        return nj.encode(claims, self.seed("operator-signing"))

    def account_jwt(self, now: float, revocations: Mapping[str, int] | None = None) -> str:
        claims = nj.account_claims(self.keys.account, name=ACCOUNT_NAME, now=now, jetstream=True,
                                   signing_keys=[self.keys.account_signing],
                                   revocations=revocations)
        return nj.encode(claims, self.seed("operator-signing"))

    def stored_jwt(self, name: str) -> str:
        """``operator.jwt`` or ``system.jwt`` as signed at bootstrap (never re-signed)."""
        return _read(self.path / f"{name}.jwt")

    def server_config(self, now: float) -> str:
        """The nats-server config text: operator mode, memory resolver, both accounts. Only the
        aegis account JWT is signed anew (with the current revocation list)."""
        revocations = read_revocations(self.path)
        return "\n".join([
            "# aegis-flow: NATS operator mode (generated; do not edit)",
            f'operator: "{self.stored_jwt("operator")}"',
            f'system_account: "{self.keys.system}"',
            "resolver: MEMORY",
            "resolver_preload: {",
            f'  {self.keys.system}: "{self.stored_jwt("system")}"',
            f'  {self.keys.account}: "{self.account_jwt(now, revocations)}"',
            "}",
            "",
        ])

    def write_server_config(self, path: Path | None = None, *, now: float | None = None) -> Path:
        target = path or self.path / "nats.conf"
        _write_secret(target, self.server_config(time.time() if now is None else now))
        return target


def bootstrap(path: str | os.PathLike[str], *, now: float | None = None) -> AuthDir:
    """Create the operator, the system account and the aegis account under ``path`` unless they
    exist; return the auth dir. Idempotent: existing keys are never replaced."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    kinds = {"operator": "operator", "operator-signing": "operator", "system": "account",
             "account": "account", "account-signing": "account"}
    for name, kind in kinds.items():
        if not (root / f"{name}.seed").is_file():
            _write_secret(root / f"{name}.seed", nj.seed_of(nj.new_key(kind)) + "\n")
    pubs = {name: nj.public(nj.key_from_seed(_read(root / f"{name}.seed"))) for name in kinds}
    keys = PublicKeys(operator=pubs["operator"], operator_signing=pubs["operator-signing"],
                      system=pubs["system"], account=pubs["account"],
                      account_signing=pubs["account-signing"])
    (root / "public.json").write_text(json.dumps(vars(keys), indent=2) + "\n")
    auth = AuthDir(root, keys)
    stamp = time.time() if now is None else now
    if not (root / "operator.jwt").is_file():
        _write_secret(root / "operator.jwt", auth.operator_jwt(stamp) + "\n")
    if not (root / "system.jwt").is_file():
        _write_secret(root / "system.jwt", auth.system_jwt(stamp) + "\n")
    if not (root / "system-user.seed").is_file():
        user = nj.new_key("user")
        claims = nj.user_claims(nj.public(user), name="aegis-system", account=keys.system,
                                perms=nj.Permissions(pub=("$SYS.>",), sub=("_INBOX.>",)),
                                now=time.time() if now is None else now, expires=None)
        claims["nats"].pop("issuer_account")  # signed by the system account's own key
        _write_secret(root / "system-user.jwt", nj.encode(claims, nj.key_from_seed(
            _read(root / "system.seed"))) + "\n")
        _write_secret(root / "system-user.seed", nj.seed_of(user) + "\n")
    return auth


def load(path: str | os.PathLike[str]) -> AuthDir:
    """An existing auth dir (a master's view: the public keys must be there)."""
    root = Path(path)
    try:
        data = json.loads(_read(root / "public.json"))
        keys = PublicKeys(**{k: str(data[k]) for k in vars(PublicKeys)["__annotations__"]})
    except (ValueError, KeyError, TypeError) as exc:
        raise AuthDirError(f"{root / 'public.json'} is damaged: {exc!r}") from None
    return AuthDir(root, keys)


# -- the revocation list ---------------------------------------------------------------------

def read_revocations(root: Path) -> dict[str, int]:
    try:
        data = json.loads((root / REVOCATIONS).read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise AuthDirError(f"{root / REVOCATIONS} is damaged: {exc}") from None
    return {str(k): int(v) for k, v in data.items()}


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    fd = os.open(root / (REVOCATIONS + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record_revocations(auth: AuthDir, users: list[str], *, now: float,
                       keep: float = REVOCATION_KEEP_S) -> dict[str, int]:
    """Add ``users`` (public keys) to the revocation list, prune entries older than ``keep``
    seconds (a revoked key's JWT has expired by then: a master passes its JWT lifetime),
    write the list and the server config; return the list. Serialized by a file lock, so
    masters sharing the dir never lose each other's entries."""
    with _locked(auth.path):
        current = read_revocations(auth.path)
        current.update({u: int(now) for u in users})
        current = {u: t for u, t in current.items() if now - t < keep}
        _write_secret(auth.path / REVOCATIONS, json.dumps(current, sort_keys=True) + "\n")
        if (auth.path / "nats.conf").is_file():
            auth.write_server_config(now=now)
        return current


def user_options(auth: AuthDir, perms: nj.Permissions, *, name: str, now: float,
                 lifetime: float = 300.0) -> dict[str, object]:
    """``nats.connect`` keyword arguments for a short-lived user of the aegis account minted on
    the spot with the account signing key (operator commands: ``status``, ``stop``)."""
    import base64

    key = nj.new_key("user")
    claims = nj.user_claims(nj.public(key), name=name, account=auth.keys.account, perms=perms,
                            now=now, expires=now + lifetime)
    jwt = nj.encode(claims, auth.seed("account-signing"))
    return {"user_jwt_cb": lambda: jwt.encode(),
            "signature_cb": lambda nonce: base64.b64encode(key.sign(nonce.encode()))}
