"""The published JSON Schemas (``docs/schemas/``) and a validator for each command's."""

from __future__ import annotations

import json
from typing import Any

from tests.support.paths import REPO

SCHEMAS = REPO / "docs" / "schemas"


def published(command: str) -> dict[str, Any]:
    path = SCHEMAS / f"{command}.schema.json"
    assert path.is_file(), f"{command}: no published schema at {path.relative_to(REPO)}"
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def validator(command: str):  # type: ignore[no-untyped-def]
    from jsonschema import Draft202012Validator

    schema = published(command)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)
