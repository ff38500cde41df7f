"""Bootcheck's environment report, and the comparison across workers ("multiple versions").

Side effects: :func:`env_report` imports torch lazily and asks it for CUDA/NCCL/cuDNN versions
and the device count and name (the name initialises CUDA: run it in the forked check process,
not in a zygote); it reads the host name. :func:`compare_env` is pure.

Comparison per key: the value most workers report wins; the workers with another value are the
odd ones out. When no value has a strict majority over the others (a tie at the top), there is no
telling who is odd, so every worker is named for that key.
"""

from __future__ import annotations

import platform
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aegis_flow.steps.base import (
    DEFAULT_BUDGETS,
    CheckResult,
    CheckStatus,
    Outcome,
    run_with_budget,
)

#: the keys whose values must agree across workers (host name and aegis-flow's own do not count)
COMPARED_KEYS: tuple[str, ...] = ("python", "torch", "cuda", "nccl", "cudnn", "device_count",
                                  "device_name")


def _torch_report(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"torch": str(torch.__version__),
                           "cuda": getattr(torch.version, "cuda", None)}
    try:
        cudnn = torch.backends.cudnn.version()
    except Exception:  # a CPU build, a broken install: report, do not crash
        cudnn = None
    out["cudnn"] = None if cudnn is None else str(cudnn)
    nccl: Any = None
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:
            nccl = None
        count = int(torch.cuda.device_count())
        out.update(device_count=count,
                   device_name=str(torch.cuda.get_device_name(0)) if count else None)
    else:
        out.update(device_count=0, device_name=None)
    out["nccl"] = nccl
    return out


def env_report(torch: Any = None) -> dict[str, Any]:
    """This worker's environment: python, torch, CUDA, NCCL, cuDNN, device count/name, host."""
    report: dict[str, Any] = {"host": socket.gethostname(), "python": platform.python_version(),
                              "platform": platform.platform()}
    if torch is None:
        try:
            import torch as imported

            torch = imported
        except ImportError:
            pass
    if torch is None:
        report.update(torch=None, cuda=None, nccl=None, cudnn=None, device_count=0,
                      device_name=None)
    else:
        report.update(_torch_report(torch))
    return report


@dataclass(frozen=True)
class EnvVerdict:
    """``verdict`` is ``"ok"`` or ``"multiple versions"``; ``odd[key]`` names the odd ranks."""

    verdict: str
    odd: Mapping[str, Sequence[int]] = field(default_factory=dict)
    majority: Mapping[str, Any] = field(default_factory=dict)  # None where there is a tie
    values: Mapping[str, Mapping[int, Any]] = field(default_factory=dict)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    @property
    def odd_ranks(self) -> list[int]:
        return sorted({r for ranks in self.odd.values() for r in ranks})

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "odd": {k: list(v) for k, v in self.odd.items()},
                "majority": dict(self.majority),
                "values": {k: {str(r): x for r, x in v.items()} for k, v in self.values.items()},
                "detail": self.detail}


def compare_env(reports: Mapping[int, Mapping[str, Any]],
                keys: Sequence[str] = COMPARED_KEYS) -> EnvVerdict:
    """Compare the workers' reports (rank → report). Pure."""
    odd: dict[str, list[int]] = {}
    majority: dict[str, Any] = {}
    values: dict[str, dict[int, Any]] = {}
    lines = []
    for key in keys:
        seen = {rank: reports[rank].get(key) for rank in sorted(reports)}
        counts = Counter(_hashable(v) for v in seen.values())
        if len(counts) <= 1:
            continue
        ranked = counts.most_common()
        values[key] = seen
        if ranked[0][1] > ranked[1][1]:
            winner = ranked[0][0]
            majority[key] = seen[next(r for r, v in seen.items() if _hashable(v) == winner)]
            odd[key] = [r for r, v in seen.items() if _hashable(v) != winner]
            lines.append(f"{key}: rank(s) {_ranks(odd[key])} differ from the majority "
                         f"{majority[key]!r} ({', '.join(f'{r}={seen[r]!r}' for r in odd[key])})")
        else:
            majority[key] = None
            odd[key] = list(seen)
            lines.append(f"{key}: no majority, every worker named "
                         f"({', '.join(f'{r}={v!r}' for r, v in seen.items())})")
    if not odd:
        return EnvVerdict("ok", detail=f"env ok: {len(reports)} worker(s) agree on "
                          f"{', '.join(keys)}")
    return EnvVerdict("multiple versions", odd, majority, values,
                      "multiple versions: " + "; ".join(lines))


def _hashable(value: Any) -> Any:
    return repr(value) if isinstance(value, (list, dict, set)) else value


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))


def probe_env(torch: Any = None) -> Outcome:
    report = env_report(torch)
    devices = (f", {report['device_count']} x {report['device_name']}"
               if report["device_count"] else ", no GPU")
    return Outcome(CheckStatus.PASS, f"env: python {report['python']}, torch {report['torch']}, "
                   f"CUDA {report['cuda']}, NCCL {report['nccl']}, cuDNN {report['cudnn']}"
                   f"{devices} on {report['host']}", report)


def check_env(*, budget: float | None = DEFAULT_BUDGETS["env"], torch: Any = None,
              now: Callable[[], float] = time.time) -> CheckResult:
    """This worker's report as a CheckResult (``data`` is the report); bootcheck compares them."""
    return run_with_budget("env", lambda: probe_env(torch), budget, now)
