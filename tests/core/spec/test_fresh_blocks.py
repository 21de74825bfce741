"""Which migrate expressions hand the writer blocks that nothing else holds (``fresh_blocks``:
TensorStore then encodes from them without copying each block first), and that those blocks
really are their own: two reads of one region, and a held whole value, share no memory."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core.format.arrays import ArrayInfo, LeafReader
from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.initializers import Initializer

ROWS, COLS, CHUNK = 16, 8, 4
VALUES = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
#: One array every block of ``_Shared`` is a view of.
SHARED = np.zeros((ROWS, COLS), np.float32)


@dataclass(frozen=True, eq=False)
class _Shared(ops.Node):
    """A node the classification does not know: its blocks are views of one array."""

    def fetch(self, region: ops.Region, ctx: ops.EvalContext) -> Any:
        return SHARED[region]


def _context() -> ops.EvalContext:
    import tensorstore as ts

    spec = {"driver": "zarr", "kvstore": "memory://", "metadata": {"chunks": [CHUNK, COLS]}}
    arr = ts.open(spec, create=True, dtype=ts.float32, shape=[ROWS, COLS]).result()
    arr.write(VALUES).result()
    info = ArrayInfo("float32", (ROWS, COLS), (CHUNK, COLS), 2, None)
    store = SimpleNamespace(reader=lambda name, info_, database: LeafReader(arr, info))
    return ops.EvalContext(store, {})  # type: ignore[arg-type]


def _nodes() -> dict[str, tuple[ops.Node, np.ndarray]]:
    """name -> (node, its whole expected value)."""
    info = ArrayInfo("float32", (ROWS, COLS), (CHUNK, COLS), 2, None)
    src = ops.Source((ROWS, COLS), "float32", "w", info, "")
    bf16 = VALUES.astype(ml_dtypes.bfloat16)
    return {
        "source": (src, VALUES),
        "cast": (ops.Cast((ROWS, COLS), "bfloat16", src, None, "rule 1 (cast)", "w"), bf16),
        "const": (ops.Const((ROWS, COLS), "float32", 2.0), np.full((ROWS, COLS), 2.0, np.float32)),
        "init": (
            ops.Init((ROWS, COLS), "float32", Initializer("constant", value=3), "w"),
            np.full((ROWS, COLS), 3.0, np.float32),
        ),
        "transpose": (ops.Transpose((COLS, ROWS), "float32", src, (1, 0)), VALUES.T),
        "slice": (ops.Slice((ROWS - 4, COLS), "float32", src, 0, 4), VALUES[4:]),
        "reshape": (ops.Reshape((COLS, ROWS), "float32", src), VALUES.reshape(COLS, ROWS)),
        "concat": (
            ops.Concat((2 * ROWS, COLS), "float32", (src, src), 0),
            np.concatenate([VALUES, VALUES]),
        ),
    }


@pytest.mark.parametrize("name", sorted(_nodes()))
def test_fresh_expressions_give_blocks_of_their_own(name: str) -> None:
    node, whole = _nodes()[name]
    assert ops.fresh_blocks(node)
    ctx = _context()
    # A block across the source's chunks (for the concat across its two parts).
    region = (slice(2, node.shape[0] - 3), slice(0, node.shape[1]))
    first, second = (ops.resolve(node.fetch(region, ctx)) for _ in range(2))
    expected = whole[region].astype(np.float32)
    for block in (first, second):
        np.testing.assert_array_equal(block.astype(np.float32), expected)
    assert not np.shares_memory(first, second)
    assert not np.shares_memory(first, SHARED)
    if name == "reshape":
        assert ctx.held, "the reshape holds its whole value"
    for held in ctx.held.values():  # a block copied out of a held whole value
        assert not np.shares_memory(first, held)


def test_an_unknown_node_and_what_is_built_on_it_are_copied() -> None:
    shared = _Shared((ROWS, COLS), "float32")
    ctx = _context()
    region = (slice(0, CHUNK), slice(0, COLS))
    assert np.shares_memory(ops.resolve(shared.fetch(region, ctx)), SHARED)  # why it must be
    for node in (
        shared,
        ops.Slice((ROWS - 4, COLS), "float32", shared, 0, 4),
        ops.Transpose((COLS, ROWS), "float32", shared, (1, 0)),
        ops.Concat((2 * ROWS, COLS), "float32", (_nodes()["source"][0], shared), 0),
    ):
        assert not ops.fresh_blocks(node)
    # A cast copies whatever it casts.
    assert ops.fresh_blocks(ops.Cast((ROWS, COLS), "bfloat16", shared, None, "rule 1", "w"))
