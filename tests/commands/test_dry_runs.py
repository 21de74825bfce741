"""Every ``--dry-run`` ends the same way: the plan, then one line on stderr saying that
nothing was changed, and nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.main import get_command

from ckpt_cli.app import app
from ckpt_cli.commands import COMMANDS
from ckpt_cli.commands._output import DRY_RUN_NOTE
from tests.support.paths import FIXTURES

SEED = FIXTURES / "seed_mlp"


def _with_dry_run() -> list[str]:
    group = get_command(app)
    return [
        c.name
        for c in COMMANDS
        if any("--dry-run" in p.opts for p in group.commands[c.name].params)  # type: ignore[attr-defined]
    ]


def _arguments(command: str, tmp_path: Path, cli) -> list[object]:  # type: ignore[no-untyped-def]
    """A dry run of ``command`` that succeeds, writing into ``tmp_path / "out"``."""
    out = tmp_path / "out"
    if command == "prune":
        root = shutil.copytree(SEED, tmp_path / "root")
        return [root, "--keep-last", "1"]
    if command == "migrate":
        spec = tmp_path / "spec.yaml"
        spec.write_text("rules: [{op: drop, match: rng}]\n")
        return [SEED, out, "--spec", spec]
    if command == "reshard":
        return [SEED, out, "--mesh", "data=1"]
    if command == "average":
        return [SEED, out, "--steps", "300,400,500"]
    if command in ("export", "cp"):
        return [SEED, out]
    if command == "import":
        exported = tmp_path / "exported"
        assert cli("export", SEED, exported).code == 0
        return [exported, out]
    raise AssertionError(f"no dry run of {command} in this test: add its arguments")


def test_the_commands_with_a_dry_run() -> None:
    assert _with_dry_run() == ["prune", "reshard", "migrate", "average", "export", "import", "cp"]


@pytest.mark.parametrize("json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", _with_dry_run())
def test_every_dry_run_says_nothing_was_changed(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, command: str, json: bool
) -> None:
    args = _arguments(command, tmp_path, cli)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = cli(command, *args, "--dry-run", *(["--json"] if json else []))
    assert r.code == 0, r.stderr
    assert r.stderr.splitlines()[-1] == DRY_RUN_NOTE, r.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    if json:
        assert "schema_version" in r.json()  # the plan, one document


@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        ([], "--dry-run lists every leaf"),
        (["--dry-run"], "the plan above lists every leaf"),
        (["--dry-run", "--json"], "the plan in the JSON document lists every leaf"),
    ],
)
def test_a_refused_plan_hints_dry_run_only_when_it_was_not_given(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, extra: list[str], hint: str
) -> None:
    """A rank-2 spec on the biases: the plan is refused; with --dry-run it is shown already."""
    args = [
        "reshard",
        SEED,
        tmp_path / "out",
        "--mesh",
        "data=8",
        "--rule",
        "params.*=[data, null]",
    ]
    r = cli(*args, *extra)
    assert r.code == 3 and "cannot take the target layout" in r.stderr
    assert hint in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
