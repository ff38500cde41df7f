"""A 4,096-rank job renders, lints and fits Argo's and the kernel's limits (review B6), and the
size checks catch what would not fit."""

from __future__ import annotations

import copy
import json

import pytest

from aegis_flow.argo import lint, scale
from aegis_flow.jobspec import JobSpec
from aegis_flow.templates import cli
from aegis_flow.workflow import render

SPEC = JobSpec(image="img:1", command=("python", "train.py"), workers=4096, gpus_per_worker=8)


@pytest.fixture(scope="module")
def wf4096() -> dict:  # type: ignore[type-arg]
    return render(SPEC)


def test_4096_ranks_render_and_lint(wf4096: dict) -> None:  # type: ignore[type-arg]
    assert lint([wf4096]) == []
    run = next(s for g in wf4096["spec"]["templates"][0]["steps"] for s in g
               if s["name"] == "run")
    assert run["withSequence"] == {"count": "4096"}


def test_nothing_rendered_grows_with_the_ranks(wf4096: dict) -> None:  # type: ignore[type-arg]
    """No env var or argument is sized by the number of ranks: the longest string of a
    4,096-rank workflow is the longest of a 2-rank one, far under 128 KiB."""
    small = render(SPEC.model_copy(update={"workers": 2}))
    assert scale.longest_string(wf4096)[1] == scale.longest_string(small)[1] < 4096
    assert scale.longest_string(wf4096)[1] < scale.MAX_ARG_STRLEN


def test_the_status_of_4096_ranks_fits_once_argo_compresses_it(
        wf4096: dict) -> None:  # type: ignore[type-arg]
    size = scale.status_size(wf4096, 4096, pods_per_rank=2)
    assert size.nodes == 2 * 4096 + 4096 + 11
    assert size.compressed_by_argo and not size.needs_offloading
    # many pod retries per rank: past the limit even compressed
    assert scale.status_size(wf4096, 4096, pods_per_rank=5).needs_offloading


def test_a_small_job_is_left_as_it_is() -> None:
    wf = render(SPEC.model_copy(update={"workers": 3}))
    size = scale.status_size(wf, 3)
    assert size.nodes == 2 * 3 + 11 and size.raw < scale.MAX_WORKFLOW_SIZE
    assert not size.compressed_by_argo and scale.warnings(wf, 3) == []


def test_a_planted_env_var_sized_by_the_ranks_is_caught(wf4096: dict) -> None:  # type: ignore[type-arg]
    """B6's verdict input (the ranks' outputs in one env var) planted back in."""
    bad = copy.deepcopy(wf4096)
    runs = json.dumps([{"outcome": "succeeded", "node": f"ip-10-0-{i // 250}-{i % 250}"}
                       for i in range(4096)])
    bad["spec"]["templates"][-1].setdefault("script", {}).setdefault("env", []).append(
        {"name": "RUNS", "value": runs})
    notes = scale.warnings(bad, 4096)
    assert any("over the kernel's 131072-byte limit" in n for n in notes), notes


def test_render_says_what_a_large_job_needs(capsys: pytest.CaptureFixture[str],
                                            tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["render", "--workers", "4096", "--image", "img:1", "-o",
                     str(tmp_path / "wf.yaml"), "--", "python", "t.py"]) == 0
    assert "Argo will keep it compressed" in capsys.readouterr().err
    assert cli.main(["render", "--workers", "8", "--image", "img:1", "-o",
                     str(tmp_path / "wf8.yaml"), "--", "python", "t.py"]) == 0
    assert "note:" not in capsys.readouterr().err
