"""The reusable ``aegis-checks`` WorkflowTemplate (bootcheck and each single check).

PURE: ``build()`` returns Hera objects; the golden file is ``aegis_checks.yaml``. Install it
with ``kubectl apply -n NS -f workflows/aegis_checks.yaml`` and call it with templateRef.
"""

from __future__ import annotations

from typing import Any

from aegis_flow.jobspec import DEFAULT_AEGIS_IMAGE
from aegis_flow.workflow import build_checks_template


def build() -> list[Any]:
    return [build_checks_template(image=DEFAULT_AEGIS_IMAGE)]
