"""``JobSpec``: everything needed to render one training job as an Argo Workflow.

PURE: a pydantic model and its validators; no I/O except ``JobSpec.from_file``, which reads
the YAML/JSON file it is given. Error messages name the bad value and the fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from aegis_flow.settings import MASTER

# a Kubernetes object name (RFC 1123 label); Workflow names get a generated suffix, so keep room
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# a Secret name or a DNS name (RFC 1123 subdomain)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i?|[mun]|k)?$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_OPERATORS = ("Exists", "Equal")

DEFAULT_AEGIS_IMAGE = "ghcr.io/aegis-flow/aegis-flow:0.1.0"
SLOW_WINDOW = int(MASTER.slow_window)  # the master's default (settings.MASTER)


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


DEFAULT_GRPC_TLS_SECRET = "aegis-grpc-tls"  # made by aegis-flow install --create-secrets

class JobSpecError(ValueError):
    """A job spec that cannot be rendered; the message says what to change."""


class Toleration(BaseModel):
    """A Kubernetes toleration (the subset a training job needs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    @field_validator("operator")
    @classmethod
    def _operator(cls, v: str) -> str:
        if v not in _OPERATORS:
            raise ValueError(f"toleration operator {v!r} is not valid: use one of {_OPERATORS}")
        return v

    @field_validator("effect")
    @classmethod
    def _effect(cls, v: str) -> str:
        if v and v not in _EFFECTS:
            raise ValueError(f"toleration effect {v!r} is not valid: use one of {_EFFECTS} "
                             "(or leave it empty for every effect)")
        return v


_KUBELET_VAR = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def mangled_by_argo(arg: str) -> str | None:
    """Why a command argument would not reach the container as written, or None.

    Argo substitutes ``{{...}}`` in a template's command (and an unclosed ``{{`` makes the
    whole workflow invalid; util/template); the kubelet replaces ``$(NAME)`` with the value of
    the container's variable NAME and turns ``$$(`` into ``$(`` (its only escape). PURE."""
    if "{{" in arg or "}}" in arg:
        return (f"the command argument {arg!r} contains '{{{{' or '}}}}': Argo would replace "
                "{{...}} with its own variables (or refuse the workflow); there is no escape, "
                "so pass such a value in a file or an environment variable, and read "
                "$AEGIS_JOB for the job's name")
    m = _KUBELET_VAR.search(arg)
    if m:
        return (f"the command argument {arg!r} contains $({m.group(1)}): the kubelet replaces "
                f"$(NAME) with the container's variable NAME; write $$({m.group(1)}) for a "
                "literal $(...) (e.g. shell command substitution)")
    return None


class JobSpec(BaseModel):
    """One training job. ``nats_url`` empty means the cluster NATS that ``aegis-flow install``
    runs in the namespace (``nats://aegis-nats.NAMESPACE:4222``, JetStream on a volume): the
    master keeps its status there, where a restarted master finds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "aegis-job"
    image: str
    command: tuple[str, ...]
    workers: int = 2
    gpus_per_worker: int = 0
    cpu: str = "1"
    memory: str = "2Gi"
    max_retry: int = 3
    namespace: str = "default"
    service_account: str = "aegis-flow"  # nodes get/list/patch: the master and quarantine only
    executor_service_account: str = "aegis-flow-executor"  # every other pod: Argo's executor
    nats_url: str = ""
    aegis_image: str = DEFAULT_AEGIS_IMAGE
    supervisor: tuple[str, ...] = ("aegis-flow", "worker")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    active_deadline_seconds: int = 7 * 24 * 3600
    ttl_seconds_after_completion: int = 24 * 3600
    pod_retry_limit: int = 3
    master_retry_limit: int = 5
    # pod-sized timeouts (seconds): the master and the ranks' pods are created together, so
    # the connect timeout counts from when the run pods exist; both cover scheduling, an
    # image pull and the init containers (with gang scheduling, the wait for the whole gang)
    # the checkpoint directory every rank shares (a ReadWriteMany PersistentVolumeClaim):
    # mounted at checkpoint_dir in every worker pod, named in $AEGIS_CHECKPOINT_DIR, and where
    # the io check writes; a rank moved to another node resumes from the same checkpoint
    checkpoint_claim: str = ""
    checkpoint_dir: str = "/checkpoints"
    connect_timeout: int = 900  # every rank acks within this, or the ranks run on their own
    replace_timeout: int = 900  # a replaced rank is back within this, or the job stops
    # seconds a rank's forwards must take more than twice its peers' median, in a row, before
    # the master marks it slow (T13s; evicted right after the next checkpoint, T13e): the
    # master's --slow-window, rendered only when it differs from the master's default
    slow_window: int = SLOW_WINDOW
    # ranks per worker pod (torchrun's --nproc-per-node; one per GPU): the supervisor starts
    # them all; the pod (a node) is still what fails, restarts and is rescheduled as one
    nproc_per_node: int = 1
    # zero intrusion: an init container copies the supervisor bundle into the pod and the
    # worker runs it with the image's own Python; False: the image has aegis-flow installed
    inject_supervisor: bool = True
    python: str = "python3"
    # a checkpoint saver/uploader every worker runs beside training (``--saver``), one
    # shell-like string; restarted 3 s after every exit. Empty: none
    saver: str = ""
    metrics_port: int = 9464  # the master's /metrics, /healthz, /readyz
    grpc_port: int = 50051  # the master's SyncWorkerCreds
    # the Secret (key "token") with the bootstrap token the ranks buy their NATS credentials
    # with; empty: one per workflow, <workflow>-bootstrap, made by its first step and deleted
    # with it (aegis_flow/k8s/token.py); a name: that Secret, shared by every job using it
    bootstrap_secret: str = ""
    auth_secret: str = "aegis-auth"  # Secret: the master's NATS auth dir (nats.conf, seeds)
    # TLS for SyncWorkerCreds, on by default: a Secret with tls.crt + tls.key (the master's
    # certificate, for tls_server_name) and ca.crt (the CA that signed it; workers verify the
    # master with it, and with mutual TLS the master verifies workers with it too).
    # `aegis-flow install --create-secrets` makes the default one, aegis-grpc-tls.
    grpc_tls_secret: str = DEFAULT_GRPC_TLS_SECRET
    # plaintext gRPC: the bootstrap token and the JWTs cross the pod network in the clear
    # (review F4); only when asked for by name
    grpc_plaintext: bool = False
    # mutual TLS: a Secret with tls.crt + tls.key, the client certificate every worker-init
    # shows, signed by the CA in grpc_tls_secret's ca.crt (needs grpc_tls_secret)
    grpc_tls_client_secret: str = ""
    # the DNS name the master's certificate must carry; workers dial the master's pod IP,
    # unknown when the certificate is issued, so they check this name instead
    # (empty: aegis-master.NAMESPACE.svc)
    grpc_tls_server_name: str = ""

    @field_validator("metrics_port", "grpc_port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 1 <= v <= 65535:
            raise ValueError(f"port ({v}) must be between 1 and 65535")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not v or any(c.isspace() for c in v):
            raise ValueError(f"python {v!r} must be one interpreter name or path, e.g. "
                             "'python3' or '/opt/conda/bin/python'")
        return v

    @field_validator("name", "namespace", "service_account", "executor_service_account",
                     "bootstrap_secret", "auth_secret")
    @classmethod
    def _dns_label(cls, v: str, info: ValidationInfo) -> str:
        if info.field_name == "bootstrap_secret" and v == "":
            return v  # one per workflow
        if not _DNS_LABEL.match(v) or len(v) > 52:
            fixed = re.sub(r"[^a-z0-9-]+", "-", v.lower()).strip("-")[:52] or "aegis-job"
            raise ValueError(f"{v!r} is not a valid Kubernetes name: use lower-case letters, "
                             f"digits and '-', at most 52 characters (e.g. {fixed!r})")
        return v

    @field_validator("grpc_tls_secret", "grpc_tls_client_secret")
    @classmethod
    def _secret_name(cls, v: str) -> str:
        if v and (not _DNS_SUBDOMAIN.match(v) or len(v) > 253):
            raise ValueError(f"{v!r} is not a valid Secret name: use lower-case letters, "
                             "digits, '-' and '.', e.g. 'aegis-grpc-tls' (or leave it empty)")
        return v

    @field_validator("grpc_tls_server_name")
    @classmethod
    def _server_name(cls, v: str) -> str:
        if v and (not _DNS_SUBDOMAIN.match(v) or len(v) > 253 or _is_ip(v)):
            raise ValueError(f"{v!r} is not a DNS name: give the name in "
                             "the master certificate's DNS SANs, e.g. "
                             "'aegis-master.training.svc' (an IP address cannot be used: the "
                             "master's pod IP is not known when its certificate is issued)")
        return v

    @field_validator("image", "aegis_image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not v.strip() or any(c.isspace() for c in v):
            raise ValueError(f"image {v!r} is not an image reference: give e.g. "
                             "'registry.example.com/team/train:1.0'")
        return v

    @field_validator("command", "supervisor", mode="before")
    @classmethod
    def _argv(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError(f"command {v!r} is a string: give a list of arguments, e.g. "
                             f"{v.split()!r}")
        return v

    @field_validator("command", "supervisor")
    @classmethod
    def _non_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v or not v[0]:
            raise ValueError("the command is empty: give the training command, e.g. "
                             "['python', 'train.py'] (on the command line: -- python train.py)")
        for arg in v:
            problem = mangled_by_argo(arg)
            if problem:
                raise ValueError(problem)
        return v

    @field_validator("saver")
    @classmethod
    def _saver(cls, v: str) -> str:
        if not v:
            return v
        from aegis_flow.argtypes import split_command

        split_command(v, what="saver")  # ValueError: named, with the fix
        problem = mangled_by_argo(v)
        if problem:
            raise ValueError(problem.replace("the command argument", "saver", 1))
        return v

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: int) -> int:
        if not 1 <= v <= 4096:
            raise ValueError(f"workers ({v}) must be between 1 and 4096")
        return v

    @field_validator("gpus_per_worker")
    @classmethod
    def _gpus(cls, v: int) -> int:
        if not 0 <= v <= 64:
            raise ValueError(f"gpus_per_worker ({v}) must be between 0 and 64 (0 = CPU only)")
        return v

    @field_validator("max_retry")
    @classmethod
    def _max_retry(cls, v: int) -> int:
        # the recursive attempt template nests one level per retry; Argo stops at depth 100
        if not 0 <= v <= 50:
            raise ValueError(f"max_retry ({v}) must be between 0 and 50: each retry nests one "
                             "level of the recursive attempt template, and Argo's limit is 100")
        return v

    @field_validator("pod_retry_limit", "master_retry_limit")
    @classmethod
    def _limits(cls, v: int) -> int:
        if not 0 <= v <= 100:
            raise ValueError(f"retry limit ({v}) must be between 0 and 100")
        return v

    @field_validator("checkpoint_dir")
    @classmethod
    def _abs_dir(cls, v: str) -> str:
        if not v.startswith("/") or any(c.isspace() for c in v):
            raise ValueError(f"checkpoint_dir {v!r} must be an absolute path in the pod")
        return v

    @field_validator("connect_timeout", "replace_timeout")
    @classmethod
    def _pod_timeout(cls, v: int) -> int:
        if not 10 <= v <= 7 * 24 * 3600:
            raise ValueError(f"timeout ({v} s) must be between 10 s and 7 days: a pod needs "
                             "time to be scheduled, pull its image and run its init containers")
        return v

    @field_validator("slow_window")
    @classmethod
    def _slow_window(cls, v: int) -> int:
        if not 0 <= v <= 7 * 24 * 3600:
            raise ValueError(f"slow_window ({v} s) must be between 0 s (mark at once) and "
                             f"7 days (the master's default: {SLOW_WINDOW} s)")
        return v

    @field_validator("active_deadline_seconds", "ttl_seconds_after_completion")
    @classmethod
    def _seconds(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"seconds ({v}) must be at least 1")
        return v

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _quantity(cls, v: Any) -> Any:
        text = str(v)
        if not _QUANTITY.match(text):
            raise ValueError(f"{text!r} is not a Kubernetes quantity: write e.g. '4', '500m', "
                             "'16Gi'")
        return text

    @field_validator("nats_url")
    @classmethod
    def _nats(cls, v: str) -> str:
        if v and not re.match(r"^(nats|tls|wss?)://[^\s/]+", v):
            raise ValueError(f"nats_url {v!r} is not a NATS URL: write "
                             "'nats://HOST:4222', or leave it empty for the cluster NATS of "
                             "`aegis-flow install`")
        return v

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not key or any(c.isspace() for c in key):
                raise ValueError(f"node_selector key {key!r} is not a label key")
        return v

    @model_validator(mode="after")
    def _nproc_fits(self) -> JobSpec:
        if not 1 <= self.nproc_per_node <= 64:
            raise ValueError(f"nproc_per_node ({self.nproc_per_node}) must be between 1 and 64")
        if self.gpus_per_worker and self.nproc_per_node > self.gpus_per_worker:
            raise ValueError(f"nproc_per_node ({self.nproc_per_node}) is more than the "
                             f"{self.gpus_per_worker} GPU(s) each worker pod asks for "
                             "(gpus_per_worker): one rank per GPU")
        return self

    @model_validator(mode="after")
    def _quarantine_label(self) -> JobSpec:
        if "aegis.io/quarantined" in self.node_selector:
            raise ValueError("node_selector must not use 'aegis.io/quarantined': aegis-flow "
                             "already keeps workers off quarantined nodes")
        return self

    @model_validator(mode="after")
    def _tls_needs_a_secret(self) -> JobSpec:
        if not self.grpc_tls_secret and not self.grpc_plaintext:
            raise ValueError(
                "grpc_tls_secret is empty: the credential exchange would send the bootstrap "
                "token in the clear; give the Secret with the master's certificate "
                f"(aegis-flow install --create-secrets makes {DEFAULT_GRPC_TLS_SECRET!r}), or "
                "ask for plaintext by name: grpc_plaintext: true (--grpc-plaintext)")
        if self.grpc_plaintext and self.grpc_tls_client_secret:
            raise ValueError(
                f"grpc_tls_client_secret ({self.grpc_tls_client_secret!r}) is mutual TLS, and "
                "grpc_plaintext turns TLS off: drop one")
        if self.grpc_tls_client_secret and not self.grpc_tls:
            raise ValueError(
                f"grpc_tls_client_secret ({self.grpc_tls_client_secret!r}) turns on mutual TLS, "
                "which needs grpc_tls_secret too: the Secret with the master's tls.crt, tls.key "
                "and the ca.crt that signed both certificates (--grpc-tls-secret NAME)")
        if self.grpc_tls_server_name and not self.grpc_tls:
            raise ValueError(
                f"grpc_tls_server_name ({self.grpc_tls_server_name!r}) has no effect without "
                "grpc_tls_secret: give the Secret with the master's certificate "
                "(--grpc-tls-secret NAME), or drop the name")
        return self

    @property
    def setup_service_account(self) -> str:
        """The account of a workflow's first steps (its Service and its token Secret):
        ``aegis-flow install`` makes it beside ``service_account``."""
        return f"{self.service_account}-setup"

    @property
    def bootstrap_secret_name(self) -> str:
        """The Secret the master and worker-init read the token from."""
        return self.bootstrap_secret or "{{workflow.name}}-bootstrap"

    @property
    def cluster_nats_url(self) -> str:
        """The NATS every pod of the job dials (``aegis-flow install``'s, by default)."""
        return self.nats_url or f"nats://aegis-nats.{self.namespace}:4222"

    @property
    def grpc_tls(self) -> bool:
        """SyncWorkerCreds over TLS (the default; off only with ``grpc_plaintext``)."""
        return bool(self.grpc_tls_secret) and not self.grpc_plaintext

    @property
    def grpc_mutual_tls(self) -> bool:
        """Workers show a client certificate too (``grpc_tls_client_secret`` set)."""
        return bool(self.grpc_tls_client_secret)

    @property
    def tls_server_name(self) -> str:
        """The name worker-init expects in the master's certificate."""
        return self.grpc_tls_server_name or f"aegis-master.{self.namespace}.svc"

    @classmethod
    def parse(cls, data: dict[str, Any]) -> JobSpec:
        """Validate a mapping; raise ``JobSpecError`` with one line per problem."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise JobSpecError(explain(exc)) from None

    @classmethod
    def from_file(cls, path: str | Path) -> JobSpec:
        """Read a job file (YAML or JSON). Keys may use '-' or '_' (``max-retry``)."""
        text = Path(path).read_text()
        try:
            if str(path).endswith(".json"):
                raw = json.loads(text)
            else:
                import yaml

                raw = yaml.safe_load(text)
        except Exception as exc:  # noqa: BLE001 - any parse error becomes one clear message
            raise JobSpecError(f"{path}: not valid YAML/JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise JobSpecError(f"{path}: expected a mapping of job fields, got "
                               f"{type(raw).__name__}")
        return cls.parse({str(k).replace("-", "_"): v for k, v in raw.items()})


_HINTS = {
    "image": ": give the training image, e.g. --image registry.example.com/team/train:1.0",
    "command": ": put the training command after '--' (e.g. -- python train.py), or give "
               "command: [python, train.py] in the job file",
}


def explain(exc: ValidationError) -> str:
    """One line per error: ``field: message`` (pydantic's own prefix stripped)."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "job"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field {where!r}: check the spelling (fields: " + ", ".join(
                JobSpec.model_fields) + ")"
        elif err["type"] == "missing":
            msg = "is required" + _HINTS.get(where, "")
        lines.append(f"{where}: {msg}")
    return "\n".join(lines)
