"""Sizes and chunk counts from metadata are checked before anything is
allocated. A zarr header (plain zarr2, zarr3, or inside OCDBT) claiming 1e15 elements in chunks
of one element, or one chunk of 1e15 elements: one line, exit 3 (verify: its findings, exit 1),
never a MemoryError, a C++ abort, or a hang.

Each command runs in a subprocess under an address-space limit (``MEM_LIMIT``, 1.5 GiB: every
command runs on the small fixtures within it), so a runaway allocation fails fast here instead
of taking the shared machine's memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ckpt_process import INTERNAL_ERROR, ckpt, copy_fixture, edit_json

SIDE = 31622776  # SIDE**2 ~ 1e15 elements
HUGE = 10**15
LEAF = "params.Dense_0.kernel"


def _consistent(item: Path, write_shape: list[int], chunk: list[int]) -> None:
    """Make array_metadatas and _METADATA agree with the edited header, so only sizes are odd."""

    def am(doc: dict) -> None:
        for a in doc["array_metadatas"]:
            if a["array_metadata"]["param_name"] == LEAF:
                a["array_metadata"]["write_shape"] = write_shape
                a["array_metadata"]["chunk_shape"] = chunk

    edit_json(item / "array_metadatas" / "process_0", am)

    def tm(doc: dict) -> None:
        for key, v in doc["tree_metadata"].items():
            if "kernel" in key and "Dense_0" in key and "params" in key:
                v["value_metadata"]["write_shape"] = write_shape

    edit_json(item / "_METADATA", tm)


def plain_zarr2_tiny_chunks(tmp: Path) -> Path:
    src = copy_fixture("no_ocdbt", tmp / "S")
    item = src / "0" / "default"
    edit_json(
        item / LEAF / ".zarray",
        lambda z: z.update(shape=[SIDE, SIDE], chunks=[1, 1]),
    )
    _consistent(item, [SIDE, SIDE], [1, 1])
    return src


def plain_zarr2_one_huge_chunk(tmp: Path) -> Path:
    src = copy_fixture("no_ocdbt", tmp / "S")
    item = src / "0" / "default"
    # Still two-dimensional, so the stored chunk ``0.0`` is the one chunk of the grid.
    rows = HUGE // 8
    edit_json(item / LEAF / ".zarray", lambda z: z.update(shape=[rows, 8], chunks=[rows, 8]))
    _consistent(item, [rows, 8], [rows, 8])
    return src


def plain_zarr3_tiny_chunks(tmp: Path) -> Path:
    src = copy_fixture("no_ocdbt_zarr3", tmp / "S")
    item = next(p for p in src.glob("*/*") if (p / "_METADATA").exists())
    header = item / LEAF / "zarr.json"
    doc = json.loads(header.read_text())
    doc["shape"] = [SIDE, SIDE]
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [1, 1]
    for codec in doc.get("codecs", []):
        if codec.get("name") == "sharding_indexed":
            codec["configuration"]["chunk_shape"] = [1, 1]
    header.write_text(json.dumps(doc))
    _consistent(item, [SIDE, SIDE], [1, 1])
    return src


def ocdbt_zarr2_tiny_chunks(tmp: Path) -> Path:
    """The header rewritten inside the OCDBT database, through TensorStore."""
    import tensorstore as ts

    src = copy_fixture("seed_mlp", tmp / "S")
    item = src / "500" / "default"
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{item}/"}).result()
    key = f"{LEAF}/.zarray"
    header = json.loads(kv.read(key).result().value)
    header.update(shape=[SIDE, SIDE], chunks=[1, 1])
    kv.write(key, json.dumps(header).encode()).result()
    _consistent(item, [SIDE, SIDE], [1, 1])
    return src


SOURCES: list[Callable[[Path], Path]] = [
    plain_zarr2_tiny_chunks,
    plain_zarr2_one_huge_chunk,
    plain_zarr3_tiny_chunks,
    ocdbt_zarr2_tiny_chunks,
]
COMMANDS = {
    "verify": ["verify", "{src}"],
    "verify-deep": ["verify", "{src}", "--deep"],
    "inspect-stats": ["inspect", "{src}", "--stats"],
    "reshard": ["reshard", "{src}", "{dst}", "--mesh", "data=8"],
    "migrate": ["migrate", "{src}", "{dst}", "--spec", "{spec}", "--allow-unused"],
    "diff": ["diff", "{src}", "{src}"],
    "export": ["export", "{src}", "{dst}", "--params-only"],
}


@pytest.mark.parametrize("make", SOURCES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_absurd_header_sizes_one_line_no_allocation(
    tmp_path: Path, make: Callable[[Path], Path], command: str
) -> None:
    src = make(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules:\n  - {op: rename, from: 'step', to: 'step'}\n")
    args = [a.format(src=src, dst=tmp_path / "D", spec=spec) for a in COMMANDS[command]]
    run = ckpt(*args, timeout=30)
    assert run.code != -9, f"hung: {args}"
    assert INTERNAL_ERROR not in run.stderr, run.stderr
    if command.startswith("verify"):
        assert run.code in (1, 3), run.stderr
        assert LEAF in run.stdout + run.stderr
    else:
        assert run.code == 3, run.stderr
        assert len(run.lines) == 1 and LEAF in run.stderr, run.stderr
    assert not (tmp_path / "D").exists() or not any((tmp_path / "D").iterdir())
