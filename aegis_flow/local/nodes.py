"""The local backend's node names and per-node settings (``aegis-flow run --node-env``). Pure.

``aegis-flow run`` plays Kubernetes on one machine: rank R starts on node ``local-node-R``, and a
worker that leaves with the node-fault code is started again on a new node ``local-node-R-N``
(N = 1, 2, …), as a pod would be rescheduled elsewhere. A setting that belongs to a *node* —
where its sysfs is mounted, its scratch disk — is therefore keyed by the node name, not by the
rank: after a quarantine, the replacement does not inherit the broken node's settings.
"""

from __future__ import annotations

import re

_NODE = re.compile(r"local-node-(\d+)(?:-(\d+))?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class NodeEnvError(ValueError):
    pass


def node_name(rank: int, generation: int = 0) -> str:
    """The node of rank ``rank`` after ``generation`` node-fault replacements."""
    return f"local-node-{rank}" + (f"-{generation}" if generation else "")


def parse_node_env(spec: str, workers: int) -> tuple[str, str, str]:
    """``NODE:NAME=VALUE`` → (node, name, value); NodeEnvError naming the bad part."""
    node, colon, assignment = spec.partition(":")
    name, eq, value = assignment.partition("=")
    if not colon or not eq:
        raise NodeEnvError(f"{spec!r}: expected NODE:NAME=VALUE, e.g. "
                           "local-node-1:AEGIS_SYSFS_ROOT=/mnt/host-sys")
    match = _NODE.fullmatch(node)
    if match is None:
        raise NodeEnvError(f"{spec!r}: unknown node {node!r}; aegis-flow run names its nodes "
                           "local-node-RANK (local-node-RANK-N after N node-fault replacements)")
    rank = int(match.group(1))
    if rank >= workers:
        raise NodeEnvError(f"{spec!r}: node {node!r} would hold rank {rank}, which does not "
                           f"exist (ranks 0..{workers - 1})")
    if _ENV_NAME.fullmatch(name) is None:
        raise NodeEnvError(f"{spec!r}: {name!r} is not an environment variable name")
    return node, name, value
