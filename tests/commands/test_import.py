"""``ckpt import`` through the real entry point: the plan (``--dry-run``, text and JSON), the step
and item written (recorded by ``ckpt export``, or ``--step``/``--item``), a mesh layout, and its
refusals: one line, exit 2 for a request that makes no sense, 3 for files or a destination that
cannot be, nothing written. Orbax restoring what import wrote is in
``tests/e2e/test_import_orbax.py``; hostile headers in ``tests/hostile/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.commands import command
from tests.support.paths import FIXTURES
from tests.support.sharded import assert_same_values, read_values

SEED = FIXTURES / "seed_mlp"  # steps 300 400 500; export takes the latest
#: What ``ckpt import --dry-run --json`` prints; the run adds ``written``.
PLAN_KEYS = {
    "schema_version", "ok", "source", "output", "spec", "mesh", "total_bytes", "leaves", "tree",
    "dropped", "unused_rules",
}  # fmt: skip


@pytest.fixture
def exported(cli: Any, tmp_path: Path) -> Path:
    out = tmp_path / "exported"
    r = cli("export", SEED, out)
    assert r.code == 0, r.stderr
    return out


def test_unused_rule_hint_names_the_tensors(cli, exported: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A dry run refuses too, so the hint shows the names the patterns were matched against."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules: [{op: drop, match: 'nothing\\..*'}]\n")
    r = cli("import", exported, tmp_path / "out", "--spec", spec, "--dry-run")
    assert r.code == 3 and "matched no tensor" in r.stderr
    assert "--dry-run lists" not in r.stderr
    assert "the tensors are named 'opt_state.0.count', " in r.stderr and " more;" in r.stderr


def test_dry_run_json_is_the_plan_and_writes_nothing(cli, exported: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dst = tmp_path / "out"
    r = cli("import", exported, dst, "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert set(doc) == PLAN_KEYS and doc["ok"] is True
    assert doc["schema_version"] == command("import").schema_version()
    assert doc["source"]["files"] == ["model.safetensors"]
    assert doc["source"]["metadata"]["ckpt.step"] == "500"
    assert doc["output"] == {"root": str(dst), "step": 500, "item": "default"}
    names = [leaf["name"] for leaf in doc["leaves"]]
    assert "params.Dense_0.kernel" in names and len(names) == 15
    assert doc["total_bytes"] == sum(leaf["bytes"] for leaf in doc["leaves"])
    assert doc["tree"]["empty"] == [{"name": "opt_state.1", "value_type": "None"}]
    assert not dst.exists()


def test_dry_run_text_is_a_table_and_a_summary(cli, exported: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("import", exported, tmp_path / "out", "--dry-run")
    assert r.code == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    assert rows["leaf"] == ["leaf", "array", "chunk", "sharding", "operations"]
    assert rows["params.Dense_0.kernel"][1:] == ["float32[16,64]", "[16,64]", "cpu:0", "unchanged"]
    assert "15 leaves, 20.4 KiB from 1 file; into item 'default' of step 500" in r.stdout
    assert "dry run: nothing was changed" in r.stderr
    assert not (tmp_path / "out").exists()


def test_the_step_is_the_exported_one_and_its_values_come_back(  # type: ignore[no-untyped-def]
    cli, exported: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "out"
    r = cli("import", exported, dst, "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert set(doc) == PLAN_KEYS | {"written"}
    assert sorted(p.name for p in dst.iterdir()) == ["500"]
    assert (dst / "500" / "commit_success.txt").is_file()
    assert_same_values(read_values(SEED, step=500), read_values(dst))


def test_step_item_and_mesh_say_where_and_how(cli, exported: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rules = tmp_path / "rules.yaml"
    rules.write_text(json.dumps({"params.Dense_0.kernel": [None, "data"]}))
    dst = tmp_path / "out"
    args = ["--step", "9", "--item", "params", "--mesh", "data=2", "--rules", rules, "--json"]
    r = cli("import", exported, dst, *args)
    assert r.code == 0, r.stderr
    assert r.json()["output"] == {"root": str(dst), "step": 9, "item": "params"}
    kernel = next(x for x in r.json()["leaves"] if x["name"] == "params.Dense_0.kernel")
    assert kernel["chunk_shape"] == [16, 32]
    assert sorted(p.name for p in (dst / "9").iterdir()) == [
        "_CHECKPOINT_METADATA", "commit_success.txt", "params",
    ]  # fmt: skip
    inspected = cli("inspect", dst, "--item", "params", "--json")
    leaves = {x["name"]: x for x in inspected.json()["leaves"]}
    assert leaves["params.Dense_0.kernel"]["chunk_shape"] == [16, 32]


def _truncated(exported: Path) -> None:
    f = exported / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-5])


@pytest.mark.parametrize(
    ("case", "code", "phrase"),
    [
        ("taken", 3, "already exists"),
        ("truncated", 3, "run past the end"),
        ("missing", 3, "missing"),
        ("mesh", 2, "NAME=SIZE"),
        ("negative", 2, "-1"),
    ],
)
def test_refusals_are_one_line_and_write_nothing(  # type: ignore[no-untyped-def]
    cli, exported: Path, tmp_path: Path, case: str, code: int, phrase: str
) -> None:
    dst = tmp_path / "out"
    src: Path = exported
    extra: list[str] = []
    if case == "taken":
        assert cli("import", exported, dst).code == 0
    elif case == "truncated":
        _truncated(exported)
    elif case == "missing":
        src = tmp_path / "missing"
    elif case == "mesh":
        extra = ["--mesh", "data=x"]
    else:
        extra = ["--step", "-1"]
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    r = cli("import", src, dst, *extra)
    assert r.code == code, r.stdout + r.stderr
    assert phrase in r.stderr and "Traceback" not in r.stderr, r.stderr
    if code == 3:
        assert r.stderr.startswith("ckpt: error:") and len(r.stderr.strip().splitlines()) == 1
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
