"""The check phases: bootcheck (one pod per rank), troubleshoot (one pod per bad node), and the
single checks published in the reusable ``aegis-checks`` WorkflowTemplate.

PURE: returns Hera templates; nothing is submitted. Every check pod runs
``aegis-flow check NAMES --json --out FILE`` and exposes FILE as the ``result`` parameter.
"""

from __future__ import annotations

import json
from typing import Any

from hera.workflows import Container, Env, FieldEnv, Parameter, RetryStrategy, UserContainer
from hera.workflows import models as m

from aegis_flow.jobspec import JobSpec
from aegis_flow.steps.gpu import EXPECT_ENV
from aegis_flow.templates import common as c
from aegis_flow.templates import inject

# the checks callable one by one through templateRef (aegis-flow check NAME)
SINGLE_CHECKS = ("env", "io", "gpu", "runtime", "rdma", "all")


def _check_args(which: str, expect_gpus: int) -> list[str]:
    args = ["check", which, "--json", "--out", c.CHECK_OUT]
    if expect_gpus:
        args += ["--expect-gpus", str(expect_gpus)]
    return args


def _in_user_image(spec: JobSpec) -> dict[str, object]:
    """Command and pod pieces to run ``aegis-flow check`` in the user's image: from the
    injected bundle (only Python needed), or the image's own aegis-flow."""
    if not spec.inject_supervisor:
        return {"command": ["aegis-flow"]}
    return {"command": [spec.python, inject.BUNDLE],
            "init_containers": [inject.copy_bundle(spec)],
            "volumes": [inject.shared_volume()], "volume_mounts": [inject.shared_mount()]}


def _result() -> list[Parameter]:
    return [Parameter(name="result", value_from=m.ValueFrom(path=c.CHECK_OUT, default="[]"))]


def bootcheck_template(spec: JobSpec) -> Container:
    """One rank's pre-flight checks, in the user's image, placed like a worker pod.

    A failing check is retried once on another node (nodeAntiAffinity); if it fails again the
    attempt fails, visibly, before any training pod starts.
    """
    return Container(
        name=c.BOOTCHECK,
        image=spec.image,
        **_in_user_image(spec),  # type: ignore[arg-type]
        args=_check_args(c.BOOTCHECK_CHECKS, spec.gpus_per_worker),
        inputs=c.params("rank", pod_spec_patch="{}"),
        outputs=_result(),
        env=c.pod_env(spec),
        resources=c.resources(spec),
        node_selector=spec.node_selector or None,
        tolerations=c.tolerations(spec),
        affinity=c.not_quarantined(),
        pod_spec_patch=c.inp("pod-spec-patch"),
        retry_strategy=RetryStrategy(
            limit="1", retry_policy="Always",
            affinity=m.RetryAffinity(node_anti_affinity=m.RetryNodeAntiAffinity())),
    )


def troubleshoot_template(spec: JobSpec) -> Container:
    """Diagnose one suspected node: its checks, pinned to it (tolerating the quarantine taint)."""
    tol = c.tolerations(spec) or []
    tol.append(m.Toleration(key=c.QUARANTINE_LABEL, operator="Exists"))
    return Container(
        name=c.TROUBLESHOOT,
        image=spec.image,
        **_in_user_image(spec),  # type: ignore[arg-type]
        args=_check_args(c.TROUBLESHOOT_CHECKS, spec.gpus_per_worker),
        inputs=c.params("node"),
        outputs=_result(),
        env=c.pod_env(spec),
        resources=c.resources(spec),
        node_selector={c.HOSTNAME_LABEL: c.inp("node")},
        tolerations=tol,
        active_deadline_seconds=600,
    )


GPU_RESOURCE = "nvidia.com/gpu"
AEGIS_IMAGE_INPUT = "aegis-image"


def checks_gpu(which: str) -> bool:
    """Whether a check list includes the gpu check (``all`` does)."""
    names = {n.strip() for n in which.split(",")}
    return "gpu" in names or "all" in names


