"""aegis_flow.steps: the checks, the log classifier and the diagnosis (DESIGN.md §2).

One module per check — ``io``, ``gpu`` (over the ``accel`` interface), ``runtime``, ``rdma``,
``hang`` — plus ``env`` (bootcheck's environment report and comparison), ``classify`` (output →
cause code), ``diagnose`` (pure: results + cause → recovery level) and ``cli`` (``aegis-flow
check`` / ``explain``). Every check returns a :class:`CheckResult` and runs under a configurable
budget (:func:`run_with_budget`).

Side effects: importing this package has none and loads only the standard library; torch and
pynvml are imported inside the checks that need them. See each module for its own.
"""

from __future__ import annotations

from aegis_flow.steps.accel import (
    Accelerator,
    AcceleratorUnavailable,
    DeviceHealth,
    FakeAccelerator,
)
from aegis_flow.steps.base import (
    CHECK_TYPES,
    DEFAULT_BUDGETS,
    CheckResult,
    CheckStatus,
    Outcome,
    all_ok,
    resolve_budgets,
    run_with_budget,
    run_with_budget_async,
)
from aegis_flow.steps.classify import Cause, CauseTable, classify, load_table
from aegis_flow.steps.diagnose import Diagnosis, diagnose, explain_table, plan_checks
from aegis_flow.steps.env import EnvVerdict, check_env, compare_env, env_report
from aegis_flow.steps.gpu import check_gpu
from aegis_flow.steps.hang import HangWatchdog, ProgressSocket, collect_stacks
from aegis_flow.steps.io import check_io
from aegis_flow.steps.rdma import check_rdma
from aegis_flow.steps.runtime import check_runtime

__all__ = [
    "CHECK_TYPES", "DEFAULT_BUDGETS", "Accelerator", "AcceleratorUnavailable", "Cause",
    "CauseTable", "CheckResult", "CheckStatus", "DeviceHealth", "Diagnosis", "EnvVerdict",
    "FakeAccelerator", "HangWatchdog", "Outcome", "ProgressSocket", "all_ok", "check_env",
    "check_gpu", "check_io", "check_rdma", "check_runtime", "classify", "collect_stacks",
    "compare_env", "diagnose", "env_report", "explain_table", "load_table", "plan_checks",
    "resolve_budgets", "run_with_budget", "run_with_budget_async",
]
