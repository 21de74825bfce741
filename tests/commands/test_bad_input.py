"""Bad input: one line on stderr naming the problem and what to do, a documented exit code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_cli._version import ISSUES
from tests.support.paths import FIXTURES


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("ckpt: error: ")
    return lines[0]


@pytest.mark.parametrize("command", ["ls", "inspect"])
def test_missing_path(cli, tmp_path: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    r = cli(command, tmp_path / "nope")
    assert r.code == 3
    assert "does not exist" in one_error_line(r.stderr)


@pytest.mark.parametrize("command", ["ls", "inspect"])
def test_not_a_checkpoint_says_what_is_there(cli, tmp_path: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "data").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    r = cli(command, tmp_path)
    assert r.code == 3
    line = one_error_line(r.stderr)
    assert "not an Orbax checkpoint" in line and "data/" in line and "notes.txt" in line


def test_empty_root(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", tmp_path)
    assert r.code == 3
    assert "empty directory" in one_error_line(r.stderr)


def test_root_with_only_unfinished_saves(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "7.orbax-checkpoint-tmp").mkdir()
    assert cli("ls", tmp_path).code == 0
    r = cli("inspect", tmp_path)
    assert r.code == 3
    assert "no committed step" in one_error_line(r.stderr)


def test_a_file_is_not_a_checkpoint(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "model.bin"
    f.write_bytes(b"\0" * 10)
    r = cli("inspect", f)
    assert r.code == 3
    assert "is a file" in one_error_line(r.stderr)


@pytest.mark.parametrize("command", ["ls", "inspect", "verify", "diff", "cp"])
def test_legacy_msgpack_is_one_unsupported_error(cli, tmp_path: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    legacy = FIXTURES / "msgpack_legacy"
    args = {"diff": [legacy, legacy], "cp": [legacy, tmp_path / "copy"]}.get(command, [legacy])
    r = cli(command, *args)
    assert r.code == 3
    line = one_error_line(r.stderr)
    assert "is a legacy Flax msgpack checkpoint (flax.training.checkpoints)" in line
    doc = cli(command, *args, "--json").json()
    assert doc["ok"] is False and doc["error"]["code"] == "unsupported"
    hint = doc["error"]["hint"]
    want = "copy the file itself" if command == "cp" else "flax.training.checkpoints.restore"
    assert want in hint


@pytest.mark.parametrize(
    ("relpath", "content", "phrase"),
    [
        ("500/default/_METADATA", '{"tree_metadata": {"(', "not valid JSON"),
        ("500/default/_METADATA", "", "is empty"),
        ("500/default/_METADATA", '{"x": 1}', "no 'tree_metadata'"),
        ("500/default/_sharding", "[1, 2", "not valid JSON"),
        ("500/default/array_metadatas/process_0", "{}", "array_metadatas layout"),
    ],
)
def test_damaged_json(cli, fixture_copy, relpath: str, content: str, phrase: str) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("seed_mlp")
    (root / relpath).write_text(content)
    r = cli("inspect", root)
    assert r.code == 3
    line = one_error_line(r.stderr)
    assert phrase in line and Path(relpath).name in line


def test_truncated_step_metadata(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("composite_best")
    path = root / "4" / "_CHECKPOINT_METADATA"
    path.write_bytes(path.read_bytes()[:40])
    r = cli("inspect", root, "--item", "state")
    assert r.code == 3
    assert "_CHECKPOINT_METADATA is not valid JSON" in one_error_line(r.stderr)


def test_missing_step_and_item(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", FIXTURES / "seed_mlp", "--step", "7")
    assert r.code == 3
    assert "step 7 not found" in one_error_line(r.stderr) and "300, 400, 500" in r.stderr
    r = cli("inspect", FIXTURES / "seed_mlp", "--item", "params")
    assert r.code == 3
    assert "item 'params' not found" in one_error_line(r.stderr)


def test_several_pytree_items_each_compared_or_named_where_one_is_needed(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("composite_best")
    shutil.copytree(root / "4" / "state", root / "4" / "params")  # two PyTree items
    # diff and reshard act on every item (the step is the unit); export writes one item
    r = cli("diff", root, root)
    assert r.code == 0, r.stderr
    assert "item params: equal" in r.stdout and "item state: equal" in r.stdout
    r = cli("export", root, root.parent / "out.safetensors")
    assert r.code == 2, r.stderr
    assert "several items (extra, params, state)" in one_error_line(r.stderr)
    assert "--item" in r.stderr
    assert not (root.parent / "out.safetensors").exists()
    # inspect shows them all
    r = cli("inspect", root, "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["item"] is None and [i["item"] for i in doc["items"]] == ["extra", "params", "state"]
    assert all(i["leaves"] for i in doc["items"])


@pytest.mark.parametrize(
    "shape",
    [[10**30, 10**30], [-4, 2], [2**40, 2**40], "big", [1.5]],
)
def test_absurd_zarr_shape(cli, fixture_copy, shape: object) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    zarray = root / "0" / "default" / "params.Dense_0.kernel" / ".zarray"
    doc = json.loads(zarray.read_text())
    doc["shape"] = shape
    zarray.write_text(json.dumps(doc))
    for args in (["inspect", root], ["inspect", root, "--stats"]):
        r = cli(*args)
        assert r.code == 3, r.stderr
        assert "zarr header of leaf 'params.Dense_0.kernel'" in one_error_line(r.stderr)


def test_usage_errors_exit_2(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("inspect").code == 2
    assert cli("inspect", FIXTURES / "seed_mlp", "--step", "abc").code == 2
    r = cli("inspect", FIXTURES / "seed_mlp", "--filter", "(")
    assert r.code == 2 and "not a valid pattern" in r.stderr


def test_layout_of_unknown_leaf(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", FIXTURES / "sharded_4x2", "--layout", "params.nope")
    assert r.code == 3
    assert "no leaf named 'params.nope'" in one_error_line(r.stderr)


def test_unexpected_errors_are_one_line_bugs(cli, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ckpt_cli.core.listing as ls_mod

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("kaput")

    monkeypatch.setattr(ls_mod, "list_root", boom)
    r = cli("ls", FIXTURES / "seed_mlp")
    assert r.code == 70
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt: internal error: RuntimeError: kaput")
    assert "CKPT_DEBUG=1" in lines[0] and f"report it at {ISSUES}" in lines[0]


def test_version(cli) -> None:  # type: ignore[no-untyped-def]
    from ckpt_cli import __version__

    r = cli("--version")
    assert r.code == 0 and r.stdout.strip() == f"ckpt {__version__}"


SEED = FIXTURES / "seed_mlp"

#: Every place that takes a leaf pattern: how to give it the bad pattern ``(`` (``{bad}``: a
#: rules file or a spec holding it), and how the error line names the place.
PATTERN_PLACES = {
    "inspect --filter": (["inspect", SEED, "--filter", "("], "--filter '('"),
    "diff --filter": (["diff", f"{SEED}@400", f"{SEED}@500", "--filter", "("], "--filter '('"),
    "reshard --rule": (
        ["reshard", SEED, "{out}", "--mesh", "data=1", "--rule", "(=[]"],
        "--rule '(=[]': rule '('",
    ),
    "reshard --rules": (
        ["reshard", SEED, "{out}", "--mesh", "data=1", "--rules", "{rules}"],
        "rule '('",
    ),
    "import --rules": (
        ["import", "{exported}", "{out}", "--mesh", "data=1", "--rules", "{rules}"],
        "rule '('",
    ),
    "migrate --spec match": (
        ["migrate", SEED, "{out}", "--spec", "{spec}"],
        "rule 1 (drop): field 'match' '('",
    ),
    "export --spec match": (["export", SEED, "{out}", "--spec", "{spec}"], "field 'match' '('"),
    "import --spec match": (
        ["import", "{exported}", "{out}", "--spec", "{spec}"],
        "field 'match' '('",
    ),
}


@pytest.mark.parametrize("place", list(PATTERN_PLACES))
def test_a_bad_leaf_pattern_is_a_usage_error_everywhere(cli, tmp_path: Path, place: str) -> None:  # type: ignore[no-untyped-def]
    """Exit 2 and one line naming the pattern, where it was given and RE2's reason, pointing at
    the one page on leaf patterns; nothing written."""
    args, names = PATTERN_PLACES[place]
    fill = {
        "out": tmp_path / "out",
        "rules": tmp_path / "rules.yaml",
        "spec": tmp_path / "spec.yaml",
        "exported": tmp_path / "exported",
    }
    fill["rules"].write_text("'(': []\n")
    fill["spec"].write_text("rules: [{op: drop, match: '('}]\n")
    if "{exported}" in args:
        assert cli("export", SEED, fill["exported"]).code == 0
    r = cli(*[str(a).format(**fill) if isinstance(a, str) else a for a in args])
    assert r.code == 2, r.stderr
    line = one_error_line(r.stderr)
    assert f"{names} is not a valid pattern (RE2: missing ): (" in line, line
    assert "docs/reference/layouts.md#leaf-patterns" in line
    assert not fill["out"].exists()
    assert cli(*[str(a).format(**fill) for a in args], "--json").json()["error"]["code"] == "usage"
