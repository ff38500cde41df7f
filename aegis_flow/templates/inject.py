"""Zero intrusion (DESIGN.md §5): what the aegis-flow image puts into the user's pods.

Worker pods get two init containers from the aegis-flow image — ``aegis-bundle`` copies the
self-contained supervisor (``aegis-flow bundle``) into a shared ``emptyDir``, and
``aegis-worker-init`` runs the one-time credential step (``aegis-flow worker-init``) with the
job's bootstrap token from a Kubernetes Secret, writing the NATS creds file into the same
``emptyDir``. The worker container then runs ``python3 /aegis/aegis-supervisor.pyz … -- CMD``
with the image's own Python. Check pods get only the bundle (``bundle.pyz check …``).

With ``JobSpec.grpc_tls_secret`` the master serves SyncWorkerCreds over TLS: its container
mounts that Secret (``tls.crt``, ``tls.key``, ``ca.crt``), and each ``aegis-worker-init`` mounts
only its ``ca.crt`` (never the master's key) and checks the certificate for
``JobSpec.tls_server_name`` (it dials the master's pod IP). With ``grpc_tls_client_secret``
(mutual TLS) worker-init also mounts that client certificate and key, and the master requires
client certificates signed by ``ca.crt``. These Secret volumes are mounted only into the
init container, never into the container that runs user code.

The master pod copies its auth Secret (the NATS operator-mode ``nats.conf`` and seeds) into an
``emptyDir``, because the master rewrites revocations there and Secret volumes are read-only.

PURE: returns Hera/Argo model objects; nothing is submitted.
"""

from __future__ import annotations

from hera.workflows import SecretEnv, UserContainer
from hera.workflows import models as m

from aegis_flow.jobspec import JobSpec

SHARED_VOLUME = "aegis"
SHARED_DIR = "/aegis"
BUNDLE_IN_IMAGE = "/opt/aegis/aegis-supervisor.pyz"  # where the aegis-flow image keeps it
BUNDLE = f"{SHARED_DIR}/aegis-supervisor.pyz"
CREDS = f"{SHARED_DIR}/creds"
TOKEN_VOLUME, TOKEN_DIR, TOKEN_KEY = "bootstrap-token", "/var/run/aegis/bootstrap", "token"
AUTH_SECRET_VOLUME, AUTH_SECRET_DIR = "auth-secret", "/var/run/aegis/auth-secret"
AUTH_VOLUME, AUTH_DIR = "auth", "/var/run/aegis/auth"
# gRPC TLS (the key names are those of a kubernetes.io/tls Secret, as cert-manager writes it)
TLS_CERT_KEY, TLS_KEY_KEY, TLS_CA_KEY = "tls.crt", "tls.key", "ca.crt"
GRPC_TLS_VOLUME, GRPC_TLS_DIR = "grpc-tls", "/var/run/aegis/grpc-tls"
GRPC_CLIENT_VOLUME, GRPC_CLIENT_DIR = "grpc-tls-client", "/var/run/aegis/grpc-tls-client"
# Secret files are root-owned: 0440 lets the aegis image's non-root user (group 0, see the
# Dockerfile) read them, and an fsGroup, where a cluster sets one, too. Only containers of the
# aegis image mount these volumes, never the one that runs user code.
SECRET_MODE = 0o440
INIT_DEADLINE = 10  # seconds per SyncWorkerCreds attempt of worker-init (plus <= 4 s backoff)


def shared_volume() -> m.Volume:
    return m.Volume(name=SHARED_VOLUME, empty_dir=m.EmptyDirVolumeSource())


def shared_mount() -> m.VolumeMount:
    return m.VolumeMount(name=SHARED_VOLUME, mount_path=SHARED_DIR)


def copy_bundle(spec: JobSpec) -> UserContainer:
    """Init container: the supervisor bundle from the aegis-flow image into the emptyDir."""
    return UserContainer(
        name="aegis-bundle", image=spec.aegis_image, command=["cp", BUNDLE_IN_IMAGE, BUNDLE],
        volume_mounts=[shared_mount()],
        resources=m.ResourceRequirements(requests={"cpu": "50m", "memory": "32Mi"}))  # type: ignore[dict-item]


