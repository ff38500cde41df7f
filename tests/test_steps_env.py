"""Bootcheck's environment report and the "multiple versions" verdict across workers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aegis_flow.steps.base import CheckStatus
from aegis_flow.steps.env import check_env, compare_env, env_report

BASE = {"python": "3.11.7", "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3",
        "cudnn": "91000", "device_count": 8, "device_name": "NVIDIA H200", "host": "n"}


def workers(n: int, **odd: dict[str, Any]) -> dict[int, dict[str, Any]]:
    out = {r: {**BASE, "host": f"node-{r}"} for r in range(n)}
    for rank, change in odd.items():
        out[int(rank.removeprefix("r"))].update(change)
    return out


def test_report_on_this_machine() -> None:
    pytest.importorskip("torch")
    report = env_report()
    assert report["torch"].startswith("2.") and report["python"].count(".") == 2
    assert report["device_count"] == 0 and report["device_name"] is None and report["host"]
    json.dumps(report)  # it travels over NATS
    r = check_env()
    assert r.status is CheckStatus.PASS and r.data["torch"] == report["torch"]


def test_identical_workers_are_ok_whatever_their_host() -> None:
    verdict = compare_env(workers(4))
    assert verdict.ok and verdict.verdict == "ok" and verdict.odd_ranks == []


def test_mismatched_torch_names_the_odd_worker() -> None:
    verdict = compare_env(workers(4, r2={"torch": "2.12.1"}))
    assert verdict.verdict == "multiple versions" and not verdict.ok
    assert dict(verdict.odd) == {"torch": [2]} and verdict.majority["torch"] == "2.13.0"
    assert "rank(s) 2" in verdict.detail and "2.12.1" in verdict.detail
    json.dumps(verdict.to_dict())


def test_each_key_names_its_own_odd_workers() -> None:
    verdict = compare_env(workers(5, r0={"cuda": "12.4"}, r3={"device_count": 7},
                                  r4={"device_count": 7}))
    assert dict(verdict.odd) == {"cuda": [0], "device_count": [3, 4]}
    assert verdict.odd_ranks == [0, 3, 4]


def test_a_tie_names_every_worker() -> None:
    verdict = compare_env(workers(4, r2={"nccl": "2.21"}, r3={"nccl": "2.21"}))
    assert dict(verdict.odd) == {"nccl": [0, 1, 2, 3]} and verdict.majority["nccl"] is None
    assert "no majority" in verdict.detail
    two = compare_env(workers(2, r1={"torch": "2.12.1"}))
    assert two.odd["torch"] == [0, 1]


def test_a_three_way_split_with_a_majority() -> None:
    verdict = compare_env(workers(5, r1={"cudnn": "1"}, r2={"cudnn": "2"}))
    assert verdict.odd["cudnn"] == [1, 2] and verdict.majority["cudnn"] == "91000"
