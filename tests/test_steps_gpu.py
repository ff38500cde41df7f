"""The gpu check over the Accelerator interface: every failure mode with a fake, the NVML
adapter against a stand-in pynvml module, and an honest not_applicable on this GPU-less machine."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

from aegis_flow.steps.accel import (
    AcceleratorUnavailable,
    DeviceHealth,
    FakeAccelerator,
    NvmlAccelerator,
    open_nvidia,
)
from aegis_flow.steps.base import CheckStatus
from aegis_flow.steps.gpu import check_gpu, expected_from_env, probe_gpu

HEALTHY = DeviceHealth(0, "NVIDIA H100", "GPU-0", ecc_uncorrected=0, ecc_corrected=3,
                       retired_pages=0, retired_pages_pending=False,
                       remapped_rows_pending=False, remapped_rows_failure=False,
                       temperature_c=45.0)


def two(**second: Any) -> FakeAccelerator:
    return FakeAccelerator([HEALTHY, DeviceHealth(**{**HEALTHY.__dict__, "index": 1, **second})])


def test_healthy_devices_pass() -> None:
    r = check_gpu(two(), expected_gpus=2)
    assert r.status is CheckStatus.PASS and r.passed, r.detail
    assert r.budget == 66.0 and r.data["count"] == 2 and "45" in r.detail


@pytest.mark.parametrize(("fault", "words"), [
    ({"ecc_uncorrected": 2}, "2 uncorrected ECC"),
    ({"remapped_rows_failure": True}, "row remapping failed"),
    ({"remapped_rows_pending": True}, "row remapping pending"),
    ({"retired_pages_pending": True}, "page retirement pending"),
    ({"temperature_c": 93.0}, "93 °C"),
    ({"lost": True}, "is lost"),
], ids=["ecc", "remap-failure", "remap-pending", "retire-pending", "hot", "lost"])
def test_each_fault_fails_naming_the_device(fault: dict[str, Any], words: str) -> None:
    r = check_gpu(two(**fault))
    assert r.status is CheckStatus.FAIL, r.detail
    assert "GPU 1" in r.detail and words in r.detail and "GPU 0" not in r.detail


def test_corrected_ecc_errors_alone_do_not_fail() -> None:
    assert check_gpu(two(ecc_corrected=1000)).passed


def test_temperature_threshold_is_configurable() -> None:
    assert check_gpu(two(temperature_c=80.0)).passed
    assert not check_gpu(two(temperature_c=80.0), max_temp_c=75.0).passed


def test_device_count_vs_expected() -> None:
    r = check_gpu(two(), expected_gpus=8)
    assert r.status is CheckStatus.FAIL and "expected 8 GPU(s), found 2" in r.detail
    r = check_gpu(FakeAccelerator([HEALTHY], count=2), expected_gpus=2)
    assert r.status is CheckStatus.PASS  # the count is the driver's, devices are per index


def test_expected_count_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AEGIS_EXPECT_GPUS", "4")
    assert "expected 4" in check_gpu(two()).detail
    assert expected_from_env({"AEGIS_EXPECT_GPUS": ""}) is None
    with pytest.raises(ValueError, match="whole number"):
        expected_from_env({"AEGIS_EXPECT_GPUS": "four"})


def test_no_gpus_here_is_not_applicable_never_a_pass() -> None:
    r = check_gpu()  # this machine has no GPU and no pynvml
    assert r.status is CheckStatus.NOT_APPLICABLE and not r.passed and not r.failed
    assert "no NVIDIA GPUs here" in r.detail


def test_driver_missing_on_a_node_that_should_have_gpus_fails() -> None:
    def gone() -> FakeAccelerator:
        raise AcceleratorUnavailable("NVMLError_DriverNotLoaded: Driver Not Loaded",
                                     driver_missing=True)

    assert probe_gpu(open_accelerator=gone).status is CheckStatus.NOT_APPLICABLE
    r = probe_gpu(open_accelerator=gone, expected=8)
    assert r.status is CheckStatus.FAIL and "expected 8" in r.detail


def test_an_empty_driver_is_not_applicable() -> None:
    assert check_gpu(FakeAccelerator([])).status is CheckStatus.NOT_APPLICABLE


# --- the NVML adapter, against a stand-in pynvml -------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801 - pynvml's names
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    pass


def fake_pynvml(*, lost: frozenset[int] = frozenset(), init_error: type[Exception] | None = None,
                rows: tuple[int, int, int, int] = (0, 0, 0, 0), ecc: int = 0) -> Any:
    def per_device(value: Callable[[int], Any]) -> Callable[..., Any]:
        def call(handle: int, *args: Any) -> Any:
            if handle in lost:
                raise NVMLError_GpuIsLost("GPU is lost")
            return value(handle)
        return call

    def init() -> None:
        if init_error is not None:
            raise init_error("Driver Not Loaded")

    def no_retired_pages(handle: int, cause: int) -> Any:
        raise NVMLError_NotSupported("Not Supported")  # A100+ remap rows instead

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVMLError_GpuIsLost=NVMLError_GpuIsLost,
        NVMLError_NotSupported=NVMLError_NotSupported,
        NVMLError_DriverNotLoaded=NVMLError_DriverNotLoaded,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
        NVML_VOLATILE_ECC=0, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlSystemGetDriverVersion=lambda: b"550.54",
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=per_device(lambda h: b"NVIDIA H200"),
        nvmlDeviceGetUUID=per_device(lambda h: f"GPU-{h}"),
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: (
            per_device(lambda _: ecc if kind == 1 else 0)(h)),
        nvmlDeviceGetRetiredPages=no_retired_pages,
        nvmlDeviceGetRetiredPagesPendingStatus=per_device(lambda h: 0),
        nvmlDeviceGetRemappedRows=per_device(lambda h: rows),
        nvmlDeviceGetTemperature=per_device(lambda h: 40 + h),
    )


def test_nvml_adapter_reads_healthy_devices() -> None:
    acc = open_nvidia(lambda name: fake_pynvml())
    assert isinstance(acc, NvmlAccelerator) and acc.driver_version() == "550.54"
    devs = acc.devices()
    assert [d.name for d in devs] == ["NVIDIA H200"] * 2
    assert devs[1].temperature_c == 41.0 and devs[0].retired_pages is None  # not supported
    assert check_gpu(acc, expected_gpus=2).passed


def test_nvml_adapter_reports_lost_ecc_and_remapping() -> None:
    assert "GPU 1 is lost" in check_gpu(NvmlAccelerator(fake_pynvml(lost=frozenset({1})))).detail
    assert "uncorrected ECC" in check_gpu(NvmlAccelerator(fake_pynvml(ecc=1))).detail
    r = check_gpu(NvmlAccelerator(fake_pynvml(rows=(0, 2, 0, 1))))
    assert r.status is CheckStatus.FAIL and "row remapping failed" in r.detail


def test_nvml_unavailable_tells_driver_from_package() -> None:
    with pytest.raises(AcceleratorUnavailable, match="no NVIDIA driver") as info:
        open_nvidia(lambda name: fake_pynvml(init_error=NVMLError_DriverNotLoaded))
    assert info.value.driver_missing

    def no_module(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    with pytest.raises(AcceleratorUnavailable, match="nvidia-ml-py") as info:
        open_nvidia(no_module)
    assert not info.value.driver_missing
