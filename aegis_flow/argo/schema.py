"""Validate manifests against Argo's JSON schema, made strict.

Side effects: reads the schema file once (cached). Argo's published schema (v4.0.5; not shipped
with aegis-flow: it is Argo's file — point ``$AEGIS_ARGO_SCHEMA`` at it, or keep it in the
``shared/argo/`` folder beside a checkout) is lenient in ways that hide our mistakes, so we
patch it:
``IntOrString`` becomes string-or-integer (it is published as string only), ``Quantity``
string-or-number, and every object definition with ``properties`` gets
``additionalProperties: false``, so a misspelt key (``retryStrategy.expresion``) fails.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from aegis_flow.settings import env_value

SCHEMA_VERSION = "v4.0.5"
_HERE = Path(__file__).resolve().parent
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
KINDS = {"Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow"}


@dataclass(frozen=True)
class SchemaError:
    """One schema violation: where (a JSON path) and what."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class SchemaUnavailable(RuntimeError):
    """Argo's schema file cannot be found; the semantic lint still works without it."""


def schema_path() -> Path:
    """``$AEGIS_ARGO_SCHEMA``, else ``shared/argo/`` beside the checkout; SchemaUnavailable."""
    env = env_value("AEGIS_ARGO_SCHEMA", "")
    if env:
        if not Path(env).is_file():
            raise SchemaUnavailable(f"AEGIS_ARGO_SCHEMA={env} does not exist")
        return Path(env)
    name = f"schema-{SCHEMA_VERSION}.json"
    for base in (_HERE.parents[1], _HERE.parents[2]):
        candidate = base / "shared" / "argo" / name
        if candidate.is_file():
            return candidate
    raise SchemaUnavailable(
        f"Argo's JSON schema ({name}) was not found: download it from Argo Workflows' release "
        f"(api/jsonschema/schema.json of {SCHEMA_VERSION}) and set AEGIS_ARGO_SCHEMA to its "
        "path, or lint with --no-schema")


def strict_schema(raw: dict[str, Any]) -> dict[str, Any]:
    """Argo's schema with the patches described in the module docstring (a copy)."""
    schema = copy.deepcopy(raw)
    defs = schema["definitions"]
    defs[_INT_OR_STRING] = {"type": ["string", "integer"]}
    defs[_QUANTITY] = {"type": ["string", "number"]}
    for definition in defs.values():
        if "properties" in definition and "additionalProperties" not in definition:
            definition["additionalProperties"] = False
    return schema


@lru_cache(maxsize=4)
def _validator(path: str) -> Any:
    import jsonschema

    schema = strict_schema(json.loads(Path(path).read_text()))
    cls = jsonschema.validators.validator_for(schema)
    defs = schema["definitions"]
    return {kind: cls({"$schema": schema.get("$schema"), "definitions": defs,
                       "$ref": f"#/definitions/io.argoproj.workflow.v1alpha1.{kind}"})
            for kind in KINDS}


def validate_schema(manifest: dict[str, Any], *, path: Path | None = None) -> list[SchemaError]:
    """Every schema violation of one manifest (empty: valid), against its own kind's
    definition, so the messages point at the bad key instead of 'not valid under oneOf'."""
    kind = manifest.get("kind")
    if kind not in KINDS:
        return [SchemaError("kind", f"{kind!r} is not one of {sorted(KINDS)}")]
    validator = _validator(str(path or schema_path()))[kind]
    errors = []
    for err in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        errors.append(SchemaError(where.lstrip(".") or "(root)", err.message))
    return errors
