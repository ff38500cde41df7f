"""TLS for the credential exchange on Argo: what the JobSpec's TLS fields put on the master
pod and on each worker-init, the CLI flags and job files that set them, their errors, and a
real TLS handshake with the rendered flags.

The handshake test is the point of ``--tls-server-name``: worker-init dials the master's pod
IP, which no certificate can carry in advance, so the master's certificate carries a DNS name
(``aegis-master.NAMESPACE.svc``) and worker-init checks that name instead.
"""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_flow.jobspec import JobSpec, JobSpecError
from aegis_flow.templates import cli
from aegis_flow.workflow import render

BASE = {"image": "img:1", "command": ["python", "train.py"], "namespace": "training"}
TLS = {**BASE, "grpc_tls_secret": "aegis-grpc-tls"}
MTLS = {**TLS, "grpc_tls_client_secret": "aegis-grpc-client"}


def templates(spec: JobSpec) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in render(spec)["spec"]["templates"]}


def flags(argv: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of an argv (flags without a value map to '')."""
    out, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            out[argv[i]] = argv[i + 1] if has_value else ""
            i += 2 if has_value else 1
        else:
            i += 1
    return out


def mounted_file(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) that ``path`` is in this container, through its mounts and the
    pod's volumes; fails when the file would not exist in the pod."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            secret = volumes[mount["name"]]["secret"]
            key = path[len(prefix):]
            assert key in {i["path"] for i in secret["items"]}, f"{path}: {key} not projected"
            assert mount.get("readOnly") is True
            return secret["secretName"], key
    raise AssertionError(f"{path} is not under any mount of {container['name']}")


def worker_init(t: dict[str, dict[str, Any]]) -> dict[str, Any]:
    init: dict[str, Any] = {c["name"]: c for c in t["worker"]["initContainers"]}[
        "aegis-worker-init"]
    return init


def test_tls_is_the_default_and_plaintext_is_asked_for_by_name() -> None:
    """Review F4: the credential exchange was plaintext unless configured. Now the default
    serves it over TLS with the Secret aegis-grpc-tls (install --create-secrets makes it);
    plaintext needs grpc_plaintext, and an empty Secret name alone is an error."""
    t = templates(JobSpec.parse(BASE))
    assert flags(t["master"]["container"]["args"])["--tls-cert"] == \
        "/var/run/aegis/grpc-tls/tls.crt"
    assert flags(worker_init(t)["args"])["--tls-ca"] == "/var/run/aegis/grpc-tls/ca.crt"
    secrets = {v["secret"]["secretName"] for v in t["master"]["volumes"] + t["worker"]["volumes"]
               if "secret" in v}
    assert "aegis-grpc-tls" in secrets
    plain = templates(JobSpec.parse({**BASE, "grpc_plaintext": True}))
    for argv in (plain["master"]["container"]["args"], worker_init(plain)["args"]):
        assert not [a for a in argv if a.startswith("--tls")]
    names = {v["name"] for v in plain["master"]["volumes"] + plain["worker"]["volumes"]}
    assert not {n for n in names if "tls" in n}
    with pytest.raises(JobSpecError, match="grpc_tls_secret is empty: the credential exchange "
                       "would send the bootstrap token in the clear"):
        JobSpec.parse({**BASE, "grpc_tls_secret": ""})


def test_tls_master_mounts_its_certificate_and_serves_with_it() -> None:
    spec = JobSpec.parse(TLS)
    t = templates(spec)
    master, c = t["master"], t["master"]["container"]
    f = flags(c["args"])
    assert mounted_file(master, c, f["--tls-cert"]) == ("aegis-grpc-tls", "tls.crt")
    assert mounted_file(master, c, f["--tls-key"]) == ("aegis-grpc-tls", "tls.key")
    assert "--tls-client-ca" not in f  # plain TLS: any worker with the token may ask
    # the certificate is the master container's alone: not its init container's or sidecars'
    assert all("tls" not in m["name"] for i in master["initContainers"]
               for m in i["volumeMounts"])


def test_tls_worker_init_gets_only_the_ca_and_checks_the_masters_name() -> None:
    t = templates(JobSpec.parse(TLS))
    w, init = t["worker"], worker_init(t)
    f = flags(init["args"])
    assert mounted_file(w, init, f["--tls-ca"]) == ("aegis-grpc-tls", "ca.crt")
    assert f["--tls-server-name"] == "aegis-master.training.svc"
    assert f["--master"] == "{{workflow.name}}-master:50051"  # the Service, not the name
    assert "--tls-cert" not in f and "--tls-key" not in f
    # the master's private key never reaches a worker pod
    tls_volume = {v["name"]: v for v in w["volumes"]}["grpc-tls"]["secret"]
    assert [i["key"] for i in tls_volume["items"]] == ["ca.crt"]
    # the user's container and the bundle copy mount no TLS material
    others = [w["container"], *[i for i in w["initContainers"] if i is not init]]
    assert all("tls" not in m["name"] for c in others for m in c.get("volumeMounts", []))


def test_mutual_tls_master_requires_client_certs_and_workers_show_theirs() -> None:
    t = templates(JobSpec.parse(MTLS))
    master, c = t["master"], t["master"]["container"]
    assert mounted_file(master, c, flags(c["args"])["--tls-client-ca"]) == (
        "aegis-grpc-tls", "ca.crt")
    w, init = t["worker"], worker_init(t)
    f = flags(init["args"])
    assert mounted_file(w, init, f["--tls-cert"]) == ("aegis-grpc-client", "tls.crt")
    assert mounted_file(w, init, f["--tls-key"]) == ("aegis-grpc-client", "tls.key")
    assert mounted_file(w, init, f["--tls-ca"]) == ("aegis-grpc-tls", "ca.crt")


def test_a_given_server_name_is_what_workers_check() -> None:
    t = templates(JobSpec.parse({**TLS, "grpc_tls_server_name": "master.aegis.example.com"}))
    assert flags(worker_init(t)["args"])["--tls-server-name"] == "master.aegis.example.com"


@pytest.mark.parametrize(("fields", "says"), [
    ({**BASE, "grpc_plaintext": True, "grpc_tls_client_secret": "aegis-grpc-client"},
     "is mutual TLS, and grpc_plaintext turns TLS off: drop one"),
    ({**BASE, "grpc_plaintext": True, "grpc_tls_server_name": "aegis-master.training.svc"},
     "has no effect without grpc_tls_secret"),
    ({**TLS, "grpc_tls_server_name": "10.0.0.5"}, "an IP address cannot be used"),
    ({**TLS, "grpc_tls_server_name": "Master_Name"}, "is not a DNS name"),
    ({**BASE, "grpc_tls_secret": "My_Secret"}, "'My_Secret' is not a valid Secret name"),
])
def test_bad_tls_settings_are_named_with_the_fix(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(JobSpecError) as exc:
        JobSpec.parse(fields)
    assert says in str(exc.value)


def test_cli_flags_and_job_files_set_tls(tmp_path: Path) -> None:
    out = tmp_path / "wf.yaml"
    assert cli.main(["render", "--image", "IMG", "--namespace", "training",
                     "--grpc-tls-secret", "aegis-grpc-tls", "--grpc-tls-client-secret",
                     "aegis-grpc-client", "-o", str(out), "--", "python", "train.py"]) == 0
    t = {x["name"]: x for x in yaml.safe_load(out.read_text())["spec"]["templates"]}
    assert flags(t["master"]["container"]["args"])["--tls-client-ca"]
    assert flags(worker_init(t)["args"])["--tls-server-name"] == "aegis-master.training.svc"
    job = tmp_path / "job.yaml"
    job.write_text("image: img:1\ncommand: [python, train.py]\n"
                   "grpc-tls-secret: aegis-grpc-tls\ngrpc-tls-server-name: m.example.com\n")
    spec = JobSpec.from_file(job)
    assert (spec.grpc_tls, spec.grpc_mutual_tls, spec.tls_server_name) == (
        True, False, "m.example.com")


def test_cli_mutual_tls_without_a_tls_secret_is_a_clear_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "--image", "IMG", "--grpc-plaintext",
                     "--grpc-tls-client-secret", "c", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "invalid job" in err and "grpc_plaintext turns TLS off" in err
    assert "Traceback" not in err


# -- a real handshake with the rendered worker-init flags --------------------------------------

def _cert(name: str, *, issuer: Any = None, ca: bool = False) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_cert, signer_key = issuer if issuer else (None, key)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(signer_cert.subject if signer_cert else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:  # a DNS name only: no IP address, as a certificate for a pod's master must be
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]),
                                        critical=False)
    return builder.sign(signer_key, hashes.SHA256()), key


def _secret_dir(tmp: Path, name: str, cert: Any, key: Any, ca: Any) -> Path:
    """A directory laid out like the Secret volume (tls.crt, tls.key, ca.crt)."""
    from cryptography.hazmat.primitives import serialization

    d = tmp / name
    d.mkdir()
    (d / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return d


def test_the_rendered_flags_complete_a_tls_handshake_with_the_master_dialled_by_ip(
        tmp_path: Path) -> None:
    pytest.importorskip("cryptography", reason="the cryptography package makes the test certs")
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from aegis_flow.security.worker_init import InitConfig, _channel, build_parser
    from aegis_flow.templates import inject

    ca = _cert("aegis test ca", ca=True)
    spec = JobSpec.parse(MTLS)
    server_dir = _secret_dir(tmp_path, "server", *_cert(spec.tls_server_name, issuer=ca), ca[0])
    client_dir = _secret_dir(tmp_path, "client", *_cert("worker", issuer=ca), ca[0])

    def local(path: str) -> str:  # the pod's mount paths, here the directories above
        return path.replace(inject.GRPC_CLIENT_DIR, str(client_dir)).replace(
            inject.GRPC_TLS_DIR, str(server_dir))

    t = templates(spec)
    m = flags(t["master"]["container"]["args"])
    server = grpc.server(ThreadPoolExecutor(2))
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(Path(local(m["--tls-key"])).read_bytes(), Path(local(m["--tls-cert"])).read_bytes())],
        root_certificates=Path(local(m["--tls-client-ca"])).read_bytes(),
        require_client_auth=True))
    server.start()
    try:
        init = worker_init(t)
        argv = [local(a) for a in init["args"]]
        argv[argv.index("--master") + 1] = f"127.0.0.1:{port}"  # an IP, as {{steps.master.ip}}
        a = build_parser().parse_args(argv)
        cfg = InitConfig(master=a.master, job="j", namespace="training", worker="0", token="t",
                         out=tmp_path / "creds", tls_ca=a.tls_ca, tls_cert=a.tls_cert,
                         tls_key=a.tls_key, tls_server_name=a.tls_server_name)

        def ready(c: InitConfig, timeout: float) -> bool:
            with _channel(c) as channel:
                try:
                    grpc.channel_ready_future(channel).result(timeout=timeout)
                except grpc.FutureTimeoutError:
                    return False
                return True

        assert ready(cfg, 30.0)
        # without the name, the IP is checked against the certificate, and it fails
        assert not ready(replace(cfg, tls_server_name=""), 3.0)
    finally:
        server.stop(None)
