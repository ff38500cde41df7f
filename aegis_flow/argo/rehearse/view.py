"""Pictures of a Workflow ``status`` (the JSON Argo stores, ``argo get -o json``'s ``.status``).

* :func:`tree_text`: the node tree as ``argo get`` prints it, ported from argoproj/argo-workflows
  v4.0.5 ``cmd/argo/commands/common/get.go`` (``PrintWorkflowHelper``, ``convertToRenderTrees``,
  ``insertSorted``, ``filterNode``, ``renderChild``, ``printNode``), ``common.go`` (icons,
  ``ansiFormat``), ``util/humanize``, ``workflow/util/pod_name.go`` (v2 pod names) and Go's
  ``text/tabwriter`` (padding 2; rows keep its trailing blanks). As in v4: StepGroups and
  one-attempt Retries are no rows (their children hang off ``┬─``/``──`` joints), Omitted
  Skipped nodes are hidden, siblings go by ``startedAt`` (ties: ``(N:`` index, then name), types
  the CLI doesn't draw (TaskGroup, Container, unknown) are left out, and the ``onExit`` tree
  follows after an empty row. Header: Name, Status, Message, Conditions, Duration, Progress,
  Output Parameters (not those needing the Workflow object or the clock: Namespace,
  ServiceAccount, Created/Started/Finished).
* :func:`svg_text`: a layered graph like the Argo UI's, one rounded box per node (StepGroups as
  small circles) in the UI's phase colours, edges parent -> child.

PURE except :func:`write_svg`, which writes the file. No clock is read: a running node's duration
runs to ``now`` (RFC3339; default: the status' latest timestamp). Missing fields and unknown
phases or types are drawn plainly, never raised on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from aegis_flow.argo.rehearse.podspec import node_id, pod_name

Node = Mapping[str, Any]

# common.go initializeSession (UTF-8 icons) with their ANSI colours
_FG_RED, _FG_GREEN, _FG_YELLOW, _FG_CYAN, _FG_DEFAULT = 31, 32, 33, 36, 39
PHASE_ICONS: dict[str, tuple[str, int]] = {
    "Pending": ("◷", _FG_YELLOW), "Running": ("●", _FG_CYAN), "Succeeded": ("✔", _FG_GREEN),
    "Skipped": ("○", _FG_DEFAULT), "Failed": ("✖", _FG_RED), "Error": ("⚠", _FG_RED)}
SUSPEND_ICON = ("ǁ", _FG_CYAN)  # an active Suspend node (type Suspend, phase Running)
CONDITION_ICONS = {"MetricsError": ("✖", _FG_RED), "SpecWarning": ("⚠", _FG_YELLOW)}
_BOUNDARY = ("DAG", "Steps")
_NON_BOUNDARY_PARENT = ("StepGroup", "Retry")
_EXECUTION = ("Pod", "Skipped", "Suspend", "HTTP", "Plugin")

# the Argo UI's colours (argo-ui: success, failed, running, warning, gray-6, gray-4)
PHASE_COLOURS = {"Succeeded": "#18BE94", "Failed": "#E96D76", "Error": "#E96D76",
                 "Running": "#0DADEA", "Pending": "#F4C030", "Skipped": "#6D7F8B",
                 "Omitted": "#6D7F8B"}
SUSPENDED_COLOUR = "#F4C030"
UNKNOWN_COLOUR = "#CCD6DD"

_NS = 1_000_000_000
_MIN, _HOUR, _DAY = 60 * _NS, 3600 * _NS, 86400 * _NS
_WEEK, _MONTH = 7 * _DAY, 30 * _DAY
_YEAR = 12 * _MONTH
_MAX_DURATION = 2**63 - 1  # Go's Time.Sub saturates
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# humanize.shortTimeMagnitudes / relativeMagnitudes: (below, format, divisor)
_SHORT = [(_NS, "0s", _NS), (2 * _NS, "1s", 1), (_MIN, "%ds", _NS), (2 * _MIN, "1m", 1),
          (_HOUR, "%dm", _MIN), (2 * _HOUR, "1h", 1), (_DAY, "%dh", _HOUR),
          (2 * _DAY, "1d", 1), (_WEEK, "%dd", _DAY)]
_LONG = [(_NS, "0 seconds", _NS), (2 * _NS, "1 second", 1), (_MIN, "%d seconds", _NS),
         (2 * _MIN, "1 minute", 1), (_HOUR, "%d minutes", _MIN), (2 * _HOUR, "1 hour", 1),
         (_DAY, "%d hours", _HOUR), (2 * _DAY, "1 day", 1), (_WEEK, "%d days", _DAY),
         (2 * _WEEK, "1 week", 1), (_MONTH, "%d weeks", _WEEK), (2 * _MONTH, "1 month", 1),
         (_YEAR, "%d months", _MONTH), (18 * _MONTH, "1 year", 1), (2 * _YEAR, "2 years", 1),
         (37 * _YEAR, "%d years", _YEAR), (_MAX_DURATION, "a long while", 1)]


def parse_time(value: object) -> int | None:
    """An RFC3339 timestamp as Unix nanoseconds; None when absent or unreadable (Go's zero)."""
    if not isinstance(value, str):
        return None
    try:
        delta = datetime.fromisoformat(value.replace("Z", "+00:00")) - _EPOCH
    except (TypeError, ValueError):  # unreadable, or without a zone
        return None
    return (delta.days * 86400 + delta.seconds) * _NS + delta.microseconds * 1000


def _custom_rel(diff: int, magnitudes: list[tuple[int, str, int]]) -> str:
    diff = abs(diff)
    mag = next((m for m in magnitudes if m[0] > diff), magnitudes[-1])
    return mag[1].replace("%d", str(diff // mag[2]))


def short_duration(start: int | None, finish: int | None, now: int | None) -> str:
    """``humanize.RelativeDurationShort``: "0s", "5s", "1m", "2h", "3d"."""
    return _custom_rel(_sub(now if finish is None and start is not None else finish, start),
                       _SHORT)


def long_duration(diff: int) -> str:
    """``humanize.Duration``: "5 seconds", "1 minute 5 seconds", "2 hours 3 minutes"."""
    trunc = _custom_rel(diff, _LONG)
    seconds = diff / _NS
    if seconds < 60.0:
        return trunc
    if seconds / 60 < 60.0:
        return f"{trunc} {int(math.fmod(seconds, 60))} seconds"
    if seconds / 3600 < 24.0:
        return f"{trunc} {int(math.fmod(seconds / 60, 60))} minutes"
    return f"{trunc} {int(math.fmod(seconds / 3600, 24))} hours"


def _sub(finish: int | None, start: int | None) -> int:
    if finish is None or start is None:  # Go's year-1 zero time on one side saturates
        return 0 if finish is None and start is None else _MAX_DURATION
    return finish - start


def recover_index(name: str) -> int:
    """``RecoverIndexFromNodeName``: N in ``step(N:item)``, else -1."""
    start, end = name.find("("), name.find(":")
    digits = name[start + 1:end] if 0 <= start < end else ""  # (Go panics when ':' is first)
    ok = re.fullmatch(r"[+-]?[0-9]+", digits) and abs(int(digits)) < 2**63
    return int(digits) if ok else -1


def _s(node: Node, key: str) -> str:
    value = node.get(key)
    return value if isinstance(value, str) else ""


def _children(node: Node) -> list[str]:
    kids = node.get("children")
    return [k for k in kids if isinstance(k, str)] if isinstance(kids, list) else []


def _nodes(status: Mapping[str, Any]) -> dict[str, Node]:
    nodes = status.get("nodes")
    items = nodes.items() if isinstance(nodes, Mapping) else ()
    return {str(k): v for k, v in items if isinstance(v, Mapping)}


def _latest(status: Mapping[str, Any], nodes: Mapping[str, Node]) -> int | None:
    stamps = (parse_time(x.get(k)) for x in (status, *nodes.values())
              for k in ("startedAt", "finishedAt"))
    return max((t for t in stamps if t is not None), default=None)


# ---- argo get ----------------------------------------------------------------------------

@dataclass
class _RNode:
    id: str
    children: list[_RNode] = field(default_factory=list)


def _render_trees(nodes: Mapping[str, Node]) -> dict[str, _RNode]:
    """``convertToRenderTrees``: a forest; returns its roots by node id."""
    roots: dict[str, _RNode] = {}
    boundaries: dict[str, _RNode] = {}
    waiting: dict[str, list[_RNode]] = {}
    parents = {i: _RNode(i) for i, n in nodes.items() if _s(n, "type") in _NON_BOUNDARY_PARENT}
    parent_of = {kid: parents[i] for i in parents for kid in _children(nodes[i])}  # pass 1

    def start(r: _RNode) -> int:
        t = parse_time(nodes[r.id].get("startedAt"))
        return -(2**63) if t is None else t  # Go's zero time comes first

    def insert_sorted(into: list[_RNode], item: _RNode) -> None:
        t, name = start(item), _s(nodes[item.id], "displayName")

        def goes_before(existing: _RNode) -> bool:
            other = _s(nodes[existing.id], "displayName")
            a, b = recover_index(name), recover_index(other)
            tie = (a < b) if a >= 0 and b >= 0 else (name < other)
            return t < start(existing) or (t == start(existing) and tie)

        into.insert(next((i for i, e in enumerate(into) if goes_before(e)), len(into)), item)

    def attach(r: _RNode, boundary_id: str) -> bool:
        parent = parent_of.get(r.id) or (boundaries.get(boundary_id) if boundary_id else None)
        if parent is not None:
            insert_sorted(parent.children, r)
        elif boundary_id:
            waiting.setdefault(boundary_id, []).append(r)
        return parent is None and not boundary_id  # a possible root

    for nid, n in nodes.items():
        kind = _s(n, "type")
        if kind not in _BOUNDARY + _NON_BOUNDARY_PARENT + _EXECUTION:
            continue
        r = parents.get(nid) or _RNode(nid)
        if kind in _BOUNDARY:
            boundaries[nid] = r
        if attach(r, _s(n, "boundaryID")):
            roots[nid] = r
        for early in waiting.get(nid, []) if kind in _BOUNDARY else []:
            insert_sorted(r.children, early)
    return roots


def _ansi(text: str, code: int, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


class _Printer:
    def __init__(self, wf: str, nodes: Mapping[str, Node], now: int | None, color: bool):
        self.wf, self.nodes, self.now, self.color = wf, nodes, now, color
        self.rows: list[str] = []
        self.seen: set[str] = set()

    def render(self, r: _RNode, node_prefix: str, child_prefix: str) -> None:
        if r.id in self.seen:  # a malformed status with a cycle: draw each node once
            return
        self.seen.add(r.id)
        n, kind = self.nodes[r.id], _s(self.nodes[r.id], "type")
        indent = kind == "StepGroup"  # filterNode
        filtered = indent or (kind == "Retry" and len(_children(n)) == 1) or (
            kind == "Skipped" and _s(n, "phase") == "Omitted")
        if not filtered:
            self.print_node(n, node_prefix)
        last = len(r.children) - 1
        for i, kid in enumerate(r.children):  # renderChild
            part, subp = ("└─", "  ") if i == last else ("├─", "│ ")
            if filtered and indent and (last == 0 or i == 0):
                part, subp = ("──", "  ") if last == 0 else ("┬─", "│ ")
            elif filtered and not indent:
                part, subp = "", ""
            first = node_prefix if filtered and i == 0 else child_prefix
            self.render(kid, first + part, child_prefix + subp)

    def print_node(self, n: Node, prefix: str) -> None:
        icon, code = PHASE_ICONS.get(_s(n, "phase"), ("", 0))
        if _s(n, "type") == "Suspend" and _s(n, "phase") == "Running":
            icon, code = SUSPEND_ICON
        label = f"{_ansi(icon, code, self.color) if icon else ''} {_s(n, 'displayName')}"
        ref, template = n.get("templateRef"), _s(n, "templateName")
        shown = template
        if isinstance(ref, Mapping):
            template, shown = _s(ref, "template"), f"{_s(ref, 'name')}/{_s(ref, 'template')}"
        pod, duration = "", ""
        if _s(n, "type") == "Pod":
            pod = pod_name(self.wf, _s(n, "name"), template)
            duration = short_duration(parse_time(n.get("startedAt")),
                                      parse_time(n.get("finishedAt")), self.now)
        self.rows.append(f"{prefix}{label}\t{shown}\t{pod}\t{duration}\t{_s(n, 'message')}\t\n")


def tabwrite(text: str, padding: int = 2) -> str:
    """Go's ``text/tabwriter`` (minwidth 0, padchar ' ', no flags) on ``text``."""
    lines = [line.split("\t") for line in text.split("\n")]
    out: list[str] = []
    widths: list[int] = []

    def write_lines(line0: int, line1: int) -> None:
        for i in range(line0, line1):
            for j, cell in enumerate(lines[i]):
                out.append(cell + " " * (widths[j] - len(cell)) if j < len(widths) else cell)
            if i + 1 < len(lines):
                out.append("\n")

    def format_block(line0: int, line1: int) -> None:
        column = len(widths)
        this = line0
        while this < line1:
            if column >= len(lines[this]) - 1:
                this += 1
                continue
            write_lines(line0, this)
            line0 = this
            width = 0
            while this < line1 and column < len(lines[this]) - 1:
                width = max(width, len(lines[this][column]) + padding)
                this += 1
            widths.append(width)
            format_block(line0, this)
            widths.pop()
            line0 = this
        write_lines(line0, line1)

    format_block(0, len(lines))
    return "".join(out)


def workflow_status(status: Mapping[str, Any], nodes: Mapping[str, Node]) -> str:
    """``printer.WorkflowStatus`` (the Workflow object's spec is not known here)."""
    phase = _s(status, "phase")
    if phase == "Running" and any(_s(n, "type") == "Suspend" and _s(n, "phase") == "Running"
                                  for n in nodes.values()):
        return "Running (Suspended)"
    return "Pending" if phase in ("", "Pending") else phase


def tree_text(workflow_name: str, status: Mapping[str, Any], *, color: bool = False,
              now: str | None = None) -> str:
    """What ``argo get NAME`` prints for this status (see the module docstring)."""
    nodes = _nodes(status)
    now_ns = parse_time(now) if now is not None else _latest(status, nodes)

    def line(key: str, value: object) -> str:
        return f"{key:<20} {value}\n"

    out = line("Name:", workflow_name) + line("Status:", workflow_status(status, nodes))
    if _s(status, "message"):
        out += line("Message:", _s(status, "message"))
    conditions = status.get("conditions")
    if isinstance(conditions, list) and conditions:
        out += line("Conditions:", "")
        for c in (c for c in conditions if isinstance(c, Mapping)):
            icon, code = CONDITION_ICONS.get(_s(c, "type"), ("", 0))
            prefix = f"{_ansi(icon, code, color) if icon else ''} {_s(c, 'type')}"
            out += line(prefix, _s(c, "message") or _s(c, "status"))
    started, finished = parse_time(status.get("startedAt")), parse_time(status.get("finishedAt"))
    if started is not None:
        out += line("Duration:", long_duration(_sub(finished or now_ns, started)))
    out += line("Progress:", _s(status, "progress"))
    outputs = status.get("outputs")
    params = outputs.get("parameters") if isinstance(outputs, Mapping) else None
    if isinstance(params, list) and params:
        out += line("Output Parameters:", "")
        for p in (p for p in params if isinstance(p, Mapping) and "value" in p):
            out += line(f"  {_s(p, 'name')}:", p.get("value"))
    roots = _render_trees(nodes)
    main = roots.get(workflow_name)
    if workflow_name not in nodes or main is None:
        return out
    printer = _Printer(workflow_name, nodes, now_ns, color)
    printer.render(main, " ", " ")
    exit_name = f"{workflow_name}.onExit"
    on_exit = roots.get(node_id(workflow_name, exit_name)) or next(
        (r for r in roots.values() if _s(nodes[r.id], "name") == exit_name), None)
    if on_exit is not None and on_exit is not main:
        printer.rows.append("\t\t\t\t\t\n")
        printer.render(on_exit, " ", " ")
    header = f"{_ansi('STEP', _FG_DEFAULT, color)}\tTEMPLATE\tPODNAME\tDURATION\tMESSAGE\n"
    return out + "\n" + tabwrite(header + "".join(printer.rows))


# ---- the graph (SVG) ---------------------------------------------------------------------

BOX_W, BOX_H, DOT_R, ROW_H, GAP_X, MARGIN = 190, 42, 7, 76, 20, 20
_LABEL_CHARS = 26
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def phase_colour(node: Node) -> str:
    """The Argo UI's fill for a node (an active Suspend node is "Suspended": the warning fill)."""
    suspended = _s(node, "type") == "Suspend" and _s(node, "phase") == "Running"
    return SUSPENDED_COLOUR if suspended else PHASE_COLOURS.get(_s(node, "phase"), UNKNOWN_COLOUR)


def _second_line(node: Node) -> str:
    outputs = node.get("outputs")
    code = outputs.get("exitCode") if isinstance(outputs, Mapping) else None
    exit_code = f"exit code {code}" if code is not None and code != "" else ""
    return _s(node, "message") or exit_code or _s(node, "phase")


def _clip(text: str, limit: int = _LABEL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def graph_layers(workflow_name: str, status: Mapping[str, Any]) -> list[list[str]]:
    """Node ids by layer, top to bottom: the longest path from the workflow's root (children in
    their ``children`` order); then the onExit node's graph below it; then any node not reached
    (its own root). Back edges of a malformed, cyclic status are ignored."""
    nodes = _nodes(status)
    kids = {nid: [k for k in _children(n) if k in nodes] for nid, n in nodes.items()}
    pointed = {k for ks in kids.values() for k in ks}
    on_exit = [i for i, n in nodes.items() if _s(n, "name") == f"{workflow_name}.onExit"]
    order = [i for i in nodes if i == workflow_name] + on_exit
    order += [i for i in nodes if i not in pointed] + list(nodes)  # repeats are skipped
    depth: dict[str, int] = {}
    rank: dict[str, int] = {}
    for root in order:
        if root in depth:
            continue
        base = max(depth.values(), default=-1) + 1
        topo = _reverse_postorder(root, kids, depth)
        position = {nid: i for i, nid in enumerate(topo)}
        depth.update(dict.fromkeys(topo, base))
        for nid in topo:
            for k in kids[nid]:
                if k in position and position[k] > position[nid]:
                    depth[k] = max(depth[k], depth[nid] + 1)
        queue = [root]  # order within a layer: breadth first, children in order
        for nid in queue:
            if nid not in rank and nid in position:
                rank[nid] = len(rank)
                queue += kids[nid]
    layers: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for nid in sorted(depth, key=lambda i: rank[i]):
        layers[depth[nid]].append(nid)
    return layers


def _reverse_postorder(root: str, kids: Mapping[str, list[str]],
                       placed: Mapping[str, int]) -> list[str]:
    post: list[str] = []
    seen = {root}
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        nid, i = stack.pop()
        if i < len(kids[nid]):
            stack.append((nid, i + 1))
            k = kids[nid][i]
            if k not in seen and k not in placed:
                seen.add(k)
                stack.append((k, 0))
        else:
            post.append(nid)
    return post[::-1]


def _x(text: object) -> str:
    """Text safe in XML 1.0 content and double-quoted attributes (control characters dropped)."""
    return escape(_NOT_XML.sub("", str(text)), {'"': "&quot;"})


def svg_text(workflow_name: str, status: Mapping[str, Any]) -> str:
    """An SVG picture of the node graph (see the module docstring)."""
    nodes = _nodes(status)
    layers = graph_layers(workflow_name, status)

    def dot(nid: str) -> bool:
        return _s(nodes[nid], "type") == "StepGroup"

    def slot(nid: str) -> int:
        return 2 * DOT_R if dot(nid) else BOX_W

    rows = [sum(slot(n) for n in layer) + GAP_X * (len(layer) - 1) for layer in layers]
    width = max(rows, default=BOX_W) + 2 * MARGIN
    height = max(len(layers) * ROW_H - ROW_H + BOX_H, 0) + 2 * MARGIN + 24
    centre: dict[str, tuple[float, float]] = {}
    for row, layer in enumerate(layers):
        x = MARGIN + (width - 2 * MARGIN - rows[row]) / 2
        for nid in layer:
            centre[nid] = (x + slot(nid) / 2, MARGIN + 24 + row * ROW_H + BOX_H / 2)
            x += slot(nid) + GAP_X
    title = f"{workflow_name} ({_s(status, 'phase') or 'Unknown'})"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
           f'viewBox="0 0 {width:g} {height:g}" font-family="sans-serif">',
           f'<rect width="{width:g}" height="{height:g}" fill="#FFFFFF"/>',
           f'<text x="{MARGIN}" y="{MARGIN + 4}" font-size="14" font-weight="bold" '
           f'fill="#363C4A">{_x(title)}</text>',
           '<g class="edges" stroke="#8FA4B1" stroke-width="1.5" fill="none">']
    for nid, (x1, y1) in centre.items():
        for kid in (k for k in _children(nodes[nid]) if k in centre):
            x2, y2 = centre[kid]
            y1 += DOT_R if dot(nid) else BOX_H / 2
            y2 -= DOT_R if dot(kid) else BOX_H / 2
            mid = (y1 + y2) / 2
            out.append(f'<path class="edge" data-from="{_x(nid)}" data-to="{_x(kid)}" '
                       f'd="M{x1:g},{y1:g} C{x1:g},{mid:g} {x2:g},{mid:g} {x2:g},{y2:g}"/>')
            y1 = centre[nid][1]
    out.append("</g>")
    for nid, (cx, cy) in centre.items():
        n = nodes[nid]
        attrs = (f'data-id="{_x(nid)}" data-phase="{_x(_s(n, "phase"))}" '
                 f'data-type="{_x(_s(n, "type"))}"')
        tip = f"<title>{_x(_s(n, 'displayName') or _s(n, 'name') or nid)}</title>"
        if dot(nid):
            out.append(f'<circle class="stepgroup" {attrs} cx="{cx:g}" cy="{cy:g}" '
                       f'r="{DOT_R}" fill="{phase_colour(n)}">{tip}</circle>')
            continue
        out += [f'<g class="node" {attrs}>{tip}',
                f'<rect class="box" x="{cx - BOX_W / 2:g}" y="{cy - BOX_H / 2:g}" '
                f'width="{BOX_W}" height="{BOX_H}" rx="8" ry="8" fill="{phase_colour(n)}"/>',
                f'<text x="{cx:g}" y="{cy - 4:g}" text-anchor="middle" font-size="13" '
                f'fill="#FFFFFF">{_x(_clip(_s(n, "displayName") or nid))}</text>',
                f'<text x="{cx:g}" y="{cy + 13:g}" text-anchor="middle" font-size="10" '
                f'fill="#FFFFFF">{_x(_clip(_second_line(n), 34))}</text></g>']
    out.append("</svg>\n")
    return "\n".join(out)


def write_svg(workflow_name: str, status: Mapping[str, Any], path: str | Path) -> None:
    """Write :func:`svg_text` to ``path`` (the only side effect in this module)."""
    Path(path).write_text(svg_text(workflow_name, status), encoding="utf-8")
