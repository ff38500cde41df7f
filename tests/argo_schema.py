"""Argo's published JSON schema is Argo's file, not ours: it is found through
``$AEGIS_ARGO_SCHEMA`` or a ``shared/argo/`` folder beside the checkout (see
``aegis_flow.argo.schema``). Where it is absent, the schema half of a test is skipped with the
reason, after the semantic lint half has run."""

from __future__ import annotations

import pytest

from aegis_flow.argo.schema import SchemaUnavailable, schema_path


def missing_reason() -> str:
    try:
        schema_path()
    except SchemaUnavailable as exc:
        return str(exc)
    return ""


def require_schema() -> None:
    """Skip the rest of the calling test, saying why, when Argo's schema is not here."""
    reason = missing_reason()
    if reason:
        pytest.skip(f"Argo's schema is not available here: {reason}")


needs_schema = pytest.mark.skipif(bool(missing_reason()), reason="Argo's JSON schema not found "
                                  "(set AEGIS_ARGO_SCHEMA to schema-v4.0.5.json)")
