"""The credential exchange's TLS certificates: a private CA and the master's certificate.

``aegis-flow install --create-secrets DIR`` makes them once per namespace and renders them as the
``aegis-grpc-tls`` Secret (``tls.crt``, ``tls.key``, ``ca.crt``) that the rendered workflows
mount by default: the master serves SyncWorkerCreds with ``tls.crt``/``tls.key``; each
worker-init gets only ``ca.crt`` and checks the master's certificate for
``aegis-master.NAMESPACE.svc`` (``JobSpec.tls_server_name``), whatever address it dials.

Needs ``cryptography`` (the ``k8s`` extra). Side effects: :func:`ensure` writes the three PEM
files (the key and the CA key with mode 0600) in a directory, keeping existing ones; the CA key
stays there, never in a Secret. :func:`make` is pure apart from randomness.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

CA_KEY_FILE = "grpc-ca.key"  # stays in the install directory: signs nothing else
FILES = ("ca.crt", "tls.crt", "tls.key")  # the Secret's keys
DAYS = 825  # what browsers accept for a leaf; the CA lives ten years


def make(server_name: str, *, now: dt.datetime | None = None) -> dict[str, bytes]:
    """A new CA and a certificate for ``server_name`` signed by it: ``ca.crt``, ``tls.crt``,
    ``tls.key`` and the CA's key (``grpc-ca.key``), as PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    start = (now or dt.datetime.now(dt.timezone.utc)) - dt.timedelta(minutes=5)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("aegis-flow grpc ca"))
          .issuer_name(name("aegis-flow grpc ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start)
          .not_valid_after(start + dt.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=False, content_commitment=False, key_encipherment=False,
              data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
              encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(name(server_name))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(server_name)]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))

    def private(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    pem = serialization.Encoding.PEM
    return {"ca.crt": ca.public_bytes(pem), "tls.crt": leaf.public_bytes(pem),
            "tls.key": private(key), CA_KEY_FILE: private(ca_key)}


def ensure(directory: Path, server_name: str) -> dict[str, str]:
    """The Secret's three files from ``directory``, made there first if any is missing (the
    keys with mode 0600). A certificate made for another name is made again."""
    paths = {f: directory / f for f in (*FILES, CA_KEY_FILE)}
    if not all(p.is_file() for p in paths.values()) or not _names(paths["tls.crt"], server_name):
        directory.mkdir(parents=True, exist_ok=True)
        for fname, data in make(server_name).items():
            mode = 0o600 if fname.endswith(".key") else 0o644
            fd = os.open(paths[fname], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
    return {f: paths[f].read_text() for f in FILES}


def _names(cert_file: Path, server_name: str) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    return server_name in sans.get_values_for_type(x509.DNSName)
