"""The gpu check: devices present, no uncorrected ECC errors, no failed row remapping or pending
page retirement, temperature under a threshold, no lost device.

Side effects: :func:`check_gpu` opens the node's accelerator (NVML) when none is passed in, and
closes what it opened; :func:`evaluate_gpu` is pure. Standard library only at import time.

Without an accelerator the result is ``not_applicable`` with the reason — never a silent pass —
except when GPUs are *expected* (``expected_gpus`` or ``$AEGIS_EXPECT_GPUS``) and the NVML
library or driver is missing: that node has lost its GPUs, a ``fail``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence

from aegis_flow.steps.accel import (
    Accelerator,
    AcceleratorUnavailable,
    DeviceHealth,
    detect_accelerator,
)
from aegis_flow.steps.base import (
    DEFAULT_BUDGETS,
    CheckResult,
    CheckStatus,
    Outcome,
    run_with_budget,
)

EXPECT_ENV = "AEGIS_EXPECT_GPUS"
DEFAULT_MAX_TEMP_C = 90.0


def expected_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    raw = (os.environ if environ is None else environ).get(EXPECT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{EXPECT_ENV} must be a whole number of GPUs, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{EXPECT_ENV} must be 0 or more, got {value}")
    return value


def device_problems(dev: DeviceHealth, *, max_temp_c: float = DEFAULT_MAX_TEMP_C) -> list[str]:
    """What is wrong with one device (empty: healthy). Pure."""
    tag = f"GPU {dev.index}" + (f" ({dev.name})" if dev.name else "")
    if dev.lost:
        return [f"{tag} is lost (fell off the bus; NVML_ERROR_GPU_IS_LOST)"]
    problems = []
    if dev.ecc_uncorrected:
        problems.append(f"{tag} has {dev.ecc_uncorrected} uncorrected ECC error(s)")
    if dev.remapped_rows_failure:
        problems.append(f"{tag} row remapping failed")
    if dev.remapped_rows_pending:
        problems.append(f"{tag} has a row remapping pending (needs a GPU reset)")
    if dev.retired_pages_pending:
        problems.append(f"{tag} has a page retirement pending (needs a GPU reset)")
    if dev.temperature_c is not None and dev.temperature_c >= max_temp_c:
        problems.append(f"{tag} is at {dev.temperature_c:g} °C (limit {max_temp_c:g} °C)")
    return problems


def evaluate_gpu(devices: Sequence[DeviceHealth], *, count: int | None = None,
                 expected: int | None = None, max_temp_c: float = DEFAULT_MAX_TEMP_C,
                 vendor: str = "") -> Outcome:
    """Judge the devices an accelerator reported. Pure."""
    seen = len(devices) if count is None else count
    problems: list[str] = []
    if expected is not None and seen != expected:
        problems.append(f"expected {expected} GPU(s), found {seen}")
    for dev in devices:
        problems += device_problems(dev, max_temp_c=max_temp_c)
    data = {"vendor": vendor, "count": seen, "expected": expected, "max_temp_c": max_temp_c,
            "devices": [d.to_dict() for d in devices]}
    if problems:
        return Outcome(CheckStatus.FAIL, "gpu: " + "; ".join(problems), data)
    if seen == 0:
        return Outcome(CheckStatus.NOT_APPLICABLE,
                       f"gpu: the {vendor or 'accelerator'} driver is present but reports no "
                       "devices", data)
    temps = [d.temperature_c for d in devices if d.temperature_c is not None]
    hottest = f", hottest {max(temps):g} °C" if temps else ""
    names = sorted({d.name for d in devices if d.name})
    return Outcome(CheckStatus.PASS,
                   f"gpu ok: {seen} device(s) {', '.join(names)}; no uncorrected ECC error, "
                   f"no failed remapping{hottest}", data)


def probe_gpu(accelerator: Accelerator | None = None, *, expected: int | None = None,
              max_temp_c: float = DEFAULT_MAX_TEMP_C,
              open_accelerator: Callable[[], Accelerator] = detect_accelerator) -> Outcome:
    """Query ``accelerator`` (or open the node's own, and close it again) and judge it."""
    opened = accelerator is None
    if accelerator is None:
        try:
            accelerator = open_accelerator()
        except AcceleratorUnavailable as exc:
            data = {"expected": expected, "reason": str(exc)}
            if expected and exc.driver_missing:
                return Outcome(CheckStatus.FAIL,
                               f"gpu: expected {expected} GPU(s), but {exc}", data)
            return Outcome(CheckStatus.NOT_APPLICABLE, f"gpu: no NVIDIA GPUs here: {exc}", data)
    try:
        return evaluate_gpu(accelerator.devices(), count=accelerator.device_count(),
                            expected=expected, max_temp_c=max_temp_c,
                            vendor=accelerator.vendor)
    finally:
        if opened:
            accelerator.close()


def check_gpu(accelerator: Accelerator | None = None, *, expected_gpus: int | None = None,
              max_temp_c: float = DEFAULT_MAX_TEMP_C,
              budget: float | None = DEFAULT_BUDGETS["gpu"],
              now: Callable[[], float] = time.time) -> CheckResult:
    """The gpu check under its budget (66 s); ``expected_gpus`` defaults to the env var."""
    expected = expected_gpus if expected_gpus is not None else expected_from_env()
    return run_with_budget("gpu", lambda: probe_gpu(accelerator, expected=expected,
                                                    max_temp_c=max_temp_c), budget, now)
