"""``--json`` on every error path of every command.

With ``--json`` every outcome, errors included, is exactly one JSON document on stdout,
``{"schema_version": N, "ok": false, "error": {"code", "message", "hint"}}``, with the exit code
the same command has without ``--json``. The matrix below names, for every command of the
registry and every error class, a way to provoke it, or why the class cannot arise there; a
command registered without its rows fails ``test_every_error_class_is_covered[<command>]``,
which says what to add.

``test_provocation`` (no ``--json``) proves each case really reaches its error class today: exit
code and the phrase on stderr. ``test_json_error_document`` is the contract.
"""

from __future__ import annotations

import pytest

from ckpt_cli._version import ISSUES
from tests.support.error_cases import (
    CASES,
    EXIT,
    Case,
    coverage_gaps,
    maybe_lock,
    registry_names,
)
from tests.support.world import World, one_json_document

#: command -> error class -> why the class cannot arise there.
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "ls": {
        "refused": "read-only: never refuses",
        "locked": "takes no lock",
    },
    "du": {
        "refused": "read-only: never refuses",
        "locked": "takes no lock",
        "invalid-metadata": "reads sizes and b-tree nodes: an unreadable zarr header leaves "
        "that leaf's logical_bytes null, damaged OCDBT leaves the item inexact (verify says why)",
    },
    "inspect": {
        "refused": "read-only: never refuses",
        "locked": "takes no lock",
    },
    "verify": {
        # Damage is what verify looks for: a finding (exit 1, the report with ok=false),
        # never an error document; see test_verify_damage_is_a_report.
        "invalid-metadata": "damaged metadata is a finding in the report (exit 1)",
        "refused": "a refused --mark-committed is a finding in the report (exit 1)",
        "locked": "takes no lock",
    },
    "diff": {
        "refused": "read-only: never refuses",
        "locked": "takes no lock",
    },
    "digest": {
        "refused": "read-only: never refuses",
        "locked": "takes no lock",
    },
    "doctor": {"locked": "takes no lock"},
    "trend": {
        "refused": "read-only: never refuses",
        "locked": "takes no lock",
    },
    "prune": {},
    "reshard": {},
    "migrate": {},
    "average": {},
    "export": {"locked": "writes a new directory under a tmp name: takes no root lock"},
    "import": {
        "not-a-checkpoint": "reads safetensors files, not a checkpoint (invalid-metadata instead)",
        "unreachable": "reads local safetensors files only (an s3:// or gs:// source is unsupported)",
    },
    "cp": {},
    "pin": {"invalid-metadata": "reads no metadata: a pin names a step directory"},
    "unpin": {
        "invalid-metadata": "reads no metadata: a pin names a step directory",
        "refused": "unpinning a step that is not pinned changes nothing: exit 0",
    },
}


def _params() -> list[object]:
    return [pytest.param(case, id=case.id) for case in CASES]


@pytest.mark.parametrize("command", registry_names())
def test_every_error_class_is_covered(command: str) -> None:
    """Each registered command: every error class has a case or a reason it cannot arise."""
    gaps = coverage_gaps(command, NOT_APPLICABLE)
    assert not gaps, "\n".join(gaps)


def test_every_row_names_a_registered_command() -> None:
    names = set(registry_names())
    assert {c.command for c in CASES} <= names, {c.command for c in CASES} - names
    assert set(NOT_APPLICABLE) <= names, set(NOT_APPLICABLE) - names


@pytest.mark.parametrize("case", _params())
def test_provocation(case: Case, world: World, cli) -> None:  # type: ignore[no-untyped-def]
    """Without --json: the case reaches its class (exit code, phrase), stdout stays empty."""
    with maybe_lock(case, world):
        r = cli(*case.args(world))
    assert r.code == EXIT[case.error], r.stderr
    assert case.phrase in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("case", _params())
def test_json_error_document(case: Case, world: World, cli) -> None:  # type: ignore[no-untyped-def]
    with maybe_lock(case, world):
        r = cli(*case.args(world), "--json")
    assert r.code == EXIT[case.error], r.stderr
    doc = one_json_document(r.stdout)
    assert isinstance(doc.get("schema_version"), int) and doc["schema_version"] >= 1, doc
    assert doc["ok"] is False
    error = doc["error"]
    assert set(error) == {"code", "message", "hint"}, error
    assert error["code"] == case.error, error
    assert isinstance(error["message"], str) and error["message"].strip()
    assert error["hint"] is None or (isinstance(error["hint"], str) and error["hint"].strip())
    # People reading a CI log still get the one line on stderr; never a traceback.
    lines = [line for line in r.stderr.splitlines() if line.startswith("ckpt: error: ")]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_refused_prune_document_carries_the_plan(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    """A prune refused for want of --yes still says what it would have done, in the same one
    document: the plan, ``outcome`` null, ``ok`` false and the error."""
    r = cli("prune", world.good, "--keep-last", "1", "--json")
    assert r.code == 3
    doc = one_json_document(r.stdout)
    assert doc["ok"] is False and doc["error"]["code"] == "refused"
    assert [d["step"] for d in doc["delete"]] == [300, 400]
    assert doc["outcome"] is None
    assert sorted(p.name for p in world.good.iterdir()) == ["300", "400", "500"]


def test_internal_error_is_a_document_too(world: World, cli, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ckpt_cli.core.listing as listing

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("kaput")

    monkeypatch.setattr(listing, "list_root", boom)
    r = cli("ls", world.good, "--json")
    assert r.code == 70
    doc = one_json_document(r.stdout)
    assert doc["ok"] is False and doc["error"]["code"] == "internal"
    assert "kaput" in doc["error"]["message"] and "CKPT_DEBUG=1" in (doc["error"]["hint"] or "")
    assert ISSUES in doc["error"]["hint"]


def test_success_documents_say_ok(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    """``ok`` is in every document and is true exactly when the exit code is 0."""
    runs = [
        (["ls", world.good], 0),
        (["inspect", world.good], 0),
        (["verify", world.good], 0),
        (["diff", world.good, world.good], 0),
        (["diff", f"{world.good}@400", f"{world.good}@500"], 1),
        (["prune", world.good, "--keep-last", "1", "--dry-run"], 0),
    ]
    for args, code in runs:
        r = cli(*args, "--json")
        assert r.code == code, (args, r.stderr)
        assert one_json_document(r.stdout)["ok"] is (code == 0), args


def test_verify_damage_is_a_report(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    """Why verify has no invalid-metadata error: damage is what it reports, exit 1."""
    r = cli("verify", world.bad_item, "--json")
    assert r.code == 1
    doc = one_json_document(r.stdout)
    assert doc["ok"] is False and "error" not in doc
    assert "json-invalid" in {p["code"] for p in doc["problems"]}
