"""Network namespaces for partition tests: a private network the test builds and removes.

Topology (every address from 198.18.0.0/15, the benchmarking range, and only inside the
namespaces made here; no default route, no route out)::

    hub namespace: bridge br0 198.18.0.1/24 (the control plane: nats-server listens here)
      |-- h-NAME  <veth>  ctl 198.18.0.x/24   in namespace NAME (a worker, the master)
    data links: a veth pair "data" straight between two namespaces (torch's traffic), e.g.
      w0 data 198.18.1.10/24  <veth>  w1 data 198.18.1.11/24

``cut(NAME)`` sets the hub's end of NAME's control link down: packets on it are dropped
silently, as in a real partition, while the data links stay up (only the control plane is cut);
``restore(NAME)`` sets it up again.

Namespaces are named ``aegis-pt-<pid>-<n>-<name>``; :meth:`Network.destroy` kills what still runs
in them (``ip netns pids``: only processes started inside the test's own namespaces) and
deletes them. :func:`remove_stale` deletes namespaces of this naming whose pytest is gone (a
run that was SIGKILLed).

Side effects: creates and deletes network namespaces and links (needs root and ``ip``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from aegis_flow.argo.rehearse.netns import BRIDGE_MAC, _ip, kill_inside
from aegis_flow.argo.rehearse.netns import remove_stale as _remove_stale
from tests.jobs import Proc

PREFIX = "aegis-pt-"
HUB_ADDR = "198.18.0.1"
_counter = itertools.count()


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no ``ip``, EPERM): the test skips."""


def why_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can (makes and removes one)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) on PATH"
    probe = f"{PREFIX}{os.getpid()}-probe"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"`ip netns add` failed: {res.stderr.strip() or res.returncode}"
    try:
        res = _ip("-n", probe, "link", "add", "name", "br0", "type", "bridge", check=False)
        if res.returncode != 0:
            return f"cannot create a bridge in a namespace: {res.stderr.strip()}"
        res = _ip("-n", probe, "link", "add", "name", "a0", "type", "veth", "peer", "name", "b0",
                  check=False)
        if res.returncode != 0:
            return f"cannot create a veth pair in a namespace: {res.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def remove_stale() -> None:
    """Delete namespaces left by a test run whose process is gone (it was SIGKILLed)."""
    _remove_stale(PREFIX)


class Network:
    """A hub with a bridge, hosts attached to it, and direct data links between hosts."""

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}-{next(_counter)}-"
        self.hub = self.tag + "hub"
        self.namespaces: list[str] = []
        self.hosts: dict[str, str] = {}  # name -> its control address
        self.rto_capped = False

    def ns(self, name: str) -> str:
        return self.tag + name

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        # Cap TCP's retransmission backoff at 1 s (Linux >= 6.15; best effort): a restored
        # link then carries the queued heartbeats within a second, not after a backoff of many
        # seconds, so the length of a cut is what the test says it is.
        res = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                              "net.ipv4.tcp_rto_max_ms=1000"], capture_output=True, timeout=20)
        self.rto_capped = res.returncode == 0

    def create(self) -> Network:
        try:
            self._add_ns(self.hub)
            _ip("-n", self.hub, "link", "add", "name", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "address", BRIDGE_MAC)  # see BRIDGE_MAC
            _ip("-n", self.hub, "addr", "add", f"{HUB_ADDR}/24", "dev", "br0")
            _ip("-n", self.hub, "link", "set", "br0", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def add_host(self, name: str, addr: str) -> str:
        """Namespace ``name`` with a control link ``ctl`` (``addr``/24) to the hub's bridge."""
        ns = self.ns(name)
        self._add_ns(ns)
        hub_end = f"h-{name}"
        _ip("-n", self.hub, "link", "add", "name", hub_end, "type", "veth", "peer", "name",
            "ctl", "netns", ns)
        _ip("-n", self.hub, "link", "set", hub_end, "master", "br0")
        _ip("-n", self.hub, "link", "set", hub_end, "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "ctl")
        _ip("-n", ns, "link", "set", "ctl", "up")
        self.hosts[name] = addr
        return ns

    def link(self, a: str, addr_a: str, b: str, addr_b: str, dev: str = "data") -> None:
        """A veth pair ``dev`` straight between hosts ``a`` and ``b`` (each address /24)."""
        ns_a, ns_b = self.ns(a), self.ns(b)
        _ip("-n", ns_a, "link", "add", "name", dev, "type", "veth", "peer", "name", dev,
            "netns", ns_b)
        for ns, addr in ((ns_a, addr_a), (ns_b, addr_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")

    def cut(self, name: str) -> None:
        """Partition host ``name`` from the control plane: its link's hub end goes down."""
        _ip("-n", self.hub, "link", "set", f"h-{name}", "down")

    def restore(self, name: str) -> None:
        _ip("-n", self.hub, "link", "set", f"h-{name}", "up")

    def exec_argv(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(name), *argv]

    def destroy(self) -> None:
        """Kill what still runs inside, delete every namespace (and so every link)."""
        for ns in reversed(self.namespaces):
            kill_inside(ns)
        for ns in reversed(self.namespaces):
            for _ in range(50):
                if _ip("netns", "del", ns, check=False).returncode == 0:
                    break
                time.sleep(0.1)
        self.namespaces.clear()

    def leftovers(self) -> list[str]:
        """This network's namespaces that ``ip netns list`` still shows."""
        res = _ip("netns", "list", check=False)
        return [line.split()[0] for line in res.stdout.splitlines()
                if line.split() and line.split()[0].startswith(self.tag)]


class NsProc(Proc):
    """A process started inside a namespace (``ip netns exec``), in its own process group, with
    its output collected line by line (waitable): ``tests.jobs.Proc``."""

    def __init__(self, net: Network, host: str, argv: list[str], env: dict[str, str],
                 cwd: Path, label: str) -> None:
        self.started_at = time.monotonic()
        super().__init__(net.exec_argv(host, argv), env, cwd, label=label,
                         start_new_session=True)

    def seen(self, text: str) -> int:
        with self._cond:
            return sum(text in line for line in self.lines)

    def appears(self, text: str, timeout: float) -> bool:
        """Whether ``text`` shows up in the output within ``timeout`` seconds."""
        try:
            self.wait_for(text, timeout)
        except AssertionError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the process group (the process and everything it started) and reap."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)

