"""Where an imported tensor's bytes go: the partition spec its ``--rules`` pattern gives it on
``--mesh`` (the first pattern that matches; none: replicated), the sharding recorded for it
(one device without a mesh), the shard each device holds, and chunks under
``--max-chunk-bytes`` that tile the shard, slabs of whole rows where they can be
(``row_chunk``: one positioned read per chunk of a single-device leaf).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.format.sharding import MeshSpec, ShardingInfo, shard_shape, split_chunk
from ckpt_cli.core.reshard.rules import Rule
from ckpt_cli.errors import RefusedError

SINGLE_DEVICE = ShardingInfo("SingleDeviceSharding", device_str="cpu:0")


@dataclass(frozen=True)
class Placement:
    partition: tuple[Any, ...] | None  # None: no mesh
    sharding: ShardingInfo
    chunk: tuple[int, ...]
    shard: tuple[int, ...]
    rule: str | None  # the --rules pattern that gave the partition spec


def place(
    name: str,
    shape: tuple[int, ...],
    dtype: str,
    mesh: MeshSpec | None,
    rules: Sequence[Rule],
    max_chunk_bytes: int,
    used: set[str],
) -> Placement:
    """The placement of leaf ``name``; ``used`` collects the patterns that matched."""
    partition: tuple[Any, ...] | None = None
    rule = None
    sharding = SINGLE_DEVICE
    shard = shape
    if mesh is not None:
        match = next((r for r in rules if r.regex.match(name)), None)
        partition = match.spec if match else ()
        rule = match.pattern if match else None
        if match:
            used.add(match.pattern)
        shard, problem = shard_shape(shape, partition, mesh)
        if problem:
            raise RefusedError(
                f"leaf {name!r} {list(shape)} cannot be laid out on the mesh: {problem}; nothing written",
                hint="change the partition spec its --rules pattern gives it",
            )
        sharding = mesh.sharding(partition)
    chunk = row_chunk(shard, dtype_itemsize(dtype), max_chunk_bytes)
    return Placement(partition, sharding, chunk, shard, rule)


def row_chunk(shard: tuple[int, ...], itemsize: int, max_bytes: int) -> tuple[int, ...]:
    """Chunks under ``max_bytes`` that tile the shard exactly and are, where they can be, slabs
    of whole rows (a divisor of the first axes, every later axis whole): a chunk of a
    single-device leaf is then one contiguous run of its safetensors tensor, read with one
    positioned read. When only a far smaller slab divides the shard (a prime number of rows),
    ``split_chunk``'s chunks are used instead."""
    chunk = list(shard)
    for k in range(len(chunk)):
        if math.prod(chunk[k:]) * itemsize <= max_bytes:
            break
        rest = math.prod(chunk[k + 1 :]) * itemsize
        if rest <= max_bytes:
            chunk[k] = _largest_divisor(chunk[k], max(1, max_bytes // max(1, rest)))
            break
        chunk[k] = 1
    other = split_chunk(shard, itemsize, max_bytes)
    if math.prod(chunk) * 4 < math.prod(other):
        return other
    return tuple(chunk)


def _largest_divisor(n: int, most: int) -> int:
    """The largest divisor of ``n`` that is at most ``most``."""
    best = 1
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            for x in (d, n // d):
                if best < x <= most:
                    best = x
    return best
