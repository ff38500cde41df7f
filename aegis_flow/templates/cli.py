"""``aegis-flow render``, ``submit`` and ``lint``: thin, over ``workflow`` and ``argo``.

Side effects: reading job/manifest files, writing the ``-o`` file, printing; ``submit`` POSTs
to the Argo Server (``argo.submit``). ``add_parsers(sub)`` adds the commands (each sets
``handler``); Hera, PyYAML and jsonschema load only when a command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from aegis_flow.argtypes import non_negative_int, port, positive_int


def add_parsers(sub: Any) -> None:
    """Add ``render``, ``submit`` and ``lint`` to an ``add_subparsers()`` object."""
    r = sub.add_parser(
        "render", help="render a job as an Argo Workflow (YAML; validated, never submitted)",
        usage="aegis-flow render (--image IMG [options] | -f job.yaml) [-o wf.yaml] "
              "[-- CMD ...]",
        description="Render the training job as an Argo Workflow with a master daemon, "
        "bootcheck, run, troubleshoot, quarantine and resume steps. The result is checked "
        "against Argo's JSON schema and our lint before it is written.")
    _job_flags(r)
    r.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    r.add_argument("--checks-template", action="store_true",
                   help="also write the aegis-checks WorkflowTemplate (a second document)")
    r.set_defaults(handler=handle_render)
    sm = sub.add_parser(
        "submit", help="render (or read) a workflow, validate it, and submit it to Argo",
        usage="aegis-flow submit --argo-server URL (--image IMG [options] -- CMD | -f job.yaml"
              " | --workflow wf.yaml)",
        description="Submit through the Argo Server's API (Hera's WorkflowsService): POST "
        "/api/v1/workflows/NAMESPACE with the rendered workflow. The bearer token comes from "
        "the environment (ARGO_TOKEN; 'argo auth token' prints one). Nothing is submitted "
        "unless the workflow passes the JSON schema and the lint, and (unless --no-check) "
        "the service accounts and Secrets it uses exist in the namespace (read through the "
        "Kubernetes API with your kubeconfig); each missing one is named with the command "
        "that creates it.")
    _job_flags(sm)
    sm.add_argument("--workflow", metavar="FILE",
                    help="submit this rendered Workflow YAML instead of rendering one")
    sm.add_argument("--argo-server", default=os.environ.get("ARGO_SERVER"),
                    help="Argo Server URL, e.g. https://argo.example.com:2746 (env ARGO_SERVER)")
    sm.add_argument("--no-check", dest="check_cluster", action="store_false",
                    help="do not check through the Kubernetes API that the service accounts "
                    "and Secrets the workflow uses exist in its namespace")
    sm.add_argument("--kubeconfig", help="for that check: kubeconfig file (default: "
                    "$KUBECONFIG / ~/.kube/config, or in-cluster)")
    sm.add_argument("--context", help="for that check: kubeconfig context")
    tls = sm.add_mutually_exclusive_group()
    tls.add_argument("--insecure", dest="verify_ssl", action="store_false",
                     help="do not verify the server's TLS certificate")
    tls.add_argument("--verify-ssl", dest="verify_ssl", action="store_true", default=True,
                     help="verify it (the default)")
    sm.set_defaults(handler=handle_submit)
    lt = sub.add_parser(
        "lint", help="validate Argo manifests offline (JSON schema + semantic lint)",
        description="Check each YAML file (multi-document allowed) against Argo's JSON schema "
        "v4.0.5 made strict, and our semantic lint. templateRefs may point to "
        "WorkflowTemplates in any of the files, or to the built-in aegis-checks. Exit 1 on "
        "any finding.")
    lt.add_argument("files", nargs="+", metavar="FILE")
    lt.add_argument("--no-schema", action="store_true", help="skip the JSON schema")
    lt.set_defaults(handler=handle_lint)


def _job_flags(r: Any) -> None:
    r.add_argument("-f", "--file", help="job file (YAML/JSON with JobSpec fields); flags "
                   "given on the command line override it")
    r.add_argument("--name", help="job name (the Workflow's generateName prefix)")
    r.add_argument("--image", help="the training image (needs only Python)")
    r.add_argument("--workers", type=positive_int, help="number of worker pods")
    r.add_argument("--gpus-per-worker", type=non_negative_int)
    r.add_argument("--max-retry", type=non_negative_int, help="the workflow's max-retry default")
    r.add_argument("--namespace")
    r.add_argument("--service-account", help="the account with nodes get/list/patch, used by "
                   "the master and the quarantine step only (default aegis-flow)")
    r.add_argument("--executor-service-account", help="every other pod's account: Argo's "
                   "executor rights, no node rights (default aegis-flow-executor)")
    r.add_argument("--nats-url", help="the NATS every pod dials, with JetStream (default: "
                   "aegis-flow install's, nats://aegis-nats.NAMESPACE:4222)")
    r.add_argument("--aegis-image", help="image with aegis-flow (master, init containers, "
                   "bootstrap-token, quarantine, give-up, report)")
    r.add_argument("--bootstrap-secret", metavar="SECRET",
                   help="a Secret (key 'token') every job shares (default: each workflow "
                   "makes its own, <workflow>-bootstrap, deleted with it)")
    r.add_argument("--checkpoint-claim", metavar="PVC",
                   help="a ReadWriteMany PersistentVolumeClaim every rank mounts as its "
                   "checkpoint directory ($AEGIS_CHECKPOINT_DIR), so a moved rank resumes")
    r.add_argument("--checkpoint-dir", metavar="PATH",
                   help="where it is mounted (default /checkpoints)")
    r.add_argument("--connect-timeout", type=int, metavar="S",
                   help="seconds for every rank's pod to be scheduled, pulled and started "
                   "(default 900)")
    r.add_argument("--replace-timeout", type=int, metavar="S",
                   help="seconds for a replaced rank's new pod to come back (default 900)")
    r.add_argument("--slow-window", type=non_negative_int, metavar="S",
                   help="seconds a rank's forwards must take more than twice its peers' "
                   "median before the master marks it slow; it is evicted (exit 72, its node "
                   "quarantined) right after the next checkpoint (default 60)")
    r.add_argument("--nproc-per-node", type=int, metavar="K",
                   help="ranks per worker pod, as torchrun's --nproc-per-node (one per GPU; at "
                   "most --gpus-per-worker): the job trains with workers*K ranks (default 1)")
    r.add_argument("--python", help="the interpreter in the training image that runs the "
                   "supervisor bundle (default python3)")
    r.add_argument("--no-bundle", dest="inject_supervisor", action="store_false", default=None,
                   help="the training image has aegis-flow installed: no bundle init container")
    r.add_argument("--metrics-port", type=port, help="the master's /metrics and /readyz port")
    r.add_argument("--grpc-tls-secret", metavar="SECRET",
                   help="the Secret with the master's tls.crt and tls.key and the ca.crt that "
                   "signed them, for the credential exchange (gRPC) over TLS (default "
                   "aegis-grpc-tls)")
    r.add_argument("--grpc-plaintext", action="store_true", default=None,
                   help="serve the credential exchange WITHOUT TLS: the bootstrap token and the "
                   "JWTs cross the pod network in the clear (default: TLS with the Secret "
                   "aegis-grpc-tls, made by aegis-flow install --create-secrets)")
    r.add_argument("--grpc-tls-client-secret", metavar="SECRET",
                   help="mutual TLS: a Secret with the workers' client tls.crt and tls.key, "
                   "signed by that ca.crt (needs --grpc-tls-secret)")
    r.add_argument("--grpc-tls-server-name", metavar="NAME",
                   help="the DNS name in the master's certificate that workers check "
                   "(default aegis-master.NAMESPACE.svc)")
    r.add_argument("--saver", metavar="CMD",
                   help="a checkpoint saver/uploader every worker runs beside training, as one "
                   "shell-like string, e.g. \"python upload.py --dir /checkpoints\"; "
                   "restarted 3 s after every exit, stopped with its worker")
    r.add_argument("train_command", nargs="*", metavar="CMD",
                   help="the training command, after '--'")


def _spec_from_args(args: argparse.Namespace) -> Any:
    from aegis_flow.jobspec import JobSpec

    fields: dict[str, Any] = {}
    if args.file:
        fields = JobSpec.from_file(args.file).model_dump()
    for key in ("name", "image", "workers", "gpus_per_worker", "max_retry", "namespace",
                "service_account", "executor_service_account", "nats_url", "aegis_image",
                "python", "inject_supervisor",
                "metrics_port", "grpc_tls_secret", "grpc_plaintext", "grpc_tls_client_secret",
                "grpc_tls_server_name", "bootstrap_secret", "checkpoint_claim",
                "checkpoint_dir", "connect_timeout", "replace_timeout", "slow_window",
                "saver", "nproc_per_node"):
        value = getattr(args, key)
        if value is not None:
            fields[key] = value
    if args.train_command:
        fields["command"] = args.train_command
    return JobSpec.parse(fields)


def _job_spec(args: argparse.Namespace, command: str, how: str) -> Any | None:
    """The JobSpec from flags and/or ``-f``, or None after printing why (``how``: the ways to
    give a job, for the message)."""
    from aegis_flow.jobspec import JobSpecError

    if not args.file and not args.image:
        print(f"aegis-flow {command}: give {how}", file=sys.stderr)
        return None
    try:
        return _spec_from_args(args)
    except JobSpecError as exc:
        print(f"aegis-flow {command}: invalid job:\n{exc}", file=sys.stderr)
        return None


def check_documents(docs: list[dict[str, Any]], *, schema: bool = True) -> list[str]:
    """Schema errors and lint findings of the documents, as printable lines (plain
    Kubernetes objects get the structural checks of ``k8s.validate``)."""
    from aegis_flow.argo.lint import lint
    from aegis_flow.argo.schema import SchemaUnavailable, schema_path, validate_schema
    from aegis_flow.k8s.validate import check_objects

    plain = [d for d in docs if not str(d.get("apiVersion", "")).startswith("argoproj.io/")]
    docs = [d for d in docs if d not in plain]
    problems: list[str] = check_objects(plain) if plain else []  # install's RBAC, NATS
    if schema:
        try:
            schema_path()
        except SchemaUnavailable as exc:
            print(f"warning: JSON schema NOT checked: {exc}", file=sys.stderr)
            schema = False
    if schema:
        for doc in docs:
            name = (doc.get("metadata") or {}).get("name") or (doc.get("metadata") or {}).get(
                "generateName", "?")
            problems += [f"{doc.get('kind')} {name}: [schema] {e}" for e in validate_schema(doc)]
    problems += [str(f) for f in lint(docs, known=builtin_templates())]
    return problems


def builtin_templates() -> dict[str, dict[str, dict[str, Any]]]:
    """The aegis-checks WorkflowTemplate, known to the lint even when not in the files."""
    from aegis_flow.jobspec import DEFAULT_AEGIS_IMAGE
    from aegis_flow.workflow import CHECKS_TEMPLATE, build_checks_template

    wt = build_checks_template(image=DEFAULT_AEGIS_IMAGE).to_dict()
    return {CHECKS_TEMPLATE: {t["name"]: t for t in wt["spec"]["templates"]}}


def handle_render(args: argparse.Namespace) -> int:
    from aegis_flow.workflow import build_checks_template, build_workflow, to_yaml

    spec = _job_spec(args, "render", "--image IMG (and -- CMD), or -f job.yaml")
    if spec is None:
        return 2
    objs: list[Any] = [build_workflow(spec)]
    if args.checks_template:
        objs.append(build_checks_template(image=spec.aegis_image, namespace=spec.namespace))
    problems = check_documents([o.to_dict() for o in objs])
    if problems:  # a bug in our builders, never the user's: refuse to write it
        print("aegis-flow render: the rendered workflow is invalid (a bug, please report):",
              *problems, sep="\n  ", file=sys.stderr)
        return 1
    from aegis_flow.argo.scale import warnings

    for note in warnings(objs[0].to_dict(), spec.workers):  # the limits that bite at scale
        print(f"note: {note}", file=sys.stderr)
    text = to_yaml(*objs)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def handle_submit(args: argparse.Namespace) -> int:
    from aegis_flow.argo.submit import SubmitError, submit

    if not args.argo_server:
        print("aegis-flow submit: give --argo-server URL (or set ARGO_SERVER)", file=sys.stderr)
        return 2
    token = os.environ.get("ARGO_TOKEN", "")
    if args.workflow:
        import yaml

        try:
            doc = yaml.safe_load(Path(args.workflow).read_text())
        except (OSError, yaml.YAMLError) as exc:
            print(f"aegis-flow submit: cannot read {args.workflow}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(doc, dict) or doc.get("kind") != "Workflow":
            print(f"aegis-flow submit: {args.workflow} is not one Workflow document",
                  file=sys.stderr)
            return 2
        namespace = args.namespace or (doc.get("metadata") or {}).get("namespace") or "default"
    else:
        from aegis_flow.workflow import render

        spec = _job_spec(args, "submit",
                         "--image IMG (and -- CMD), -f job.yaml or --workflow wf.yaml")
        if spec is None:
            return 2
        doc, namespace = render(spec), spec.namespace
    problems = check_documents([doc])
    if problems:
        print("aegis-flow submit: not submitted, the workflow is invalid:", *problems,
              sep="\n  ", file=sys.stderr)
        return 1
    if args.check_cluster:
        code = check_cluster(doc, namespace, kubeconfig=args.kubeconfig, context=args.context)
        if code:
            return code
    if not token:
        print("warning: ARGO_TOKEN is not set: submitting without a token", file=sys.stderr)
    try:
        done = submit(doc, server=args.argo_server, token=token, namespace=namespace,
                      verify_ssl=args.verify_ssl)
    except SubmitError as exc:
        print(f"aegis-flow submit: {exc}", file=sys.stderr)
        return 1
    print(f"submitted {done.namespace}/{done.name}")
    return 0


def check_cluster(doc: dict[str, Any], namespace: str, *, kubeconfig: str | None,
                  context: str | None, api: Any = None) -> int:
    """0 when every service account and Secret the workflow uses is in ``namespace``; else
    print each missing one with the command that creates it and return 1 (2: no cluster to
    ask). ``api``: an ``ObjectApi`` (default: the kubeconfig's cluster)."""
    from aegis_flow.k8s.api import NodeApiError
    from aegis_flow.k8s.preflight import missing, needs, report

    if api is None:
        from aegis_flow.k8s.client import KubeNodeApi

        try:
            api = KubeNodeApi.connect(kubeconfig=kubeconfig, context=context)
        except NodeApiError as exc:
            print(f"aegis-flow submit: not submitted: cannot check the workflow's service "
                  f"accounts and Secrets: {exc}; or pass --no-check to submit unchecked",
                  file=sys.stderr)
            return 2
    found = missing(api, namespace, needs(doc))
    if found:
        print(f"aegis-flow submit: not submitted: without these objects in namespace "
              f"{namespace} its pods would not start (Argo would show them Pending until the "
              "workflow's deadline). Create them with the commands shown:",
              *report(namespace, found), "(--no-check submits without checking)",
              sep="\n  ", file=sys.stderr)
        return 1
    return 0


def handle_lint(args: argparse.Namespace) -> int:
    import yaml

    docs: list[dict[str, Any]] = []
    for name in args.files:
        try:
            docs += [d for d in yaml.safe_load_all(Path(name).read_text()) if d]
        except (OSError, yaml.YAMLError) as exc:
            print(f"{name}: cannot read: {exc}", file=sys.stderr)
            return 2
    bad = [d for d in docs if not isinstance(d, dict)]
    if bad:
        print(f"expected YAML mappings, got {type(bad[0]).__name__}", file=sys.stderr)
        return 2
    problems = check_documents(docs, schema=not args.no_schema)
    for line in problems:
        print(line)
    print(f"{len(docs)} document(s), {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m aegis_flow.templates.cli render|lint …`` (until wired into aegis-flow)."""
    parser = argparse.ArgumentParser(prog="aegis-flow")
    add_parsers(parser.add_subparsers(dest="command_name", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
