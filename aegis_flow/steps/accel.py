"""The accelerator interface the gpu check goes through, with NVIDIA (NVML) and a fake.

Side effects: :func:`open_nvidia` imports ``pynvml`` (package ``nvidia-ml-py``) lazily and
initialises NVML; :class:`NvmlAccelerator` queries the driver and ``close()`` shuts NVML down.
:class:`FakeAccelerator` has none. Another vendor plugs in by implementing :class:`Accelerator`.

"No NVIDIA GPUs here" is :class:`AcceleratorUnavailable`: pynvml missing, the NVML library not
found, or the driver not loaded. ``driver_missing`` tells the last two apart from the first —
a node that should have GPUs but whose driver is gone is a fault; a missing Python package is not.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health; ``None`` where the device does not support the query."""

    index: int
    name: str = ""
    uuid: str = ""
    ecc_uncorrected: int | None = None  # volatile (since the driver loaded)
    ecc_corrected: int | None = None
    retired_pages: int | None = None  # pages retired for double-bit ECC errors
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    temperature_c: float | None = None
    lost: bool = False  # NVML_ERROR_GPU_IS_LOST: fell off the bus
    errors: tuple[str, ...] = field(default=())  # queries that failed unexpectedly

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


class Accelerator(Protocol):
    vendor: str

    def device_count(self) -> int: ...

    def devices(self) -> list[DeviceHealth]: ...

    def driver_version(self) -> str: ...

    def close(self) -> None: ...


class AcceleratorUnavailable(Exception):
    """No accelerator of this vendor can be queried here; ``driver_missing`` see module doc."""

    def __init__(self, message: str, *, driver_missing: bool = False) -> None:
        super().__init__(message)
        self.driver_missing = driver_missing


@dataclass
class FakeAccelerator:
    """In-memory devices for tests; ``count`` defaults to ``len(devices)``."""

    fake_devices: Sequence[DeviceHealth]
    count: int | None = None
    vendor: str = "fake"
    closed: bool = False

    def device_count(self) -> int:
        return len(self.fake_devices) if self.count is None else self.count

    def devices(self) -> list[DeviceHealth]:
        return list(self.fake_devices)

    def driver_version(self) -> str:
        return "fake-1.0"

    def close(self) -> None:
        self.closed = True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlAccelerator:
    """NVIDIA GPUs through NVML; ``nvml`` is the ``pynvml`` module (or a stand-in for tests)."""

    vendor = "nvidia"

    def __init__(self, nvml: Any) -> None:
        self._nv = nvml
        self._lost_error: type[BaseException] = getattr(nvml, "NVMLError_GpuIsLost", _Never)
        self._not_supported: type[BaseException] = getattr(nvml, "NVMLError_NotSupported",
                                                           _Never)
        self._error: type[BaseException] = getattr(nvml, "NVMLError", Exception)

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def driver_version(self) -> str:
        return _text(self._nv.nvmlSystemGetDriverVersion())

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._error:
            pass

    def devices(self) -> list[DeviceHealth]:
        return [self._device(i) for i in range(self.device_count())]

    def _device(self, index: int) -> DeviceHealth:
        nv = self._nv
        health = DeviceHealth(index)
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except self._lost_error:
            return replace(health, lost=True)
        errors: list[str] = []

        def ask(what: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except self._lost_error:
                raise
            except self._not_supported:
                return None
            except self._error as exc:
                errors.append(f"{what}: {exc}")
                return None

        try:
            name = ask("name", lambda: _text(nv.nvmlDeviceGetName(handle)))
            uuid = ask("uuid", lambda: _text(nv.nvmlDeviceGetUUID(handle)))
            unc = ask("ecc", lambda: nv.nvmlDeviceGetTotalEccErrors(
                handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
            corr = ask("ecc", lambda: nv.nvmlDeviceGetTotalEccErrors(
                handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))
            pages = ask("retired pages", lambda: nv.nvmlDeviceGetRetiredPages(
                handle, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
            pending = ask("retired pages pending",
                          lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle))
            rows = ask("remapped rows", lambda: nv.nvmlDeviceGetRemappedRows(handle))
            temp = ask("temperature", lambda: nv.nvmlDeviceGetTemperature(
                handle, nv.NVML_TEMPERATURE_GPU))
        except self._lost_error:
            return replace(health, lost=True)
        return replace(
            health, name=name or "", uuid=uuid or "",
            ecc_uncorrected=None if unc is None else int(unc),
            ecc_corrected=None if corr is None else int(corr),
            retired_pages=None if pages is None else len(list(pages)),
            retired_pages_pending=None if pending is None else bool(pending),
            remapped_rows_pending=None if rows is None else bool(rows[2]),
            remapped_rows_failure=None if rows is None else bool(rows[3]),
            temperature_c=None if temp is None else float(temp),
            errors=tuple(errors))


class _Never(Exception):
    """Stands in for an NVML error class this pynvml does not define: never raised."""


def open_nvidia(import_module: Callable[[str], Any] = importlib.import_module) -> NvmlAccelerator:
    """Import pynvml and initialise NVML, or raise :class:`AcceleratorUnavailable`."""
    try:
        nv = import_module("pynvml")
    except ImportError as exc:
        raise AcceleratorUnavailable(
            f"pynvml is not installed ({exc}); install nvidia-ml-py to check NVIDIA GPUs") from None
    missing = tuple(getattr(nv, n) for n in ("NVMLError_LibraryNotFound",
                                             "NVMLError_DriverNotLoaded") if hasattr(nv, n))
    error: type[BaseException] = getattr(nv, "NVMLError", Exception)
    try:
        nv.nvmlInit()
    except missing as exc:
        raise AcceleratorUnavailable(f"no NVIDIA driver here: {type(exc).__name__}: {exc}",
                                     driver_missing=True) from None
    except error as exc:
        raise AcceleratorUnavailable(f"NVML could not start: {type(exc).__name__}: {exc}",
                                     driver_missing=True) from None
    return NvmlAccelerator(nv)


def detect_accelerator(import_module: Callable[[str], Any] = importlib.import_module,
                       ) -> Accelerator:
    """The accelerator of this node (NVIDIA only for now), or AcceleratorUnavailable."""
    return open_nvidia(import_module)
