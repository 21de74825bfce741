"""The public Python API (``ckpt_cli.__all__``): cheap to import, no JAX, documented, and doing
what the CLI does (the same results, the same JSON)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt_cli
from ckpt_cli.errors import NotFoundError, RefusedError, UsageError
from tests.support.paths import FIXTURES, REPO


def _probe(code: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_is_cheap() -> None:
    loaded = _probe(
        "import sys, json, ckpt_cli\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ckpt_cli', 'tensorstore', 'numpy', 'jax', 'typer', 'rich'))))"
    )
    assert loaded == ["ckpt_cli", "ckpt_cli._version", "ckpt_cli.errors"]


def test_reading_and_verifying_never_imports_jax() -> None:
    heavy = _probe(
        "import sys, json, numpy as np, ckpt_cli\n"
        f"ck = ckpt_cli.open({str(FIXTURES / 'sharded_4x2')!r})\n"
        "item = ck.item()\n"
        "[item.read(leaf.name) for leaf in item.leaves]\n"
        "item.read('params.w', index=np.s_[1:3])\n"
        "item.read_tree()\n"
        f"assert ckpt_cli.verify({str(FIXTURES / 'seed_mlp')!r}, deep=True).ok\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('jax', 'jaxlib', 'orbax', 'flax'))))"
    )
    assert heavy == []


def test_every_public_name_resolves_and_is_documented() -> None:
    assert ckpt_cli.__all__
    for name in ckpt_cli.__all__:
        value = getattr(ckpt_cli, name)
        if name != "__version__" and callable(value) and not name.startswith("Progress"):
            assert (value.__doc__ or "").strip(), f"{name} has no docstring"
    with pytest.raises(AttributeError):
        ckpt_cli.no_such_name  # noqa: B018


def test_open_steps_item_leaves() -> None:
    ck = ckpt_cli.open(FIXTURES / "seed_mlp")
    steps = ck.steps()
    assert [(s.step, s.status) for s in steps] == [(300, "committed"), (400, "committed"), (500, "committed")]  # fmt: skip
    item = ck.item()
    assert (item.step, item.name) == (500, "default")
    assert ck.item(step=300).step == 300
    leaves = {leaf.name: leaf for leaf in item.leaves}
    assert leaves["params.Dense_0.kernel"].dtype == "float32"
    assert leaves["params.Dense_0.kernel"].shape == (16, 64)
    with pytest.raises(NotFoundError):
        item.read("params.nope")


def test_regions_equal_slices_of_the_whole() -> None:
    item = ckpt_cli.open(FIXTURES / "sharded_4x2").item()
    arrays = [leaf for leaf in item.leaves if leaf.is_array and leaf.shape]
    assert arrays
    for leaf in arrays:
        whole = item.read(leaf.name)
        assert whole.shape == leaf.shape and str(whole.dtype) == leaf.dtype
        for index in (np.s_[1:], np.s_[-1], np.s_[..., 0], np.s_[0::2]):
            assert np.array_equal(item.read(leaf.name, index=index), whole[index]), (leaf, index)
    with pytest.raises(UsageError):
        item.read(arrays[0].name, index=np.s_[0, 0, 0, 0])


def test_read_tree_nests_and_keeps_sequences() -> None:
    item = ckpt_cli.open(FIXTURES / "strings").item()
    tree = item.read_tree()
    assert isinstance(tree["name"], str) and tree["name"] == item.read("name")
    assert isinstance(tree["meta"]["tags"], list) and all(
        isinstance(t, str) for t in tree["meta"]["tags"]
    )
    assert tree["nothing"] is None
    seed = ckpt_cli.open(FIXTURES / "seed_mlp").item().read_tree()
    assert isinstance(seed["opt_state"], list)  # optax's state tuple, saved as a sequence
    assert seed["params"]["Dense_0"]["kernel"].shape == (16, 64)


def test_verify_is_the_cli_report(cli: Any) -> None:
    report = ckpt_cli.verify(FIXTURES / "seed_mlp", deep=True)
    doc = cli("verify", FIXTURES / "seed_mlp", "--deep", "--json").json()
    ours = report.to_json()
    ours.pop("elapsed_s"), doc.pop("elapsed_s")
    assert ours == doc and report.ok


def test_du_is_the_cli_report(cli: Any) -> None:
    report = ckpt_cli.du(FIXTURES / "with_tmp")
    doc = cli("du", FIXTURES / "with_tmp", "--json").json()
    assert report.to_json() == doc and report.garbage


def test_plan_then_execute_each_writer(tmp_path: Path, fixture_copy: Any) -> None:
    plan = ckpt_cli.plan_reshard(
        FIXTURES / "seed_mlp", tmp_path / "out", mesh="data=2,model=2",
        rules={"params.*kernel": [None, "model"]},
    )  # fmt: skip
    assert plan.refusal is None and plan.to_json()["mesh"] == {"data": 2, "model": 2}
    assert not (tmp_path / "out").exists()  # a plan writes nothing
    written = ckpt_cli.execute(plan)
    assert written.output.step == 500 and (tmp_path / "out" / "500").is_dir()
    assert ckpt_cli.verify(tmp_path / "out", deep=True).ok

    spec = tmp_path / "spec.yaml"
    spec.write_text("rules:\n  - {op: cast, match: 'params\\..*', dtype: bfloat16}\n")
    migration = ckpt_cli.plan_migration(FIXTURES / "seed_mlp", tmp_path / "m", str(spec))
    assert {leaf.name for leaf in migration.changed} >= {"params.Dense_0.kernel"}
    ckpt_cli.execute(migration)
    kernel = ckpt_cli.open(tmp_path / "m").item().read("params.Dense_0.kernel")
    assert str(kernel.dtype) == "bfloat16"

    unused = tmp_path / "unused.yaml"
    unused.write_text("rules:\n  - {op: drop, match: 'nothing_here'}\n")
    refused = ckpt_cli.plan_migration(FIXTURES / "seed_mlp", tmp_path / "r", str(unused))
    assert isinstance(refused.refusal, RefusedError)
    with pytest.raises(RefusedError):
        ckpt_cli.execute(refused)
    assert not (tmp_path / "r").exists()

    root = fixture_copy("seed_mlp")
    prune = ckpt_cli.plan_prune(root, keep_last=1)
    assert [r.step for r in prune.delete] == [300, 400]
    result = ckpt_cli.execute(prune)
    assert sorted(p.name for p in root.iterdir()) == ["500"]
    assert result.to_json()["outcome"]["deleted"] == ["300", "400"]


def test_export_and_import_are_plan_execute_pairs(tmp_path: Path) -> None:
    plan = ckpt_cli.plan_export(FIXTURES / "seed_mlp", tmp_path / "hf", params_only=True)
    assert isinstance(plan, ckpt_cli.ExportPlan) and not (tmp_path / "hf").exists()
    assert plan.to_json()["tensors"]
    result = ckpt_cli.execute(plan)
    assert isinstance(result, ckpt_cli.ExportResult)
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    back = ckpt_cli.plan_import(tmp_path / "hf", tmp_path / "root", step=500)
    assert isinstance(back, ckpt_cli.ImportPlan) and not (tmp_path / "root").exists()
    done = ckpt_cli.execute(back)
    assert isinstance(done, ckpt_cli.ImportResult)
    item = ckpt_cli.open(tmp_path / "root").item(step=500)
    original = ckpt_cli.open(FIXTURES / "seed_mlp").item(step=500)
    names = sorted(leaf.name for leaf in item.leaves)
    assert names and names == sorted(
        x.name for x in original.leaves if x.name.startswith("params.")
    )
    for name in names:
        assert item.read(name).tobytes() == original.read(name).tobytes()


@pytest.mark.parametrize(("old", "new"), [("export", "plan_export"), ("import_", "plan_import")])
def test_the_old_names_of_plan_export_and_plan_import_warn(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"ckpt_cli.{new}"):
        alias = getattr(ckpt_cli, old)
    assert alias is getattr(ckpt_cli, new)
    assert old not in ckpt_cli.__all__ and new in ckpt_cli.__all__


def test_dir_lists_the_public_api_only() -> None:
    names = dir(ckpt_cli)
    assert names == sorted(ckpt_cli.__all__)
    assert "plan_export" in names and "Policy" in names
    assert not {"importlib", "os", "warnings", "annotations", "TYPE_CHECKING"} & set(names)


def test_public_functions_take_typed_keywords_not_options() -> None:
    """Every option of a public function is a named, annotated parameter: an IDE and mypy
    see them, and a misspelt one is a TypeError, not a silently ignored key."""
    functions = [
        getattr(ckpt_cli, name)
        for name in ckpt_cli.__all__
        if inspect.isfunction(getattr(ckpt_cli, name))
    ]
    assert {f.__name__ for f in functions} >= {"plan_prune", "plan_export", "plan_import"}
    for f in functions:
        for p in inspect.signature(f).parameters.values():
            assert p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL), f"{f.__name__}: {p}"
            assert p.annotation is not p.empty, f"{f.__name__}: {p.name} has no type"
    with pytest.raises(TypeError):
        ckpt_cli.plan_prune(FIXTURES / "seed_mlp", keep_lats=2)  # type: ignore[call-arg]


def test_plan_prune_takes_the_rules_as_keywords_or_a_policy() -> None:
    by_keywords = ckpt_cli.plan_prune(FIXTURES / "seed_mlp", keep_last=1, keep_steps=[300])
    assert [d.step for d in by_keywords.delete] == [400]
    policy = ckpt_cli.Policy(keep_last=1, keep_steps=frozenset({300}))
    assert ckpt_cli.plan_prune(FIXTURES / "seed_mlp", policy).delete == by_keywords.delete
    with pytest.raises(UsageError, match="not both"):
        ckpt_cli.plan_prune(FIXTURES / "seed_mlp", policy, keep_last=1)


def test_the_types_ship_with_the_package() -> None:
    """PEP 561: ``py.typed`` is in the package and in the built distribution's package data."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the package supports 3.10
    assert (REPO / "ckpt_cli" / "py.typed").is_file()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["ckpt_cli"]
