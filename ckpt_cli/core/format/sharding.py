"""``_sharding``: how each array was laid out over a device mesh, read and written; and which
device holds which block of an array under such a layout.

``_sharding`` maps urlsafe-base64 param names to JSON *strings* (FORMAT.md). The block layout
follows JAX's rule: a dimension partitioned over mesh axes (a, b) is split into size(a)*size(b)
blocks, a device's block index being its mesh coordinates on those axes read as a mixed-radix
number, major axis first; devices that differ only on unused axes hold replicas.
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.storage import Location
from ckpt_cli.core.storage.base import loads_json
from ckpt_cli.core.units import short_repr
from ckpt_cli.errors import InvalidMetadataError, UsageError

Spec = tuple[Any, ...]  # per dimension: None, an axis name, or a tuple of axis names


Shape = list[int]
PartitionSpecJSON = list[str | list[str] | None]  # per dimension: not split, an axis, several axes


class ShardingJSON(TypedDict):
    type: str
    mesh: NotRequired[dict[str, int]]
    partition_spec: NotRequired[PartitionSpecJSON]
    device_ids: NotRequired[list[int]]
    device: NotRequired[str]


@dataclass(frozen=True)
class ShardingInfo:
    """A decoded ``_sharding`` entry."""

    type: str
    mesh_shape: tuple[int, ...] | None = None
    axis_names: tuple[str, ...] | None = None
    partition_spec: tuple[Any, ...] | None = None  # per dim: None, an axis name, or a tuple of them
    device_ids: tuple[int, ...] | None = None  # mesh devices in mesh (C) order
    device_str: str | None = None

    def to_json(self) -> ShardingJSON:
        out: ShardingJSON = {"type": self.type}
        if self.mesh_shape is not None and self.axis_names is not None:
            out["mesh"] = dict(zip(self.axis_names, self.mesh_shape, strict=False))
            out["partition_spec"] = [
                list(p) if isinstance(p, tuple) else p for p in self.partition_spec or ()
            ]
            out["device_ids"] = list(self.device_ids or ())
        if self.device_str is not None:
            out["device"] = self.device_str
        return out

    def mesh_str(self) -> str | None:
        if self.mesh_shape is None or self.axis_names is None:
            return None
        return ",".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape, strict=False))

    def short(self) -> str:
        """The partition spec alone (``P(data,model)``, ``replicated``) or the device."""
        if self.mesh_shape is not None:
            if not any(p is not None for p in self.partition_spec or ()):
                return "replicated"
            return "P(" + ",".join(_spec_str(p) for p in self.partition_spec or ()) + ")"
        return self.device_str or self.type

    def describe(self) -> str:
        if self.mesh_shape is not None and self.axis_names is not None:
            mesh = ",".join(
                f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape, strict=False)
            )
            spec = ", ".join(_spec_str(p) for p in self.partition_spec or ())
            return f"mesh({mesh}) P({spec})"
        if self.device_str:
            return f"single({self.device_str})"
        return self.type


def _spec_str(p: Any) -> str:
    if p is None:
        return "None"
    if isinstance(p, tuple):
        return "(" + ",".join(p) + ")"
    return str(p)


def _flatten_ids(mesh: Any) -> list[int]:
    if isinstance(mesh, list):
        return [i for m in mesh for i in _flatten_ids(m)]
    if isinstance(mesh, dict) and "id" in mesh:
        return [int(mesh["id"])]
    raise ValueError("bad device mesh")


# A tree has a handful of distinct shardings repeated over thousands of leaves.
@functools.lru_cache(maxsize=4096)
def decode_sharding_entry(text: str) -> ShardingInfo:
    raw = loads_json(text, "a _sharding entry")
    kind = str(raw.get("sharding_type", "unknown"))
    if kind == "NamedSharding":
        spec = tuple(tuple(p) if isinstance(p, list) else p for p in raw.get("partition_spec", []))
        ids = tuple(_flatten_ids(raw["device_mesh"]["mesh"])) if "device_mesh" in raw else None
        return ShardingInfo(
            kind, tuple(int(s) for s in raw["shape"]), tuple(raw["axis_names"]), spec, ids
        )
    if kind == "SingleDeviceSharding":
        return ShardingInfo(kind, device_str=raw.get("device_str"))
    return ShardingInfo(kind)


def read_shardings(item: Location) -> dict[str, ShardingInfo]:
    """``_sharding``: urlsafe-base64 param names to JSON strings; decoded per param name."""
    loc = item.child("_sharding")
    raw = loc.read_json_if_exists()
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidMetadataError(f"{loc} is not a JSON object")
    out = {}
    for key, value in raw.items():
        try:
            name = base64.urlsafe_b64decode(key.encode()).decode()
            out[name] = decode_sharding_entry(value)
        except (
            binascii.Error,
            UnicodeDecodeError,
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            RecursionError,
        ):
            raise InvalidMetadataError(f"{loc}: cannot decode the entry {key!r}") from None
    return out


def sharding_json(s: ShardingInfo) -> dict[str, Any]:
    """A ``_sharding`` entry for a NamedSharding (device ids in mesh order), as Orbax writes it."""
    if s.mesh_shape is None or s.axis_names is None:
        return {"sharding_type": "SingleDeviceSharding", "device_str": s.device_str or "cpu:0"}
    ids = list(s.device_ids or range(math.prod(s.mesh_shape)))

    def nest(flat: list[int], dims: Sequence[int]) -> Any:
        if len(dims) == 1:
            return [{"id": i} for i in flat]
        step = len(flat) // dims[0]
        return [nest(flat[k * step : (k + 1) * step], dims[1:]) for k in range(dims[0])]

    return {
        "sharding_type": "NamedSharding",
        "shape": list(s.mesh_shape),
        "axis_names": list(s.axis_names),
        "axis_types": ["AxisType.Auto"] * len(s.axis_names),
        "partition_spec": [list(p) if isinstance(p, tuple) else p for p in s.partition_spec or ()],
        "device_mesh": {"mesh": nest(ids, s.mesh_shape)},
    }


@dataclass(frozen=True)
class MeshSpec:
    axis_names: tuple[str, ...]
    shape: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> MeshSpec:
        """``data=8,model=4``."""
        names, sizes = [], []
        for part in text.split(","):
            name, _, size = part.strip().partition("=")
            # ASCII digits, at most 18 (``isdigit`` takes ``²``; int() refuses 4,300 digits).
            valid = re.fullmatch(r"[A-Za-z_]\w*", name) and re.fullmatch(r"[0-9]{1,18}", size)
            if not valid or int(size) < 1:
                raise UsageError(
                    f"--mesh {short_repr(text, 80)}: expected NAME=SIZE[,NAME=SIZE...], "
                    "e.g. data=8,model=4"
                )
            if name in names:
                raise UsageError(f"--mesh {text!r}: axis {name!r} appears twice")
            names.append(name)
            sizes.append(int(size))
        return cls(tuple(names), tuple(sizes))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def sharding(self, spec: Spec) -> ShardingInfo:
        return ShardingInfo(
            "NamedSharding", self.shape, self.axis_names, spec, tuple(range(self.size))
        )


def shard_shape(
    shape: Sequence[int], spec: Spec, mesh: MeshSpec
) -> tuple[tuple[int, ...], str | None]:
    """The per-device block of ``shape`` under ``spec``, or a reason it does not divide."""
    sizes = dict(zip(mesh.axis_names, mesh.shape, strict=True))
    if len(spec) > len(shape):
        return tuple(shape), f"partition spec has {len(spec)} entries for a rank-{len(shape)} array"
    out = []
    for d, n in enumerate(shape):
        p = spec[d] if d < len(spec) else None
        axes = () if p is None else (p,) if isinstance(p, str) else tuple(p)
        parts = math.prod(sizes[a] for a in axes)
        if n % parts:
            return tuple(
                shape
            ), f"dimension {d} of size {n} is not divisible by {parts} ({'*'.join(axes)})"
        out.append(n // parts)
    return tuple(out), None


def split_chunk(shard: tuple[int, ...], itemsize: int, max_bytes: int) -> tuple[int, ...]:
    """Split a shard into equal chunks under ``max_bytes``: the largest dimension first, by its
    smallest prime factor, so every chunk tiles the shard exactly. A zero-size dimension gets
    chunks of 1, as Orbax writes them (zarr allows no chunk of 0)."""
    chunk = [max(1, d) for d in shard]
    while math.prod(chunk) * itemsize > max_bytes:
        for d in sorted(range(len(chunk)), key=lambda i: -chunk[i]):
            f = _smallest_factor(chunk[d])
            if f:
                chunk[d] //= f
                break
        else:
            break  # only prime-free dims left (all 1): cannot split further
    return tuple(chunk)


def _smallest_factor(n: int) -> int | None:
    if n < 2:
        return None
    for f in range(2, math.isqrt(n) + 1):
        if n % f == 0:
            return f
    return n


@dataclass(frozen=True)
class Block:
    index: tuple[int, ...]  # block coordinates, one per array dimension
    bounds: tuple[tuple[int, int], ...]  # [start, stop) per dimension
    devices: tuple[int, ...]


class BlockJSON(TypedDict):
    index: list[int]
    bounds: list[list[int]]
    devices: list[int]


class LayoutJSON(TypedDict):
    leaf: str
    sharding: str
    grid: list[int]
    block_shape: list[int]
    replicas: int
    blocks: list[BlockJSON]


@dataclass(frozen=True)
class ShardLayout:
    shape: tuple[int, ...]
    grid: tuple[int, ...]  # blocks per dimension
    blocks: tuple[Block, ...]
    replicas: int  # devices holding each block
    description: str
    leaf: str = ""  # the leaf laid out, when known

    @property
    def block_shape(self) -> tuple[int, ...]:
        return tuple(-(-s // g) if g else 0 for s, g in zip(self.shape, self.grid, strict=True))

    def to_json(self) -> LayoutJSON:
        return {
            "leaf": self.leaf,
            "sharding": self.description,
            "grid": list(self.grid),
            "block_shape": list(self.block_shape),
            "replicas": self.replicas,
            "blocks": [
                {
                    "index": list(b.index),
                    "bounds": [list(x) for x in b.bounds],
                    "devices": list(b.devices),
                }
                for b in self.blocks
            ],
        }


def _axes(spec: tuple[object, ...] | None, dim: int) -> tuple[str, ...]:
    if spec is None or dim >= len(spec) or spec[dim] is None:
        return ()
    p = spec[dim]
    return tuple(str(a) for a in p) if isinstance(p, tuple) else (str(p),)


def shard_layout(
    shape: tuple[int, ...], sharding: ShardingInfo | None, leaf: str = ""
) -> ShardLayout:
    """Which devices hold which block of an array of ``shape`` (``leaf`` names it)."""
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
            leaf,
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
    return ShardLayout(shape, grid, tuple(blocks), replicas, sharding.describe(), leaf)
