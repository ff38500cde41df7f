"""What ``aegis-flow rehearse`` accepts (PURE): every field is honoured, accepted with no local
effect (listed, and named in ``docs/argo.md``), or refused with a message naming it.

Nothing is silently ignored: a workflow that uses a refused field does not start.
"""

from __future__ import annotations

from typing import Any

# Workflow.spec fields
SPEC_HONOURED = {
    "entrypoint", "arguments", "templates", "onExit", "activeDeadlineSeconds",
    "serviceAccountName", "automountServiceAccountToken", "volumes", "podSpecPatch",
    "nodeSelector", "tolerations", "affinity", "terminationGracePeriodSeconds", "hooks",
}
SPEC_NO_EFFECT = {
    # what they change happens outside the run (garbage collection, metadata, images)
    "podGC", "ttlStrategy", "imagePullSecrets", "securityContext", "podMetadata",
    "priorityClassName", "schedulerName", "podPriorityClassName", "archiveLogs",
    "workflowMetadata", "podDisruptionBudget", "artifactGC",
}
# Template fields
TEMPLATE_HONOURED = {
    "name", "inputs", "outputs", "container", "script", "steps", "daemon", "retryStrategy",
    "activeDeadlineSeconds", "initContainers", "sidecars", "volumes", "podSpecPatch",
    "nodeSelector", "tolerations", "affinity", "serviceAccountName",
    "automountServiceAccountToken", "metadata",
}
TEMPLATE_NO_EFFECT = {"securityContext", "priorityClassName", "schedulerName",
                      "archiveLocation", "podSpecPatchFrom"}
STEP_HONOURED = {"name", "template", "arguments", "when", "withItems", "withParam",
                 "withSequence", "continueOn"}
RETRY_HONOURED = {"limit", "retryPolicy", "expression", "backoff", "affinity"}
BACKOFF_HONOURED = {"duration", "factor", "maxDuration", "cap"}
CONTAINER_HONOURED = {
    "name", "image", "command", "args", "env", "envFrom", "volumeMounts", "workingDir",
    "resources", "readinessProbe", "ports", "source", "mirrorVolumeMounts",
    # accepted, no local effect (images are not pulled; probes other than readiness and
    # security settings do not change what a local process does)
    "imagePullPolicy", "securityContext", "livenessProbe", "startupProbe",
    "terminationMessagePath", "terminationMessagePolicy", "stdin", "tty",
}


class Unsupported(ValueError):
    """The workflow uses something rehearse does not implement: the run does not start."""


def _check(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise Unsupported(f"{where}: {', '.join(extra)} {'is' if len(extra) == 1 else 'are'} "
                          "not supported by rehearse (see docs/argo.md)")


def check_workflow(wf: dict[str, Any]) -> None:
    if not isinstance(wf, dict) or wf.get("kind") != "Workflow":
        raise Unsupported("rehearse runs a Workflow document (kind: Workflow); got "
                          f"{wf.get('kind') if isinstance(wf, dict) else type(wf).__name__!s}")
    spec = wf.get("spec")
    if not isinstance(spec, dict) or not spec.get("entrypoint"):
        raise Unsupported("spec.entrypoint is required")
    _check(spec, SPEC_HONOURED | SPEC_NO_EFFECT, "spec")
    hooks = spec.get("hooks") or {}
    if set(hooks) - {"exit"} or set(hooks.get("exit") or {}) - {"template"}:
        raise Unsupported("spec.hooks: only hooks.exit.template (the exit handler) is supported")
    names = [t.get("name") for t in spec.get("templates") or []]
    if spec["entrypoint"] not in names:
        raise Unsupported(f"spec.entrypoint {spec['entrypoint']!r} names no template")
    for t in spec.get("templates") or []:
        check_template(t)
    for vol in spec.get("volumes") or []:
        _check_volume(vol, "spec.volumes")


def check_template(t: dict[str, Any]) -> None:
    where = f"template {t.get('name')!r}"
    _check(t, TEMPLATE_HONOURED | TEMPLATE_NO_EFFECT, where)
    kinds = [k for k in ("container", "script", "steps") if k in t]
    if len(kinds) != 1:
        raise Unsupported(f"{where}: needs exactly one of container, script, steps "
                          f"(dag, resource, suspend, http, data, plugin and containerSet are "
                          f"not supported)")
    for c in [*(t.get("initContainers") or []), *(t.get("sidecars") or []),
              *([t["container"]] if "container" in t else []),
              *([t["script"]] if "script" in t else [])]:
        _check(c, CONTAINER_HONOURED, f"{where} container {c.get('name', 'main')!r}")
    rs = t.get("retryStrategy")
    if rs is not None:
        _check(rs, RETRY_HONOURED, f"{where} retryStrategy")
        _check(rs.get("backoff") or {}, BACKOFF_HONOURED, f"{where} retryStrategy.backoff")
        _check(rs.get("affinity") or {}, {"nodeAntiAffinity"}, f"{where} retryStrategy.affinity")
    for group in t.get("steps") or []:
        if not isinstance(group, list):
            raise Unsupported(f"{where}: steps must be a list of lists (parallel groups)")
        for step in group:
            _check(step, STEP_HONOURED, f"{where} step {step.get('name')!r}")
            args = step.get("arguments") or {}
            _check(args, {"parameters"}, f"{where} step {step.get('name')!r} arguments")
            for p in args.get("parameters") or []:
                _check(p, {"name", "value"}, f"{where} step {step.get('name')!r} parameter")
    for p in (t.get("inputs") or {}).get("parameters") or []:
        _check(p, {"name", "value", "default", "description", "enum"},
               f"{where} input parameter {p.get('name')!r}")
    _check(t.get("inputs") or {}, {"parameters"}, f"{where} inputs")
    _check(t.get("outputs") or {}, {"parameters", "result"}, f"{where} outputs")
    for vol in t.get("volumes") or []:
        _check_volume(vol, where)


def _check_volume(vol: dict[str, Any], where: str) -> None:
    kinds = set(vol) - {"name"}
    if not kinds <= {"emptyDir", "secret"}:
        raise Unsupported(f"{where} volume {vol.get('name')!r}: {', '.join(sorted(kinds))} "
                          "volumes are not supported (emptyDir and secret are)")
