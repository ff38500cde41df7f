"""Where each rank really runs, from a source the worker cannot forge (review F1).

A worker's heartbeat names its node, and a hardware fault quarantines that node: taken on
trust, a hostile worker could name any node of the cluster (a control-plane node included) and
have the master label and taint it with the master's own rights. The master asks a
:class:`Placement` instead; the heartbeat's claim is only compared with it (a mismatch is
counted as ``foreign`` and logged).

* :class:`RunnerFile` — local runs: ``aegis-flow run`` writes ``nodes.json`` (rank → the node
  it started that worker on) and rewrites it whenever it starts a worker elsewhere.
* :class:`PodsByAddress` — Kubernetes: the credential exchange (gRPC) sees the worker pod's
  address; the API says which pod has it (``status.podIP``) and where it runs
  (``spec.nodeName``), and that it belongs to this workflow. Recorded per rank at every
  exchange, so a replaced rank's new pod replaces the old node.

Side effects: :class:`RunnerFile` reads a file (cached by mtime); :class:`PodsByAddress` asks
the API through a :class:`PodLookup` (the kubernetes client, blocking: the master calls it in a
thread). :func:`trusted_node` is pure.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Protocol


class Placement(Protocol):
    def node_of(self, rank: int) -> str | None:
        """The node rank ``rank``'s current worker runs on, or None when not known (yet)."""
        ...


def trusted_node(claimed: str, known: str | None) -> tuple[str, bool]:
    """The node to use for a heartbeat that claims ``claimed`` when the trusted source says
    ``known``: (node, foreign). Without a trusted answer the claim stands. PURE."""
    if not known:
        return claimed, False
    return known, bool(claimed) and claimed != known


class RunnerFile:
    """``nodes.json`` of ``aegis-flow run``: ``{"0": "local-node-0", ...}``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._nodes: dict[int, str] = {}

    def node_of(self, rank: int) -> str | None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime, st.st_size)
            if stamp != self._stamp:
                with open(self.path) as fh:
                    raw = json.load(fh)
                self._nodes = {int(r): str(n) for r, n in raw.items()}
                self._stamp = stamp
        except (OSError, ValueError, AttributeError, TypeError):
            pass  # being rewritten, or not there yet: the last good answer stands
        return self._nodes.get(rank)


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    workflow: str  # the workflows.argoproj.io/workflow label ("" when none)


class PodLookup(Protocol):
    def pod_at(self, address: str) -> Pod | None:
        """The running pod whose ``status.podIP`` is ``address``, if exactly one."""
        ...


WORKFLOW_LABEL = "workflows.argoproj.io/workflow"


class KubePods:
    """A :class:`PodLookup` over the API (``KubeNodeApi.pods_at``) in one namespace."""

    def __init__(self, api: object, namespace: str) -> None:
        self.api, self.namespace = api, namespace

    def pod_at(self, address: str) -> Pod | None:
        found = self.api.pods_at(self.namespace, address)  # type: ignore[attr-defined]
        if len(found) != 1:
            return None
        pod = found[0]
        return Pod(str(pod["name"]), str(pod["node"]),
                   str(pod["labels"].get(WORKFLOW_LABEL, "")))


class PodsByAddress:
    """Kubernetes: each rank's node, recorded at its credential exchange from the pod that
    made the request (its address as the gRPC server saw it)."""

    def __init__(self, lookup: PodLookup, workflow: str) -> None:
        self.lookup = lookup
        self.workflow = workflow
        self._nodes: dict[int, str] = {}
        self.refused: list[str] = []  # why an exchange got no trusted node (for the log)

    def record(self, rank: int, peer: str) -> str | None:
        """Resolve the pod behind ``peer`` (gRPC's ``ipv4:10.0.0.7:41234`` form) for ``rank``;
        the node, or None (then the rank has no trusted node until its next exchange)."""
        address = peer_address(peer)
        try:
            pod = self.lookup.pod_at(address) if address else None
        except Exception as exc:  # noqa: BLE001 - the API out of reach: no trusted node
            self._nodes.pop(rank, None)
            self.refused.append(f"rank {rank}: cannot ask the API about {address!r}: {exc}")
            return None
        if pod is None or (self.workflow and pod.workflow != self.workflow):
            self._nodes.pop(rank, None)
            self.refused.append(f"rank {rank}: no pod of workflow {self.workflow!r} at "
                                f"{address or peer!r}")
            return None
        self._nodes[rank] = pod.node
        return pod.node

    def forget(self, rank: int, why: str) -> None:
        """The lookup for ``rank`` took too long: no trusted node until its next exchange
        (an answer that comes later may still record it: it is the API's own word)."""
        self._nodes.pop(rank, None)
        self.refused.append(why)

    def node_of(self, rank: int) -> str | None:
        return self._nodes.get(rank)


def peer_address(peer: str) -> str:
    """The IP of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``); "" otherwise."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        host = rest.rsplit(":", 1)[0]
        return host.strip("[]").replace("%5B", "").replace("%5D", "")
    return ""
