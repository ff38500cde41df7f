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
ARGOSAY_IMAGE = re.compile(r"^(docker\.io/)?argoproj/argosay:v2$")
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
    message: str = ""


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
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.name, self.spec, self.ctx, self.net = name, spec, ctx, net
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

    @property
    def done(self) -> bool:
        return self.view.phase in ("Succeeded", "Failed")

    # ------------------------------------------------------------------ helpers
    def _changed(self) -> None:
        with contextlib.suppress(Exception):
            self.on_change()

    def _volumes(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for vol in self.spec.get("volumes") or []:
            name = vol["name"]
            where = self.dir / "volumes" / name
            if "emptyDir" in vol:
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
                                   "(emptyDir and secret are)")
            out[name] = where
        return out

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
        st.started = True
        st.ready = kind != "init" and not c.get("readinessProbe")

    def _hosts(self) -> Path:
        """The pod's /etc/hosts as the kubelet writes it: its hostname is its pod IP (what
        gloo and NCCL resolve to pick the address they advertise)."""
        path = self.dir / "etc-hosts"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"
                            "::1\tlocalhost ip6-localhost ip6-loopback\n"
                            f"{self.view.pod_ip}\t{self.name[:63]}\n")
        return path

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
        v.containers[WAIT].started = v.containers[WAIT].ready = True
        mains = [c for c in mains if c["name"] != WAIT]
        for c in mains:
            self._launch(c, v.containers[c["name"]].kind, vols)
        self._changed()
        main = "main"
        next_probe: dict[str, float] = {
            c["name"]: time.time() + float(c["readinessProbe"].get("initialDelaySeconds", 0))
            for c in mains if c.get("readinessProbe")}
        while True:
            rc = self._procs[main].poll()
            if rc is not None:
                break
            if self._stop.is_set() or self._past_deadlines():
                self._stop_containers([c["name"] for c in mains])
                break
            now = time.time()
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
        v.containers[WAIT].exit_code, v.containers[WAIT].reason = 0, "Completed"
        for c in mains:
            st = v.containers[c["name"]]
            st.exit_code = self._procs[c["name"]].wait()
            st.ready = False
        st = v.containers[main]
        code = st.exit_code if st.exit_code is not None else -1
        v.ready = False
        v.finished_at = time.time()
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
        return proc.returncode

    # ------------------------------------------------------------------ results
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
        for vm in main.get("volumeMounts") or []:
            candidates.append((os.path.normpath(vm["mountPath"]),
                               self.dir / "volumes" / vm["name"]))
        for mount, src in sorted(candidates, key=lambda c: -len(c[0])):
            if real == mount or real.startswith(mount + "/"):
                target = src / os.path.relpath(real, mount)
                return target.read_text() if target.is_file() else None
        raise PodSpecError(f"output path {path!r} is outside the container's /tmp and its "
                           "volumes, where rehearse cannot read it")

