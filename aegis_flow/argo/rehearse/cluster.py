"""Fake Kubernetes nodes for ``aegis-flow rehearse``: the Node store and the scheduler's decision.

PURE except ``NodeStore``'s lock: no I/O, no clock. Nodes are plain ``v1.Node``-shaped dicts
(camelCase JSON, as the API serves them). Each part follows its Kubernetes original, named in
its docstring: apimachinery's ``resource.ParseQuantity``, ``labels.Parse`` and strategicpatch,
RFC 7386, the apiserver's PATCH handling, and kube-scheduler's default filter plugins
(NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit, in the profile's order)
with ``FitError.Error()`` and DefaultPreemption's wording.
"""

from __future__ import annotations

import builtins
import copy
import math
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
HOSTNAME = "kubernetes.io/hostname"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)(.*)")


def parse_quantity(text: str | int | float | Fraction) -> Fraction:
    """``"500m"`` -> 1/2, ``"256Gi"`` -> 256*2**30, ``"1e3"`` -> 1000 (exact)."""
    if not isinstance(text, str):
        return Fraction(str(text) if isinstance(text, float) else text)
    m = _QUANTITY.fullmatch(text.strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression: {text!r}")
    sign, number, suffix = m.groups()
    value = Fraction(number) * (-1 if sign == "-" else 1)
    if suffix in _BINARY:
        return value * (1 << _BINARY[suffix])
    if suffix in _DECIMAL:
        return value * Fraction(10) ** _DECIMAL[suffix]
    if re.fullmatch(r"[eE][+-]?[0-9]+", suffix):
        return value * Fraction(10) ** int(suffix[1:])
    raise ValueError(f"unable to parse quantity's suffix: {text!r}")


def amount(resource: str, quantity: str | int | float | Fraction) -> int:
    """The scheduler's integer for a resource: millicores for ``cpu``, units otherwise
    (rounded up, as ``MilliValue``/``Value`` round)."""
    q = parse_quantity(quantity)
    return math.ceil(q * 1000) if resource == "cpu" else math.ceil(q)


_REQ = re.compile(r"\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.-]*)"
                  r"|\s(in|notin)\s*\(([^)]*)\))?\s*")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in" (= and == too), "notin" (!= too), "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        return {"in": has and labels.get(self.key) in self.values, "exists": has, "!": not has,
                "notin": labels.get(self.key) not in self.values}[self.op]


def parse_selector(text: str | None) -> tuple[Requirement, ...]:
    """``labels.Parse``; a ``ValueError`` for what it rejects."""
    out = []
    for part in re.split(r",(?![^()]*\))", text) if text and text.strip() else []:
        m = _REQ.fullmatch(part)
        if not m or (m.group(1) and (m.group(3) or m.group(5))):
            raise ValueError(f"unable to parse requirement: {part.strip()!r}")
        neg, key, op, value, setop, values = m.groups()
        out.append(Requirement(key, setop, tuple(v.strip() for v in values.split(","))) if setop
                   else Requirement(key, "notin" if op == "!=" else "in", (value,)) if op
                   else Requirement(key, "!" if neg else "exists"))
    return tuple(out)


class ApiError(Exception):
    """What the apiserver answers with a ``v1.Status`` (``name``: the node, for ``details``)."""

    def __init__(self, code: int, reason: str, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.name = code, reason, message, name


def not_found(name: str) -> ApiError:
    return ApiError(404, "NotFound", f'nodes "{name}" not found', name)


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = json_merge_patch(out.get(key), value)
    return out


_MERGE_KEYS = {("metadata", "ownerReferences"): "uid", ("status", "conditions"): "type",
               ("status", "addresses"): "type"}
_SET_LISTS = {("metadata", "finalizers"), ("spec", "podCIDRs")}


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """apimachinery strategicpatch with the Node's patch metadata: ``status.conditions`` and
    ``status.addresses`` merge by ``type``, ``metadata.ownerReferences`` by ``uid``,
    ``metadata.finalizers`` and ``spec.podCIDRs`` as sets; every other list, ``spec.taints``
    included (it has no ``patchStrategy``), is replaced whole. Honours ``$patch:
    replace|delete``, ``$retainKeys`` and ``$deleteFromPrimitiveList/``; ignores
    ``$setElementOrder/``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        sub = (*path, key)
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            out[name] = [x for x in out.get(name) or [] if x not in value]
        elif key.startswith("$"):
            continue
        elif value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            out.pop(key, None)
        elif isinstance(value, list) and sub in _MERGE_KEYS:
            out[key] = _merge_by_key(out.get(key) or [], value, _MERGE_KEYS[sub], sub)
        elif isinstance(value, list) and sub in _SET_LISTS:
            out[key] = [*(old := out.get(key) or []), *(v for v in value if v not in old)]
        else:
            out[key] = strategic_merge_patch(out.get(key), value, sub)
    if isinstance(patch.get("$retainKeys"), list):
        out = {k: v for k, v in out.items() if k in patch["$retainKeys"]}
    return out


def _merge_by_key(items: list[Any], patch: list[Any], key: str, path: tuple[str, ...]
                  ) -> list[Any]:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    out = list(items)
    for p in (p for p in patch if isinstance(p, dict)):
        same = [i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == p.get(key)]
        if p.get("$patch") == "delete":
            out = [x for i, x in enumerate(out) if i not in same]
        elif same:
            out[same[0]] = strategic_merge_patch(out[same[0]], p, path)
        else:
            out.append(strategic_merge_patch({}, p, path))
    return out


def node_from_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``{"name", "labels", "annotations", "taints", "unschedulable", "ready", "allocatable"}``
    as a ``v1.Node``: hostname/os/arch labels and ``pods: 110`` unless given, capacity =
    allocatable, a Ready condition."""
    name = str(spec["name"])
    labels = {HOSTNAME: name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              **{str(k): str(v) for k, v in (spec.get("labels") or {}).items()}}
    alloc = {"pods": "110", **{str(k): str(v) for k, v in (spec.get("allocatable") or {}).items()}}
    ready = {"type": "Ready", "status": "True" if spec.get("ready", True) else "False"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"node/{name}")),
                         "labels": labels, "annotations": dict(spec.get("annotations") or {})},
            "spec": {"taints": [dict(t) for t in spec.get("taints") or []],
                     "unschedulable": bool(spec.get("unschedulable", False))},
            "status": {"allocatable": alloc, "capacity": dict(alloc), "conditions": [ready]}}


