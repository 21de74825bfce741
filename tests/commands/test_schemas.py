"""Published JSON Schemas of every command's ``--json``.

* every command of the app has ``docs/schemas/<command>.schema.json``, a valid JSON Schema
  (draft 2020-12) that is exactly what the result types generate (never edited by hand);
* real outputs of every command, successes and errors, validate against it, and a damaged
  document does not (the schemas are not vacuous);
* a schema never changes under the same ``schema_version``: ``docs/schemas/versions.json``
  holds the hash of every published version, so a changed type without a bump fails here.

Validator: ``jsonschema`` (the reference implementation of the JSON Schema specs, maintained by
the spec's editors; ``Draft202012Validator``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.cli import app_commands
from tests.support.error_cases import CASES
from tests.support.paths import FIXTURES
from tests.support.schemas import SCHEMAS, published, validator
from tests.support.world import World, one_json_document

VERSIONS = SCHEMAS / "versions.json"


def canonical_hash(schema: dict[str, Any]) -> str:
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def test_every_command_publishes_a_valid_schema() -> None:
    commands = app_commands()
    for command in sorted(commands):
        validator(command)
    extra = {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")}
    assert extra == commands, "a published schema for a command the app does not have"


def test_published_schemas_are_the_generated_ones() -> None:
    """The files in docs/ are generated from the result types (``make schemas``)."""
    from ckpt_cli.commands._schemas import command_schemas

    generated = command_schemas()
    assert set(generated) == app_commands()
    for command, schema in sorted(generated.items()):
        assert published(command) == schema, (
            f"docs/schemas/{command}.schema.json is stale: run `make schemas`"
        )


def test_schema_changes_bump_the_version() -> None:
    """Each (command, schema_version) has one schema forever: its hash is in versions.json."""
    from ckpt_cli.commands._schemas import command_schemas, schema_version

    registry = json.loads(VERSIONS.read_text())
    generated = command_schemas()
    assert generated
    for command, schema in sorted(generated.items()):
        version = str(schema_version(command))
        known = registry.get(command, {})
        assert version in known, (
            f"{command} schema_version {version} is not registered: run `make schemas`"
        )
        assert known[version] == canonical_hash(schema), (
            f"the JSON of `ckpt {command} --json` changed but its schema_version is still "
            f"{version}: bump it and run `make schemas`"
        )


def test_every_object_is_closed() -> None:
    """Every object lists its properties (``additionalProperties`` false or a schema): a key
    the types do not declare fails validation instead of slipping through."""

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object":
                assert "additionalProperties" in node, where
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    for command in sorted(app_commands()):
        walk(published(command), command)


# --- real outputs ------------------------------------------------------------------------------

Run = tuple[str, Callable[[World], list[str]]]


def _damaged_recorded(w: World) -> str:
    """seed_mlp with recorded digests, then a byte of step 500's data flipped (cp --verify)."""
    import shutil

    import ckpt_cli

    root = w.tmp / "recorded_damaged"
    if not root.exists():
        shutil.copytree(w.good, root)
        assert ckpt_cli.verify(root, record=True).ok
        data = sorted((root / "500" / "default" / "d").iterdir())[0]
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    return str(root)


