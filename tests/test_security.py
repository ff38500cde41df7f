"""Credentials, unit level: NATS JWTs, the issuer's rules, the creds file, the generated stubs.

The real-server tier (nats-server in operator mode, the gRPC server) is test_security_nats.py.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from aegis_flow import protocol as p
from aegis_flow.security import issuer as iss
from aegis_flow.security import natsjwt as nj
from aegis_flow.security import operator
from aegis_flow.security.tokens import read_token, write_token
from aegis_flow.supervisor import creds as cf

NOW = 1_800_000_000.0
TOKEN = "t" * 32


def make_issuer(**kw: object) -> iss.Issuer:
    args: dict[str, object] = dict(job="a", namespace="ns", workers=2, token=TOKEN,
                                   account=nj.public(nj.new_key("account")),
                                   signing_key=nj.new_key("account"),
                                   nats_urls=("nats://x:4222",), lifetime=60.0)
    args.update(kw)
    return iss.Issuer(**args)  # type: ignore[arg-type]


def request(worker: str = "0", token: str = TOKEN, key: str | None = None,
            job: str = "a") -> iss.Request:
    return iss.Request(job=job, namespace="ns", worker=worker,
                       public_key=key or nj.public(nj.new_key("user")), token=token)


# -- JWTs ---------------------------------------------------------------------------------------

def test_a_minted_jwt_verifies_and_carries_the_claims() -> None:
    signer = nj.new_key("account")
    user = nj.public(nj.new_key("user"))
    perms = nj.Permissions(pub=("aegis.ns.a.master",), sub=("aegis.ns.a.broadcast",), resp=True)
    token = nj.encode(nj.user_claims(user, name="w", account="ACC", perms=perms, now=NOW,
                                     expires=NOW + 60), signer)
    claims = nj.decode(token, trusted=[nj.public(signer)], now=NOW + 1)
    assert claims["sub"] == user and claims["iss"] == nj.public(signer)
    assert claims["exp"] == int(NOW + 60)
    assert claims["nats"]["pub"] == {"allow": ["aegis.ns.a.master"]}
    assert claims["nats"]["resp"] == {"max": 1, "ttl": 0}
    assert claims["nats"]["type"] == "user" and claims["nats"]["version"] == 2
    assert len(claims["jti"]) == 52  # base32 of a 256-bit hash, no padding


@pytest.mark.parametrize("damage", ["claims", "signature", "untrusted", "expired"])
def test_decode_catches_a_planted_fault(damage: str) -> None:
    signer = nj.new_key("account")
    token = nj.encode({"sub": "x", "iat": int(NOW), "exp": int(NOW + 5)}, signer)
    head, body, sig = token.split(".")
    trusted = [nj.public(signer)]
    now = NOW
    if damage == "claims":
        claims = json.loads(base64.urlsafe_b64decode(body + "=="))
        claims["exp"] = int(NOW + 10_000)
        body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    elif damage == "signature":
        sig = ("A" if sig[0] != "A" else "B") + sig[1:]
    elif damage == "untrusted":
        trusted = [nj.public(nj.new_key("account"))]
    else:
        now = NOW + 5
    with pytest.raises(nj.JwtError):
        nj.decode(f"{head}.{body}.{sig}", trusted=trusted, now=now)


def test_public_key_kinds_and_checksums_are_checked() -> None:
    user = nj.public(nj.new_key("user"))
    assert nj.check_public_key(user, "user") == user
    with pytest.raises(nj.JwtError, match="not a user public key"):
        nj.check_public_key(nj.public(nj.new_key("account")), "user")
    with pytest.raises(nj.JwtError, match="checksum"):
        nj.check_public_key(user[:-1] + ("A" if user[-1] != "A" else "B"), "user")


# -- the issuer's rules ---------------------------------------------------------------------------

def test_a_grant_is_scoped_to_the_job_and_the_rank() -> None:
    issuer = make_issuer()
    grant, stale = issuer.sync(request("1"), now=NOW)
    assert stale == []
    subjects = p.Subjects("ns", "a")
    assert grant.pub == ("aegis.ns.a.master.1", "aegis.ns.a.creds.1")  # its own report subject
    assert grant.sub == (subjects.broadcast, subjects.worker(1), "aegis.ns.a.inbox.1.>")
    assert grant.inbox_prefix == "aegis.ns.a.inbox.1"
    assert grant.expires_at == int(NOW + 60)
    every = grant.pub + grant.sub
    assert all(s.startswith("aegis.ns.a.") for s in every)
    assert not any(s.startswith(("_INBOX", "$JS", ">")) for s in every)
    claims = nj.decode(grant.jwt, trusted=[nj.public(issuer.signing_key)])
    assert claims["nats"]["issuer_account"] == issuer.account


@pytest.mark.parametrize("bad, code", [
    (dict(token="x" * 32), iss.Code.UNAUTHENTICATED),
    (dict(job="b"), iss.Code.PERMISSION_DENIED),
    (dict(worker="2"), iss.Code.INVALID_ARGUMENT),
    (dict(worker="-1"), iss.Code.INVALID_ARGUMENT),
    (dict(key="ABCDEF"), iss.Code.INVALID_ARGUMENT),
])
def test_bad_requests_are_refused_and_mint_nothing(bad: dict[str, str], code: iss.Code) -> None:
    issuer = make_issuer()
    with pytest.raises(iss.Refused) as err:
        issuer.sync(request(**bad), now=NOW)
    assert err.value.code is code
    assert issuer.minted == 0 and issuer.keys == {}


def test_an_ended_job_mints_nothing_even_with_the_right_token() -> None:
    issuer = make_issuer()
    grant, _ = issuer.sync(request("0"), now=NOW)
    issuer.end()
    with pytest.raises(iss.Refused) as err:
        issuer.sync(request("0"), now=NOW + 1)
    assert err.value.code is iss.Code.FAILED_PRECONDITION
    with pytest.raises(iss.Refused):
        issuer.renew(0, nj.decode(grant.jwt)["sub"], now=NOW + 1)
    assert issuer.minted == 1


def test_a_replacement_revokes_its_predecessor_and_eviction_blocks_renewal() -> None:
    issuer = make_issuer()
    old = nj.public(nj.new_key("user"))
    issuer.sync(request("0", key=old), now=NOW)
    assert issuer.renew(0, old, now=NOW + 30).expires_at == int(NOW + 90)
    new = nj.public(nj.new_key("user"))
    _, stale = issuer.sync(request("0", key=new), now=NOW + 31)
    assert stale == [old]
    with pytest.raises(iss.Refused, match="no live credentials"):
        issuer.renew(0, old, now=NOW + 32)
    with pytest.raises(iss.Refused, match="revoked"):
        issuer.sync(request("0", key=old), now=NOW + 33)
    assert issuer.evict(0) == [new] and issuer.evict(0) == []
    with pytest.raises(iss.Refused):
        issuer.renew(0, new, now=NOW + 34)
    with pytest.raises(iss.Refused):  # a key granted to rank 0 does not renew as rank 1
        issuer.renew(1, new, now=NOW + 34)


def test_a_restarted_master_renews_what_an_earlier_one_granted() -> None:
    """Regression: a master restarted mid-run starts with an empty issuer; its workers must
    still renew (else the server drops them when their JWTs expire)."""
    signer = nj.new_key("account")
    first = make_issuer(signing_key=signer)
    key = nj.public(nj.new_key("user"))
    grant, _ = first.sync(request("1", key=key), now=NOW)
    second = make_issuer(signing_key=signer, account=first.account)
    with pytest.raises(iss.Refused):
        second.renew(1, key, now=NOW + 10)  # no proof
    foreign = make_issuer().sync(request("1", key=key), now=NOW)[0].jwt
    for rank, bad in ((1, foreign), (0, grant.jwt)):  # another signer; another rank
        with pytest.raises(iss.Refused):
            second.renew(rank, key, now=NOW + 10, current=bad)
    with pytest.raises(iss.Refused):
        second.renew(1, key, now=NOW + 61, current=grant.jwt)  # expired
    assert second.renew(1, key, now=NOW + 10, current=grant.jwt).expires_at == int(NOW + 70)
    second.revoked.add(key)
    with pytest.raises(iss.Refused):
        second.renew(1, key, now=NOW + 11, current=grant.jwt)


def test_a_short_token_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="16"):
        make_issuer(token="short")
    path = write_token(tmp_path / "tok", "z" * 20)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_token(path=str(path)) == "z" * 20
    with pytest.raises(ValueError, match="cannot read"):
        read_token(path=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="AEGIS_NO_SUCH_VAR"):
        read_token(env="AEGIS_NO_SUCH_VAR")


# -- the auth dir and the creds file -----------------------------------------------------------

def test_bootstrap_writes_private_keys_once_and_a_memory_resolver_config(tmp_path: Path) -> None:
    auth = operator.bootstrap(tmp_path / "auth", now=NOW)
    again = operator.bootstrap(tmp_path / "auth", now=NOW)
    assert again.keys == auth.keys  # idempotent: keys are never replaced
    assert os.stat(tmp_path / "auth").st_mode & 0o777 == 0o700
    for seed in (tmp_path / "auth").glob("*.seed"):
        assert os.stat(seed).st_mode & 0o777 == 0o600, seed
    conf = auth.server_config(NOW)
    assert "resolver: MEMORY" in conf and f'system_account: "{auth.keys.system}"' in conf
    op_claims = nj.decode(conf.split('operator: "')[1].split('"')[0])
    assert op_claims["nats"]["signing_keys"] == [auth.keys.operator_signing]
    acc = nj.decode(auth.account_jwt(NOW), trusted=[auth.keys.operator_signing])
    assert acc["nats"]["signing_keys"] == [auth.keys.account_signing]
    assert acc["nats"]["limits"]["disk_storage"] == -1  # JetStream on for the aegis account
    assert operator.load(tmp_path / "auth").keys == auth.keys


def test_revocations_accumulate_and_are_signed_into_the_account(tmp_path: Path) -> None:
    auth = operator.bootstrap(tmp_path / "auth", now=NOW)
    auth.write_server_config(now=NOW)
    operator.record_revocations(auth, ["U1"], now=NOW)
    listed = operator.record_revocations(auth, ["U2"], now=NOW + 1)
    assert listed == {"U1": int(NOW), "U2": int(NOW + 1)}
    assert "revocations" in nj.decode(auth.account_jwt(NOW + 2, listed))["nats"]
    conf = (tmp_path / "auth" / "nats.conf").read_text()
    account_jwt = conf.split(f'{auth.keys.account}: "')[1].split('"')[0]
    assert nj.decode(account_jwt)["nats"]["revocations"] == listed
    old = operator.record_revocations(auth, [], now=NOW + operator.REVOCATION_KEEP_S + 5)
    assert old == {}  # pruned once no JWT issued before them can still be alive


def test_a_masters_auth_dir_records_revocations_without_the_offline_keys(
        tmp_path: Path) -> None:
    """Regression: revocations re-signed the operator JWT (needs the operator's identity key,
    which masters do not hold) and changed it, which makes nats-server refuse the reload."""
    import shutil

    from aegis_flow.security.cli import MASTER_FILES, OFFLINE_FILES

    full = operator.bootstrap(tmp_path / "full", now=NOW)
    before = full.server_config(NOW)
    master_dir = tmp_path / "master"
    master_dir.mkdir()
    for name in (*MASTER_FILES, "nats.conf"):
        if name == "nats.conf":
            (master_dir / name).write_text(before)
        else:
            shutil.copy(tmp_path / "full" / name, master_dir / name)
    assert not any((master_dir / f).exists() for f in OFFLINE_FILES)
    auth = operator.load(master_dir)
    operator.record_revocations(auth, ["UREVOKED"], now=NOW + 5)
    after = (master_dir / "nats.conf").read_text()
    line = [ln for ln in before.splitlines() if ln.startswith("operator:")][0]
    assert line in after  # the operator JWT is the one signed at bootstrap
    assert "UREVOKED" in str(nj.decode(after.split(f'{auth.keys.account}: "')[1].split('"')[0]))


def creds_fixture() -> cf.Creds:
    user = nj.new_key("user")
    jwt = nj.encode({"sub": nj.public(user), "iat": int(NOW), "exp": int(NOW + 90)},
                    nj.new_key("account"))
    return cf.Creds(jwt=jwt, seed=nj.seed_of(user), nats_urls=("nats://h:1",),
                    publish=("aegis.ns.a.master",), subscribe=("aegis.ns.a.broadcast",),
                    inbox_prefix="aegis.ns.a.inbox.0", renew_subject="aegis.ns.a.creds.0",
                    expires_at=int(NOW + 90), issued_at=int(NOW), job="a", namespace="ns",
                    worker="0")


def test_creds_file_round_trips_privately_in_the_nats_format(tmp_path: Path) -> None:
    creds = creds_fixture()
    path = cf.write(tmp_path / "c" / "0.creds", creds)
    assert os.stat(path).st_mode & 0o777 == 0o600
    text = path.read_text()
    assert "-----BEGIN NATS USER JWT-----\n" + creds.jwt in text
    assert "-----BEGIN USER NKEY SEED-----\n" + creds.seed in text
    assert cf.read(path) == creds
    assert creds.renew_due() == NOW + 90 * cf.renew_share(creds.public_key)
    assert creds.public_key == nj.decode(creds.jwt)["sub"]


def test_renewals_of_a_job_are_spread_over_a_quarter_of_the_lifetime() -> None:
    """4,096 workers granted in the same second do not renew in the same second (at one share
    of the lifetime they all reconnected at once, and the master judged a rank lost): each
    key's share lies in [1/2, 3/4), is the same every time, and the keys spread evenly."""
    shares = [cf.renew_share(nj.public(nj.new_key("user"))) for _ in range(4096)]
    assert all(cf.RENEW_FROM <= x < cf.RENEW_TO for x in shares)
    width = cf.RENEW_TO - cf.RENEW_FROM
    buckets = [0] * 15  # a minute each of a 1 h JWT's 15-minute window
    for x in shares:
        buckets[int((x - cf.RENEW_FROM) / width * 15)] += 1
    assert max(buckets) < 2 * 4096 / 15, buckets  # no minute holds twice its share
    key = nj.public(nj.new_key("user"))
    assert cf.renew_share(key) == cf.renew_share(key)
    creds = replace(creds_fixture(), issued_at=int(NOW), expires_at=int(NOW + 3600))
    assert NOW + 1800 <= creds.renew_due() < NOW + 2700


