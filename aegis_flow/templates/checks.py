"""The check phases: bootcheck (one pod per rank), troubleshoot (one pod per bad node), and the
single checks published in the reusable ``aegis-checks`` WorkflowTemplate.

PURE: returns Hera templates; nothing is submitted. Every check pod runs
``aegis-flow check NAMES --json --out FILE`` and exposes FILE as the ``result`` parameter.
"""

from __future__ import annotations

from hera.workflows import Container, FieldEnv, Parameter, RetryStrategy
from hera.workflows import models as m

from aegis_flow.jobspec import JobSpec
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


def check_template(name: str, which: str, *, image: str) -> Container:
    """One check (or a comma list) for the reusable WorkflowTemplate; ``image`` is an input
    with a default, so a caller's pipeline can run the check in its own image."""
    return Container(
        name=name,
        image=c.inp("image"),
        command=["aegis-flow"],
        args=_check_args(which, 0),
        inputs=c.params(image=image),
        outputs=_result(),
        env=[FieldEnv(name="AEGIS_NODE", field_path="spec.nodeName")],
        affinity=c.not_quarantined(),
    )
