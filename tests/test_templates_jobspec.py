"""JobSpec: valid jobs parse; bad values are rejected with the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from aegis_flow.jobspec import JobSpec, JobSpecError

BASE = {"image": "img:1", "command": ["python", "train.py"]}


def test_defaults_and_the_cluster_nats() -> None:
    spec = JobSpec.parse(BASE)
    assert spec.workers == 2 and spec.max_retry == 3
    assert spec.cluster_nats_url == "nats://aegis-nats.default:4222"  # aegis-flow install's
    assert JobSpec.parse({**BASE, "nats_url": "nats://nats:4222"}).cluster_nats_url == \
        "nats://nats:4222"


@pytest.mark.parametrize(("field", "value", "says"), [
    ("workers", 0, "workers (0) must be between 1 and 4096"),
    ("max_retry", 80, "Argo's limit is 100"),
    ("name", "My_Job", "e.g. 'my-job'"),
    ("command", "python train.py", "['python', 'train.py']"),
    ("command", [], "the command is empty"),
    ("memory", "lots", "'lots' is not a Kubernetes quantity"),
    ("nats_url", "localhost:4222", "nats://HOST:4222"),
    ("image", "bad image", "is not an image reference"),
    ("gpus_per_worker", -1, "between 0 and 64"),
    ("connect_timeout", 5, "between 10 s and 7 days"),
    ("replace_timeout", 10**7, "between 10 s and 7 days"),
    ("slow_window", -1, "slow_window (-1 s) must be between 0 s"),
    ("nproc_per_node", 0, "nproc_per_node (0) must be between 1 and 64"),
    ("workrs", 3, "unknown field 'workrs': check the spelling"),
    ("node_selector", {"aegis.io/quarantined": "x"}, "already keeps workers off"),
])
def test_bad_values_are_named_with_the_fix(field: str, value: object, says: str) -> None:
    with pytest.raises(JobSpecError) as exc:
        JobSpec.parse({**BASE, field: value})
    assert says in str(exc.value)
    assert "Value error" not in str(exc.value)


def test_nproc_per_node_is_at_most_one_rank_per_gpu() -> None:
    with pytest.raises(JobSpecError, match=r"nproc_per_node \(4\) is more than the 2 GPU"):
        JobSpec.parse({**BASE, "gpus_per_worker": 2, "nproc_per_node": 4})
    assert JobSpec.parse({**BASE, "nproc_per_node": 4}).nproc_per_node == 4  # CPU: any


def test_missing_image_is_required() -> None:
    with pytest.raises(JobSpecError, match="image: is required"):
        JobSpec.parse({"command": ["x"]})


def test_from_file_accepts_dashed_keys(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("image: img:1\ncommand: [python, train.py]\nmax-retry: 5\n"
                   "gpus-per-worker: 8\ntolerations:\n- {key: gpu, operator: Exists}\n")
    spec = JobSpec.from_file(job)
    assert (spec.max_retry, spec.gpus_per_worker, spec.tolerations[0].key) == (5, 8, "gpu")


def test_from_file_rejects_a_non_mapping(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("- a\n- b\n")
    with pytest.raises(JobSpecError, match="expected a mapping"):
        JobSpec.from_file(job)


def test_bad_toleration_effect() -> None:
    with pytest.raises(JobSpecError, match="NoSchedule"):
        JobSpec.parse({**BASE, "tolerations": [{"key": "k", "effect": "Never"}]})


@pytest.mark.parametrize("arg, says", [
    ("echo {{", "'{{'"),  # an unclosed tag: Argo refuses the whole workflow
    ("--lr={{workflow.parameters.lr}}", "Argo would replace {{...}}"),
    ("echo }}", "'}}'"),
    ("echo $(date)", "write $$(date)"),
    ("--addr=$(POD_IP):4222", "write $$(POD_IP)"),
])
def test_commands_argo_or_the_kubelet_would_mangle_are_refused(arg: str, says: str) -> None:
    """Hera would write invalid YAML for an unbalanced '{{' (the review's render with rc 0);
    Argo and the kubelet would change the others silently."""
    with pytest.raises(JobSpecError) as err:
        JobSpec.parse({**BASE, "command": ["sh", "-c", arg]})
    assert says in str(err.value)


def test_the_kubelet_escape_passes() -> None:
    spec = JobSpec.parse({**BASE, "command": ["sh", "-c", "echo $$(date) $HOME ${X}"]})
    assert spec.command[2] == "echo $$(date) $HOME ${X}"
