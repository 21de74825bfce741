"""docs/reference/json.md shows, per command, the document `--json` prints: its top-level fields are the
ones the command really prints on the fixtures (the doc's shapes are not JSON: ``A | B`` stands
for the values a field takes, so the keys are read with a small scanner)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_cli.app import app
from ckpt_cli.commands._schemas import schema_version
from tests.support.cli import CliResult
from tests.support.paths import FIXTURES, REPO

PAGE = (REPO / "docs" / "reference" / "json.md").read_text()


def top_level_keys(shape: str) -> list[str]:
    """The keys of the outermost object of a documented shape, in order."""
    keys: list[str] = []
    depth = 0
    i = 0
    while i < len(shape):
        c = shape[i]
        if c == '"':
            end = shape.index('"', i + 1)
            if depth == 1 and re.match(r"\s*:", shape[end + 1 :]):
                keys.append(shape[i + 1 : end])
            i = end + 1
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        i += 1
    return keys


def documented(command: str) -> list[str]:
    section = re.search(rf"^## `ckpt {command}`\n(.*?)(?=^## |\Z)", PAGE, re.M | re.S)
    assert section, f"docs/reference/json.md has no section for ckpt {command}"
    block = re.search(r"^```json\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, f"docs/reference/json.md: no json block for ckpt {command}"
    return top_level_keys(block.group(1))


def test_the_version_table_is_the_code() -> None:
    """The page's table of versions names every command once, each at the version it prints."""
    rows = re.findall(r"^\| `([a-z]+)` \| (\d+) \|$", PAGE, re.M)
    names = [c.name for c in app.registered_commands]
    assert names and rows
    assert sorted(name for name, _ in rows) == sorted(names)
    documented = {name: int(version) for name, version in rows}
    assert documented == {name: schema_version(name) for name in names}


def test_each_section_shows_the_version_its_command_prints() -> None:
    names = [c.name for c in app.registered_commands]
    assert names
    for name in names:
        section = re.search(rf"^## `ckpt {name}`\n(.*?)(?=^## |\Z)", PAGE, re.M | re.S)
        assert section, f"docs/reference/json.md has no section for ckpt {name}"
        shown = re.search(r'"schema_version": (\d+)', section.group(1))
        assert shown and int(shown.group(1)) == schema_version(name), (
            f"docs/reference/json.md shows ckpt {name} at schema_version "
            f"{shown and shown.group(1)}, it prints {schema_version(name)}"
        )


def test_the_scanner_reads_keys_of_the_outer_object_only() -> None:
    shape = '{"a": 1 | null, "b": {"c": [{"d": 2}]}, "e": ["f", "g"], "h": "x: y"}'
    assert top_level_keys(shape) == ["a", "b", "e", "h"]


Cli = Callable[..., CliResult]


def _cases(tmp: Path) -> dict[str, tuple[list[str], set[str]]]:
    """command -> (arguments, top-level fields documented that this run leaves out)."""
    seed = FIXTURES / "seed_mlp"
    return {
        "ls": ([str(seed)], set()),
        "inspect": (
            [str(FIXTURES / "sharded_4x2"), "--stats", "--layout", "params.w"],
            set(),
        ),
        "verify": ([str(seed), "--deep"], set()),
        "diff": ([f"{seed}@400", f"{seed}@500"], set()),
        "digest": ([str(seed)], set()),
        "prune": ([str(tmp / "seed_mlp"), "--keep-last", "1", "--yes"], set()),
        "reshard": ([str(seed), str(tmp / "r"), "--mesh", "data=2"], set()),
        "migrate": (
            [str(seed), str(tmp / "m"), "--spec", str(REPO / "examples" / "widen_64_to_128.yaml")],
            set(),  # "digests" (only when the source has a record) is documented in the prose
        ),
        "cp": ([str(seed), str(tmp / "c"), "--steps", "400-"], set()),
    }


@pytest.mark.parametrize(
    "command", ["ls", "inspect", "verify", "diff", "digest", "prune", "reshard", "migrate", "cp"]
)
def test_the_documented_fields_are_the_printed_ones(
    command: str, cli: Cli, tmp_path: Path, fixture_copy: Callable[[str], Path]
) -> None:
    fixture_copy("seed_mlp")  # prune deletes from this copy
    args, absent = _cases(tmp_path)[command]
    result = cli(command, *args, "--json")
    assert result.code in (0, 1), result.stderr
    printed = list(json.loads(result.stdout))
    keys = documented(command)
    assert keys and keys[0] == "schema_version"
    assert set(printed) <= set(keys), (
        f"ckpt {command} prints undocumented {set(printed) - set(keys)}"
    )
    assert set(keys) - set(printed) == absent, (
        f"documented but not printed: {set(keys) - set(printed)}"
    )
