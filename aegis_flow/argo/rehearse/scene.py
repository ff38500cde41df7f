"""What a scenario puts around the workflow: cluster objects that exist before it starts
(``objects:``, standing in for what ``aegis-flow install`` creates) and faults done to its pods
while they run (``faults:``).

Object Pods run as workflow pods do (``pods.PodRun``: own network namespace, Secrets from the
rehearsal's secrets directory, commands on this machine's filesystem), placed by the same
scheduler on the scenario's nodes, with their own labels (a Service selects them); they have no
Argo ``main``/``wait`` containers and run until the rehearsal ends (``restartPolicy`` is not
modelled: a container that exits is not restarted). Object Services are created in the
``objects.ObjectStore`` as if applied by an administrator (no RBAC check).

Faults are checked once per operator pass (every 0.2 s or on a pod's change): a fault fires,
at most once, on the first running pod whose node matches it, once its ``main`` container has
run ``after`` seconds and (with ``when-log``) its stdout or stderr contains the text.

Side effects: pods (processes, namespaces), Services (addresses, proxy threads).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from aegis_flow.argo.rehearse.cluster import Placement, schedule
from aegis_flow.argo.rehearse.netns import Network
from aegis_flow.argo.rehearse.objects import ObjectStore
from aegis_flow.argo.rehearse.pods import PodContext, PodRun
from aegis_flow.argo.rehearse.scenario import Fault


class ObjectError(RuntimeError):
    """A scenario object could not be created or did not become ready: one line."""


class ObjectPods:
    """The scenario's Pods and Services, created in order."""

    def __init__(self, objects: Iterable[dict[str, Any]], *, store: ObjectStore,
                 nodes: Callable[[], list[dict[str, Any]]], used: dict[str, dict[str, int]],
                 ctx: PodContext, net: Network, log: Callable[[str], None]) -> None:
        self.objects = list(objects)
        self.store, self.nodes, self.used, self.ctx, self.net = store, nodes, used, ctx, net
        self.log = log
        self.pods: dict[str, PodRun] = {}  # "ns/name" -> pod
        self.placements: dict[str, Placement] = {}

    def start(self) -> None:
        for obj in self.objects:
            meta = obj.get("metadata") or {}
            ns = str(meta.get("namespace") or "default")
            name = str(meta["name"])
            if obj["kind"] == "Service":
                try:
                    self.store.create("services", ns, obj)
                except Exception as exc:
                    raise ObjectError(f"scenario object Service {ns}/{name}: {exc}") from None
                continue
            spec = dict(obj.get("spec") or {})
            placement = schedule(spec, self.nodes(), self.used)
            if not isinstance(placement, Placement):
                raise ObjectError(f"scenario object Pod {ns}/{name} cannot be scheduled: "
                                  f"{placement.condition_message}")
            for res, qty in placement.requests.items():
                self.used.setdefault(placement.node, {}).setdefault(res, 0)
                self.used[placement.node][res] += int(qty)
            self.placements[f"{ns}/{name}"] = placement
            pod = PodRun(name, spec, node=placement.node,
                         labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
                         annotations={str(k): str(v) for k, v in
                                      (meta.get("annotations") or {}).items()},
                         ctx=dataclasses.replace(self.ctx, namespace=ns), net=self.net,
                         main=None)
            self.pods[f"{ns}/{name}"] = pod
            self.log(f"object pod {ns}/{name} on {placement.node}")
            pod.start()

    def wait_ready(self, timeout: float) -> None:
        """Until every object Pod is ready (all containers ready), or ``ObjectError`` naming
        the first that is not (with what its containers said)."""
        end = time.monotonic() + timeout
        while True:
            waiting = [(k, p) for k, p in self.pods.items() if not p.serving]
            if not waiting:
                return
            for key, pod in waiting:
                if pod.done:
                    said = f": {pod.view.message}" if pod.view.message else ""
                    raise ObjectError(f"scenario object Pod {key} ended before it was ready "
                                      f"({pod.view.phase}{said}){_tail(pod)}")
            if time.monotonic() > end:
                key, pod = waiting[0]
                why = f"{pod.view.reason}: {pod.view.message}" if pod.view.message else \
                    pod.view.phase
                raise ObjectError(f"scenario object Pod {key} was not ready within "
                                  f"{timeout:g} s ({why}){_tail(pod)}")
            time.sleep(0.1)

    def sources(self) -> Iterable[PodRun]:
        return list(self.pods.values())

    def stop(self) -> None:
        for pod in self.pods.values():
            if not pod.done:
                pod.kill("rehearsal ended")
        for pod in self.pods.values():
            pod.join(60)


def _tail(pod: PodRun) -> str:
    for name in pod.view.containers:
        err = pod.stderr(name).strip().splitlines()
        if err:
            return f"; {name} stderr: {err[-1]}"
    return ""


def _run_into(run: Callable[[tuple[str, ...]], dict[str, Any]], command: tuple[str, ...],
              record: dict[str, Any], log: Callable[[str], None]) -> None:
    record.update(run(command))
    log(f"fault: exec {' '.join(command)} -> exit {record.get('rc')}")


class Faults:
    """The scenario's ``faults:``; ``check`` is called once per operator pass."""

    def __init__(self, faults: Iterable[Fault], log: Callable[[str], None], *,
                 operator: Callable[[tuple[str, ...]], dict[str, Any]] | None = None) -> None:
        self.pending = list(faults)
        self.fired: list[dict[str, Any]] = []
        self.log = log
        self.operator = operator  # exec: runs a command from the cluster network
        self.threads: list[threading.Thread] = []

    def _exec(self, command: tuple[str, ...], record: dict[str, Any]) -> None:
        if self.operator is None:
            record.update(rc=None, output="no operator runner")
            return
        t = threading.Thread(target=_run_into, args=(self.operator, command, record, self.log),
                             daemon=True)
        t.start()
        self.threads.append(t)

    def join(self, timeout: float = 60.0) -> None:
        for t in self.threads:
            t.join(timeout)

    def check(self, pods: dict[str, PodRun], nodes: dict[str, dict[str, Any]],
              wake: Callable[[], None]) -> None:
        now = time.time()
        for fault in list(self.pending):
            for nid, pod in list(pods.items()):
                node = nodes.get(nid)
                if node is None or pod.done or pod.deleting:
                    continue
                if not (fault.matches(node["name"], node.get("templateName", "")) or
                        fault.matches(node["displayName"], node.get("templateName", ""))):
                    continue
                main = pod.view.containers.get("main")
                if main is None or main.started_at is None or main.exit_code is not None:
                    continue
                if now - main.started_at < fault.after:
                    continue
                if fault.when_log is not None and fault.when_log not in pod.logs("main"):
                    continue
                record = {"action": fault.action, "match": fault.match, "node": node["name"],
                          "displayName": node["displayName"], "pod": pod.name,
                          "after": round(now - main.started_at, 3)}
                if fault.action == "kill":
                    pod.kill_main()
                elif fault.action == "delete-pod":
                    pod.delete()
                else:  # exec, in a thread: the operator loop goes on meanwhile
                    self._exec(fault.command, record)
                self.fired.append(record)
                self.pending.remove(fault)
                self.log(f"fault: {fault.action} pod {pod.name} ({node['displayName']}, "
                         f"{record['after']:g} s after main started)")
                wake()
                break
