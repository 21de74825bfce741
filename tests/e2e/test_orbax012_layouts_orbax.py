"""The Orbax 0.12.x save layouts (``fixtures/orbax012/layouts/``) against the installed Orbax:
the truth is what it restores now, and deleting every file ``verify`` or ``du`` advises deleting
(unknown files, unreferenced data files) leaves what it restores unchanged: no advice of ckpt's
ever destroys a step, whatever the per-process databases are named and wherever a database
keeps its files (``d/``, or ``ocdbt_meta/`` and ``ocdbt_data/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.du import disk_usage
from ckpt_cli.core.storage import LocalLocation, open_location
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions
from tests.support.orbax012_layouts import LAYOUTS, NAMES, copy_layout, item_dir, truth

pytestmark = pytest.mark.slow

#: Restored without a target by ``PyTreeCheckpointer`` (the truth of ``no_sharding_file`` was
#: restored with one: without ``_sharding`` Orbax has no sharding for its jax.Array leaves).
WITHOUT_TARGET = [n for n in NAMES if n != "no_sharding_file"]


def _restored(orbax: Any, item: Path) -> dict[str, tuple[str, list[int], str]]:
    leaves = orbax.item(item)["leaves"]
    return {
        ".".join(k for k, _ in leaf["keypath"]): (leaf["dtype"], leaf["shape"], leaf["sha256"])
        for leaf in leaves
    }


def _truth(name: str) -> dict[str, tuple[str, list[int], str]]:
    return {k: (v["dtype"], v["shape"], v["sha256"]) for k, v in truth(name)["restored"].items()}


@pytest.mark.parametrize("name", WITHOUT_TARGET)
def test_the_truth_is_what_orbax_restores_now(orbax: Any, name: str) -> None:
    assert _restored(orbax, LAYOUTS / name / item_dir(name)) == _truth(name)


@pytest.mark.parametrize("name", WITHOUT_TARGET)
def test_deleting_what_verify_and_du_advise_deleting_leaves_the_restore_unchanged(
    orbax: Any, name: str, tmp_path: Path
) -> None:
    root = copy_layout(name, tmp_path)
    report = verify_path(LocalLocation(str(root)), VerifyOptions(deep=True))
    advised = {
        root / p.file
        for p in report.problems
        if p.code in ("unknown-file", "unreferenced-file") and p.file
    }
    usage = disk_usage(open_location(str(root)))
    advised |= {Path(g.path) for g in usage.garbage if g.kind == "unreferenced-file"}
    for path in advised:
        path.unlink()
    assert _restored(orbax, root / item_dir(name)) == _truth(name)
    assert len(advised) == len(truth(name)["unreferenced"])
