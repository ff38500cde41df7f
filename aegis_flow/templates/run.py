"""The run phase: N worker pods (the supervisor ``-- <user command>``) and the verdict step
that reduces their outcomes.

PURE: returns Hera templates; nothing is submitted. The verdict script's source is
``contract.verdict`` itself, embedded with ``inspect.getsource``.
"""

from __future__ import annotations

import inspect
import textwrap

from hera.workflows import Container, Env, Parameter, RetryStrategy, Script
from hera.workflows import models as m

from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import common as c
from aegis_flow.templates import contract, inject


def supervisor_argv(spec: JobSpec) -> list[str]:
    """The injected bundle run by the image's Python, or the image's own ``aegis-flow``."""
    return [spec.python, inject.BUNDLE] if spec.inject_supervisor else [*spec.supervisor]


def worker_command(spec: JobSpec, *, rank: str, nats_url: str) -> list[str]:
    """``<supervisor> --job … --rank R --world-size N --nats-url URL --creds F -- <cmd>``."""
    return [*supervisor_argv(spec), "--job", "{{workflow.name}}", "--namespace",
            spec.namespace, "--rank", rank, "--world-size", str(spec.workers),
            "--nats-url", nats_url, "--creds", inject.CREDS, "--", *spec.command]


def worker_template(spec: JobSpec) -> Container:
    """One rank. A node fault or container restart recreates only this pod, elsewhere
    (nodeAntiAffinity) and never on a quarantined node; the others wait in Restarting."""
    return Container(
        name=c.WORKER,
        image=spec.image,
        command=worker_command(spec, rank=c.inp("rank"), nats_url=c.inp("nats-url")),
        inputs=c.params("rank", "nats-url", "master-addr", pod_spec_patch="{}"),
        init_containers=[
            *([inject.copy_bundle(spec)] if spec.inject_supervisor else []),
            inject.worker_init(spec, master_addr=c.inp("master-addr"), rank=c.inp("rank"))],
        volumes=[inject.shared_volume(), inject.token_volume(spec),
                 *inject.worker_tls_volumes(spec)],
        volume_mounts=[inject.shared_mount()],
        outputs=[
            Parameter(name="outcome", value_from=m.ValueFrom(
                path=contract.OUTCOME_FILE, default=contract.UNKNOWN)),
            Parameter(name="node", value_from=m.ValueFrom(path=contract.NODE_FILE, default="")),
        ],
        env=[*c.pod_env(spec), Env(name="AEGIS_POD_RETRY", value="{{retries}}")],
        resources=c.resources(spec),
        node_selector=spec.node_selector or None,
        tolerations=c.tolerations(spec),
        affinity=c.not_quarantined(),
        pod_spec_patch=c.inp("pod-spec-patch"),
        retry_strategy=RetryStrategy(
            limit=str(spec.pod_retry_limit), retry_policy="Always",
            expression=contract.worker_retry_expression(),
            affinity=m.RetryAffinity(node_anti_affinity=m.RetryNodeAntiAffinity()),
            backoff=m.Backoff(duration="5s", factor=m.IntOrString("2"), max_duration="2m")),
    )


VERDICT_MAIN = '''
import json, os
runs = json.loads(os.environ["RUNS"] or "[]")
out = verdict([r.get("outcome", "unknown") for r in runs], [r.get("node", "") for r in runs],
              json.loads(os.environ["EXCLUDED"] or "[]"))
out["next-attempt"] = str(int(os.environ["ATTEMPT"]) + 1)
where = os.environ.get("AEGIS_OUTCOME_DIR", "/tmp/aegis")
os.makedirs(where, exist_ok=True)
for key, value in out.items():
    with open(os.path.join(where, key), "w") as f:
        f.write(value)
print(json.dumps(out))
'''

VERDICT_OUTPUTS = ("verdict", "bad-nodes", "excluded-nodes", "pod-spec-patch", "next-attempt")


def verdict_source() -> str:
    return textwrap.dedent(inspect.getsource(contract.verdict)) + VERDICT_MAIN


def verdict_template(spec: JobSpec) -> Script:
    """Reduce the per-rank outcomes (``{{steps.run.outputs.parameters}}``, a JSON list) to
    the attempt's verdict, the nodes to quarantine and the next attempt's exclusion patch."""
    return Script(
        name=c.VERDICT,
        image=spec.aegis_image,
        command=["python"],
        source=verdict_source(),
        add_cwd_to_sys_path=False,
        inputs=c.params("runs", "attempt", "excluded-nodes"),
        env=[Env(name="RUNS", value=c.inp("runs")), Env(name="ATTEMPT", value=c.inp("attempt")),
             Env(name="EXCLUDED", value=c.inp("excluded-nodes"))],
        outputs=[Parameter(name=n, value_from=m.ValueFrom(path=f"{contract.OUTCOME_DIR}/{n}"))
                 for n in VERDICT_OUTPUTS],
        resources=m.ResourceRequirements(requests={"cpu": "100m", "memory": "64Mi"}),  # type: ignore[dict-item]
    )
