"""NATS JWT v2 (header.claims.ed25519-signature) minted and checked over ``nkeys``. PURE.

No side effects but reading ``os.urandom`` in :func:`new_key`. Time is an argument.

A NATS JWT is ``base64url(header) . base64url(claims) . base64url(ed25519 signature)`` (no
padding), header ``{"typ":"JWT","alg":"ed25519-nkey"}``; the signature covers the first two
parts. ``jti`` is the base32 SHA-512/256 of the claims serialized with an empty ``jti``. Claims
carry ``iss`` (the signer's public key), ``sub`` (the subject's public key), ``iat``, optional
``exp``, and a ``nats`` object whose ``type`` is ``operator``, ``account`` or ``user`` and
``version`` 2.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import nkeys

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
NO_LIMIT = -1

PREFIXES = {"operator": nkeys.PREFIX_BYTE_OPERATOR, "account": nkeys.PREFIX_BYTE_ACCOUNT,
            "user": nkeys.PREFIX_BYTE_USER}
_LETTER = {"operator": "O", "account": "A", "user": "U"}


class JwtError(ValueError):
    """A JWT or key that is malformed, mis-signed, expired or of the wrong kind."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise JwtError(f"bad base64 in JWT: {exc}") from None


def new_key(kind: str) -> nkeys.KeyPair:
    """A fresh operator, account or user key pair (the seed comes from ``os.urandom``)."""
    seed = nkeys.encode_seed(os.urandom(32), PREFIXES[kind])
    return nkeys.from_seed(bytearray(seed))


def key_from_seed(seed: str | bytes) -> nkeys.KeyPair:
    raw = seed.encode() if isinstance(seed, str) else bytes(seed)
    try:
        return nkeys.from_seed(bytearray(raw.strip()))
    except Exception as exc:  # noqa: BLE001 - nkeys raises several error types
        raise JwtError(f"not an nkey seed: {exc!r}") from None


def public(kp: nkeys.KeyPair) -> str:
    return str(kp.public_key.decode())


def seed_of(kp: nkeys.KeyPair) -> str:
    return str(kp.seed.decode())


def check_public_key(key: str, kind: str) -> str:
    """Validate an encoded public key (prefix letter, length, CRC); return it."""
    raw = _decode_public(key)
    if raw[0] != PREFIXES[kind]:
        raise JwtError(f"{key[:8]}... is not a {kind} public key (expected a key starting "
                       f"with {_LETTER[kind]!r})")
    return key


def _decode_public(key: str) -> bytes:
    try:
        raw = base64.b32decode(key.encode() + b"=" * (-len(key) % 8))
    except (binascii.Error, ValueError):
        raise JwtError("public key is not base32") from None
    if len(raw) != 35:
        raise JwtError("public key has the wrong length")
    body, crc = raw[:-2], raw[-2:]
    if nkeys.crc16(bytearray(body)).to_bytes(2, "little") != crc:
        raise JwtError("public key checksum mismatch")
    return body


def verify_signature(key: str, data: bytes, sig: bytes) -> bool:
    """Does ``sig`` sign ``data`` under the encoded public ``key``?"""
    import nacl.exceptions
    import nacl.signing

    raw = _decode_public(key)
    try:
        nacl.signing.VerifyKey(raw[1:]).verify(data, sig)
        return True
    except nacl.exceptions.BadSignatureError:
        return False


def _claims_id(claims: Mapping[str, Any]) -> str:
    body = json.dumps({**claims, "jti": ""}, separators=(",", ":"), sort_keys=True).encode()
    digest = hashlib.new("sha512_256", body).digest()
    return base64.b32encode(digest).decode().rstrip("=")


