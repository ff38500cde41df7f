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
    "volumeClaimTemplates",
}
SPEC_NO_EFFECT = {
    # what they change happens outside the run (garbage collection, metadata, images)
    "podGC", "ttlStrategy", "imagePullSecrets", "securityContext", "podMetadata",
    "priorityClassName", "schedulerName", "podPriorityClassName", "archiveLogs",
    "workflowMetadata", "podDisruptionBudget", "artifactGC", "volumeClaimGC",
}
# Template fields
TEMPLATE_HONOURED = {
    "name", "inputs", "outputs", "container", "script", "steps", "dag", "daemon",
    "retryStrategy",
    "activeDeadlineSeconds", "initContainers", "sidecars", "volumes", "podSpecPatch",
    "nodeSelector", "tolerations", "affinity", "serviceAccountName",
    "automountServiceAccountToken", "metadata", "resource",
}
TEMPLATE_NO_EFFECT = {"securityContext", "priorityClassName", "schedulerName",
                      "archiveLocation", "podSpecPatchFrom"}
STEP_HONOURED = {"name", "template", "templateRef", "arguments", "when", "withItems",
                 "withParam", "withSequence", "continueOn"}
# DAG tasks (dag.go): the step fields plus the graph
DAG_TASK_HONOURED = STEP_HONOURED | {"dependencies", "depends"}
DAG_HONOURED = {"tasks", "target", "failFast"}
TEMPLATE_REF_HONOURED = {"name", "template", "clusterScope"}
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
    for i, claim in enumerate(spec.get("volumeClaimTemplates") or []):
        if not isinstance(claim, dict) or not (claim.get("metadata") or {}).get("name"):
            raise Unsupported(f"spec.volumeClaimTemplates[{i}]: metadata.name is required")


def check_template(t: dict[str, Any]) -> None:
    where = f"template {t.get('name')!r}"
    _check(t, TEMPLATE_HONOURED | TEMPLATE_NO_EFFECT, where)
    kinds = [k for k in ("container", "script", "steps", "dag", "resource") if k in t]
    if len(kinds) != 1:
        raise Unsupported(f"{where}: needs exactly one of container, script, steps, dag, "
                          f"resource (suspend, http, data, plugin and containerSet are "
                          f"not supported)")
    if "resource" in t:
        _check_resource(t["resource"], where)
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
            _check_call(step, STEP_HONOURED, f"{where} step {step.get('name')!r}")
    if "dag" in t:
        _check_dag(t["dag"], where)
    for p in (t.get("inputs") or {}).get("parameters") or []:
        _check(p, {"name", "value", "default", "description", "enum"},
               f"{where} input parameter {p.get('name')!r}")
    _check(t.get("inputs") or {}, {"parameters"}, f"{where} inputs")
    _check(t.get("outputs") or {}, {"parameters", "result"}, f"{where} outputs")
    for vol in t.get("volumes") or []:
        _check_volume(vol, where)


def _check_call(step: dict[str, Any], allowed: set[str], where: str) -> None:
    """A step or a DAG task: its fields, arguments and ``templateRef``."""
    _check(step, allowed, where)
    args = step.get("arguments") or {}
    _check(args, {"parameters"}, f"{where} arguments")
    for p in args.get("parameters") or []:
        _check(p, {"name", "value"}, f"{where} parameter")
    ref = step.get("templateRef")
    if ref is not None:
        _check(ref, TEMPLATE_REF_HONOURED, f"{where} templateRef")
        if ref.get("clusterScope"):
            raise Unsupported(f"{where}: templateRef.clusterScope (a ClusterWorkflowTemplate) "
                              "is not supported by rehearse (WorkflowTemplates are)")


def _check_dag(dag: Any, where: str) -> None:
    """``validateDAG`` (validate.go) as far as rehearse needs: fields, unique task names, and
    every dependency naming a task."""
    if not isinstance(dag, dict) or not isinstance(dag.get("tasks"), list):
        raise Unsupported(f"{where}: dag.tasks must be a list")
    _check(dag, DAG_HONOURED, f"{where} dag")
    names = [task.get("name") for task in dag["tasks"]]
    for task in dag["tasks"]:
        _check_call(task, DAG_TASK_HONOURED, f"{where} task {task.get('name')!r}")
        if task.get("dependencies") and task.get("depends"):
            raise Unsupported(f"{where} task {task.get('name')!r}: cannot use both "
                              "'depends' and 'dependencies' in the same DAG template")
        for dep in task.get("dependencies") or []:
            if dep not in names:
                raise Unsupported(f"{where} task {task.get('name')!r}: dependency {dep!r} "
                                  "not defined")


def check_workflow_template(wt: Any, where: str = "WorkflowTemplate") -> str:
    """A ``WorkflowTemplate`` a ``templateRef`` may name: its templates are checked like a
    Workflow's. Returns its name."""
    if not isinstance(wt, dict) or wt.get("kind") != "WorkflowTemplate":
        kind = wt.get("kind") if isinstance(wt, dict) else type(wt).__name__
        raise Unsupported(f"{where}: expected a WorkflowTemplate document, got {kind}")
    name = (wt.get("metadata") or {}).get("name")
    if not name:
        raise Unsupported(f"{where}: metadata.name is required")
    spec = wt.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("templates"), list):
        raise Unsupported(f"WorkflowTemplate {name!r}: spec.templates is required")
    for t in spec["templates"]:
        check_template(t)
    return str(name)


RESOURCE_HONOURED = {"action", "manifest", "setOwnerReference"}
RESOURCE_KINDS = {("v1", "Service"), ("v1", "Secret"), ("v1", "ConfigMap")}


def _check_resource(res: Any, where: str) -> None:
    """Resource templates: ``action: create`` of a ``manifest`` (a v1 Service, Secret or
    ConfigMap), optionally ``setOwnerReference``."""
    if not isinstance(res, dict):
        raise Unsupported(f"{where}: resource must be a mapping")
    _check(res, RESOURCE_HONOURED, f"{where} resource")
    if res.get("action") != "create":
        raise Unsupported(f"{where}: resource action {res.get('action')!r} is not supported by "
                          "rehearse (create is)")
    manifest = res.get("manifest")
    if not isinstance(manifest, str) or not manifest.strip():
        raise Unsupported(f"{where}: resource.manifest (a string) is required")
    import yaml

    try:
        doc = yaml.safe_load(manifest)
    except yaml.YAMLError:
        return  # may hold {{...}} that only parses once substituted; the executor says
    if isinstance(doc, dict) and "{{" not in str(doc.get("kind")) and \
            (doc.get("apiVersion"), doc.get("kind")) not in RESOURCE_KINDS:
        raise Unsupported(f"{where}: resource.manifest kind {doc.get('apiVersion')} "
                          f"{doc.get('kind')} is not supported by rehearse (v1 Service, Secret "
                          "and ConfigMap are)")


def _check_volume(vol: dict[str, Any], where: str) -> None:
    kinds = set(vol) - {"name"}
    if not kinds <= {"emptyDir", "secret", "persistentVolumeClaim"}:
        raise Unsupported(f"{where} volume {vol.get('name')!r}: {', '.join(sorted(kinds))} "
                          "volumes are not supported (emptyDir, secret and "
                          "persistentVolumeClaim are)")
