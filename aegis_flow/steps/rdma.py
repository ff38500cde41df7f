"""The rdma check: every RDMA port (sysfs ``class/infiniband/*/ports/*``) is ACTIVE and LinkUp.

Side effects: :func:`read_ports` reads files under the sysfs root (``/sys`` by default;
configurable so tests use a synthetic tree); :func:`evaluate_ports` is pure. Standard library.

A port is healthy when ``state`` is ``4: ACTIVE`` and ``phys_state`` is ``5: LinkUp``; the
numeric codes decide (the text is for people). No RDMA device at all is ``not_applicable``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aegis_flow.steps.base import (
    DEFAULT_BUDGETS,
    CheckResult,
    CheckStatus,
    Outcome,
    run_with_budget,
)

ACTIVE, LINK_UP = 4, 5


@dataclass(frozen=True)
class PortState:
    device: str
    port: str
    state: str  # e.g. "4: ACTIVE"
    phys_state: str  # e.g. "5: LinkUp"
    rate: str = ""
    link_layer: str = ""

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def healthy(self) -> bool:
        return _code(self.state) == ACTIVE and _code(self.phys_state) == LINK_UP


def _code(text: str) -> int | None:
    head = text.split(":", 1)[0].strip()
    return int(head) if head.isdigit() else None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"


def read_ports(root: str | Path = "/sys") -> list[PortState]:
    """Every port under ``<root>/class/infiniband``, sorted by device and port."""
    base = Path(root) / "class" / "infiniband"
    if not base.is_dir():
        return []
    ports = []
    for dev in sorted(base.iterdir()):
        ports_dir = dev / "ports"
        if not ports_dir.is_dir():
            continue
        for port in sorted(ports_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
            ports.append(PortState(dev.name, port.name, _read(port / "state"),
                                   _read(port / "phys_state"),
                                   _read(port / "rate") if (port / "rate").exists() else "",
                                   _read(port / "link_layer")
                                   if (port / "link_layer").exists() else ""))
    return ports


def evaluate_ports(ports: Sequence[PortState], *, root: str = "/sys") -> Outcome:
    """Judge the ports. Pure."""
    data = {"root": root, "ports": [p.__dict__.copy() for p in ports]}
    if not ports:
        return Outcome(CheckStatus.NOT_APPLICABLE,
                       f"rdma: no RDMA device under {root}/class/infiniband", data)
    bad = [p for p in ports if not p.healthy]
    if bad:
        what = "; ".join(f"{p.name} state {p.state!r}, phys_state {p.phys_state!r}" for p in bad)
        return Outcome(CheckStatus.FAIL, f"rdma: {len(bad)} of {len(ports)} port(s) not "
                       f"ACTIVE/LinkUp: {what}", data)
    return Outcome(CheckStatus.PASS, f"rdma ok: {len(ports)} port(s) ACTIVE and LinkUp "
                   f"({', '.join(p.name for p in ports)})", data)


def probe_rdma(root: str | Path = "/sys") -> Outcome:
    return evaluate_ports(read_ports(root), root=str(root))


def check_rdma(*, sysfs_root: str | Path = "/sys", budget: float | None = DEFAULT_BUDGETS["rdma"],
               now: Callable[[], float] = time.time) -> CheckResult:
    """The rdma check under its budget (25 s)."""
    return run_with_budget("rdma", lambda: probe_rdma(sysfs_root), budget, now)
