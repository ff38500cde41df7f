"""``aegis-flow nodes list|quarantine|release`` and ``aegis-flow install``: thin, over
``ops``, ``client`` and ``install``.

Side effects: Kubernetes API calls (nodes), or reading/writing the ``--fake-cluster`` JSON
file instead; writing ``--record``/``-o`` files; printing. ``kubernetes`` loads only when a
command talks to a real cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from aegis_flow.k8s.api import FakeNodeApi, NodeApi, NodeApiError
from aegis_flow.k8s.nodes import Record
from aegis_flow.settings import env_value


def add_parsers(sub: Any) -> None:
    n = sub.add_parser("nodes", help="list, quarantine and release Kubernetes nodes",
                       description="Quarantine labels the node aegis.io/quarantined=true, "
                       "taints it aegis.io/quarantined=true:NoSchedule and annotates the "
                       "reason, time and who; release removes exactly that. Each NODE is "
                       "handled on its own; exit 1 if any failed.")
    n.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then "
                   "$KUBECONFIG / ~/.kube/config)")
    n.add_argument("--context", help="kubeconfig context")
    n.add_argument("--fake-cluster", type=Path, metavar="FILE",
                   help="operate on a JSON list of Node objects in FILE instead of a cluster")
    n.add_argument("--json", action="store_true", help="print JSON")
    ns = n.add_subparsers(dest="nodes_command", metavar="ACTION", required=True)
    ls = ns.add_parser("list", help="quarantined nodes (--all: every node)")
    ls.add_argument("--all", action="store_true")
    q = ns.add_parser("quarantine", help="quarantine NODE...")
    q.add_argument("names", nargs="+", metavar="NODE")
    q.add_argument("--reason", required=True, help="why (kept in an annotation)")
    q.add_argument("--by", default=env_value("AEGIS_JOB", "") or os.environ.get("USER")
                   or "aegis-flow", help="who quarantines (default: $AEGIS_JOB or $USER)")
    q.add_argument("--no-taint", dest="taint", action="store_false",
                   help="label only (aegis-flow pods avoid it; other pods may still land)")
    q.add_argument("--record", metavar="FILE",
                   help="also write the records as JSON to FILE (the workflow step output)")
    r = ns.add_parser("release", help="release NODE...")
    r.add_argument("names", nargs="+", metavar="NODE")
    n.set_defaults(handler=handle_nodes)
    b = sub.add_parser(
        "bootstrap-token", help="make one workflow's bootstrap token Secret (its first step)",
        description="Create the Secret SECRET (key 'token': 256 random bits, made here, never "
        "written anywhere else) owned by the workflow, so Kubernetes deletes it with the "
        "workflow. An existing Secret is kept (a retried step). Needs 'secrets create' in the "
        "namespace (aegis-flow install grants it to the master's account).")
    b.add_argument("--namespace", required=True)
    b.add_argument("--secret", required=True, help="the Secret's name (<workflow>-bootstrap)")
    b.add_argument("--workflow", required=True, help="the owning workflow's name")
    b.add_argument("--workflow-uid", required=True, help="... and its uid")
    b.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster)")
    b.add_argument("--context", help="kubeconfig context")
    b.set_defaults(handler=handle_bootstrap_token)
    i = sub.add_parser(
        "install", help="render the cluster-side manifests (RBAC, aegis-checks, NATS)",
        description="Render, validate and print what a namespace needs before jobs run: the "
        "service accounts and RBAC (nodes get/list/patch for quarantine, pods get/list, the "
        "master's Service, Argo's workflowtaskresults), the aegis-checks WorkflowTemplate, a "
        "NATS server for cluster mode (JetStream on a volume claim, operator mode from the auth "
        "Secret) and, with --create-secrets, the auth and bootstrap Secrets. "
        "Apply with: aegis-flow install -o aegis.yaml && kubectl apply -f aegis.yaml")
    i.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    i.add_argument("--namespace", default="default")
    i.add_argument("--service-account", default="aegis-flow",
                   help="the account that may patch nodes (the master, the quarantine step)")
    i.add_argument("--executor-service-account", default="aegis-flow-executor",
                   help="every other pod's account: Argo's executor rights only")
    i.add_argument("--aegis-image", default=None, help="image of the check templates")
    i.add_argument("--no-nats", dest="nats", action="store_false",
                   help="no NATS server (render jobs with --nats-url of your own, JetStream on)")
    i.add_argument("--nats-image", default="nats:2.10-alpine")
    i.add_argument("--nats-storage", default="1Gi", help="JetStream volume size")
    i.add_argument("--auth-secret", default="aegis-auth",
                   help="Secret with the operator-mode nats.conf and the master's keys "
                   "(aegis-flow nats-bootstrap)")
    i.add_argument("--bootstrap-secret", default="aegis-bootstrap",
                   help="Secret with a bootstrap token (key 'token') for jobs rendered with "
                   "--bootstrap-secret (by default each workflow makes its own)")
    i.add_argument("--create-secrets", type=Path, metavar="DIR",
                   help="also render both Secrets: the NATS operator keys are made (once; "
                   "existing ones are kept) in DIR as 'aegis-flow nats-bootstrap DIR' does, the "
                   "token kept in DIR/bootstrap-token; the offline seeds stay in DIR. Without "
                   "it, the commands that create the Secrets are printed")
    i.set_defaults(handler=handle_install)


def handle_bootstrap_token(args: argparse.Namespace) -> int:
    from aegis_flow.k8s.client import KubeNodeApi
    from aegis_flow.k8s.token import mint

    try:
        api = KubeNodeApi.connect(kubeconfig=args.kubeconfig, context=args.context)
        made = mint(api, namespace=args.namespace, secret=args.secret,
                    workflow=args.workflow, uid=args.workflow_uid)
    except (NodeApiError, ValueError) as exc:
        print(f"aegis-flow bootstrap-token: {exc}", file=sys.stderr)
        return 1
    print(f"{'created' if made else 'kept the existing'} Secret {args.namespace}/{args.secret}"
          f" (owned by workflow {args.workflow})")
    return 0


def _api(args: argparse.Namespace) -> NodeApi:
    if args.fake_cluster is not None:
        try:
            return FakeNodeApi(json.loads(args.fake_cluster.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NodeApiError(f"--fake-cluster {args.fake_cluster}: {exc}") from None
    from aegis_flow.k8s.client import KubeNodeApi

    return KubeNodeApi.connect(kubeconfig=args.kubeconfig, context=args.context)


def _save(args: argparse.Namespace, api: NodeApi) -> None:
    if args.fake_cluster is not None and isinstance(api, FakeNodeApi):
        args.fake_cluster.write_text(json.dumps(list(api.nodes.values()), indent=1))


def _print_records(records: list[Record], as_json: bool) -> None:
    if as_json:
        print(json.dumps([r.to_dict() for r in records], indent=1))
        return
    for r in records:
        detail = r.error or " ".join(x for x in (r.reason and f"reason={r.reason!r}",
                                                 r.at and f"at={r.at}", r.by and f"by={r.by}")
                                     if x)
        print(f"{r.node:<32} {r.action:<20} {detail}")


def handle_nodes(args: argparse.Namespace) -> int:
    from aegis_flow.k8s import ops

    try:
        api = _api(args)
        if args.nodes_command == "list":
            nodes = api.list_nodes(None if args.all else "aegis.io/quarantined")
            if args.json:
                print(json.dumps([{"name": n.name, "quarantined": n.quarantined,
                                   "reason": n.reason, "since": n.since, "by": n.by,
                                   "ready": n.ready} for n in nodes], indent=1))
            else:
                print(f"{'NODE':<32} {'READY':<6} {'QUARANTINED':<12} {'SINCE':<21} REASON")
                for n in nodes:
                    print(f"{n.name:<32} {str(n.ready).lower():<6} "
                          f"{str(n.quarantined).lower():<12} {n.since or '-':<21} "
                          f"{n.reason or '-'}")
            return 0
        if args.nodes_command == "quarantine":
            records = ops.quarantine(api, args.names, reason=args.reason, now=time.time(),
                                     by=args.by, taint=args.taint)
            if args.record:
                Path(args.record).parent.mkdir(parents=True, exist_ok=True)
                Path(args.record).write_text(json.dumps([r.to_dict() for r in records]))
        else:
            records = ops.release(api, args.names)
        _save(args, api)
    except NodeApiError as exc:
        print(f"aegis-flow nodes: {exc}", file=sys.stderr)
        return 2
    _print_records(records, args.json)
    return 1 if any(r.error for r in records) else 0


def _secret_docs(opts: Any, directory: Path) -> list[dict[str, Any]]:
    """Make (once) the NATS operator keys and the bootstrap token in ``directory``; return the
    two Secret documents with the master's files, ``nats.conf`` and the token."""
    from aegis_flow.k8s.install import secrets
    from aegis_flow.k8s.preflight import AUTH_KEYS
    from aegis_flow.security.operator import AuthDirError, bootstrap
    from aegis_flow.security.tokens import new_token, read_token, write_token

    try:
        auth = bootstrap(directory)
        auth.write_server_config()
    except AuthDirError as exc:
        raise ValueError(str(exc)) from None
    token_file = directory / "bootstrap-token"
    if not token_file.is_file():
        write_token(token_file, new_token())
    token = read_token(path=str(token_file))
    files = {k: (directory / k).read_text() for k in AUTH_KEYS}
    from aegis_flow.security import tls

    tls_files = tls.ensure(directory / "grpc-tls", opts.grpc_server_name)
    return secrets(opts, auth_files=files, token=token, tls_files=tls_files)


