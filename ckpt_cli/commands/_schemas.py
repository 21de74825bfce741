"""The published JSON Schema of every command's ``--json`` document, and their versions.

Each command's document type is the ``TypedDict`` its result's ``to_json()`` returns (mypy checks
that the code builds exactly that); its published schema is ``anyOf: [document, error
document]``, both with ``schema_version`` fixed to the command's version, so the error documents
a command prints belong to its versioned contract.

``python -m ckpt_cli.commands._schemas DIR`` (``make schemas``) writes ``DIR/<command>.schema.json``
and records each version's hash in ``DIR/versions.json``. A version whose hash is already
recorded never gets another: a changed schema needs a new ``schema_version`` (the test suite
checks the same rule).
"""

from __future__ import annotations

import hashlib
import json
import sys
import typing
from pathlib import Path
from typing import Any

SCHEMA_BASE = "https://ckpt.invalid/schemas"


def _documents() -> dict[str, Any]:
    """command -> the TypedDict of its document, from the registry (resolved here, not at
    module level, so that ``ckpt --help`` never loads the result types)."""
    from ckpt_cli.commands import COMMANDS

    return {c.name: c.document_type() for c in COMMANDS}


def schema_version(command: str) -> int:
    """The version of ``command``'s document (its ``Command`` record names the source)."""
    from ckpt_cli.commands import command as find

    return find(command).schema_version()


def schema_version_of_argv(argv: list[str]) -> int:
    """The version of the document the command named in ``argv`` prints (an error document
    before any result: the command line may not even parse)."""
    from ckpt_cli.commands import COMMANDS
    from ckpt_cli.core.schema import SCHEMA_VERSION

    names = {c.name for c in COMMANDS}
    command = next((a for a in argv if a in names), None)
    return schema_version(command) if command else SCHEMA_VERSION


def canonical_hash(schema: dict[str, Any]) -> str:
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def command_schema(command: str) -> dict[str, Any]:
    from ckpt_cli.core.schema import json_schema
    from ckpt_cli.errors import ErrorDocumentJSON

    document, version = _documents()[command], schema_version(command)
    schema = json_schema(
        document | ErrorDocumentJSON,
        schema_id=f"{SCHEMA_BASE}/{command}/v{version}.json",
        title=f"ckpt {command} --json (schema_version {version})",
        description=(
            f"The one JSON document `ckpt {command} --json` prints on stdout: its result, or an "
            "error document. `ok` is true exactly when the exit code is 0."
        ),
    )
    # A command may print one of several documents (inspect: one item, or every item).
    members = typing.get_args(document) or (document,)
    for name in (*(m.__name__ for m in members), ErrorDocumentJSON.__name__):
        schema["$defs"][name]["properties"]["schema_version"] = {"const": version}
    return schema


def command_schemas() -> dict[str, dict[str, Any]]:
    return {command: command_schema(command) for command in sorted(_documents())}


def write_schemas(directory: Path) -> list[str]:
    """Write every schema and register new versions; refuses (ValueError) a changed schema under
    a version already registered."""
    directory.mkdir(parents=True, exist_ok=True)
    registry_path = directory / "versions.json"
    registry: dict[str, dict[str, str]] = (
        json.loads(registry_path.read_text()) if registry_path.exists() else {}
    )
    written = []
    for command, schema in command_schemas().items():
        version, digest = str(schema_version(command)), canonical_hash(schema)
        known = registry.setdefault(command, {})
        if known.get(version, digest) != digest:
            raise ValueError(
                f"the schema of `ckpt {command} --json` changed under schema_version {version}: "
                "bump the command's schema_version"
            )
        known[version] = digest
        path = directory / f"{command}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(str(path))
    registry_path.write_text(json.dumps(registry, indent=2, sort_keys=True) + "\n")
    return written


if __name__ == "__main__":
    try:
        for path in write_schemas(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas")):
            print(path)
    except ValueError as e:
        sys.exit(f"schemas: {e}")
