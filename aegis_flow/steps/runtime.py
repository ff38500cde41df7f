"""The runtime check: the CUDA runtime/driver (or, without CUDA, the CPU backend and gloo) works.

Side effects: :func:`check_runtime` imports torch if it is not imported yet (outside the ms
budget, under ``import_budget``) and then allocates tiny tensors and runs a matmul on every
CUDA device (or the CPU), synchronizing each device. Nothing here imports torch at module import.

Built to run inside an already-warm interpreter: the supervisor forks a pre-warmed process that
has imported torch and never touched CUDA, and runs this there — so the fast path stays in
milliseconds. Call it in the forked child, never in the zygote itself: initialising CUDA in a
process that later forks breaks the children.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from aegis_flow.steps.base import (
    DEFAULT_BUDGETS,
    CheckResult,
    CheckStatus,
    Outcome,
    run_with_budget,
)

N = 32  # ones(N, N) @ ones(N, N) is N everywhere: sum is N**3
DEFAULT_IMPORT_BUDGET = 60.0


def _matmul_ok(torch: Any, device: str) -> tuple[bool, float]:
    a = torch.ones((N, N), device=device)
    total = float((a @ a).sum().item())  # .item() synchronizes with the device
    return total == float(N**3), total


def probe_runtime(torch: Any = None, *, require_torch: bool = False) -> Outcome:
    """Exercise the runtime through ``torch`` (the imported module, or a stand-in for tests)."""
    if torch is None:
        try:
            import torch as imported
        except ImportError as exc:
            status = CheckStatus.FAIL if require_torch else CheckStatus.NOT_APPLICABLE
            return Outcome(status, f"runtime: torch is not importable here ({exc})",
                           {"torch": None})
        torch = imported
    data: dict[str, Any] = {"torch": str(torch.__version__),
                            "cuda": getattr(torch.version, "cuda", None)}
    try:
        if torch.cuda.is_available():
            count = int(torch.cuda.device_count())
            data.update(backend="cuda", device_count=count)
            for i in range(count):
                ok, got = _matmul_ok(torch, f"cuda:{i}")
                torch.cuda.synchronize(i)
                if not ok:
                    return Outcome(CheckStatus.FAIL, f"runtime: a matmul on cuda:{i} returned "
                                   f"{got:g}, expected {N**3}: the device computes wrong", data)
            return Outcome(CheckStatus.PASS, f"runtime ok: torch {data['torch']}, CUDA "
                           f"{data['cuda']}, a matmul on each of {count} device(s)", data)
        gloo = bool(torch.distributed.is_available()
                    and torch.distributed.is_gloo_available())
        data.update(backend="cpu", device_count=0, gloo=gloo)
        ok, got = _matmul_ok(torch, "cpu")
    except Exception as exc:  # a CUDA error, a driver mismatch, a broken install
        data["exception"] = type(exc).__name__
        return Outcome(CheckStatus.FAIL,
                       f"runtime: torch {data['torch']} failed: {type(exc).__name__}: {exc}", data)
    if not ok:
        return Outcome(CheckStatus.FAIL, f"runtime: a CPU matmul returned {got:g}, expected "
                       f"{N**3}", data)
    if not gloo:
        return Outcome(CheckStatus.FAIL, f"runtime: torch {data['torch']} has no CUDA and no "
                       "gloo backend: torch.distributed cannot run here", data)
    return Outcome(CheckStatus.PASS, f"runtime ok: torch {data['torch']} CPU backend (no CUDA "
                   "here), matmul and gloo available", data)


def check_runtime(*, budget: float | None = DEFAULT_BUDGETS["runtime"],
                  import_budget: float | None = DEFAULT_IMPORT_BUDGET, require_torch: bool = False,
                  torch: Any = None, now: Callable[[], float] = time.time) -> CheckResult:
    """The runtime check (budget: ms, 1 s by default).

    A cold interpreter first imports torch under ``import_budget``, outside the ms budget; the
    result's ``data["warm"]`` says whether torch was already imported, ``data["import_s"]`` how
    long the import took.
    """
    warm = torch is not None or "torch" in sys.modules
    import_s = 0.0
    if not warm:
        imported = run_with_budget("runtime", _import_torch, import_budget, now)
        import_s = imported.duration
        if imported.status is not CheckStatus.PASS:
            status = imported.status
            if status is CheckStatus.NOT_APPLICABLE and require_torch:
                status = CheckStatus.FAIL
            return CheckResult.make("runtime", status, imported.detail, duration=import_s,
                                    budget=import_budget, timestamp=imported.timestamp,
                                    data={**imported.data, "warm": False})
    result = run_with_budget("runtime", lambda: probe_runtime(torch, require_torch=require_torch),
                             budget, now)
    detail = result.detail if warm else (f"{result.detail} (cold process: importing torch took "
                                         f"{import_s:.1f} s first, outside the budget)")
    return CheckResult.make("runtime", result.status, detail, duration=result.duration,
                            budget=budget, timestamp=result.timestamp,
                            data={**result.data, "warm": warm, "import_s": round(import_s, 3)})


def _import_torch() -> Outcome:
    try:
        import torch
    except ImportError as exc:
        return Outcome(CheckStatus.NOT_APPLICABLE, f"runtime: torch is not importable here ({exc})",
                       {"torch": None})
    return Outcome(CheckStatus.PASS, f"imported torch {torch.__version__}")