def encode(claims: Mapping[str, Any], signer: nkeys.KeyPair) -> str:
    """Sign ``claims`` (``iss`` is set to the signer, ``jti`` computed) into a JWT string."""
    full = {**claims, "iss": public(signer)}
    full["jti"] = _claims_id(full)
    head = _b64(json.dumps(HEADER, separators=(",", ":")).encode())
    body = _b64(json.dumps(full, separators=(",", ":"), sort_keys=True).encode())
    sig = signer.sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{_b64(sig)}"


def decode(token: str, *, trusted: Sequence[str] | None = None,
           now: float | None = None) -> dict[str, Any]:
    """Parse and verify a JWT: signature by its ``iss``; ``iss`` among ``trusted`` when given;
    not expired at ``now`` when given. Raises JwtError saying what is wrong."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError("a JWT has three dot-separated parts")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except ValueError:
        raise JwtError("JWT header or claims are not JSON") from None
    if not isinstance(header, dict) or header.get("alg") != HEADER["alg"]:
        raise JwtError(f"unsupported JWT algorithm {header!r}")
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise JwtError("JWT claims without an issuer")
    issuer = claims["iss"]
    if not verify_signature(issuer, f"{parts[0]}.{parts[1]}".encode(), _unb64(parts[2])):
        raise JwtError("JWT signature does not verify")
    if trusted is not None and issuer not in trusted:
        raise JwtError(f"JWT issued by an untrusted key {issuer[:8]}...")
    exp = claims.get("exp")
    if now is not None and isinstance(exp, int) and exp <= now:
        raise JwtError("JWT expired")
    return claims


# -- claims builders (pure) -------------------------------------------------------------------

def _limits(*, jetstream: bool) -> dict[str, Any]:
    limits: dict[str, Any] = {"subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT,
                              "imports": NO_LIMIT, "exports": NO_LIMIT, "wildcards": True,
                              "conn": NO_LIMIT, "leaf": NO_LIMIT}
    if jetstream:
        limits.update(mem_storage=NO_LIMIT, disk_storage=NO_LIMIT, streams=NO_LIMIT,
                      consumer=NO_LIMIT)
    return limits


def operator_claims(operator_pub: str, *, name: str, system_account: str,
                    signing_keys: Sequence[str], now: float) -> dict[str, Any]:
    return {"sub": operator_pub, "name": name, "iat": int(now),
            "nats": {"signing_keys": list(signing_keys), "system_account": system_account,
                     "type": "operator", "version": 2}}


def account_claims(account_pub: str, *, name: str, now: float, jetstream: bool,
                   signing_keys: Sequence[str] = (),
                   revocations: Mapping[str, int] | None = None) -> dict[str, Any]:
    nats: dict[str, Any] = {"limits": _limits(jetstream=jetstream),
                            "default_permissions": {"pub": {}, "sub": {}},
                            "type": "account", "version": 2}
    if signing_keys:
        nats["signing_keys"] = list(signing_keys)
    if revocations:
        nats["revocations"] = dict(sorted(revocations.items()))
    return {"sub": account_pub, "name": name, "iat": int(now), "nats": nats}


@dataclass(frozen=True)
class Permissions:
    """What a user may publish and subscribe to (allow lists only: everything else is denied)."""

    pub: tuple[str, ...]
    sub: tuple[str, ...]
    resp: bool = False  # may reply once to a request it received (NATS ``resp``)


def user_claims(user_pub: str, *, name: str, account: str, perms: Permissions, now: float,
                expires: float | None) -> dict[str, Any]:
    """A user of ``account`` (``issuer_account``: the user is signed by an account signing key).
    """
    nats: dict[str, Any] = {
        "pub": {"allow": list(perms.pub)}, "sub": {"allow": list(perms.sub)},
        "subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT,
        "issuer_account": account, "type": "user", "version": 2}
    if perms.resp:
        nats["resp"] = {"max": 1, "ttl": 0}
    claims: dict[str, Any] = {"sub": user_pub, "name": name, "iat": int(now), "nats": nats}
    if expires is not None:
        claims["exp"] = int(expires)
    return claims
