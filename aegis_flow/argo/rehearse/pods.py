"""Pods as sets of real local processes, each pod in its own network namespace.

A :class:`PodRun` plays the kubelet for one pod that the scheduler placed on a fake node: it
materialises the pod's volumes (``emptyDir`` directories; Secrets from the rehearsal's secrets
directory, ``SECRETS/<name>/<key>``, with ``defaultMode``/``items``), resolves each container's
environment as the kubelet does (``fieldRef``, ``secretKeyRef``, ``$(VAR)`` expansion in env,
command and args), runs the init containers one after another, then the sidecars and the main
container together, probes readiness (``httpGet``/``tcpSocket``/``exec``) from the cluster
network, enforces ``activeDeadlineSeconds`` (kubelet) and the executor deadline
(``ARGO_DEADLINE``, set from ``retryStrategy.backoff.maxDuration``), stops the sidecars when the
main container has ended (as Argo's executor does), and reads output files from the main
container's filesystem view.

Every container is ``ip netns exec POD unshare --mount --uts … shim.py`` (see ``shim.py``): own
``/tmp``, the pod's volumes at their mount paths, the pod's hostname, the pod's network.

Side effects: processes, network namespaces (through ``netns.Network``), files under the
rehearsal's work directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aegis_flow.argo.rehearse.netns import Network, in_netns

SHIM = Path(__file__).with_name("shim.py")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
WAIT = "wait"  # Argo's executor container: stands for itself, not run as a process
VAR_RUN_ARGO = "/var/run/argo"  # common.VarRunArgoPath: the executor's shared volume
PROGRESS_FILE = VAR_RUN_ARGO + "/progress"  # common.ArgoProgressPath
ARGOSAY_IMAGE = re.compile(r"^(docker\.io/)?argoproj/argosay:v2$")


def hidden_by_tmp() -> tuple[str, ...]:
    """This checkout and the running interpreter's prefix when they lie under ``/tmp``: every
    container has a ``/tmp`` of its own, which would hide them, and the commands a pod runs
    come from this checkout and this interpreter (a clean clone in ``/tmp`` failed every
    rehearsal pod). Each is seen in the container again at its own path, through an overlay
    as every other host directory is (writes stay in the container)."""
    checkout = str(Path(__file__).resolve().parents[3])
    candidates = {checkout, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return tuple(sorted(p for p in candidates if p.startswith("/tmp/")))
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class PodSpecError(ValueError):
    """The pod uses something the rehearsal does not support (said, never ignored)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion (k8s.io/kubernetes third_party/forked/golang/expansion):
    ``$(VAR)`` becomes the value when VAR is defined and stays as written when not; ``$$``
    becomes ``$``."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(one, text)


@dataclass
class ContainerState:
    name: str
    kind: str  # init | main | sidecar
    exit_code: int | None = None
    ready: bool = False
    started: bool = False
    reason: str = ""  # Completed | Error | DeadlineExceeded | StartError | Killed
    message: str = ""  # the termination message (``terminationMessagePath`` under /tmp)
    started_at: float | None = None


@dataclass
class PodView:
    """What the controller reads about a pod (as ``kubectl get pod -o json`` would show)."""

    name: str
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed
    message: str = ""
    reason: str = ""
    pod_ip: str = ""
    node: str = ""
    ready: bool = False
    started_at: float | None = None
    finished_at: float | None = None
    containers: dict[str, ContainerState] = field(default_factory=dict)


@dataclass(frozen=True)
class PodContext:
    """What the kubelet knows besides the spec."""

    namespace: str
    workflow: str
    secrets_dir: Path | None
    workdir: Path
    base_path: str
    api_env: Mapping[str, str]
    image_mounts: tuple[tuple[str, str], ...] = ()
    grace_cap: float | None = None
    sa_dirs: Mapping[str, str] = field(default_factory=dict)  # service account -> token dir
    image_workdirs: Mapping[str, str] = field(default_factory=dict)  # image -> its WORKDIR
    # namespace -> /etc/hosts lines for the Services that exist now (objects.ObjectStore)
    service_hosts: Callable[[str], list[str]] | None = None
    # Argo's progress ticks (ARGO_PROGRESS_PATCH_TICK_DURATION, ARGO_PROGRESS_FILE_TICK_DURATION,
    # seconds; the controller's defaults 1m and 3s); None: progress monitoring disabled
    progress_ticks: tuple[float, float] | None = (60.0, 3.0)


