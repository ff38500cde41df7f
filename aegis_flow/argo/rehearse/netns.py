"""The rehearsal's private network: one namespace per pod on a bridge, nothing routed out.

Topology (addresses from 198.18.0.0/15, the benchmarking range, only inside namespaces made
here; no default route anywhere)::

    hub namespace: bridge br0 198.18.0.1/16  (the "cluster network": API stand-in, probes)
      |-- p<N> <veth> eth0 198.18.x.y/16 in pod namespace <tag>p<N> (own lo, own 127.0.0.1)

Namespaces are named ``aegis-rh-<pid>-<n>-…``; :meth:`Network.destroy` SIGKILLs what still runs
in them (``ip netns pids``: only processes started inside this rehearsal's namespaces) and
deletes them; :func:`remove_stale` removes those of a rehearsal whose process is gone.

:func:`in_netns` runs a callable with the *calling thread* inside a namespace (``setns(2)`` on
one thread only), so the executor can listen on and dial the cluster network without a
subprocess; sockets keep the namespace they were made in.

Side effects: creates and deletes network namespaces and links (root and ``ip`` needed).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from aegis_flow.local.runs import pid_alive

PREFIX = "aegis-rh-"
HUB_ADDR = "198.18.0.1"
PREFIXLEN = 16
#: the hub bridge's own MAC address, set once (locally administered). A Linux bridge left to
#: itself takes the lowest MAC of its ports and changes it as pods come and go; every host then
#: sends to the old one (its ARP entry) until it probes again: 10-15 s in which nothing
#: reached the bridge's addresses (the API stand-in, every Service's ClusterIP). A job's
#: master lost NATS for that long after each pod removal, and its exit took 12 s more.
BRIDGE_MAC = "02:ae:00:00:00:01"
CLONE_NEWNET = 0x40000000
_counter = itertools.count()
T = TypeVar("T")


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no ``ip``, EPERM)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")
    return res


def why_unavailable() -> str | None:
    """Why pod namespaces cannot be made here, or None (makes and removes a probe)."""
    if os.geteuid() != 0:
        return "pods run in their own network and mount namespaces, which need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on PATH (iproute2 / util-linux)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"`ip netns add` failed: {res.stderr.strip() or res.returncode}"
    try:
        res = _ip("-n", probe, "link", "add", "name", "br0", "type", "bridge", check=False)
        if res.returncode != 0:
            return f"cannot create a bridge in a namespace: {res.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def ns_pids(ns: str) -> list[int]:
    res = _ip("netns", "pids", ns, check=False)
    return [int(w) for w in res.stdout.split() if w.isdigit() and int(w) != os.getpid()]


def kill_inside(ns: str) -> None:
    """SIGKILL whatever still runs in namespace ``ns`` (one of this rehearsal's)."""
    for pid in ns_pids(ns):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def remove_stale(prefix: str = PREFIX) -> None:
    """Delete namespaces named ``<prefix><pid>-…`` whose process is gone (it was SIGKILLed)."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{re.escape(prefix)}(\d+)-", name)
        if m and not pid_alive(int(m.group(1))):
            kill_inside(name)
            _ip("netns", "del", name, check=False)


def pod_address(index: int) -> str:
    """The ``index``-th pod's address on the cluster network (198.18.1.2 onwards)."""
    hi, lo = divmod(index, 250)
    if hi > 250:
        raise ValueError("more than 62,500 pods in one rehearsal")
    return f"198.18.{1 + hi}.{2 + lo}"


class Network:
    """The hub bridge and one namespace per pod."""

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}-{next(_counter)}-"
        self.hub = self.tag + "hub"
        self.namespaces: list[str] = []
        self._lock = threading.Lock()
        self._next = itertools.count()

    def create(self) -> Network:
        try:
            self._add_ns(self.hub)
            _ip("-n", self.hub, "link", "add", "name", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "address", BRIDGE_MAC)
            _ip("-n", self.hub, "addr", "add", f"{HUB_ADDR}/{PREFIXLEN}", "dev", "br0")
            _ip("-n", self.hub, "link", "set", "br0", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        with self._lock:
            self.namespaces.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def add_pod(self) -> tuple[str, str]:
        """A new pod namespace with ``eth0`` on the bridge: returns (namespace, address)."""
        index = next(self._next)
        ns, addr, hub_end = f"{self.tag}p{index}", pod_address(index), f"p{index}"
        self._add_ns(ns)
        _ip("-n", self.hub, "link", "add", "name", hub_end, "type", "veth", "peer", "name",
            "eth0", "netns", ns)
        _ip("-n", self.hub, "link", "set", hub_end, "master", "br0")
        _ip("-n", self.hub, "link", "set", hub_end, "up")
        _ip("-n", ns, "addr", "add", f"{addr}/{PREFIXLEN}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        return ns, addr

    def remove(self, ns: str) -> None:
        kill_inside(ns)
        for _ in range(50):
            if _ip("netns", "del", ns, check=False).returncode == 0:
                break
            time.sleep(0.1)
        with self._lock:
            if ns in self.namespaces:
                self.namespaces.remove(ns)

    def destroy(self) -> None:
        """Kill what still runs inside, delete every namespace (and so every link)."""
        with self._lock:
            namespaces = list(reversed(self.namespaces))
        for ns in namespaces:
            kill_inside(ns)
        for ns in namespaces:
            self.remove(ns)

    def leftovers(self) -> list[str]:
        res = _ip("netns", "list", check=False)
        return [line.split()[0] for line in res.stdout.splitlines()
                if line.split() and line.split()[0].startswith(self.tag)]


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _enter(ns: str) -> None:
    """Move the calling thread into network namespace ``ns``."""
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        _setns(fd)
    finally:
        os.close(fd)


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` on a fresh thread inside namespace ``ns`` (this thread is untouched)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            _enter(ns)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, name=f"netns-{ns}", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
