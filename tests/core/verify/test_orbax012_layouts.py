"""``verify`` on Orbax 0.12.x layouts (``fixtures/orbax012/layouts/``): every per-process
database read whatever its name, and the split ``ocdbt_meta/``/``ocdbt_data/`` folders; no
file Orbax reads ever called unknown or unreferenced (advice to delete it would destroy the
step); the unreferenced data files exactly those TensorStore's walk finds, as ``du`` finds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_cli.core.du import disk_usage
from ckpt_cli.core.storage import LocalLocation, open_location
from ckpt_cli.core.verify.problems import Problem
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions
from tests.support.orbax012_layouts import (
    LAYOUTS,
    NAMES,
    WITH_GARBAGE,
    copy_layout,
    item_dir,
    truth,
)


def _problems(root: Path, deep: bool = True) -> list[Problem]:
    return list(verify_path(LocalLocation(str(root)), VerifyOptions(deep=deep)).problems)


def _unreferenced(root: Path, deep: bool = True) -> set[str]:
    """The data files verify names as referenced by no database (``unreferenced_files``), or
    reports as ``unreferenced-file`` (the item's own database)."""
    report = verify_path(LocalLocation(str(root)), VerifyOptions(deep=deep))
    named = set(report.checked_json()["unreferenced_files"])
    return named | {p.file or "" for p in report.problems if p.code == "unreferenced-file"}


@pytest.mark.parametrize("name", NAMES)
def test_verify_deep_names_only_the_data_files_no_version_references(name: str) -> None:
    """A per-process database's dead weight is named, never a problem (a clean save leaves
    it): no false alarm, and nothing Orbax reads among what is named."""
    assert _problems(LAYOUTS / name) == []
    assert _unreferenced(LAYOUTS / name) == set(truth(name)["unreferenced"])


@pytest.mark.parametrize("name", WITH_GARBAGE)
def test_verify_and_du_name_the_same_garbage(name: str) -> None:
    root = LAYOUTS / name
    by_verify = _unreferenced(root, deep=False)
    by_du = {
        str(Path(g.path).relative_to(root))
        for g in disk_usage(open_location(str(root))).garbage
        if g.kind == "unreferenced-file"
    }
    assert by_verify and by_verify == by_du == set(truth(name)["unreferenced"])


@pytest.mark.parametrize(
    ("name", "database"),
    [("split_folders", "ocdbt.process_0"), ("garbage_partial", "ocdbt.process_0?*")],
)
def test_a_database_without_its_manifest_is_damage_and_none_of_its_files_is_advised_away(
    tmp_path: Path, name: str, database: str
) -> None:
    """Its data files cannot be told referenced or not: they are never called unknown or
    unreferenced (the advice to delete them), only the manifest is missing."""
    root = copy_layout(name, tmp_path)
    item = root / item_dir(name)
    db = sorted(item.glob(database))[0]
    (db / "manifest.ocdbt").unlink()
    problems = _problems(root, deep=False)
    codes = {p.code for p in problems}
    assert "manifest-missing" in codes
    assert not codes & {"unknown-file", "unreferenced-file"}, problems
    assert any(p.file == f"{item.relative_to(root)}/{db.name}/manifest.ocdbt" for p in problems)