def test_creds_file_faults_are_clear(tmp_path: Path) -> None:
    with pytest.raises(cf.CredsError, match="worker-init"):
        cf.read(tmp_path / "missing.creds")
    path = cf.write(tmp_path / "0.creds", creds_fixture())
    os.chmod(path, 0o644)
    with pytest.raises(cf.CredsError, match="0600"):
        cf.read(path)
    os.chmod(path, 0o600)
    path.write_text("nothing here")
    with pytest.raises(cf.CredsError, match="lack"):
        cf.read(path)


def test_a_plain_nats_creds_file_works_without_renewal(tmp_path: Path) -> None:
    full = creds_fixture()
    text = cf.render(full).split("-----BEGIN AEGIS METADATA-----")[0]
    path = tmp_path / "plain.creds"
    path.write_text(text)
    os.chmod(path, 0o600)
    plain = cf.read(path)
    assert plain.jwt == full.jwt and plain.renew_subject == "" and plain.nats_urls == ()
    session = cf.Session(plain, clock=lambda: NOW)
    assert "inbox_prefix" not in session.connect_options()
    sig = session.connect_options()["signature_cb"]("nonce")
    raw = base64.b64decode(sig)
    assert nj.verify_signature(plain.public_key, b"nonce", raw)


# -- generated code ---------------------------------------------------------------------------

