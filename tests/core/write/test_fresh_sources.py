"""TensorStore encodes a stored leaf's blocks from the reader's arrays themselves (no copy of
each block first), and a leaf's whose source says its blocks are its own (``fresh_blocks``: a
migrate's cast); a source the pipeline knows nothing of is copied, as before."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.format.arrays import ArrayInfo, LeafReader
from ckpt_cli.core.write.pipeline import Pipeline
from ckpt_cli.core.write.types import ArrayOut, LeafOut

ROWS, COLS, CHUNK = 16, 8, 4


class _Spied:
    """An output array whose writes are logged with the keywords the pipeline passed."""

    def __init__(self, arr: Any, log: list[tuple[str, dict[str, Any]]], name: str) -> None:
        self.arr, self.log, self.name = arr, log, name
        self.dtype = arr.dtype

    def __getitem__(self, region: Any) -> _Spied:
        return _Spied(self.arr[region], self.log, self.name)

    def write(self, values: Any, **kw: Any) -> Any:
        self.log.append((self.name, kw))
        return self.arr.write(values, **kw)


def _array(dtype: Any, values: np.ndarray | None = None) -> Any:
    import tensorstore as ts

    spec = {"driver": "zarr", "kvstore": "memory://", "metadata": {"chunks": [CHUNK, COLS]}}
    arr = ts.open(spec, create=True, dtype=dtype, shape=[ROWS, COLS]).result()
    if values is not None:
        arr.write(values).result()
    return arr


def _leaf(name: str, source: Any, fresh: bool = False) -> LeafOut:
    return LeafOut(
        keypath=(name,),
        key_types=(),
        value_type="jax.Array",
        array=ArrayOut("bfloat16", (ROWS, COLS), (CHUNK, COLS), zarr3=False),
        source=source,
        source_itemsize=4,
        fresh_blocks=fresh,
    )


def test_a_stored_leafs_blocks_are_referenced_and_other_sources_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tensorstore as ts

    monkeypatch.setattr(threads, "_chosen", 2)
    values = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    stored = LeafReader(
        _array(ts.float32, values), ArrayInfo("float32", (ROWS, COLS), (CHUNK, COLS), 2, None)
    )

    def made_here(region: tuple[slice, ...]) -> np.ndarray:
        return values[region]  # a view of one array: must be copied before the next use

    def cast_here(region: tuple[slice, ...]) -> np.ndarray:
        return values[region].astype(ml_dtypes.bfloat16)  # a new array each block

    log: list[tuple[str, dict[str, Any]]] = []
    outputs = {name: _array(ts.bfloat16) for name in ("stored", "other", "cast")}
    writer = SimpleNamespace(
        in_flight=8,
        memory_limit=64 << 20,
        finite_label=None,
        slab_reads=True,
        open_array=lambda leaf: SimpleNamespace(
            result=lambda: _Spied(outputs[leaf.name], log, leaf.name)
        ),
        dest="memory://",
    )
    blocks = [(slice(r, r + CHUNK), slice(0, COLS)) for r in range(0, ROWS, CHUNK)]
    jobs = [
        (_leaf("stored", stored.read), blocks),
        (_leaf("other", made_here), blocks),
        (_leaf("cast", cast_here, fresh=True), blocks),
    ]
    Pipeline(writer, jobs, None).run()  # type: ignore[arg-type]

    by_leaf = {name: [kw for n, kw in log if n == name] for name in outputs}
    assert len(by_leaf["stored"]) == len(by_leaf["other"]) == len(by_leaf["cast"]) == len(blocks)
    referenced = by_leaf["stored"] + by_leaf["cast"]
    assert all(kw == {"can_reference_source_data_indefinitely": True} for kw in referenced)
    assert all(kw == {} for kw in by_leaf["other"])
    for arr in outputs.values():
        np.testing.assert_array_equal(arr.read().result().astype(np.float32), values)


def test_a_scaled_out_worker_hands_over_a_fresh_leafs_blocks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A worker of ``--workers``/``--executor`` rebuilds each leaf from its unit: the leaf's
    ``fresh_blocks`` travels with it, so its pipeline hands the blocks over as the driver's."""
    from ckpt_cli.core.write.distributed import WriteUnit, _unit_leaf, run_write_unit
    from ckpt_cli.core.write.item import ItemWriter

    seen: list[LeafOut] = []

    def capture(self: Any, jobs: list[tuple[LeafOut, Any]], expect: Any = None) -> Any:
        seen.extend(leaf for leaf, _ in jobs)
        return SimpleNamespace(partials={}, sha256_found=dict)

    monkeypatch.setattr(ItemWriter, "write_regions", capture)
    plan = SimpleNamespace(source=tmp_path.as_uri(), source_zarr3=False, build=lambda store: id)
    for fresh in (False, True):
        leaf = LeafOut(
            keypath=("w",),
            key_types=(),
            value_type="jax.Array",
            array=ArrayOut("bfloat16", (ROWS, COLS), (CHUNK, COLS), zarr3=False),
            source=id,
            plan=plan,  # type: ignore[arg-type]
            fresh_blocks=fresh,
        )
        part = _unit_leaf(leaf, [(slice(0, CHUNK), slice(0, COLS))])
        assert part.fresh_blocks is fresh
        run_write_unit(WriteUnit(f"fresh-{fresh}", 0, tmp_path.as_uri(), True, 1 << 26, (part,)))
    assert [leaf.fresh_blocks for leaf in seen] == [False, True]