def _invalid(node: dict[str, Any]) -> list[str]:
    """The part of ``ValidateNode`` a taint patch can break: keys, effects, uniqueness."""
    out: list[str] = []
    seen = set()
    for i, t in enumerate((node.get("spec") or {}).get("taints") or []):
        key, effect = (t.get("key"), t.get("effect")) if isinstance(t, dict) else (None, None)
        if not key:
            out.append(f"spec.taints[{i}].key: Required value")
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            out.append(f'spec.taints[{i}].effect: Unsupported value: "{effect}": supported '
                       'values: "NoExecute", "NoSchedule", "PreferNoSchedule"')
        if (key, effect) in seen:
            out.append(f"spec.taints[{i}]: Duplicate value: taints must be unique by key and "
                       "effect pair")
        seen.add((key, effect))
    return out


class NodeStore:
    """Nodes by name; every change bumps a store-wide ``resourceVersion`` (like etcd's
    revision). Thread-safe: one lock around every read and write; callers get copies."""

    def __init__(self, nodes: Iterable[Mapping[str, Any]] = ()) -> None:
        """``nodes``: ``v1.Node`` dicts or ``node_from_spec`` specs (anything without
        ``metadata``)."""
        self._lock = threading.Lock()
        self._rv = 0
        self._nodes: dict[str, dict[str, Any]] = {}
        for n in nodes:
            node = copy.deepcopy(dict(n)) if "metadata" in n else node_from_spec(n)
            self._rv += 1
            node["metadata"]["resourceVersion"] = str(self._rv)
            self._nodes[node["metadata"]["name"]] = node

    @classmethod
    def from_specs(cls, specs: Iterable[Mapping[str, Any]]) -> NodeStore:
        return cls(node_from_spec(s) for s in specs)

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    def get(self, name: str) -> dict[str, Any]:
        with self._lock:
            if name not in self._nodes:
                raise not_found(name)
            return copy.deepcopy(self._nodes[name])

    def list(self, label_selector: str | None = None) -> builtins.list[dict[str, Any]]:
        """Sorted by name; ``ValueError`` for a selector ``labels.Parse`` rejects."""
        reqs = parse_selector(label_selector)
        with self._lock:
            return [copy.deepcopy(n) for _, n in sorted(self._nodes.items())
                    if all(r.matches(n["metadata"].get("labels") or {}) for r in reqs)]

    def snapshot(self) -> builtins.list[dict[str, Any]]:
        return self.list()

    def patch(self, name: str, body: Any, patch_type: str = MERGE_PATCH) -> dict[str, Any]:
        """A merge or strategic-merge patch (``patch_type``: its content type)."""
        if patch_type == MERGE_PATCH:
            return self.update(name, lambda node: json_merge_patch(node, body))
        if patch_type == STRATEGIC_MERGE_PATCH:
            return self.update(name, lambda node: strategic_merge_patch(node, body))
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an "
                       f"unknown format - accepted media types include: {JSON_PATCH}, "
                       f"{MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}")

    def update(self, name: str, change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        """Apply ``change`` (given a copy, returns the new object) as the apiserver applies a
        PATCH of the main resource; return the node afterwards. ``ApiError``: 404 no such
        node, 409 the result names another ``resourceVersion``, 400 another name, 422 invalid.
        Status changes are dropped; a no-op keeps the ``resourceVersion``."""
        with self._lock:
            if name not in self._nodes:
                raise not_found(name)
            current = self._nodes[name]
            new = change(copy.deepcopy(current))
            meta = new.get("metadata") if isinstance(new, dict) else None
            if not isinstance(meta, dict):
                raise ApiError(422, "Invalid", f'Node "{name}" is invalid: metadata: Required')
            rv = current["metadata"]["resourceVersion"]
            if meta.get("resourceVersion") not in (None, "", rv):
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on nodes '
                               f'"{name}": the object has been modified; please apply your '
                               "changes to the latest version and try again", name)
            if meta.get("name") != name:
                raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) "
                               f"does not match the name on the URL ({name})")
            new.update(apiVersion="v1", kind="Node", status=copy.deepcopy(current.get("status")))
            meta["resourceVersion"] = rv
            if problems := _invalid(new):
                raise ApiError(422, "Invalid", f'Node "{name}" is invalid: '
                               + ", ".join(problems), name)
            if new != current:
                self._rv += 1
                new["metadata"]["resourceVersion"] = str(self._rv)
                self._nodes[name] = new
            return copy.deepcopy(self._nodes[name])


