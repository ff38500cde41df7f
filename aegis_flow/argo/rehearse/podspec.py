"""The pod Argo's controller would create for a container or script node (PURE).

Follows ``workflow/controller/workflowpod.go`` ``createWorkflowPod`` (v4.0.5): the main container
is named ``main``; ``initContainers`` and ``sidecars`` are the template's; volumes are the
workflow's plus the template's; ``nodeSelector``, ``tolerations``, ``affinity``,
``serviceAccountName`` and ``automountServiceAccountToken`` come from the template, else the
workflow spec; ``activeDeadlineSeconds`` is the template's or the time left before the
workflow's deadline, whichever is smaller (ignored for exit-handler pods); the workflow's then the
template's ``podSpecPatch`` are applied as strategic merge patches (``util.ApplyPodSpecPatch``);
and only then does ``retryStrategy.affinity.nodeAntiAffinity`` add ``kubernetes.io/hostname
NotIn <hosts of failed attempts>`` (``retry_tweak.go`` ``RetryOnDifferentHost``,
``workflow/util/retry/retry.go`` ``AddHostnamesToAffinity``), so the two compose.

Pod names follow ``workflow/util/pod_name.go`` ``GeneratePodName`` (POD_NAMES v2):
``<workflow>-<template>-<fnv32a(node name)>``.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

HOST_LABEL = "kubernetes.io/hostname"  # RETRY_HOST_NAME_LABEL_KEY's default


def fnv32a(text: str) -> int:
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def node_id(workflow: str, name: str) -> str:
    """``Workflow.NodeID`` (pkg/apis/workflow/v1alpha1/workflow_types.go)."""
    return workflow if name == workflow else f"{workflow}-{fnv32a(name)}"


def pod_name(workflow: str, node_name: str, template: str) -> str:
    """``GeneratePodName`` v2 (workflow/util/pod_name.go)."""
    if workflow == node_name:
        return workflow
    prefix = f"{workflow}-{template}" if template else workflow
    return f"{prefix[:242]}-{fnv32a(node_name)}"


def add_hostnames_to_affinity(hosts: list[str], affinity: dict[str, Any] | None
                              ) -> dict[str, Any]:
    """``AddHostnamesToAffinity`` (workflow/util/retry/retry.go), branch for branch."""
    req = {"key": HOST_LABEL, "operator": "NotIn", "values": list(hosts)}
    source = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [dict(req)]}]}}
    if not affinity:
        return {"nodeAffinity": source}
    affinity = copy.deepcopy(affinity)
    if not affinity.get("nodeAffinity"):
        affinity["nodeAffinity"] = source
        return affinity
    target = affinity["nodeAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution")
    if not target:
        affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = \
            source["requiredDuringSchedulingIgnoredDuringExecution"]
        return affinity
    terms = target.get("nodeSelectorTerms") or []
    if not terms:
        target["nodeSelectorTerms"] = source["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        return affinity
    for term in terms:
        exprs = term.get("matchExpressions") or []
        if not exprs:
            term["matchExpressions"] = [dict(req)]
            return affinity
        for e in exprs:
            if e.get("key") == HOST_LABEL and e.get("operator") == "NotIn":
                merged = list(e.get("values") or []) + hosts
                e["values"] = list(dict.fromkeys(merged))
                return affinity
    terms[0].setdefault("matchExpressions", []).append(dict(req))
    return affinity


def build_pod_spec(tmpl: dict[str, Any], wf_spec: dict[str, Any], *, script: bool,
                   active_deadline: int | None, failed_hosts: list[str] | None
                   ) -> dict[str, Any]:
    """The pod spec for one attempt of a container/script/resource template (already
    substituted)."""
    if "resource" in tmpl:
        return _resource_pod_spec(tmpl, wf_spec, active_deadline=active_deadline,
                                  failed_hosts=failed_hosts)
    if script:
        main = {k: v for k, v in tmpl["script"].items() if k != "source"}
    else:
        main = dict(tmpl["container"])
    main["name"] = "main"
    # Argo's pod: the executor's ``wait`` container first, then main, then the sidecars
    # (createWorkflowPod). Rehearse does not run ``wait`` as a process (pods.WAIT).
    wait = {"name": "wait", "image": "quay.io/argoproj/argoexec",
            "command": ["argoexec", "wait"]}
    sidecars = [_mirror(dict(s), main) for s in tmpl.get("sidecars") or []]
    containers = [wait, main, *sidecars]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": containers,
        "volumes": [*(wf_spec.get("volumes") or []), *(tmpl.get("volumes") or [])],
    }
    if tmpl.get("initContainers"):
        spec["initContainers"] = [_mirror(dict(c), main) for c in tmpl["initContainers"]]
    return _scheduling(spec, tmpl, wf_spec, POD_FIELDS, active_deadline, failed_hosts)


# pod fields a template (else the workflow) sets; a resource pod takes the first six
POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "serviceAccountName",
              "automountServiceAccountToken", "terminationGracePeriodSeconds",
              "priorityClassName", "schedulerName", "securityContext", "hostAliases")
EXECUTOR_IMAGE = "quay.io/argoproj/argoexec:v4.0.5"
TERMINATION_LOG = "/tmp/termination-log"  # Argo's is /dev/termination-log (see argoexec.py)


def _resource_pod_spec(tmpl: dict[str, Any], wf_spec: dict[str, Any], *,
                       active_deadline: int | None, failed_hosts: list[str] | None
                       ) -> dict[str, Any]:
    """``executeResource`` (operator.go): one container, ``main``, the executor running
    ``argoexec resource ACTION`` with the template in ``ARGO_TEMPLATE``; no ``wait`` container
    (createWorkflowPod adds none for resource templates). Here the executor is
    ``aegis_flow.argo.rehearse.argoexec``."""
    simplified = {k: v for k, v in tmpl.items() if k != "inputs"}
    main = {"name": "main", "image": EXECUTOR_IMAGE,
            "command": [sys.executable, "-m", "aegis_flow.argo.rehearse.argoexec", "resource",
                        str(tmpl["resource"].get("action", ""))],
            "env": [{"name": "ARGO_CONTAINER_NAME", "value": "main"},
                    {"name": "ARGO_TEMPLATE", "value": json.dumps(simplified,
                                                                  separators=(",", ":"))}],
            "terminationMessagePath": TERMINATION_LOG}
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [main], "volumes": []}
    return _scheduling(spec, tmpl, wf_spec, POD_FIELDS[:6], active_deadline, failed_hosts)


def _scheduling(spec: dict[str, Any], tmpl: dict[str, Any], wf_spec: dict[str, Any],
                keys: tuple[str, ...], active_deadline: int | None,
                failed_hosts: list[str] | None) -> dict[str, Any]:
    """What both kinds of pod take from the template (else the workflow): ``keys``, the
    deadline, both ``podSpecPatch``es, then the retry's node anti-affinity."""
    for key in keys:
        value = tmpl.get(key, wf_spec.get(key))
        if value is not None:
            spec[key] = copy.deepcopy(value)
    if active_deadline is not None:
        spec["activeDeadlineSeconds"] = active_deadline
    for patch in (wf_spec.get("podSpecPatch"), tmpl.get("podSpecPatch")):
        if patch:
            spec = strategic_merge_patch(spec, _parse_patch(patch))
    if failed_hosts:
        spec["affinity"] = add_hostnames_to_affinity(failed_hosts, spec.get("affinity"))
    return spec


