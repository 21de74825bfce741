"""``core.diff.values.sharding_changes``: what ``diff --structure`` says changed in a leaf's layout."""

from __future__ import annotations

from ckpt_cli.core.diff.values import sharding_changes
from ckpt_cli.core.format.sharding import MeshSpec, ShardingInfo
from ckpt_cli.core.inspect import Leaf


def _leaf(sharding: ShardingInfo | None, chunk: tuple[int, ...] | None = (4, 4)) -> Leaf:
    return Leaf(
        "w", ("w",), (0,), "jax.Array", "float32", (8, 4), chunk_shape=chunk, sharding=sharding
    )


def test_the_same_layout_has_no_changes() -> None:
    mesh = MeshSpec(("data", "model"), (4, 2))
    assert sharding_changes(_leaf(mesh.sharding(("data",))), _leaf(mesh.sharding(("data",)))) == []
    assert sharding_changes(_leaf(None), _leaf(None)) == []


def test_single_device_and_unsharded_leaves() -> None:
    cpu0 = ShardingInfo("SingleDeviceSharding", device_str="cpu:0")
    cpu1 = ShardingInfo("SingleDeviceSharding", device_str="cpu:1")
    assert sharding_changes(_leaf(cpu0), _leaf(cpu1)) == ["sharding cpu:0 -> cpu:1"]
    mesh = MeshSpec(("data",), (2,)).sharding(("data",))
    assert sharding_changes(_leaf(mesh, (4, 4)), _leaf(None, (8, 4))) == [
        "mesh data=2 -> none",
        "sharding P(data) -> none",
        "chunks 2x1 of [4,4] -> 1x1 of [8,4]",
    ]


def test_a_chunk_grid_change_alone_is_reported() -> None:
    # Same mesh and spec, smaller chunks (a reshard under a smaller --max-chunk-bytes).
    s = MeshSpec(("data",), (2,)).sharding(("data",))
    assert sharding_changes(_leaf(s, (4, 4)), _leaf(s, (4, 2))) == [
        "chunks 2x1 of [4,4] -> 2x2 of [4,2]"
    ]
    assert sharding_changes(_leaf(s, None), _leaf(s, (4, 2))) == []