def handle_install(args: argparse.Namespace) -> int:
    import yaml

    from aegis_flow.jobspec import DEFAULT_AEGIS_IMAGE
    from aegis_flow.k8s.install import InstallOptions, manifests
    from aegis_flow.templates.cli import check_documents

    opts = InstallOptions(namespace=args.namespace, service_account=args.service_account,
                          executor_service_account=args.executor_service_account,
                          aegis_image=args.aegis_image or DEFAULT_AEGIS_IMAGE, nats=args.nats,
                          nats_image=args.nats_image, nats_storage=args.nats_storage,
                          auth_secret=args.auth_secret, bootstrap_secret=args.bootstrap_secret)
    secret_docs = None
    if args.create_secrets is not None:
        try:
            secret_docs = _secret_docs(opts, args.create_secrets)
        except (OSError, ValueError) as exc:
            print(f"aegis-flow install: cannot make the Secrets in {args.create_secrets}: {exc}",
                  file=sys.stderr)
            return 2
    docs = manifests(opts, secret_docs=secret_docs)
    problems = check_documents(docs)
    if problems:  # a bad --namespace or --service-account, or a bug in the renderer
        print("aegis-flow install: the manifests are invalid:", *problems, sep="\n  ",
              file=sys.stderr)
        return 1
    text = yaml.safe_dump_all(docs, sort_keys=False)
    if args.output == "-":
        sys.stdout.write(text)
    elif secret_docs:  # keys in the file: readable by its owner only
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        print(f"wrote {args.output} ({len(docs)} objects, with the Secrets {opts.auth_secret}, "
              f"{opts.bootstrap_secret} and {opts.grpc_tls_secret}: mode 0600, keep it "
              "private)", file=sys.stderr)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output} ({len(docs)} objects)", file=sys.stderr)
    if not secret_docs:
        from aegis_flow.k8s.preflight import auth_secret_commands, bootstrap_secret_command

        print(f"not rendered: the Secrets {opts.auth_secret}, {opts.bootstrap_secret} and "
              f"{opts.grpc_tls_secret}; jobs' pods never start without them. Create them once "
              "(or install with --create-secrets DIR):",
              *auth_secret_commands(opts.namespace, opts.auth_secret),
              bootstrap_secret_command(opts.namespace, opts.bootstrap_secret),
              f"kubectl -n {opts.namespace} create secret generic {opts.grpc_tls_secret} "
              "--from-file=ca.crt=PATH --from-file=tls.crt=PATH --from-file=tls.key=PATH   "
              f"# a certificate for {opts.grpc_server_name}, signed by ca.crt",
              sep="\n  ", file=sys.stderr)
    if opts.nats:
        print(f"jobs in {opts.namespace}: aegis-flow render --namespace {opts.namespace} "
              f"--nats-url {opts.nats_url} ...", file=sys.stderr)
    return 0
