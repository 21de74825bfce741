"""``ckpt digest`` of a local OCDBT item reads its large chunks from the data files at the
places the structure pass found (``verify.gate.item_locator``), as ``verify --deep`` does: the
same digests as through TensorStore. A bucket, a damaged item or one without OCDBT is read
through TensorStore as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.digest import items as digest_items_module
from ckpt_cli.core.digest.safetensors import digest_any
from ckpt_cli.core.format.resolve import resolve_items
from ckpt_cli.core.storage import open_location
from ckpt_cli.core.verify.gate import item_locator
from tests.support.file_values import spy_file_values


def _save(root: Path, ocdbt: bool = True) -> dict[str, np.ndarray]:
    import orbax.checkpoint as ocp

    rng = np.random.default_rng(4)
    state = {f"w{i}": rng.standard_normal((1280, 1024), dtype=np.float32) for i in range(3)}
    state["small"] = np.arange(10, dtype=np.int32)
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt)
    with ocp.Checkpointer(handler) as ckptr:
        ckptr.save(root / "0" / "default", args=ocp.args.PyTreeSave(state))
    return state


def test_digest_reads_large_chunks_from_the_data_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _save(tmp_path / "root")
    opened = spy_file_values(monkeypatch)
    item = str(tmp_path / "root" / "0" / "default")
    direct = digest_any(item, memory_limit=64 << 20)
    assert len(opened) == 3  # the three 5 MiB leaves; the small one through TensorStore
    assert all(Path(p.path).is_file() and p.length > 0 for p in opened)
    through_ts = digest_items_module.digest_path(item, memory_limit=64 << 20)
    assert len(opened) == 3  # no locator: nothing read from the files
    got = {x.name: x.digest for i in direct.items for x in i.leaves}
    assert got == {x.name: x.digest for i in through_ts.items for x in i.leaves}
    assert sorted(got) == sorted(state) and all(got.values())


def test_no_places_off_ocdbt_or_for_a_damaged_item(tmp_path: Path) -> None:
    _save(tmp_path / "sound")
    _save(tmp_path / "plain", ocdbt=False)
    _save(tmp_path / "damaged")
    ref = resolve_items(open_location(str(tmp_path / "sound")), None)[0]
    assert item_locator(ref) is not None
    plain = resolve_items(open_location(str(tmp_path / "plain")), None)[0]
    assert item_locator(plain) is None
    damaged = tmp_path / "damaged" / "0" / "default"
    data = sorted(p for p in damaged.rglob("d/*") if p.stat().st_size > 1 << 20)
    assert data, "the save wrote no data file"
    data[0].unlink()
    bad = resolve_items(open_location(str(tmp_path / "damaged")), None)[0]
    assert item_locator(bad) is None
    report = digest_any(str(damaged), memory_limit=64 << 20)
    problems = [x.problem for i in report.items for x in i.leaves if x.problem]
    assert problems, "a deleted data file went unreported"


def test_a_structure_pass_that_fails_leaves_the_reads_to_tensorstore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the structure pass itself stops (an error raised, not a problem found), digest
    reads as it did before it had places, rather than failing."""
    from ckpt_cli.core.verify import gate
    from ckpt_cli.errors import StorageError

    state = _save(tmp_path / "root")

    def fails(ref: object) -> None:
        raise StorageError("cannot read the item's metadata")

    monkeypatch.setattr(gate, "_structure", fails)
    ref = resolve_items(open_location(str(tmp_path / "root")), None)[0]
    assert item_locator(ref) is None
    opened = spy_file_values(monkeypatch)
    report = digest_any(str(tmp_path / "root" / "0" / "default"), memory_limit=64 << 20)
    assert not opened
    assert sorted(x.name for i in report.items for x in i.leaves if x.digest) == sorted(state)


def test_no_structure_pass_where_no_chunk_streams(tmp_path: Path) -> None:
    """The places cost a structure pass: an item whose chunks all fit a slab (read through
    TensorStore whatever the places) is not given one."""
    import orbax.checkpoint as ocp

    small = {f"b{i}": np.arange(100, dtype=np.float32) + i for i in range(5)}
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "small" / "0" / "default", args=ocp.args.PyTreeSave(small))
    asked: list[object] = []

    def locator(ref: object) -> None:
        asked.append(ref)

    item = str(tmp_path / "small" / "0" / "default")
    report = digest_items_module.digest_path(item, memory_limit=64 << 20, locator=locator)
    assert not asked
    assert sorted(x.name for i in report.items for x in i.leaves if x.digest) == sorted(small)
    big = str(tmp_path / "root" / "0" / "default")
    _save(tmp_path / "root")
    digest_items_module.digest_path(big, memory_limit=64 << 20, locator=locator)
    assert len(asked) == 1  # the item with 5 MiB chunks