ERR_UNSCHEDULABLE = "node(s) were unschedulable"
ERR_TAINTS = "node(s) had untolerated taint(s)"
ERR_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
ERR_AFFINITY_CONFLICT = "pod affinity terms conflict"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
_NON_ZERO = {"cpu": 100, "memory": 200 * 1024 * 1024}  # scoring defaults (schedutil)


@dataclass(frozen=True)
class Placement:
    node: str
    requests: Mapping[str, int]  # what the pod takes: ``amount``s (cpu: millicores), pods: 1
    feasible: tuple[str, ...] = ()  # every node that passed the filters, best first


@dataclass(frozen=True)
class Unschedulable:
    """``message``: ``FitError.Error()``; ``preemption``: DefaultPreemption's PostFilter clause
    (no lower-priority pods to evict); ``condition_message``: the PodScheduled message."""

    message: str
    reasons: Mapping[str, int] = field(default_factory=dict)
    nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    preemption: str = ""

    @property
    def condition_message(self) -> str:
        return f"{self.message} {self.preemption}" if self.preemption else self.message


def _combine(into: dict[str, int], more: Mapping[str, int], fn: Any = int.__add__
             ) -> dict[str, int]:
    for k, v in more.items():
        into[k] = fn(into.get(k, 0), v)
    return into


