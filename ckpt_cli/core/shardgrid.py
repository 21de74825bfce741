"""Which device holds which block of an array, from its recorded ``NamedSharding``.

Follows JAX's rule: a dimension partitioned over mesh axes (a, b) is split into size(a)*size(b)
blocks, a device's block index being its mesh coordinates on those axes read as a mixed-radix
number, major axis first; devices that differ only on unused axes hold replicas.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ckpt_cli.core.metadata import ShardingInfo


@dataclass(frozen=True)
class Block:
    index: tuple[int, ...]  # block coordinates, one per array dimension
    bounds: tuple[tuple[int, int], ...]  # [start, stop) per dimension
    devices: tuple[int, ...]


@dataclass(frozen=True)
class ShardLayout:
    shape: tuple[int, ...]
    grid: tuple[int, ...]  # blocks per dimension
    blocks: tuple[Block, ...]
    replicas: int  # devices holding each block
    description: str

    @property
    def block_shape(self) -> tuple[int, ...]:
        return tuple(-(-s // g) if g else 0 for s, g in zip(self.shape, self.grid, strict=True))


def _axes(spec: tuple[object, ...] | None, dim: int) -> tuple[str, ...]:
    if spec is None or dim >= len(spec) or spec[dim] is None:
        return ()
    p = spec[dim]
    return tuple(str(a) for a in p) if isinstance(p, tuple) else (str(p),)


def shard_layout(shape: tuple[int, ...], sharding: ShardingInfo | None) -> ShardLayout:
    whole = tuple((0, s) for s in shape)
    if sharding is None or sharding.mesh_shape is None or sharding.axis_names is None:
        device = sharding.device_str if sharding else None
        ids: tuple[int, ...] = ()
        if device and ":" in device and device.rsplit(":", 1)[1].isdigit():
            ids = (int(device.rsplit(":", 1)[1]),)
        desc = sharding.describe() if sharding else "no sharding recorded"
        return ShardLayout(
            shape,
            tuple(1 for _ in shape),
            (Block(tuple(0 for _ in shape), whole, ids),),
            max(1, len(ids)),
            desc,
        )
    mesh = dict(zip(sharding.axis_names, sharding.mesh_shape, strict=True))
    ids_flat = sharding.device_ids or tuple(range(math.prod(sharding.mesh_shape)))
    per_dim_axes = [_axes(sharding.partition_spec, d) for d in range(len(shape))]
    grid = tuple(math.prod(mesh[a] for a in axes) for axes in per_dim_axes)
    block_size = [-(-s // g) for s, g in zip(shape, grid, strict=True)]
    holders: dict[tuple[int, ...], list[int]] = {}
    for flat, coords in enumerate(itertools.product(*(range(n) for n in sharding.mesh_shape))):
        pos = dict(zip(sharding.axis_names, coords, strict=True))
        coords_per_dim = []
        for axes in per_dim_axes:
            i = 0
            for a in axes:
                i = i * mesh[a] + pos[a]
            coords_per_dim.append(i)
        holders.setdefault(tuple(coords_per_dim), []).append(ids_flat[flat])
    blocks = []
    for index in sorted(holders):
        bounds = tuple(
            (i * b, min((i + 1) * b, s)) for i, b, s in zip(index, block_size, shape, strict=True)
        )
        blocks.append(Block(index, bounds, tuple(holders[index])))
    replicas = len(next(iter(holders.values()))) if holders else 1
    return ShardLayout(shape, grid, tuple(blocks), replicas, sharding.describe())