def _secret(ctx: PodContext, name: str) -> Path:
    if ctx.secrets_dir is None or not (ctx.secrets_dir / name).is_dir():
        raise _Waiting(f'secret "{name}" not found')
    return ctx.secrets_dir / name


class _Waiting(Exception):
    """The pod cannot start yet (kubelet keeps it in ContainerCreating)."""


class PodRun:
    """One pod's life. ``start()`` returns at once; ``view`` is updated as it runs."""

    def __init__(self, name: str, spec: dict[str, Any], *, node: str, labels: Mapping[str, str],
                 annotations: Mapping[str, str], ctx: PodContext, net: Network,
                 deadline: float | None = None, script: str | None = None,
                 on_change: Callable[[], None] = lambda: None,
                 main: str | None = "main") -> None:
        self.name, self.spec, self.ctx, self.net = name, spec, ctx, net
        self.main = main  # None: a plain pod (no Argo main container), runs until deleted
        self.labels, self.annotations = dict(labels), dict(annotations)
        self.deadline = deadline  # executor deadline (ARGO_DEADLINE), wall clock
        self.script = script
        self.on_change = on_change
        self.view = PodView(name=name, node=node)
        self.dir = ctx.workdir / "pods" / name
        self.ns = ""
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_reason = ""
        self.deleting = False  # deleted: terminating within its grace period
        self.gone = False  # deleted and its containers have ended: the API has no such pod
        self.progress: str | None = None  # self-reported progress the executor has reported
        self._thread = threading.Thread(target=self._run, name=f"pod-{name}", daemon=True)

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        self._thread.start()

    def kill(self, reason: str = "Killed") -> None:
        """Delete the pod: its containers get SIGTERM, then SIGKILL after the grace period."""
        self._stop_reason = self._stop_reason or reason
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def delete(self) -> None:
        """``kubectl delete pod``: terminating (SIGTERM, SIGKILL after the grace period), then
        gone from the API (``gone``): the controller no longer sees it."""
        self.deleting = True
        self.kill("Deleted")

    def kill_main(self) -> None:
        """SIGKILL the main container's processes (an OOM kill or ``kill -9`` in it)."""
        if self.main is not None:
            self._signal(self.main, signal.SIGKILL)

    @property
    def done(self) -> bool:
        return self.view.phase in ("Succeeded", "Failed") or self.gone

    # ------------------------------------------------------------------ as an endpoint
    @property
    def namespace(self) -> str:
        return self.ctx.namespace

    @property
    def serving(self) -> bool:
        """Running, every container ready, not terminating (in the Service's endpoints)."""
        return self.view.phase == "Running" and self.view.ready and not self.deleting \
            and not self.gone

    @property
    def address(self) -> str:
        return self.view.pod_ip

    # ------------------------------------------------------------------ helpers
    def _changed(self) -> None:
        with contextlib.suppress(Exception):
            self.on_change()

    def _volumes(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for vol in self.spec.get("volumes") or []:
            name = vol["name"]
            where = self._volume_dir(vol)
            if "emptyDir" in vol or "persistentVolumeClaim" in vol:
                where.mkdir(parents=True, exist_ok=True)
            elif "secret" in vol:
                src = _secret(self.ctx, vol["secret"]["secretName"])
                where.mkdir(parents=True, exist_ok=True)
                mode = int(vol["secret"].get("defaultMode", 0o644))
                items = vol["secret"].get("items")
                pairs = ([(i["key"], i["path"]) for i in items] if items
                         else [(p.name, p.name) for p in src.iterdir() if p.is_file()])
                for key, rel in pairs:
                    if not (src / key).is_file():
                        raise _Waiting(f'couldn\'t find key {key} in Secret '
                                       f'{self.ctx.namespace}/{vol["secret"]["secretName"]}')
                    dst = where / rel
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_bytes((src / key).read_bytes())
                    os.chmod(dst, int(items[[i["key"] for i in items].index(key)].get("mode", mode))
                             if items else mode)
            else:
                kind = next((k for k in vol if k != "name"), "?")
                raise PodSpecError(f"volume {name!r}: {kind} volumes are not supported "
                                   "(emptyDir, secret and persistentVolumeClaim are)")
            out[name] = where
        return out

    def _volume_dir(self, vol: Mapping[str, Any]) -> Path:
        """Where a volume's files live: the pod's own directory, except a
        ``persistentVolumeClaim``: one directory per claim for the whole rehearsal, shared by
        every pod that mounts it (a claim from ``volumeClaimTemplates`` is empty at the start;
        access modes and the claim's size are not enforced)."""
        pvc = vol.get("persistentVolumeClaim")
        if pvc is not None:
            return self.ctx.workdir / "pvc" / str(pvc["claimName"])
        return self.dir / "volumes" / str(vol["name"])

    def _field(self, path: str) -> str:
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            src = self.labels if m.group(1) == "labels" else self.annotations
            return src.get(m.group(2), "")
        values = {"status.podIP": self.view.pod_ip, "spec.nodeName": self.view.node,
                  "metadata.name": self.name, "metadata.namespace": self.ctx.namespace,
                  "status.hostIP": self.view.pod_ip,
                  "spec.serviceAccountName": str(self.spec.get("serviceAccountName", "default"))}
        if path not in values:
            raise PodSpecError(f"env fieldRef {path!r} is not supported")
        return values[path]

    def _env(self, c: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {
            "PATH": self.ctx.base_path, "HOME": "/root", "HOSTNAME": self.name,
            **self.ctx.api_env}
        if self.deadline is not None:
            env["ARGO_DEADLINE"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.deadline))
        env["ARGO_POD_NAME"] = self.name
        if self.ctx.progress_ticks is not None:  # createWorkflowPod, every container
            env["ARGO_PROGRESS_FILE"] = PROGRESS_FILE
            env["ARGO_PROGRESS_PATCH_TICK_DURATION"] = _go_duration(self.ctx.progress_ticks[0])
            env["ARGO_PROGRESS_FILE_TICK_DURATION"] = _go_duration(self.ctx.progress_ticks[1])
        for src in c.get("envFrom") or []:
            if "secretRef" not in src:
                raise PodSpecError("envFrom: only secretRef is supported")
            prefix = src.get("prefix", "")
            for p in sorted(_secret(self.ctx, src["secretRef"]["name"]).iterdir()):
                env[prefix + p.name] = p.read_text()
        for item in c.get("env") or []:
            name = item["name"]
            if "value" in item:
                env[name] = expand(str(item["value"]), env)
            elif "valueFrom" in item:
                vf = item["valueFrom"]
                if "fieldRef" in vf:
                    env[name] = self._field(vf["fieldRef"]["fieldPath"])
                elif "secretKeyRef" in vf:
                    ref = vf["secretKeyRef"]
                    path = _secret(self.ctx, ref["name"]) / ref["key"]
                    if not path.is_file():
                        raise _Waiting(f"couldn't find key {ref['key']} in Secret "
                                       f"{self.ctx.namespace}/{ref['name']}")
                    env[name] = path.read_text()
                else:
                    raise PodSpecError(f"env {name}: valueFrom {sorted(vf)} is not supported "
                                       "(fieldRef and secretKeyRef are)")
            else:
                env[name] = ""
        return env

    def _argv(self, c: dict[str, Any], env: Mapping[str, str]) -> list[str]:
        command = list(c.get("command") or [])
        args = list(c.get("args") or [])
        if not command:
            if ARGOSAY_IMAGE.match(str(c.get("image", ""))):
                command = [sys.executable, "-m", "aegis_flow.argo.rehearse.argosay"]
            else:
                raise PodSpecError(
                    f"container {c['name']!r} (image {c.get('image')!r}) has no command: "
                    "rehearse runs commands from this checkout, not images, so it cannot know "
                    "the image's entrypoint")
        return [expand(str(a), env) for a in command + args]

    def _launch(self, c: dict[str, Any], kind: str, vols: dict[str, Path]) -> None:
        name = c["name"]
        env = self._env(c)
        argv = self._argv(c, env)
        if kind == "main" and self.script:
            argv.append("/argo/staging/script")
        cdir = self.dir / "containers" / name
        (cdir / "tmp").mkdir(parents=True, exist_ok=True)
        os.chmod(cdir / "tmp", 0o1777)
        mounts: list[dict[str, object]] = [{"path": "/tmp", "source": str(cdir / "tmp")},
                                           {"path": "/etc/hosts", "source": str(self._hosts()),
                                            "readOnly": True}]
        for path, src in self.ctx.image_mounts:
            mounts.append({"path": path, "source": src, "readOnly": True})
        mounts += [{"path": path, "source": path, "readOnly": True, "overlay": True}
                   for path in hidden_by_tmp()]
        if self.ctx.progress_ticks is not None and self.main is not None:
            mounts.append({"path": VAR_RUN_ARGO, "source": str(self._var_run_argo())})
        sa = str(self.spec.get("serviceAccountName") or "default")
        if self.spec.get("automountServiceAccountToken", True) and sa in self.ctx.sa_dirs:
            mounts.append({"path": SA_DIR, "source": self.ctx.sa_dirs[sa], "readOnly": True})
        if self.script:
            staging = self.dir / "staging"
            staging.mkdir(parents=True, exist_ok=True)
            (staging / "script").write_text(self.script)
            mounts.append({"path": "/argo/staging", "source": str(staging)})
        for vm in c.get("volumeMounts") or []:
            if vm["name"] not in vols:
                raise PodSpecError(f"container {name!r} mounts volume {vm['name']!r}, "
                                   "which the pod does not have")
            vol = vols[vm["name"]]
            mounts.append({"path": vm["mountPath"],
                           "source": str(vol / str(vm["subPath"]) if vm.get("subPath") else vol),
                           "readOnly": bool(vm.get("readOnly"))})
        spec = {"root": str(cdir / "root"), "hostname": self.name[:63], "mounts": mounts,
                "workdir": c.get("workingDir") or self.ctx.image_workdirs.get(
                    str(c.get("image", "")), "/"), "env": env, "argv": argv}
        (cdir / "spec.json").write_text(json.dumps(spec))
        out = open(cdir / "stdout", "wb")  # noqa: SIM115 - handed to the child
        err = open(cdir / "stderr", "wb")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--uts",
                 "--propagation", "private", "--", sys.executable, str(SHIM),
                 str(cdir / "spec.json")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        finally:
            out.close()
            err.close()
        with self._lock:
            self._procs[name] = proc
        st = self.view.containers[name]
        st.started, st.started_at = True, time.time()
        st.ready = kind != "init" and not c.get("readinessProbe")

    def _hosts(self) -> Path:
        """The pod's /etc/hosts as the kubelet writes it: its hostname is its pod IP (what
        gloo and NCCL resolve to pick the address they advertise)."""
        path = self.dir / "etc-hosts"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"
                            "::1\tlocalhost ip6-localhost ip6-loopback\n"
                            f"{self.view.pod_ip}\t{self.name[:63]}\n"
                            + "".join(f"{line}\n" for line in (
                                self.ctx.service_hosts(self.ctx.namespace)
                                if self.ctx.service_hosts is not None else [])))
        return path

    def _var_run_argo(self) -> Path:
        path = self.dir / "var-run-argo"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _termination_message(self, c: dict[str, Any]) -> str:
        """The container's ``terminationMessagePath`` file, when it is under its /tmp."""
        where = str(c.get("terminationMessagePath") or "")
        if not where.startswith("/tmp/"):
            return ""
        path = self.dir / "containers" / c["name"] / "tmp" / where[len("/tmp/"):]
        return path.read_text(errors="replace")[:4096] if path.is_file() else ""

    def _signal(self, name: str, sig: int) -> None:
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    def _grace(self) -> float:
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        return min(grace, self.ctx.grace_cap) if self.ctx.grace_cap is not None else grace

    def _stop_containers(self, names: list[str]) -> None:
        for n in names:
            self._signal(n, signal.SIGTERM)
        end = time.monotonic() + self._grace()
        for n in names:
            proc = self._procs.get(n)
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(n, signal.SIGKILL)
                proc.wait()

    def _probe(self, c: dict[str, Any]) -> bool:
        probe = c["readinessProbe"]
        try:
            if "httpGet" in probe:
                hg = probe["httpGet"]
                port = self._port(c, hg["port"])
                url = f"http://{self.view.pod_ip}:{port}{hg.get('path', '/')}"

                def get() -> int:
                    with urllib.request.urlopen(url, timeout=float(  # noqa: S310
                            probe.get("timeoutSeconds", 1))) as r:
                        return int(r.status)
                return 200 <= in_netns(self.net.hub, get) < 400
            if "tcpSocket" in probe:
                port = self._port(c, probe["tcpSocket"]["port"])

                def dial() -> bool:
                    with socket.create_connection((self.view.pod_ip, port), timeout=1):
                        return True
                return in_netns(self.net.hub, dial)
            if "exec" in probe:
                argv = list(probe["exec"]["command"])
                res = subprocess.run(["ip", "netns", "exec", self.ns, *argv],
                                     capture_output=True, timeout=float(
                                         probe.get("timeoutSeconds", 1)) + 5)
                return res.returncode == 0
        except (OSError, subprocess.SubprocessError, ValueError):
            return False
        raise PodSpecError(f"readinessProbe of {c['name']!r}: only httpGet, tcpSocket and exec")

    @staticmethod
    def _port(c: dict[str, Any], port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no port named {port!r}")

    # ------------------------------------------------------------------ the pod's life
    def _run(self) -> None:
        v = self.view
        try:
            self._life()
        except PodSpecError as exc:
            v.phase, v.reason, v.message = "Failed", "Unsupported", str(exc)
        except Exception as exc:  # a harness fault: say it on the node, never hang
            v.phase, v.reason, v.message = "Failed", "RehearsalError", f"rehearse: {exc!r}"
        finally:
            if v.finished_at is None:
                v.finished_at = time.time()
            if self.deleting:
                v.phase, v.reason, self.gone = "Failed", "Deleted", True
            if self.ns:
                with contextlib.suppress(Exception):
                    self.net.remove(self.ns)
            self._changed()

    def _wait_start(self) -> dict[str, Path] | None:
        """ContainerCreating until volumes and env can be resolved (missing Secrets)."""
        while True:
            try:
                vols = self._volumes()
                for c in self._all():
                    self._env(c)
                return vols
            except _Waiting as exc:
                if self.view.message != exc.args[0]:
                    self.view.reason, self.view.message = "ContainerCreating", exc.args[0]
                    self._changed()
                if self._stop.wait(1.0) or self._past_deadlines():
                    return None

    def _all(self) -> list[dict[str, Any]]:
        return [*(self.spec.get("initContainers") or []), *self.spec["containers"]]

    def _past_deadlines(self) -> bool:
        ads = self.spec.get("activeDeadlineSeconds")
        now = time.time()
        if ads is not None and self.view.started_at is not None \
                and now >= self.view.started_at + float(ads):
            self._stop_reason = self._stop_reason or "DeadlineExceeded"
            return True
        if self.deadline is not None and now >= self.deadline:
            self._stop_reason = self._stop_reason or "ExecutorDeadline"
            return True
        return False

    def _life(self) -> None:
        v = self.view
        v.started_at = time.time()
        inits = list(self.spec.get("initContainers") or [])
        mains = list(self.spec["containers"])
        for c in inits:
            v.containers[c["name"]] = ContainerState(c["name"], "init")
        for c in mains:
            kind = {"main": "main", WAIT: "wait"}.get(c["name"], "sidecar")
            v.containers[c["name"]] = ContainerState(c["name"], kind)
        self.ns, v.pod_ip = self.net.add_pod()
        vols = self._wait_start()
        if vols is None:
            v.phase = "Failed"
            v.reason = "DeadlineExceeded" if self._stop_reason == "DeadlineExceeded" else \
                (self._stop_reason or "Killed")
            return
        v.reason, v.message = "", ""
        self._changed()
        for c in inits:
            self._launch(c, "init", vols)
            rc = self._wait_proc(c["name"])
            st = v.containers[c["name"]]
            st.exit_code = rc
            if rc is None or rc != 0:
                st.reason = "Error" if rc is not None else (self._stop_reason or "Killed")
                v.phase, v.finished_at = "Failed", time.time()
                v.reason = st.reason
                return
            st.reason = "Completed"
        v.phase = "Running"
        if WAIT in v.containers:
            v.containers[WAIT].started = v.containers[WAIT].ready = True
        mains = [c for c in mains if c["name"] != WAIT]
        for c in mains:
            self._launch(c, v.containers[c["name"]].kind, vols)
        self._changed()
        main = self.main
        next_probe: dict[str, float] = {
            c["name"]: time.time() + float(c["readinessProbe"].get("initialDelaySeconds", 0))
            for c in mains if c.get("readinessProbe")}
        monitor = _ProgressMonitor(self) if main is not None and WAIT in v.containers and \
            self.ctx.progress_ticks is not None else None
        while True:
            if main is not None and self._procs[main].poll() is not None:
                break
            if main is None and all(self._procs[c["name"]].poll() is not None for c in mains):
                break
            if self._stop.is_set() or self._past_deadlines():
                self._stop_containers([c["name"] for c in mains])
                break
            now = time.time()
            if monitor is not None:
                monitor.tick(now)
            for c in mains:
                n = c["name"]
                if n in next_probe and now >= next_probe[n]:
                    ok = self._probe(c)
                    next_probe[n] = now + float(c["readinessProbe"].get("periodSeconds", 10))
                    if ok != v.containers[n].ready:
                        v.containers[n].ready = ok
            ready = all(st.ready for st in v.containers.values() if st.kind != "init")
            if ready != v.ready:
                v.ready = ready
                self._changed()
            time.sleep(0.05)
        # main ended (or the pod was stopped): Argo's executor stops the sidecars
        self._stop_containers([c["name"] for c in mains if c["name"] != main])
        if WAIT in v.containers:
            v.containers[WAIT].exit_code, v.containers[WAIT].reason = 0, "Completed"
        for c in mains:
            st = v.containers[c["name"]]
            st.exit_code = _exit_code(self._procs[c["name"]].wait())
            st.message = self._termination_message(c)
            st.ready = False
        v.ready = False
        v.finished_at = time.time()
        if self.deleting:  # gone from the API once its containers have ended (see _run)
            return
        if main is None:
            failed = any(v.containers[c["name"]].exit_code for c in mains)
            v.phase = "Failed" if failed or self._stop_reason else "Succeeded"
            v.reason = self._stop_reason
            return
        st = v.containers[main]
        code = st.exit_code if st.exit_code is not None else -1
        if self._stop_reason:
            st.reason = self._stop_reason
            v.reason = self._stop_reason
            v.phase = "Failed"
        else:
            st.reason = "Completed" if code == 0 else "Error"
            v.phase = "Succeeded" if code == 0 else "Failed"

    def _wait_proc(self, name: str) -> int | None:
        proc = self._procs[name]
        while proc.poll() is None:
            if self._stop.is_set() or self._past_deadlines():
                self._stop_containers([name])
                return None
            time.sleep(0.05)
        return _exit_code(proc.returncode)

    # ------------------------------------------------------------------ results
    def logs(self, container: str | None = None) -> str:
        return self.stdout(container) + self.stderr(container)

    def stdout(self, container: str | None = None) -> str:
        name = container or "main"
        path = self.dir / "containers" / name / "stdout"
        return path.read_text(errors="replace") if path.exists() else ""

    def stderr(self, container: str | None = None) -> str:
        name = container or "main"
        path = self.dir / "containers" / name / "stderr"
        return path.read_text(errors="replace") if path.exists() else ""

    def read_output(self, path: str) -> str | None:
        """The main container's file at ``path`` (its /tmp or a volume), None when missing."""
        main = next(c for c in self.spec["containers"] if c["name"] == "main")
        real = os.path.normpath(path)
        candidates: list[tuple[str, Path]] = [
            ("/tmp", self.dir / "containers" / main["name"] / "tmp")]
        vols = {v["name"]: v for v in self.spec.get("volumes") or []}
        for vm in main.get("volumeMounts") or []:
            candidates.append((os.path.normpath(vm["mountPath"]),
                               self._volume_dir(vols.get(vm["name"], {"name": vm["name"]}))))
        for mount, src in sorted(candidates, key=lambda c: -len(c[0])):
            if real == mount or real.startswith(mount + "/"):
                target = src / os.path.relpath(real, mount)
                return target.read_text() if target.is_file() else None
        raise PodSpecError(f"output path {path!r} is outside the container's /tmp and its "
                           "volumes, where rehearse cannot read it")


def _exit_code(rc: int | None) -> int | None:
    """What the container runtime reports: a process killed by signal N exited 128+N."""
    return None if rc is None else (128 - rc if rc < 0 else rc)


def _go_duration(seconds: float) -> str:
    """``time.Duration.String`` for whole seconds or milliseconds (``1m0s``, ``3s``)."""
    ms = int(round(seconds * 1000))
    if ms % 1000:
        return f"{ms}ms" if ms < 1000 else f"{ms / 1000:g}s"
    sec = ms // 1000
    h, rest = divmod(sec, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{sec}s"
    if m:
        return f"{m}m{sec}s"
    return f"{sec}s"


def valid_progress(text: str) -> bool:
    """``Progress.IsValid`` (pkg/apis/workflow/v1alpha1/progress.go): ``N/M``, 0 <= N <= M, M > 0
    (each part as Go's ``strconv.ParseInt``, an unparsable part being 0)."""
    parts = text.split("/", 1)
    if len(parts) != 2:
        return False

    def num(x: str) -> int:
        return int(x) if re.fullmatch(r"\d+", x) else -1  # (stricter: digits only)
    n, m = num(parts[0]), num(parts[1])
    return 0 <= n <= m and m > 0


class _ProgressMonitor:
    """The wait container's ``monitorProgress`` (workflow/executor/executor.go): every file
    tick the last line of ``ARGO_PROGRESS_FILE``, when it parses as ``N/M``, becomes the pending
    progress; every patch tick the pending progress is reported (the task result the
    controller reads, ``taskresult.go``) and cleared. Stops with the main container: a value
    not yet reported then is lost, as with Argo."""

    def __init__(self, pod: PodRun) -> None:
        assert pod.ctx.progress_ticks is not None
        self.pod = pod
        self.patch_tick, self.file_tick = pod.ctx.progress_ticks
        now = time.time()
        self.next_patch, self.next_file = now + self.patch_tick, now + self.file_tick
        self.last_line = ""
        self.pending = ""

    def tick(self, now: float) -> None:
        if now >= self.next_patch:
            self.next_patch = now + self.patch_tick
            if self.pending:
                self.pod.progress = self.pending
                self.pending = ""
                self.pod._changed()
        if now >= self.next_file:
            self.next_file = now + self.file_tick
            path = self.pod.dir / "var-run-argo" / "progress"
            try:
                data = path.read_text(errors="replace")
            except OSError:
                return
            lines = data.strip().split("\n")
            recent = lines[-1].strip()
            if not recent or recent == self.last_line:
                return
            self.last_line = recent
            if valid_progress(recent):
                self.pending = recent