def _requests(resources: Mapping[str, Any] | None) -> dict[str, int]:
    """Requests, a limit standing in for a missing request (API defaulting)."""
    res = resources or {}
    return {k: amount(k, v) for k, v in {**(res.get("limits") or {}),
                                         **(res.get("requests") or {})}.items()}


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """``resourcehelper.PodRequests``: containers summed; the max with each init container
    (restartable init containers, i.e. sidecars, add up and count for those after them);
    pod-level ``resources`` override cpu/memory; ``overhead`` added."""
    reqs: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    init: dict[str, int] = {}
    for c in pod_spec.get("containers") or []:
        _combine(reqs, _requests(c.get("resources")))
    for c in pod_spec.get("initContainers") or []:
        r = _requests(c.get("resources"))
        if c.get("restartPolicy") == "Always":
            _combine(reqs, r)
            r = dict(_combine(sidecars, r))
        else:
            r = _combine(r, sidecars)
        _combine(init, r, max)
    _combine(reqs, init, max)
    reqs.update((k, v) for k, v in _requests(pod_spec.get("resources")).items()
                if k in ("cpu", "memory"))
    return _combine(reqs, {k: amount(k, v) for k, v in (pod_spec.get("overhead") or {}).items()})


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``Toleration.ToleratesTaint``: an empty effect matches every effect, an empty key
    (with ``Exists``) every key; ``Equal`` (or no operator) compares values."""
    tol = toleration
    if (tol.get("effect") and tol["effect"] != taint.get("effect")) or (
            tol.get("key") and tol["key"] != taint.get("key")):
        return False
    op = tol.get("operator") or "Equal"
    return op == "Exists" or (op == "Equal" and (tol.get("value") or "") == (taint.get("value")
                                                                         or ""))


def _expression(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    """One ``NodeSelectorRequirement`` (``NodeSelectorRequirementsAsSelector``); a malformed
    one matches nothing, as the scheduler's lazy-error selector skips it."""
    key, op, vals = str(req.get("key")), req.get("operator"), list(req.get("values") or [])
    has, value = key in values, values.get(key)
    if op in ("In", "NotIn"):
        return bool(vals) and (has and value in vals) == (op == "In")
    if op in ("Exists", "DoesNotExist"):
        return not vals and has == (op == "Exists")
    if op in ("Gt", "Lt") and len(vals) == 1 and has:
        try:
            left, right = int(str(value)), int(vals[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def _term(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """A ``NodeSelectorTerm``: expressions and fields ANDed; an empty term matches nothing;
    ``matchFields`` knows ``metadata.name`` with ``In``/``NotIn`` only."""
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    return bool(exprs or fields) and all(_expression(e, labels) for e in exprs) and all(
        f.get("key") == "metadata.name" and f.get("operator") in ("In", "NotIn")
        and _expression(f, {"metadata.name": name}) for f in fields)


def _required_terms(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    na = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    return None if req is None else list(req.get("nodeSelectorTerms") or [])


def _prefilter_names(terms: list[Mapping[str, Any]] | None) -> set[str] | None:
    """NodeAffinity's PreFilter: when every term names nodes (``matchFields metadata.name
    In``), only those nodes are filtered; ``None``: all nodes."""
    names: set[str] | None = None
    for t in terms or []:
        sets = [set(f.get("values") or []) for f in t.get("matchFields") or []
                if f.get("key") == "metadata.name" and f.get("operator") == "In"]
        if not sets:
            return None
        names = (names or set()) | set.intersection(*sets)
    return names


def _filter(pod_spec: Mapping[str, Any], node: Mapping[str, Any], reqs: Mapping[str, int],
            used: Mapping[str, Any], taint_values: bool) -> tuple[tuple[str, ...], bool]:
    """The default profile's filters in order; the first failure: (reasons, unresolvable)."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    labels, tols = meta.get("labels") or {}, pod_spec.get("tolerations") or []
    if spec.get("unschedulable") and not any(
            tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}) for t in tols):
        return (ERR_UNSCHEDULABLE,), True  # NodeUnschedulable
    for taint in spec.get("taints") or []:  # TaintToleration
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                tolerates(t, taint) for t in tols):
            return ((f"node(s) had untolerated taint {{{taint.get('key')}: "
                     f"{taint.get('value') or ''}}}" if taint_values else ERR_TAINTS),), True
    terms = _required_terms(pod_spec)
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()) or (
            terms is not None and not any(_term(t, labels, str(meta.get("name"))) for t in terms)):
        return (ERR_AFFINITY,), True  # NodeAffinity
    alloc = {k: amount(k, v)
             for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    have = _amounts(used)
    out = ["Too many pods"] if have.get("pods", 0) + 1 > alloc.get("pods", 0) else []
    out += [f"Insufficient {r}" for r, want in reqs.items()  # NodeResourcesFit
            if r != "pods" and want > 0 and want > alloc.get(r, 0) - have.get(r, 0)]
    return tuple(out), any(want > alloc.get(r, 0) for r, want in reqs.items() if r != "pods")


def _amounts(used: Mapping[str, Any]) -> dict[str, int]:
    return {k: v if isinstance(v, int) else amount(k, v) for k, v in used.items()}


def _score(node: Mapping[str, Any], reqs: Mapping[str, int], used: Mapping[str, Any]) -> float:
    """NodeResourcesFit's default LeastAllocated score over cpu and memory."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    caps = {r: amount(r, alloc.get(r, 0)) for r in _NON_ZERO}
    have = _amounts(used)
    scores = [max(0.0, (cap - have.get(r, 0) - (reqs.get(r) or _NON_ZERO[r])) / cap)
              for r, cap in caps.items() if cap > 0]
    return sum(scores) / len(scores) if scores else 0.0


def schedule(pod_spec: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]],
             used: Mapping[str, Mapping[str, Any]] | None = None, *,
             taint_values: bool = False) -> Placement | Unschedulable:
    """Where kube-scheduler's default filters put ``pod_spec``. ``used[node][resource]``: what
    the pods bound there take, as ints in ``Placement.requests``' units (sum their placements'
    requests) or as quantity strings. Of the nodes that pass, the highest LeastAllocated score
    wins, then the first name (the real scheduler breaks ties at random). An untolerated taint is
    worded as since kubernetes#134740 (1.35; backported to 1.32-1.34 patch releases),
    ``node(s) had untolerated taint(s)``; ``taint_values=True`` gives the older
    ``node(s) had untolerated taint {key: value}``."""
    nodes, used = list(nodes), used or {}
    if not nodes:
        return Unschedulable("no nodes available to schedule pods")
    reqs = pod_requests(pod_spec)
    total = len(nodes)
    names = _prefilter_names(_required_terms(pod_spec))
    if names is not None and not names:
        return Unschedulable(f"0/{total} nodes are available: {ERR_AFFINITY_CONFLICT}.",
                             preemption=f"preemption: 0/{total} nodes are available: "
                                        f"{total} {NOT_HELPFUL}.")
    statuses: dict[str, tuple[tuple[str, ...], bool]] = {}
    feasible = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name"))
        if names is not None and name not in names:
            statuses[name] = (("node(s) didn't satisfy plugin(s) [NodeAffinity]",), True)
            continue
        reasons, unresolvable = _filter(pod_spec, node, reqs, used.get(name) or {},
                                        taint_values)
        if reasons:
            statuses[name] = (reasons, unresolvable)
        else:
            feasible.append((-_score(node, reqs, used.get(name) or {}), name))
    if feasible:
        order = tuple(n for _, n in sorted(feasible))
        return Placement(order[0], {**reqs, "pods": 1}, order)
    hist = Counter(r for reasons, _ in statuses.values() for r in reasons)
    pre = Counter(NOT_HELPFUL if unres else NO_VICTIMS for _, unres in statuses.values())

    def joined(c: Counter[str]) -> str:
        return ", ".join(sorted(f"{v} {k}" for k, v in c.items()))

    return Unschedulable(f"0/{total} nodes are available: {joined(hist)}.", dict(hist),
                         {n: r for n, (r, _) in statuses.items()},
                         f"preemption: 0/{total} nodes are available: {joined(pre)}.")