def worker_init(spec: JobSpec, *, master_addr: str, rank: str) -> UserContainer:
    """Init container: ``aegis-flow worker-init`` — the job's bootstrap token (Secret) buys
    this worker's NATS credentials from the master's SyncWorkerCreds, once."""
    return UserContainer(
        name="aegis-worker-init", image=spec.aegis_image,
        command=["aegis-flow", "worker-init"],
        args=["--master", master_addr, "--job", "{{workflow.name}}",
              "--namespace", spec.namespace, "--worker", rank,
              "--token-file", f"{TOKEN_DIR}/{TOKEN_KEY}", "--out", CREDS,
              # keep trying for as long as the master waits for the ranks (its connect
              # timeout): it may still be scheduling, or be a recreated pod coming back
              "--deadline", str(INIT_DEADLINE),
              "--retries", str(-(-spec.connect_timeout // (INIT_DEADLINE + 4))),
              *worker_tls_args(spec)],
        volume_mounts=[shared_mount(),
                       m.VolumeMount(name=TOKEN_VOLUME, mount_path=TOKEN_DIR, read_only=True),
                       *worker_tls_mounts(spec)],
        resources=m.ResourceRequirements(requests={"cpu": "100m", "memory": "128Mi"}))  # type: ignore[dict-item]


def token_volume(spec: JobSpec) -> m.Volume:
    return m.Volume(name=TOKEN_VOLUME, secret=m.SecretVolumeSource(
        secret_name=spec.bootstrap_secret_name, default_mode=SECRET_MODE,
        items=[m.KeyToPath(key=TOKEN_KEY, path=TOKEN_KEY)]))


def bootstrap_token_env(spec: JobSpec) -> SecretEnv:
    """The master reads the same token from the environment (``--token-env``)."""
    return SecretEnv(name="AEGIS_BOOTSTRAP_TOKEN", secret_name=spec.bootstrap_secret_name,
                     secret_key=TOKEN_KEY)


def auth_volumes(spec: JobSpec) -> list[m.Volume]:
    return [m.Volume(name=AUTH_SECRET_VOLUME, secret=m.SecretVolumeSource(
                secret_name=spec.auth_secret, default_mode=SECRET_MODE)),
            m.Volume(name=AUTH_VOLUME, empty_dir=m.EmptyDirVolumeSource())]


def auth_mount() -> m.VolumeMount:
    return m.VolumeMount(name=AUTH_VOLUME, mount_path=AUTH_DIR)


def copy_auth(spec: JobSpec) -> UserContainer:
    """Master init container: the auth Secret into a writable emptyDir (follows the Secret
    volume's symlinks)."""
    return UserContainer(
        name="aegis-auth", image=spec.aegis_image,
        command=["cp", "-rL", f"{AUTH_SECRET_DIR}/.", f"{AUTH_DIR}/"],
        volume_mounts=[m.VolumeMount(name=AUTH_SECRET_VOLUME, mount_path=AUTH_SECRET_DIR,
                                     read_only=True), auth_mount()],
        resources=m.ResourceRequirements(requests={"cpu": "50m", "memory": "32Mi"}))  # type: ignore[dict-item]


def _secret_volume(name: str, secret: str, keys: tuple[str, ...]) -> m.Volume:
    return m.Volume(name=name, secret=m.SecretVolumeSource(
        secret_name=secret, default_mode=SECRET_MODE,
        items=[m.KeyToPath(key=k, path=k) for k in keys]))


def master_tls_args(spec: JobSpec) -> list[str]:
    """The master's ``--tls-cert/--tls-key`` (and ``--tls-client-ca`` for mutual TLS)."""
    if not spec.grpc_tls:
        return []
    out = ["--tls-cert", f"{GRPC_TLS_DIR}/{TLS_CERT_KEY}",
           "--tls-key", f"{GRPC_TLS_DIR}/{TLS_KEY_KEY}"]
    if spec.grpc_mutual_tls:
        out += ["--tls-client-ca", f"{GRPC_TLS_DIR}/{TLS_CA_KEY}"]
    return out


def master_tls_volumes(spec: JobSpec) -> list[m.Volume]:
    keys = (TLS_CERT_KEY, TLS_KEY_KEY, TLS_CA_KEY) if spec.grpc_mutual_tls else (
        TLS_CERT_KEY, TLS_KEY_KEY)
    return [_secret_volume(GRPC_TLS_VOLUME, spec.grpc_tls_secret, keys)] if spec.grpc_tls else []


def master_tls_mounts(spec: JobSpec) -> list[m.VolumeMount]:
    return [m.VolumeMount(name=GRPC_TLS_VOLUME, mount_path=GRPC_TLS_DIR, read_only=True)] \
        if spec.grpc_tls else []


def worker_tls_args(spec: JobSpec) -> list[str]:
    """worker-init's ``--tls-ca`` and ``--tls-server-name`` (it dials the master's pod IP,
    which no certificate can name in advance), plus the client certificate for mutual TLS."""
    if not spec.grpc_tls:
        return []
    out = ["--tls-ca", f"{GRPC_TLS_DIR}/{TLS_CA_KEY}", "--tls-server-name", spec.tls_server_name]
    if spec.grpc_mutual_tls:
        out += ["--tls-cert", f"{GRPC_CLIENT_DIR}/{TLS_CERT_KEY}",
                "--tls-key", f"{GRPC_CLIENT_DIR}/{TLS_KEY_KEY}"]
    return out


def worker_tls_volumes(spec: JobSpec) -> list[m.Volume]:
    """Only ``ca.crt`` of the master's Secret (its key stays out of worker pods)."""
    if not spec.grpc_tls:
        return []
    out = [_secret_volume(GRPC_TLS_VOLUME, spec.grpc_tls_secret, (TLS_CA_KEY,))]
    if spec.grpc_mutual_tls:
        out.append(_secret_volume(GRPC_CLIENT_VOLUME, spec.grpc_tls_client_secret,
                                  (TLS_CERT_KEY, TLS_KEY_KEY)))
    return out


def worker_tls_mounts(spec: JobSpec) -> list[m.VolumeMount]:
    out = [m.VolumeMount(name=GRPC_TLS_VOLUME, mount_path=GRPC_TLS_DIR, read_only=True)] \
        if spec.grpc_tls else []
    if spec.grpc_mutual_tls:
        out.append(m.VolumeMount(name=GRPC_CLIENT_VOLUME, mount_path=GRPC_CLIENT_DIR,
                                 read_only=True))
    return out