def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
    from aegis_flow.rpc import generate

    for fresh in generate.generate(tmp_path):
        committed = generate.HERE / fresh.name
        assert committed.read_bytes() == fresh.read_bytes(), (
            f"{committed} is out of date with proto/aegis.proto: run `make proto`")


def test_the_stub_check_catches_a_planted_proto_change(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
    from aegis_flow.rpc import generate

    planted = tmp_path / "proto" / "aegis.proto"
    planted.parent.mkdir()
    planted.write_text(generate.PROTO.read_text().replace(
        "int64 expires_at = 7;", "int64 expires_at = 7;\n  string planted = 8;"))
    fresh = generate.generate(tmp_path / "out", planted)
    differ = [f.name for f in fresh if f.read_bytes() != (generate.HERE / f.name).read_bytes()]
    assert "aegis_pb2.py" in differ and "aegis_pb2.pyi" in differ


def test_nats_bootstrap_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from aegis_flow.cli import main

    assert main(["nats-bootstrap", str(tmp_path / "keys")]) == 0
    out = capsys.readouterr().out
    assert "for the masters' Secret" in out and "keep offline: operator.seed" in out
    conf = (tmp_path / "keys" / "nats.conf").read_text()
    assert "resolver: MEMORY" in conf
    assert os.stat(tmp_path / "keys" / "nats.conf").st_mode & 0o777 == 0o600
    (tmp_path / "file").write_text("")
    assert main(["nats-bootstrap", str(tmp_path / "file" / "keys")]) == 2
    assert "nats-bootstrap" in capsys.readouterr().err