SUCCESSES: list[Run] = [
    ("ls", lambda w: ["ls", str(w.good)]),
    ("ls", lambda w: ["ls", str(w.composite)]),
    ("ls", lambda w: ["ls", str(w.with_tmp)]),
    ("ls", lambda w: ["ls", str(FIXTURES / "prefixed")]),
    ("ls", lambda w: ["ls", str(w.bad_item)]),  # a step with a problem
    ("inspect", lambda w: ["inspect", str(w.good)]),
    ("inspect", lambda w: ["inspect", str(w.good), "--stats", "--step", "400"]),
    ("inspect", lambda w: ["inspect", str(FIXTURES / "sharded_4x2"), "--layout", "params.w"]),
    ("inspect", lambda w: ["inspect", str(FIXTURES / "strings")]),
    ("inspect", lambda w: ["inspect", str(w.composite), "--item", "extra"]),
    ("inspect", lambda w: ["inspect", str(FIXTURES / "v1_zarr3"), "--item", "state"]),
    ("verify", lambda w: ["verify", str(w.good)]),
    ("verify", lambda w: ["verify", str(w.composite), "--deep"]),
    ("verify", lambda w: ["verify", str(w.good), "--sample", "50%", "--seed", "1"]),
    ("verify", lambda w: ["verify", str(w.bad_item)]),  # exit 1: a report with problems
    ("verify", lambda w: ["verify", str(FIXTURES.parent / "damaged" / "flipped-byte"), "--deep"]),
    ("verify", lambda w: ["verify", str(w.with_tmp), "--latest"]),
    ("diff", lambda w: ["diff", str(w.good), str(w.good)]),
    ("digest", lambda w: ["digest", str(w.good)]),
    ("digest", lambda w: ["digest", str(w.composite)]),
    ("digest", lambda w: ["digest", str(FIXTURES / "strings")]),
    ("diff", lambda w: ["diff", f"{w.good}@400", f"{w.good}@500"]),
    ("doctor", lambda w: ["doctor", str(w.good), "--like", str(w.good)]),
    ("doctor", lambda w: ["doctor", str(FIXTURES / "seed_mlp"), "--like", str(FIXTURES / "bf16")]),
    ("prune", lambda w: ["prune", str(w.good), "--keep-last", "1", "--dry-run"]),
    ("prune", lambda w: ["prune", str(w.with_tmp), "--keep-last", "1", "--clean-tmp", "--yes"]),
    (
        "prune",
        lambda w: [
            "prune",
            str(w.composite),
            "--keep-best",
            "1",
            "--metric",
            "loss",
            "--mode",
            "min",
            "--dry-run",
        ],
    ),
    ("reshard", lambda w: ["reshard", str(w.good), str(w.tmp / "r"), "--mesh", "data=1"]),
    (
        "reshard",
        lambda w: ["reshard", str(w.good), str(w.tmp / "rd"), "--mesh", "data=1", "--dry-run"],
    ),
    ("migrate", lambda w: ["migrate", str(w.good), str(w.tmp / "m"), "--spec", str(w.spec)]),
    (
        "migrate",
        lambda w: ["migrate", str(w.good), str(w.tmp / "md"), "--spec", str(w.spec), "--dry-run"],
    ),
    ("average", lambda w: ["average", str(w.good), str(w.tmp / "a"), "--steps", "300,400,500"]),
    (
        "average",
        lambda w: ["average", str(w.good), str(w.tmp / "ad"), "--steps", "400,500", "--dry-run"],
    ),
    ("export", lambda w: ["export", str(w.good), str(w.tmp / "x"), "--params-only"]),
    (
        "export",
        lambda w: [
            "export",
            str(w.good),
            str(w.tmp / "xs"),
            "--params-only",
            "--max-shard-size",
            "1KB",
            "--dry-run",
        ],
    ),
    ("import", lambda w: ["import", str(w.tmp / "x"), str(w.tmp / "xi")]),  # after the export
    (
        "import",
        lambda w: ["import", str(w.tmp / "x"), str(w.tmp / "xm"), "--mesh", "data=1", "--dry-run"],
    ),
    ("cp", lambda w: ["cp", str(w.good), str(w.tmp / "c"), "--steps", "400-"]),
    ("cp", lambda w: ["cp", str(w.good), str(w.tmp / "c")]),  # 400, 500 already there
    ("cp", lambda w: ["cp", str(w.with_tmp), str(w.tmp / "cw"), "--dry-run"]),
    # exit 1: step 500 unlike its record; the plan and the outcome with the error
    ("cp", lambda w: ["cp", _damaged_recorded(w), str(w.tmp / "cv"), "--verify"]),
    ("du", lambda w: ["du", str(w.good)]),
    ("du", lambda w: ["du", str(w.with_tmp)]),
    ("trend", lambda w: ["trend", str(w.good)]),
    ("pin", lambda w: ["pin", str(w.good), "400", "--note", "best eval"]),
    ("unpin", lambda w: ["unpin", str(w.good), "300"]),  # not pinned: nothing to do, exit 0
]


def _check(command: str, doc: Any, errors: list[str]) -> None:
    v = validator(command)
    found = sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path))
    errors.extend(f"{command}: {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in found)


def test_real_outputs_validate(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    for command in app_commands():
        validator(command)  # every schema exists before anything runs
    errors: list[str] = []
    seen: set[str] = set()
    assert SUCCESSES
    for command, args in SUCCESSES:
        r = cli(*args(world), "--json")
        assert r.code in (0, 1), (args(world), r.stderr)
        _check(command, one_json_document(r.stdout), errors)
        seen.add(command)
    assert seen == app_commands(), "a command without a real output in this test"
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_error_outputs_validate(case, world: World, cli) -> None:  # type: ignore[no-untyped-def]
    from tests.support.error_cases import maybe_lock

    validator(case.command)
    with maybe_lock(case, world):
        r = cli(*case.args(world), "--json")
    errors: list[str] = []
    _check(case.command, one_json_document(r.stdout), errors)
    assert not errors, "\n".join(errors)


def test_schemas_reject_damaged_documents(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    """A schema that accepts anything proves nothing: drop a required key, add an unknown one,
    change a type; each must fail validation."""
    r = cli("verify", world.good, "--json")
    doc = one_json_document(r.stdout)
    v = validator("verify")
    assert v.is_valid(doc)
    missing = copy.deepcopy(doc)
    del missing["checked"]
    unknown = {**copy.deepcopy(doc), "surprise": 1}
    wrong = {**copy.deepcopy(doc), "ok": "yes"}
    version = {**copy.deepcopy(doc), "schema_version": doc["schema_version"] + 1}
    for bad in (missing, unknown, wrong, version):
        assert not v.is_valid(bad), bad.keys()
