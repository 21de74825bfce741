"""A step whose item lost its ``_METADATA`` (digests recorded before): the missing file is the
first problem and the only one of its kind (no leaf is blamed "in _METADATA", no array called
unnamed), and ``inspect`` says the item is damaged instead of showing a lone ``checkpoint``."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.paths import FIXTURES


def test_a_lost_tree_metadata_is_the_first_problem(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = shutil.copytree(FIXTURES / "seed_mlp", tmp_path / "run")
    assert cli("verify", root, "--record").code == 0
    (root / "500" / "default" / "_METADATA").unlink()
    r = cli("verify", root, "--step", "500", "--json")
    assert r.code == 1
    codes = [p["code"] for p in r.json()["problems"]]
    assert codes and codes[0] == "metadata-missing", codes
    assert not {"leaf-without-array", "array-without-leaf", "leaf-missing"} & set(codes), codes
    assert len(codes) <= 2, codes
    inspect = cli("inspect", root, "--step", "500")
    assert inspect.code == 3
    assert "_METADATA" in inspect.stderr and "damaged" in inspect.stderr
    assert "checkpoint" not in inspect.stdout
