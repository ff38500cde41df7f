"""The runtime check: real torch on this CPU machine, stand-ins for a CUDA runtime that breaks."""

from __future__ import annotations

import subprocess
import sys
import types
from typing import Any

import pytest

from aegis_flow.steps.base import CheckStatus
from aegis_flow.steps.runtime import check_runtime, probe_runtime


def test_cpu_backend_and_gloo_pass_here() -> None:
    pytest.importorskip("torch")
    r = check_runtime()
    assert r.status is CheckStatus.PASS, r.detail
    assert r.data["backend"] == "cpu" and r.data["gloo"] is True
    assert r.data["torch"].startswith("2.") and r.budget == 1.0
    assert r.duration < 1.0  # warm: milliseconds


def test_module_import_does_not_import_torch() -> None:
    code = ("import sys, aegis_flow.steps, aegis_flow.steps.cli, aegis_flow.progress; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pynvml')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class FakeTensor:
    def __init__(self, value: float, n: int) -> None:
        self.value, self.n = value, n

    def __matmul__(self, other: FakeTensor) -> FakeTensor:
        return FakeTensor(self.value * other.value * self.n, self.n)

    def sum(self) -> FakeTensor:
        return FakeTensor(self.value * self.n * self.n, self.n)

    def item(self) -> float:
        return self.value


def fake_torch(*, cuda: bool, ones: Any = None, gloo: bool = True, devices: int = 2) -> Any:
    synced: list[int] = []

    def default_ones(shape: tuple[int, int], device: str) -> FakeTensor:
        return FakeTensor(1.0, shape[0])

    return types.SimpleNamespace(
        __version__="2.9.0+cu128", version=types.SimpleNamespace(cuda="12.8" if cuda else None),
        ones=ones or default_ones, synced=synced,
        cuda=types.SimpleNamespace(is_available=lambda: cuda, device_count=lambda: devices,
                                   synchronize=synced.append),
        distributed=types.SimpleNamespace(is_available=lambda: True,
                                          is_gloo_available=lambda: gloo))


def test_cuda_path_runs_a_matmul_and_synchronizes_every_device() -> None:
    torch = fake_torch(cuda=True, devices=3)
    out = probe_runtime(torch)
    assert out.status is CheckStatus.PASS and "3 device(s)" in out.detail
    assert torch.synced == [0, 1, 2]


def test_a_cuda_error_fails_the_check() -> None:
    def broken(shape: tuple[int, int], device: str) -> FakeTensor:
        if device == "cuda:1":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return FakeTensor(1.0, shape[0])

    out = probe_runtime(fake_torch(cuda=True, ones=broken))
    assert out.status is CheckStatus.FAIL and "illegal memory access" in out.detail


def test_wrong_results_fail_the_check() -> None:
    def wrong(shape: tuple[int, int], device: str) -> FakeTensor:
        return FakeTensor(0.5, shape[0])

    out = probe_runtime(fake_torch(cuda=True, ones=wrong))
    assert out.status is CheckStatus.FAIL and "computes wrong" in out.detail


def test_cpu_without_gloo_fails() -> None:
    out = probe_runtime(fake_torch(cuda=False, gloo=False))
    assert out.status is CheckStatus.FAIL and "no gloo" in out.detail


def test_no_torch_is_not_applicable_unless_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    assert probe_runtime().status is CheckStatus.NOT_APPLICABLE
    assert probe_runtime(require_torch=True).status is CheckStatus.FAIL
