"""An API server that accepts and never answers holds nothing for ever.

Unit tier: the real ``kubernetes`` client (``KubeNodeApi``) against a real socket that accepts
connections and never writes a byte: every call ends with a retryable ``NodeApiError`` within
its bound. The master's wait for the node labels it is still writing is bounded and says so.
Real tier: a real master (``--quarantine-nodes``, the kubeconfig naming that socket) and a real
nats-server; rank 1 fails its bootcheck with a hardware fault, so the master labels its node
on Kubernetes — and the call hangs. SIGTERM still ends the master within its bound (it used
to wait for the call for ever: the executor's threads are joined at exit, and the client had
no timeout).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from aegis_flow import protocol as p
from aegis_flow.k8s.api import FakeNodeApi, NodeApiError
from aegis_flow.k8s.client import KubeNodeApi
from aegis_flow.local.natsserver import EmbeddedNats
from aegis_flow.master import model as mm
from aegis_flow.master.runtime import NODE_JOBS_WAIT, Master, MasterConfig
from tests.fake_ranks import rank1_fails_bootcheck
from tests.http_recorder import black_hole
from tests.jobs import Proc


def _bounded(fn: Any, limit: float) -> tuple[BaseException | None, float]:
    """Call ``fn`` in a thread; its exception and time, or fail at ``limit`` s (a call that
    hangs fails the test instead of hanging it)."""
    out: list[BaseException | None] = []
    started = time.monotonic()

    def run() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert out, f"the call still hangs after {limit:g} s"
    return out[0], time.monotonic() - started


def test_an_api_server_that_never_answers_is_a_retryable_error_within_the_bound() -> None:
    with black_hole() as hole:
        api = KubeNodeApi.from_host(hole.url, timeout=(1.0, 1.0))
        for call in (lambda: api.get_node("gpu-1"), lambda: api.list_nodes(),
                     lambda: api.patch_node("gpu-1", {"metadata": {"labels": {"a": "b"}}}),
                     lambda: api.pods_at("default", "10.0.0.7")):
            exc, took = _bounded(call, 20)
            assert isinstance(exc, NodeApiError) and exc.retryable, exc
            assert "timed out" in str(exc).lower(), exc
            # a GET reads twice (one retry), a PATCH once
            assert took < 4.5, took


def test_the_default_bound_is_set_on_every_call() -> None:
    """Every call carries the (connect, read) bound unless it names its own."""
    seen: list[Any] = []

    class Core:
        api_client = None

        def read_node(self, name: str, **kw: Any) -> None:
            seen.append(kw.get("_request_timeout"))
            raise OSError("refused")

    api = KubeNodeApi(Core(), timeout=(2.0, 3.0))
    with pytest.raises(NodeApiError):
        api.get_node("n")
    assert seen == [(2.0, 3.0)]


class _StuckNodes(FakeNodeApi):
    """A NodeApi whose patch blocks until released (an API server holding the call)."""

    def __init__(self) -> None:
        super().__init__([{"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": "gpu-2", "labels": {}}, "spec": {}}])
        self.release = threading.Event()

    def patch_node(self, name: str, body: dict[str, Any]) -> Any:
        self.release.wait(30)
        return super().patch_node(name, body)


def test_an_ending_master_waits_for_node_labels_only_so_long(
        caplog: pytest.LogCaptureFixture) -> None:
    api = _StuckNodes()

    async def go() -> tuple[bool, float, bool]:
        master = Master(MasterConfig(job="job-7", workers=2, observe=False), nodes=api)
        await master._execute(mm.Quarantine(rank=1, node="gpu-2"))
        started = time.monotonic()
        done = await master.node_jobs_done(0.5)
        took = time.monotonic() - started
        api.release.set()  # the call ends: a second wait finds nothing left
        return done, took, await master.node_jobs_done(10)

    with caplog.at_level(logging.WARNING, logger="aegis_flow.master"):
        done, took, later = asyncio.run(go())
    assert not done and 0.4 < took < 3, took
    assert later
    assert "1 node label call(s) still wait on the Kubernetes API after 0.5 s" in caplog.text
    assert api.get_node("gpu-2").quarantined


@pytest.mark.e2e
def test_a_master_whose_api_server_never_answers_still_ends_on_sigterm(
        tmp_path: Path) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"0": "gpu-1", "1": "gpu-2"}))
    subjects = p.Subjects("default", "j")
    with black_hole() as hole, EmbeddedNats(tmp_path / "nats") as server:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": hole.url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        env = {**os.environ, "KUBECONFIG": str(kubeconfig),
               "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        master = Proc([sys.executable, "-m", "aegis_flow.master", "--job", "j", "--workers",
                       "2", "--nats-url", server.url, "--node-file", str(nodes),
                       "--quarantine-nodes", "--replace-timeout", "600"],
                      env, tmp_path, label="master")
        try:
            async def go() -> None:
                nc = await nats.connect(server.url)
                await rank1_fails_bootcheck(nc, subjects, lambda: master.output)
                await nc.close()

            asyncio.run(go())
            master.wait_for("node gpu-2 of rank 1 quarantined", timeout=30)
            assert hole.accepted.wait(30), master.output  # the label call is held there
            started = time.monotonic()
            master.proc.send_signal(signal.SIGTERM)
            code = master.wait(NODE_JOBS_WAIT + 20)
            took = time.monotonic() - started
        finally:
            master.kill()
    assert code == 143, master.output
    assert took < NODE_JOBS_WAIT + 10, (took, master.output)
    assert "node label call(s) still wait on the Kubernetes API" in master.output or \
        "timed out" in master.output, master.output
