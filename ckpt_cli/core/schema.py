"""The version of every JSON document ckpt prints: each result's ``to_json()`` starts with it.

Raise it only for a change that breaks readers (a key removed or its meaning changed); new keys
do not change it.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1


def document(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as a top-level JSON document: ``schema_version`` first."""
    return {"schema_version": SCHEMA_VERSION, **body}
