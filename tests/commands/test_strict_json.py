"""Every ``--json`` document is strict JSON, on a run that diverged too.

JSON has no NaN, Infinity or -Infinity: Python's ``json`` writes them, JavaScript's
``JSON.parse``, Go's ``encoding/json`` and ``jq`` refuse the whole document. The diverged runs
(``fixtures/diverged``: every parameter and Adam moment NaN from step 5, the loss NaN from step
6, ``{"loss": NaN}`` on disk) go through every command of the registry that takes ``--json``,
reads and writers (into a fresh destination), successes and error documents. Each document must
parse with NaN and Infinity refused and validate against its published schema. And the meaning
must come from the result itself (null with ``<key>_nonfinite`` beside it,
docs/reference/json.md "NaN and Inf"), not from the last guard in ``commands._output``, which
writes a stray NaN as null and says so on stderr: ``GUARDED`` lists the documents known to need
that guard still, and fails once one no longer does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.commands import COMMANDS
from tests.support.cli import app_commands
from tests.support.error_cases import CASES
from tests.support.paths import REPO
from tests.support.schemas import validator

DIVERGED = REPO / "fixtures" / "diverged"
#: What the last guard says on stderr when it had to write a NaN or Inf as null.
GUARD_WARNING = "NaN/Inf value(s) written as null"

Args = Callable[[Path, Path], list[Any]]  # (the diverged runs' copy, a scratch dir) -> argv


def _spec(t: Path) -> Path:
    spec = t / "cast.yaml"
    spec.write_text("version: 1\nrules:\n  - {op: cast, match: 'params\\..*', dtype: bfloat16}\n")
    return spec


#: (id, command, argv builder). Each command of the registry with ``--json`` has at least one.
RUNS: list[tuple[str, str, Args]] = [
    ("ls-linen", "ls", lambda d, t: ["ls", d / "linen"]),
    ("ls-nnx", "ls", lambda d, t: ["ls", d / "nnx"]),
    ("du", "du", lambda d, t: ["du", d / "linen"]),
    ("inspect-stats", "inspect", lambda d, t: ["inspect", d / "linen", "-s", "6", "--stats"]),
    ("inspect-nnx", "inspect", lambda d, t: ["inspect", d / "nnx", "-s", "5", "--stats"]),
    (
        "inspect-metrics",
        "inspect",
        lambda d, t: ["inspect", d / "linen", "-s", "6", "-i", "metrics"],
    ),
    ("verify-deep", "verify", lambda d, t: ["verify", d / "linen", "--deep"]),
    ("verify-nnx", "verify", lambda d, t: ["verify", d / "nnx", "--deep"]),
    ("digest", "digest", lambda d, t: ["digest", d / "linen"]),
    ("diff-4-5", "diff", lambda d, t: ["diff", f"{d / 'linen'}@4", f"{d / 'linen'}@5"]),
    ("diff-6-7", "diff", lambda d, t: ["diff", f"{d / 'linen'}@6", f"{d / 'linen'}@7"]),
    ("diff-nnx", "diff", lambda d, t: ["diff", f"{d / 'nnx'}@4", f"{d / 'nnx'}@5"]),
    (
        "diff-metrics",
        "diff",
        lambda d, t: ["diff", f"{d / 'linen'}@5", f"{d / 'linen'}@7", "-i", "metrics"],
    ),
    ("doctor", "doctor", lambda d, t: ["doctor", d / "linen", "--like", d / "linen"]),
    ("trend", "trend", lambda d, t: ["trend", d / "linen"]),
    ("trend-nnx", "trend", lambda d, t: ["trend", d / "nnx", "--item", "optimizer"]),
    (
        "prune-best",
        "prune",
        lambda d, t: [
            *("prune", d / "linen", "--keep-best", "2", "--metric", "loss", "--mode", "min"),
            "--dry-run",
        ],
    ),
    ("prune-last", "prune", lambda d, t: ["prune", d / "linen", "--keep-last", "2", "--yes"]),
    ("reshard-nan", "reshard", lambda d, t: ["reshard", d / "linen", t / "r", "--mesh", "data=1"]),
    (
        "reshard-4",
        "reshard",
        lambda d, t: ["reshard", d / "linen", t / "r4", "--mesh", "data=1", "-s", "4"],
    ),
    ("migrate-nan", "migrate", lambda d, t: ["migrate", d / "linen", t / "m", "--spec", _spec(t)]),
    (
        "migrate-4",
        "migrate",
        lambda d, t: ["migrate", d / "linen", t / "m4", "--spec", _spec(t), "-s", "4"],
    ),
    ("average-nan", "average", lambda d, t: ["average", d / "linen", t / "a", "--steps", "4,5"]),
    ("average-3-4", "average", lambda d, t: ["average", d / "linen", t / "a4", "--steps", "3,4"]),
    (
        "export-nan",
        "export",
        lambda d, t: ["export", d / "linen", t / "x", "--params-only", "-s", "6"],
    ),
    (
        "export-4",
        "export",
        lambda d, t: ["export", d / "linen", t / "x4", "--params-only", "-s", "4"],
    ),
    # What it imports: the last finite step, which the test exports first.
    ("import", "import", lambda d, t: ["import", t / "x4", t / "xi"]),
    ("cp", "cp", lambda d, t: ["cp", d / "linen", t / "c", "--steps", "5-"]),
    ("pin", "pin", lambda d, t: ["pin", d / "linen", "6", "--note", "diverged"]),
    ("unpin", "unpin", lambda d, t: ["unpin", d / "linen", "6"]),
    # Error documents on the diverged runs.
    ("ls-missing", "ls", lambda d, t: ["ls", d / "missing"]),
    ("inspect-no-step", "inspect", lambda d, t: ["inspect", d / "linen", "-s", "99"]),
    ("diff-no-item", "diff", lambda d, t: ["diff", f"{d / 'nnx'}@4", f"{d / 'linen'}@4"]),
]

#: Documents whose NaN still reaches the last guard (written null, no ``_nonfinite`` beside
#: it), and why: each fails this test once its result carries the meaning itself.
GUARDED = {
    "inspect-metrics": "inspect's JSON leaf `value` (core/inspect) is the bare NaN metric",
}


def json_commands() -> set[str]:
    """The registry's commands that take ``--json``."""
    import typer

    from ckpt_cli.app import app

    group = typer.main.get_command(app)
    names = {
        c.name
        for c in COMMANDS
        if any("--json" in p.opts for p in group.commands[c.name].params)  # type: ignore[attr-defined]
    }
    assert names, "no command of the registry takes --json"
    return names


