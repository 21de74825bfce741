"""Every read command on every Orbax 0.12.x save layout (``fixtures/orbax012/layouts/``: split
OCDBT folders, custom process ids, replica folders, renamed partial-save databases, storage
casts, compression off, no ``_sharding``, no ``array_metadatas/``, size-capped and uncapped data
files, garbage in each kind of database): ``ls``, ``inspect --json``, ``verify --deep``, ``du
--json`` and ``export`` say what Orbax restores and what is on disk, no false alarm, no false
ok."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.support.orbax012_layouts import LAYOUTS, NAMES, STEP, truth

#: safetensors dtype -> the NumPy name Orbax's restore reports.
_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "I32": "int32", "I64": "int64"}


def _tensors(out: Path) -> dict[str, tuple[str, list[int], str]]:
    """name -> (dtype, shape, SHA-256 of the bytes) of every tensor of the exported files."""
    found: dict[str, tuple[str, list[int], str]] = {}
    files = sorted(out.glob("*.safetensors"))
    assert files
    for path in files:
        raw = path.read_bytes()
        size = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + size])
        data = raw[8 + size :]
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, end = meta["data_offsets"]
            digest = hashlib.sha256(data[start:end]).hexdigest()
            found[name] = (_DTYPES[meta["dtype"]], meta["shape"], digest)
    return found


@pytest.mark.parametrize("name", NAMES)
def test_every_read_command_says_what_orbax_restores_and_what_is_on_disk(
    cli, name: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    root = LAYOUTS / name
    t = truth(name)
    restored = {k: (v["dtype"], v["shape"], v["sha256"]) for k, v in t["restored"].items()}
    assert restored

    listed = cli("ls", root, "--json")
    assert listed.code == 0, listed.stderr
    assert [s["step"] for s in listed.json()["steps"]] == [STEP]

    inspected = cli("inspect", root, "--json")
    assert inspected.code == 0, inspected.stderr
    leaves = {leaf["name"]: leaf for leaf in inspected.json()["leaves"]}
    assert {n: (leaf["dtype"], leaf["shape"]) for n, leaf in leaves.items()} == {
        n: (dtype, shape) for n, (dtype, shape, _) in restored.items()
    }
    assert not [leaf for leaf in leaves.values() if leaf["problem"]]

    verified = cli("verify", root, "--deep", "--json")
    assert verified.code == 0, verified.stdout  # dead weight is named, never a problem
    assert verified.json()["problems"] == []
    named = verified.json()["checked"]["unreferenced_files"]
    assert sorted(named) == sorted(t["unreferenced"])

    usage = cli("du", root, "--json")
    assert usage.code == 0, usage.stderr
    doc = usage.json()
    assert doc["total_bytes"] == sum(t["files"].values())
    unreferenced = [g["path"] for g in doc["garbage"] if g["kind"] == "unreferenced-file"]
    assert sorted(unreferenced) == sorted(str(root / rel) for rel in t["unreferenced"])

    exported = cli("export", root, tmp_path / "out")
    assert exported.code == 0, exported.stderr
    assert _tensors(tmp_path / "out") == restored