def gpu_patch(gpus: str, *, containers: tuple[str, ...] = ("main",),
              init_containers: tuple[str, ...] = ()) -> str:
    """A ``podSpecPatch`` giving these containers ``gpus`` GPUs (requests and limits).

    A parameter cannot stand in ``resources`` itself: Argo unmarshals the template before
    substituting, and ``"{{inputs.parameters.gpus}}"`` is not a Kubernetes quantity
    ("quantities must match the regular expression", argo-workflows#6939); ``podSpecPatch`` is
    a string, substituted first, then merged into the pod (Argo's documented way)."""
    res = {"requests": {GPU_RESOURCE: gpus}, "limits": {GPU_RESOURCE: gpus}}
    patch: dict[str, list[dict[str, object]]] = {}
    if init_containers:
        patch["initContainers"] = [{"name": n, "resources": res} for n in init_containers]
    if containers:
        patch["containers"] = [{"name": n, "resources": res} for n in containers]
    return json.dumps(patch, separators=(",", ":"))


def gpu_env(gpus: str) -> list[Any]:
    return [FieldEnv(name="AEGIS_NODE", field_path="spec.nodeName"),
            Env(name=EXPECT_ENV, value=gpus)]


def gpu_pod_pieces(gpus: str) -> dict[str, object]:
    """What a pod needs for its gpu check to mean something: ``gpus`` GPUs requested
    (:func:`gpu_patch`: the device plugin hands the container real devices and the NVIDIA
    runtime its NVML), the
    ``nvidia.com/gpu`` taint tolerated (GPU nodes usually carry it), and
    ``AEGIS_EXPECT_GPUS=gpus``, so a node whose GPUs or driver are gone *fails* instead of
    reporting ``not_applicable`` (steps/gpu.py)."""
    return {"pod_spec_patch": gpu_patch(gpus), "tolerations": [gpu_toleration()],
            "env": gpu_env(gpus)}


def gpu_toleration() -> m.Toleration:
    return m.Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")


def check_template(name: str, which: str, *, image: str) -> Container:
    """One check (or a comma list) for the reusable ``aegis-checks`` WorkflowTemplate.

    It runs ``aegis-flow check`` in the **aegis-flow image** (input ``aegis-image``, default
    ``image``: the job's or ``install``'s aegis image), never in the caller's image, which
    needs only Python. A template whose checks include gpu (``check-gpu``, ``check-all``,
    ``bootcheck``) also takes ``gpus`` (default 1) and requests, tolerates and expects that
    many GPUs (:func:`gpu_pod_pieces`); pass ``gpus: "0"`` to run it on a CPU node. The
    results are the ``result`` output.
    """
    gpu = checks_gpu(which)
    pieces = gpu_pod_pieces(c.inp("gpus")) if gpu else {
        "env": [FieldEnv(name="AEGIS_NODE", field_path="spec.nodeName")]}
    defaults = {AEGIS_IMAGE_INPUT: image, **({"gpus": "1"} if gpu else {})}
    return Container(
        name=name,
        image=c.inp(AEGIS_IMAGE_INPUT),
        command=["aegis-flow"],
        args=_check_args(which, 0),
        inputs=[Parameter(name=k, default=v) for k, v in defaults.items()],
        outputs=_result(),
        affinity=c.not_quarantined(),
        **pieces,
    )


def gpu_check_init_container(*, aegis_image: str, gpus: str, out: str,
                             volume_mounts: list[m.VolumeMount]) -> UserContainer:
    """The gpu check as an **init container of the pod that uses the GPUs** (the aegis-flow
    image, :func:`gpu_pod_pieces`): it runs on the node, and with the devices, that the pod's
    main container then gets (the kubelet's device manager hands an init container's devices
    on to the app containers), so what it checked is what the job uses; it writes the results
    to ``out`` (on a volume the main container also mounts) and a failure stops the pod before
    its main container starts. Its GPUs come from the pod's ``podSpecPatch``
    (``gpu_patch(gpus, init_containers=("gpu-check",))``), as ``gpus`` may be a parameter."""
    return UserContainer(
        name="gpu-check", image=aegis_image, command=["aegis-flow"],
        args=["check", "gpu", "--json", "--out", out],
        env=gpu_env(gpus), volume_mounts=volume_mounts)