def strict(text: str) -> Any:
    """The one document on stdout, parsed as JavaScript's and Go's parsers would."""

    def refuse(token: str) -> None:
        raise AssertionError(f"not JSON: a bare {token} in the document")

    text = text.strip()
    assert text, "nothing on stdout"
    doc, end = json.JSONDecoder(parse_constant=refuse).raw_decode(text)
    assert text[end:].strip() == "", f"more than one document: {text[end:][:200]!r}"
    return doc


def test_every_json_command_runs_on_the_diverged_runs() -> None:
    """The registry decides what is covered: a command with ``--json`` and no run fails here."""
    covered = {command for _, command, _ in RUNS}
    assert covered, "no run"
    assert json_commands() <= covered, sorted(json_commands() - covered)
    assert covered <= app_commands()
    assert set(GUARDED) <= {run_id for run_id, _, _ in RUNS}


@pytest.fixture
def diverged(tmp_path: Path) -> Path:
    """A writable copy of the diverged runs (prune deletes, pin writes)."""
    dst = tmp_path / "diverged"
    shutil.copytree(DIVERGED, dst, symlinks=True)
    return dst


@pytest.mark.parametrize(("run_id", "command", "args"), RUNS, ids=[r[0] for r in RUNS])
def test_json_is_strict_on_a_diverged_run(  # type: ignore[no-untyped-def]
    run_id: str, command: str, args: Args, diverged: Path, tmp_path: Path, cli
) -> None:
    scratch = tmp_path / "out"
    scratch.mkdir()
    if command == "import":  # what it imports: the last finite step, exported
        exported = cli("export", diverged / "linen", scratch / "x4", "--params-only", "-s", "4")
        assert exported.code == 0, exported.stderr
    r = cli(*args(diverged, scratch), "--json")
    assert r.code in (0, 1, 2, 3), (r.code, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    doc = strict(r.stdout)
    if r.code in (2, 3):
        assert doc["ok"] is False and doc["error"]["code"], doc
    errors = [e.message for e in validator(command).iter_errors(doc)]
    assert not errors, errors
    guarded = GUARD_WARNING in r.stderr
    if run_id in GUARDED:
        assert guarded, f"{run_id} no longer needs the guard: remove it from GUARDED"
    else:
        assert not guarded, f"a NaN reached the last guard: {r.stderr}"


def _one_case_per_command() -> list[Any]:
    seen: dict[str, Any] = {}
    for case in CASES:
        seen.setdefault(case.command, case)
    return [pytest.param(case, id=case.id) for case in seen.values()]


@pytest.mark.parametrize("case", _one_case_per_command())
def test_error_documents_are_strict(case, world, cli) -> None:  # type: ignore[no-untyped-def]
    """An error document of each command (tests/support/error_cases.py) parses strictly."""
    from tests.support.error_cases import maybe_lock

    with maybe_lock(case, world):
        r = cli(*case.args(world), "--json")
    doc = strict(r.stdout)
    assert doc["ok"] is False and set(doc["error"]) == {"code", "message", "hint"}


class _Doc:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def to_json(self) -> dict[str, Any]:
        return self.doc


def test_the_last_guard_writes_null_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """A NaN or Inf no result accounted for (a custom metadata value, say) is written null,
    named on stderr; a document of finite values is written as it is, nothing on stderr."""
    from ckpt_cli.commands._output import emit_error, emit_json

    emit_json(_Doc({"a": 1.5, "meta": {"x": [float("nan"), 2.0], "y": float("-inf")}}))
    out = capsys.readouterr()
    assert strict(out.out) == {"a": 1.5, "meta": {"x": [None, 2.0], "y": None}}
    assert GUARD_WARNING in out.err and "meta.x.0, meta.y" in out.err
    emit_error(3, {"code": "refused", "message": "m", "hint": None}, {"best": float("inf")})
    out = capsys.readouterr()
    assert strict(out.out) == {
        "schema_version": 3,
        "best": None,
        "ok": False,
        "error": {"code": "refused", "message": "m", "hint": None},
    }
    assert GUARD_WARNING in out.err
    emit_json(_Doc({"a": 1.5}))
    out = capsys.readouterr()
    assert strict(out.out) == {"a": 1.5} and out.err == ""
