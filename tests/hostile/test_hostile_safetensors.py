"""Hostile safetensors input and names that cannot be leaves: refused (exit 3, one line naming
the tensor or leaf and the field) before anything is allocated or written.

Every file starts as a real one, written by the reference writer (``safetensors.numpy``), whose
header JSON is then edited: a dimension of 2**63, rank 40, a 5,000-digit number in a shape;
tensors ``a`` and ``a.b`` (Orbax would restore only ``{a: {b}}``, losing ``a``); a NUL byte or a
lone surrogate in a name. Migrate's ``add`` and ``rename`` are held to the same rules.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import FIXTURES


def reference_file(path: Path, names: tuple[str, ...] = ("w",)) -> Path:
    """One float32 [2, 3] tensor per name, written by the reference writer."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({n: np.arange(6, dtype=np.float32).reshape(2, 3) for n in names}, str(path))
    return path


def edit_header(path: Path, edit: Callable[[dict[str, Any]], Any], raw: str | None = None) -> None:
    """Rewrite the header JSON of ``path`` (``raw``: JSON text put in place of the edited doc's
    ``"__RAW__"`` string, for numbers json.dumps cannot write). The byte buffer is kept."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    doc = json.loads(data[8 : 8 + n])
    edit(doc)
    text = json.dumps(doc, separators=(",", ":"))  # ASCII: a lone surrogate stays an escape
    if raw is not None:
        text = text.replace('"__RAW__"', raw)
    header = text.encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + n :])


def shape_of(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc["w"]["shape"] = value

    return edit


HOSTILE_SHAPES = [
    ("dimension 2**63", [2**63, 0], None, "dimension 0"),
    ("dimension 2**64-1 times zero", [0, 2**64 - 1], None, "dimension 1"),
    ("rank 40", [1] * 40, None, "rank 40"),
    ("5,000 digits", ["__RAW__", 3], "9" * 5000, "5000-digit"),
]


@pytest.mark.parametrize(
    ("case", "shape", "raw", "phrase"), HOSTILE_SHAPES, ids=[c[0] for c in HOSTILE_SHAPES]
)
def test_hostile_shapes_are_refused_naming_tensor_and_shape(
    cli: Any, tmp_path: Path, case: str, shape: list[Any], raw: str | None, phrase: str
) -> None:
    src = reference_file(tmp_path / "model.safetensors")
    edit_header(src, shape_of(shape), raw)
    for ocdbt in ("--ocdbt", "--no-ocdbt"):
        r = cli("import", src, tmp_path / "out", ocdbt)
        assert r.code == 3, (case, r.stderr)
        line = r.stderr.strip()
        assert "\n" not in line and "internal error" not in line and "Traceback" not in line
        assert "tensor 'w'" in line and "shape" in line and phrase in line, line
        assert not (tmp_path / "out").exists()
    # A rank or size no Orbax checkpoint holds is not called damage: the file may be valid.
    damaged = "damaged" in r.stderr
    assert damaged == (phrase == "5000-digit"), r.stderr


def test_an_index_with_a_5000_digit_number_is_refused(cli: Any, tmp_path: Path) -> None:
    reference_file(tmp_path / "model-00001-of-00001.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(
        '{"metadata": {"total_size": ' + "9" * 5000 + "}, "
        '"weight_map": {"w": "model-00001-of-00001.safetensors"}}'
    )
    r = cli("import", index, tmp_path / "out", "--dry-run")
    assert r.code in (0, 3), r.stderr  # total_size is informative: ignored or refused, never 70
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    index.write_text('{"weight_map": {"w": ' + "9" * 5000 + "}}")
    r = cli("import", index, tmp_path / "out", "--dry-run")
    assert r.code == 3 and "weight_map['w']" in r.stderr, r.stderr


def test_a_leaf_and_a_subtree_of_one_name_are_refused(cli: Any, tmp_path: Path) -> None:
    src = reference_file(tmp_path / "model.safetensors", ("a", "a.b"))
    r = cli("import", src, tmp_path / "out")
    assert r.code == 3, r.stderr
    assert "'a'" in r.stderr and "'a.b'" in r.stderr and "nothing written" in r.stderr
    assert not (tmp_path / "out").exists()


def _rename_header(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc[name] = doc.pop("w")

    return edit


@pytest.mark.parametrize(
    ("name", "refused_with_ocdbt", "phrase"),
    [
        ("a\x00b", False, "NUL"),
        ("a\udcffb", True, "Unicode"),
        ("x" * 300, False, "255"),
    ],
    ids=["nul", "lone-surrogate", "300-byte-segment"],
)
def test_names_no_file_system_takes_are_refused_without_ocdbt(
    cli: Any, tmp_path: Path, name: str, refused_with_ocdbt: bool, phrase: str
) -> None:
    src = reference_file(tmp_path / "model.safetensors")
    edit_header(src, _rename_header(name))
    r = cli("import", src, tmp_path / "plain", "--no-ocdbt")
    assert r.code == 3, r.stderr
    assert "leaf " in r.stderr and phrase in r.stderr and "internal error" not in r.stderr
    assert not (tmp_path / "plain").exists()
    r = cli("import", src, tmp_path / "db", "--ocdbt", "--dry-run")
    assert r.code == (3 if refused_with_ocdbt else 0), r.stderr
    assert "internal error" not in r.stderr


def _spec(tmp_path: Path, rule: dict[str, Any]) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"rules": [rule]}))
    return spec


@pytest.mark.parametrize(
    ("shape", "phrase"),
    [([1] * 40, "rank 40"), ([2**63, 0], "dimension 0")],
    ids=["rank-40", "dimension-2**63"],
)
def test_migrate_add_refuses_shapes_tensorstore_cannot_open(
    cli: Any, tmp_path: Path, shape: list[int], phrase: str
) -> None:
    spec = _spec(tmp_path, {"op": "add", "name": "params.new", "shape": shape})
    r = cli("migrate", FIXTURES / "seed_mlp", tmp_path / "out", "--spec", spec)
    assert r.code == 3, r.stderr
    assert "'params.new'" in r.stderr and "shape" in r.stderr and phrase in r.stderr
    assert not (tmp_path / "out").exists()


def test_migrate_rename_to_a_nul_name_is_refused_without_ocdbt(cli: Any, tmp_path: Path) -> None:
    rule = {"op": "rename", "from": r"params\.Dense_0\.kernel", "to": "params.a\x00b"}
    spec = _spec(tmp_path, rule)
    r = cli("migrate", FIXTURES / "seed_mlp", tmp_path / "out", "--spec", spec, "--no-ocdbt")
    assert r.code == 3, r.stderr
    assert "NUL" in r.stderr and "without OCDBT" in r.stderr and "internal error" not in r.stderr
    assert not (tmp_path / "out").exists()