def _mirror(c: dict[str, Any], main: dict[str, Any]) -> dict[str, Any]:
    """``mirrorVolumeMounts``: the user container gets main's volume mounts (workflowpod.go
    ``mirrorVolumeMounts`` for init containers and sidecars)."""
    if c.pop("mirrorVolumeMounts", False):
        c["volumeMounts"] = [*(c.get("volumeMounts") or []),
                             *copy.deepcopy(main.get("volumeMounts") or [])]
    return c


class PatchError(ValueError):
    pass


# patchMergeKey of the PodSpec lists (k8s.io/api/core/v1/types.go ``patchStrategy:"merge"``);
# a list not named here is replaced whole (e.g. tolerations, nodeSelectorTerms, args)
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
               "volumes": "name", "env": "name", "volumeMounts": "mountPath",
               "ports": "containerPort", "imagePullSecrets": "name", "hostAliases": "ip",
               "topologySpreadConstraints": "topologyKey", "volumeDevices": "devicePath",
               "resourceClaims": "name"}


def strategic_merge_patch(target: Any, patch: Any, key: str = "") -> Any:
    """A strategic merge patch on a PodSpec (what ``util.ApplyPodSpecPatch`` calls,
    ``strategicpatch.StrategicMergePatch(..., apiv1.PodSpec{})``): maps merge recursively, a
    ``null`` deletes, lists with a patch merge key merge item by item on that key, other lists
    are replaced."""
    if isinstance(patch, dict) and isinstance(target, dict):
        out = dict(target)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge_patch(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(patch, list) and isinstance(target, list) and key in _MERGE_KEYS:
        mk = _MERGE_KEYS[key]
        out_list = [copy.deepcopy(x) for x in target]
        for item in patch:
            match = next((i for i, x in enumerate(out_list) if isinstance(x, dict)
                          and isinstance(item, dict) and x.get(mk) == item.get(mk)), None)
            if match is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[match] = strategic_merge_patch(out_list[match], item)
        return out_list
    return copy.deepcopy(patch)


def _parse_patch(text: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        import yaml  # podSpecPatch may be YAML (util.ApplyPodSpecPatch converts it)

        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PatchError(f"Error applying PodSpecPatch: {exc}") from None
    if not isinstance(value, dict):
        raise PatchError(f"Error applying PodSpecPatch: not an object: {text!r}")
    return value

