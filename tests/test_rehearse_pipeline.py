"""W5: ``workflows/data_pipeline.yaml`` and the ``aegis-checks`` WorkflowTemplate, rehearsed.

The cluster: ``cpu-0`` (untainted) and ``gpu-0`` (tainted ``nvidia.com/gpu``, 8 GPUs). Images
are stood in: the training image's ``prep.py``/``train.py`` are ``tests/pipeline_image/``
(train checks every shard prep wrote against prep's checksums, and needs a passing gpu
report); the aegis-flow image is this checkout's ``aegis-flow``. No machine here has a GPU, so
the NVML the aegis image would see on a node is ``tests/fixtures/fake_nvml/pynvml.py``, put on
``PYTHONPATH`` by a scenario ``pods`` rule: a rule with ``host: gpu-0`` sets
``FAKE_NVML_GPUS`` (the GPUs the container was given) where the scenario says the node's GPUs
work; without it NVML reports no driver, as on a node that lost its GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_flow.argo.rehearse import netns
from aegis_flow.argo.rehearse.run import Result, load_workflow, rehearse
from aegis_flow.argo.rehearse.scenario import parse

REPO = Path(__file__).resolve().parents[1]
TRAIN_IMAGE = "registry.example.com/team/train:1.0"
FAKE_NVML = str(REPO / "tests" / "fixtures" / "fake_nvml")
_WHY = netns.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"rehearse needs namespaces: {_WHY}")


def scenario(*, gpus_work: bool) -> dict[str, Any]:
    nvml = {"PYTHONPATH": FAKE_NVML}
    rules: list[dict[str, Any]] = [{"match": "*", "env": nvml}]
    if gpus_work:
        rules.insert(0, {"match": "*", "host": "gpu-0", "env": {**nvml, "FAKE_NVML_GPUS": "1"}})
    return {
        "nodes": [{"name": "cpu-0", "allocatable": {"cpu": "16", "memory": "64Gi"}},
                  {"name": "gpu-0", "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                   "allocatable": {"cpu": "64", "memory": "1Ti", "nvidia.com/gpu": "8"}}],
        "images": {TRAIN_IMAGE: {"workingDir": str(REPO / "tests" / "pipeline_image")}},
        "pods": rules,
        "workflowTemplates": [str(REPO / "workflows" / "aegis_checks.yaml")],
    }


def pipeline(tmp_path: Path, *, gpus_work: bool) -> Result:
    wf = load_workflow(str(REPO / "workflows" / "data_pipeline.yaml"))
    return rehearse(wf, scenario=parse(scenario(gpus_work=gpus_work)), timeout=120,
                    keep=tmp_path / "run")


def test_data_pipeline_data_flows_and_the_gpu_check_passes_on_trains_node(tmp_path: Path
                                                                          ) -> None:
    """Succeeded: data-prep (cpu-0) wrote the shards on the ``data`` claim, train (gpu-0) read
    every one of them back, and the gpu check ran in train's pod, on gpu-0, with the GPU train
    got, and passed; its report reached train through the shared emptyDir."""
    r = pipeline(tmp_path, gpus_work=True)
    assert r.phase == "Succeeded", json.dumps(r.status, indent=1)
    prep, train = r.node("data-prep"), r.node("train")
    assert prep["hostNodeName"] == "cpu-0" and train["hostNodeName"] == "gpu-0"
    claim = f"{r.name}-data"  # createPVCs: <workflow>-<claim>
    assert r.status["persistentVolumeClaims"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    assert sorted(p.name for p in (tmp_path / "run" / "pvc" / claim / "shards").iterdir()) == [
        "MANIFEST.json", "shard-0.txt", "shard-1.txt", "shard-2.txt"]
    spec = r.pod_specs[train["id"]]
    check = next(c for c in spec["initContainers"] if c["name"] == "gpu-check")
    assert check["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # from the podSpecPatch
    main = next(c for c in spec["containers"] if c["name"] == "main")
    assert main["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert {"name": "AEGIS_EXPECT_GPUS", "value": "1"} in check["env"]
    pod_dir = next((tmp_path / "run" / "pods").glob(f"{r.name}-train-*"))
    summary = json.loads((pod_dir / "containers" / "main" / "tmp" / "train-summary.json")
                         .read_text())
    assert summary["shards"] == ["shard-0.txt", "shard-1.txt", "shard-2.txt"]
    assert summary["gpu"].startswith("gpu ok: 1 device(s)")


def test_data_pipeline_stops_before_training_on_a_node_whose_gpus_are_gone(tmp_path: Path
                                                                           ) -> None:
    """gpu-0's NVML reports no driver: the check expects 1 GPU, so it fails (not
    ``not_applicable``), the train pod fails in its init container, train's main never runs,
    and the workflow fails."""
    r = pipeline(tmp_path, gpus_work=False)
    assert r.phase == "Failed"
    assert r.node("data-prep")["phase"] == "Succeeded"
    train = r.node("train")
    assert train["phase"] == "Failed"
    assert train["message"] == "gpu-check: Error (exit code 1)"
    pod_dir = next((tmp_path / "run" / "pods").glob(f"{r.name}-train-*"))
    report = json.loads((pod_dir / "volumes" / "node-report" / "gpu-check.json").read_text())
    assert report[0]["status"] == "fail"
    assert "expected 1 GPU(s)" in report[0]["detail"]
    assert not (pod_dir / "containers" / "main" / "tmp" / "train-summary.json").exists()


CHECKS = ("bootcheck", "check-env", "check-io", "check-gpu", "check-runtime", "check-rdma",
          "check-all")


def every_check_workflow() -> dict[str, Any]:
    """A DAG calling each ``aegis-checks`` template through ``templateRef`` with its defaults,
    and a task that reads each one's ``result`` output."""
    tasks: list[dict[str, Any]] = [
        {"name": t, "templateRef": {"name": "aegis-checks", "template": t}} for t in CHECKS]
    tasks.append({"name": "collect", "template": "collect", "depends": " && ".join(CHECKS),
                  "arguments": {"parameters": [
                      {"name": "gpu", "value": "{{tasks.check-gpu.outputs.parameters.result}}"}]}})
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "every-check-"},
            "spec": {"entrypoint": "main", "templates": [
                {"name": "main", "dag": {"tasks": tasks}},
                {"name": "collect", "inputs": {"parameters": [{"name": "gpu"}]},
                 "container": {"image": "busybox",
                               "command": ["echo", "{{inputs.parameters.gpu}}"]}},
            ]}}


def test_every_aegis_checks_template_through_template_ref() -> None:
    """Each template of ``workflows/aegis_checks.yaml`` runs in the aegis image (not the
    caller's) on the GPU node with its GPU, and passes; ``check-gpu``'s ``result`` reaches the
    next task through ``{{tasks.check-gpu.outputs.parameters.result}}``."""
    r = rehearse(every_check_workflow(), scenario=parse(scenario(gpus_work=True)), timeout=240)
    assert r.phase == "Succeeded", json.dumps(
        {n["displayName"]: (n["phase"], n.get("message")) for n in r.status["nodes"].values()})
    for t in CHECKS:
        n = r.node(t)
        assert n["templateRef"] == {"name": "aegis-checks", "template": t}
        assert n["hostNodeName"] == "gpu-0" if t in ("bootcheck", "check-gpu", "check-all") \
            else n["phase"] == "Succeeded"
    result = json.loads(r.node("collect")["inputs"]["parameters"][0]["value"])
    assert [x["status"] for x in result] == ["pass"]
    wt = yaml.safe_load((REPO / "workflows" / "aegis_checks.yaml").read_text())
    images = {t["container"]["image"] for t in wt["spec"]["templates"]}
    assert images == {"{{inputs.parameters.aegis-image}}"}
