"""``aegis-flow submit``: Hera's WorkflowsService against a local recording HTTP server
standing in for the Argo Server; the POST body must be the rendered workflow."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_flow.argo.submit import SubmitError, bearer, submit
from aegis_flow.cli import main
from aegis_flow.jobspec import JobSpec
from aegis_flow.workflow import render
from tests.http_recorder import Request, recording_server

ARGS = ["--workers", "4", "--max-retry", "3", "--image", "IMG", "--namespace", "ml"]


def created(req: Request) -> tuple[int, Any]:
    wf = req.json()["workflow"]
    meta = {**wf["metadata"], "name": wf["metadata"]["generateName"] + "x7k2p", "uid": "u-1"}
    return 200, {**wf, "metadata": meta}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> Callable[..., Result]:
    """``aegis-flow submit ARGS`` in this process (the CLI entry, not a subprocess: faster)."""
    def run(*args: str, env: dict[str, str]) -> Result:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        code = main(["submit", *args])
        out = capsys.readouterr()
        return Result(code, out.out, out.err)
    return run


def test_submit_posts_the_rendered_workflow_with_the_token(cli: Callable[..., Result]) -> None:
    with recording_server() as srv:
        srv.on("POST", "/api/v1/workflows/ml", created)
        out = cli("--argo-server", srv.url, "--no-check", *ARGS, "--", "python", "train.py",
                  env={"ARGO_TOKEN": "Bearer s3cret"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "submitted ml/aegis-job-x7k2p"
    (req,) = srv.requests
    assert (req.method, req.path) == ("POST", "/api/v1/workflows/ml")
    assert req.headers["authorization"] == "Bearer s3cret"
    spec = JobSpec(image="IMG", command=("python", "train.py"), workers=4, max_retry=3,
                   namespace="ml")
    assert req.json()["workflow"] == render(spec)  # exactly what render writes


def test_submit_a_rendered_file_as_it_is(tmp_path: Path, cli: Callable[..., Result]) -> None:
    wf = tmp_path / "wf.yaml"
    assert main(["render", *ARGS, "-o", str(wf), "--", "python", "train.py"]) == 0
    with recording_server() as srv:
        srv.on("POST", "/api/v1/workflows/ml", created)
        out = cli("--argo-server", srv.url, "--workflow", str(wf), "--no-check",
                  env={"ARGO_TOKEN": "abc"})
    assert out.returncode == 0, out.stderr
    assert srv.requests[0].headers["authorization"] == "Bearer abc"  # bare token: prefixed
    assert srv.requests[0].json()["workflow"] == yaml.safe_load(wf.read_text())


def test_an_invalid_workflow_is_never_sent(tmp_path: Path, cli: Callable[..., Result]) -> None:
    doc = render(JobSpec(image="IMG", command=("python", "t.py")))
    doc["spec"]["entrypoint"] = "no-such-template"  # planted
    wf = tmp_path / "bad.yaml"
    wf.write_text(yaml.safe_dump(doc))
    with recording_server() as srv:
        out = cli("--argo-server", srv.url, "--workflow", str(wf), env={"ARGO_TOKEN": "t"})
    assert out.returncode == 1 and "not submitted" in out.stderr
    assert srv.requests == []


@pytest.mark.parametrize(("status", "text", "retryable"), [
    (401, "ARGO_TOKEN", False), (403, "may not create", False), (500, "refused", True)])
def test_server_errors_say_what_to_do(status: int, text: str, retryable: bool) -> None:
    with recording_server() as srv:
        srv.on("POST", "/api/v1/workflows/default", (status, {"code": 16, "message": "no"}))
        with pytest.raises(SubmitError, match=text) as info:
            submit(render(JobSpec(image="I", command=("c",))), server=srv.url, token="t",
                   namespace="default")
    assert info.value.retryable == retryable


def test_an_unreachable_server_and_a_url_without_scheme() -> None:
    doc = render(JobSpec(image="I", command=("c",)))
    with recording_server() as srv:
        url = srv.url
    with pytest.raises(SubmitError, match="cannot reach") as info:
        submit(doc, server=url, token="t", namespace="default")
    assert info.value.retryable
    with pytest.raises(SubmitError, match="needs a scheme"):
        submit(doc, server="argo.example.com:2746", token="t", namespace="default")
    assert bearer("x") == "Bearer x" and bearer("Bearer y") == "Bearer y"


def test_render_flags_for_the_bundle_and_the_metrics_port(tmp_path: Path) -> None:
    out = tmp_path / "wf.yaml"
    assert main(["render", "--image", "I", "--python", "/opt/conda/bin/python",
                 "--metrics-port", "9100", "-o", str(out), "--", "python", "t.py"]) == 0
    t = {x["name"]: x for x in yaml.safe_load(out.read_text())["spec"]["templates"]}
    assert t["worker"]["container"]["command"][:2] == ["/opt/conda/bin/python",
                                                       "/aegis/aegis-supervisor.pyz"]
    assert t["master"]["container"]["readinessProbe"]["httpGet"]["port"] == 9100
    assert main(["render", "--image", "I", "--no-bundle", "-o", str(out), "--", "x"]) == 0
    t = {x["name"]: x for x in yaml.safe_load(out.read_text())["spec"]["templates"]}
    assert t["worker"]["container"]["command"][:2] == ["aegis-flow", "worker"]


def test_render_slow_window_reaches_the_masters_arguments(tmp_path: Path) -> None:
    out = tmp_path / "wf.yaml"
    assert main(["render", "--image", "I", "--slow-window", "300", "-o", str(out), "--",
                 "x"]) == 0
    t = {x["name"]: x for x in yaml.safe_load(out.read_text())["spec"]["templates"]}
    args = t["master"]["container"]["args"]
    assert args[args.index("--slow-window") + 1] == "300"
