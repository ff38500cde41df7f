"""aegis_flow.argo: offline validation of Argo manifests (JSON schema + semantic lint).

PURE apart from reading Argo's schema file (see schema.py); nothing talks to a cluster.
"""

from aegis_flow.argo.lint import Finding, lint
from aegis_flow.argo.schema import SchemaError, validate_schema

__all__ = ["Finding", "SchemaError", "lint", "validate_schema"]
