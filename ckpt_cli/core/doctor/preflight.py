"""The restore's preflight: what each host keeps, reads and holds at peak when Orbax restores an
item onto a mesh split over ``hosts`` processes, and what ``ckpt reshard`` to that mesh holds.

Orbax 0.12.8 (``serialization._read_and_create_array``) reads, for each array and each host, every
*distinct* shard index the host's devices need once (replicas on the host share one read), into a
fresh host buffer of the shard's shape (``np.zeros``), by asking TensorStore for that box; it then
``device_put``s the buffer onto each of those devices. TensorStore reads and decodes every stored
chunk the box touches, whole (``estimate_read_memory_footprint``: the box widened to chunk
boundaries), and copies the part inside the box. All arrays are read at once
(``asyncio.gather``), bounded only by ``restore_concurrent_gb`` (default 96 GB: the chunk-rounded
bytes reserved while a shard is read). On CPU the devices' memory is host RAM. The prediction
(see ``orbax_peak``) is calibrated on what these steps hold, measured by bench/bench_doctor.py.

Hosts follow JAX's device order: with ``hosts`` processes over ``D`` devices, device ``i`` belongs
to process ``i // (D / hosts)`` (CPU and TPU slices).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.doctor.types import HostMemory, Memory
from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.format.sharding import MeshSpec
from ckpt_cli.core.inspect import ItemReport, Leaf
from ckpt_cli.core.write.pipeline import held_limit, source_cache_bytes
from ckpt_cli.errors import UsageError, require_orbax_extra

#: Orbax 0.12.8's default ``restore_concurrent_gb`` (StandardCheckpointHandler): 96 * 10**9.
ORBAX_RESTORE_CONCURRENT_BYTES = 96 * 10**9
#: ``ckpt reshard``'s default ``--memory-limit``: the array bytes it holds at once.
RESHARD_MEMORY_LIMIT = 1 << 30

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Placement:
    """Where a leaf lives on the restore: its mesh, its partition spec, and the mesh's device
    ids in mesh (C) order."""

    mesh: MeshSpec
    spec: tuple[Any, ...]
    device_ids: tuple[int, ...]


def device_boxes(shape: Sequence[int], p: Placement) -> list[tuple[int, Box]]:
    """Each device of the mesh with the box (start, stop per dimension) of the leaf it keeps,
    as JAX's ``NamedSharding.devices_indices_map`` lays it out."""
    sizes = dict(zip(p.mesh.axis_names, p.mesh.shape, strict=True))
    out = []
    for pos, device in zip(itertools.product(*map(range, p.mesh.shape)), p.device_ids, strict=True):
        at = dict(zip(p.mesh.axis_names, pos, strict=True))
        box = []
        for d, n in enumerate(shape):
            entry = p.spec[d] if d < len(p.spec) else None
            axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            parts, k = 1, 0
            for a in axes:  # the first axis is the major one
                k, parts = k * sizes[a] + at[a], parts * sizes[a]
            step = -(-n // parts)
            box.append((min(n, k * step), min(n, (k + 1) * step)))
        out.append((device, tuple(box)))
    return out


def box_elements(box: Box) -> int:
    return math.prod(b - a for a, b in box)


def chunk_rounded(box: Box, chunks: Sequence[int]) -> int:
    """Elements TensorStore decodes to read ``box``: the box widened to chunk boundaries (Orbax's
    ``estimate_read_memory_footprint``, without the array's end clipping it does not do)."""
    out = 1
    for (a, b), c in zip(box, chunks, strict=True):
        out *= (-(-b // c) - a // c) * c if c else b - a
    return out


def read_chunks(leaf: Leaf) -> tuple[int, ...] | None:
    """The chunk TensorStore decodes whole: a zarr3 shard's inner chunk, else the chunk."""
    if leaf.array is None:
        return None
    return leaf.array.inner_chunk_shape or leaf.array.chunk_shape


@dataclass
class _Host:
    devices: set[int]
    device_bytes: int = 0
    kept_bytes: int = 0
    read_bytes: int = 0
    assembled_bytes: int = 0  # distinct shards pieced together from more than one chunk
    single_bytes: int = 0  # distinct shards that are one chunk each
    largest_chunk: int = 0
    per_device: dict[int, int] | None = None


def host_of(device: int, per_host: int) -> int:
    return device // per_host


def hosts_split(device_count: int, hosts: int) -> int:
    """Devices per host; refused (usage) when ``hosts`` does not divide the devices."""
    if hosts < 1 or device_count % hosts:
        raise UsageError(
            f"--hosts {hosts}: the restore's {device_count} devices do not split evenly over "
            f"{hosts} hosts; give a number of hosts that divides {device_count}"
        )
    return device_count // hosts


def _tally(report: ItemReport, placements: dict[str, Placement], hosts: int) -> list[_Host]:
    count = max((max(p.device_ids) + 1 for p in placements.values()), default=1)
    per_host = hosts_split(count, hosts)
    out = [_Host(set(range(h * per_host, (h + 1) * per_host)), per_device={}) for h in range(hosts)]
    for leaf in _arrays(report.leaves):
        assert leaf.shape is not None
        item = dtype_itemsize(leaf.dtype or "uint8")
        p = placements.get(leaf.name)
        boxes = device_boxes(leaf.shape, p) if p else [(0, tuple((0, n) for n in leaf.shape))]
        chunks = read_chunks(leaf) or tuple(leaf.shape)
        seen: list[set[Box]] = [set() for _ in range(hosts)]
        for device, box in boxes:
            h = out[host_of(device, per_host)]
            nbytes = box_elements(box) * item
            h.device_bytes += nbytes
            assert h.per_device is not None
            h.per_device[device] = h.per_device.get(device, 0) + nbytes
            if box in seen[host_of(device, per_host)]:
                continue
            seen[host_of(device, per_host)].add(box)
            h.kept_bytes += nbytes
            h.read_bytes += chunk_rounded(box, chunks) * item
            if _pieces(box, chunks) > 1:
                h.assembled_bytes += nbytes
            else:
                h.single_bytes += nbytes
            h.largest_chunk = max(h.largest_chunk, math.prod(chunks) * item)
    return out


def _arrays(leaves: Iterable[Leaf]) -> list[Leaf]:
    return [leaf for leaf in leaves if leaf.is_array and leaf.shape is not None]


def _pieces(box: Box, chunks: Sequence[int]) -> int:
    """How many stored chunks ``box`` touches."""
    return math.prod(
        (-(-b // c) - a // c) if c else 1 for (a, b), c in zip(box, chunks, strict=True)
    )


def orbax_peak(h: _Host, concurrent_bytes: int = ORBAX_RESTORE_CONCURRENT_BYTES) -> int:
    """Peak host RAM Orbax's restore adds on a host (CPU devices: their arrays are host RAM).

    - the host's device arrays, replicas each their own copy (``device_put`` copies the host
      buffer onto each device);
    - the host buffers (``np.zeros`` of the shard, one per distinct shard) still alive at the
      peak. A buffer lives from its shard's read until its device copies are done. All reads
      start at once, so a shard pieced together from several chunks fills chunk by chunk with
      every other one and completes near the end: half of those buffers (``_ASSEMBLED``) are
      resident at the peak, next to the copies made so far. A shard that is one chunk is
      filled, copied and freed in turn, the copies lagging the reads: a quarter
      (``_SINGLE``). Both at most what ``restore_concurrent_gb`` lets in flight (it counts
      chunk-rounded bytes);
    - a working set: TensorStore's decoded chunks in flight (``_DECODING`` times the largest)
      and the runtime's own allocations (``_RUNTIME``).
    """
    amplification = h.read_bytes / h.kept_bytes if h.kept_bytes else 1.0
    buffers = _ASSEMBLED * h.assembled_bytes + _SINGLE * h.single_bytes
    buffers = min(buffers, concurrent_bytes / amplification)
    return round(h.device_bytes + buffers + _DECODING * h.largest_chunk + _RUNTIME)


#: The fractions of host buffers resident at the peak, the decoded chunks in flight (in units
#: of the largest stored chunk) and the restore's own working set (thread pools, XLA's CPU
#: client), from the lifetimes above and bench/bench_doctor.py's measurements (256 MiB .. 2 GiB,
#: same and changed mesh; from run to run the buffers alive at the peak differ by up to 20 %).
_ASSEMBLED = 0.5
_SINGLE = 0.25
_DECODING = 4
_RUNTIME = 128 << 20


def reshard_peak(
    total_bytes: int,
    chunk_bytes: Iterable[int] = (),
    memory_limit: int = RESHARD_MEMORY_LIMIT,
    threads_: int | None = None,
) -> int:
    """Peak host RAM (the whole process's RSS) of ``ckpt reshard`` of an item of ``total_bytes``
    whose stored chunks decode to ``chunk_bytes``, under ``--memory-limit``, on ``threads_``
    threads (else the process's count).

    - the process itself: the interpreter and the imports (``RESHARD_BASELINE``);
    - the blocks in flight: the pipeline holds up to a quarter of the limit of values (less
      the cache's room past its eighth), two blocks a thread at most (``held_limit``), with the
      decoded source chunks and the encoded output beside them
      (``_BLOCK_COPIES`` times the values at the peak, the reads and writes interleaving),
      and the threads' decoding and encoding buffers and reads in flight that the pipeline does
      not count (``_WORKING``);
    - TensorStore's source cache (``source_cache_bytes``: an eighth of the limit, or two
      decoded source chunks where those are read in parts and larger).

    An item smaller than that is in flight whole: each of its bytes about ``_ITEM_COPIES``
    times (values, decoded source, encoded output, partly overlapping), so
    ``min(_ITEM_COPIES x total, blocks in flight + cache)``: it grows with a small item and
    the limit caps it.
    """
    cache = source_cache_bytes(memory_limit, chunk_bytes)
    blocks = held_limit(memory_limit, threads_=threads_, cache_bytes=cache)
    held = round(_BLOCK_COPIES * blocks) + _WORKING + cache
    return RESHARD_BASELINE + min(round(_ITEM_COPIES * total_bytes), held)


#: ``ckpt reshard``'s process before any array: Python, ckpt, TensorStore (no jax): the peak RSS
#: of a reshard of a 1 MiB checkpoint measured 75-76 MiB (bench/bench_doctor.py, ``--sizes 1M``).
RESHARD_BASELINE = 74 << 20
#: The bytes held per byte of values in flight (a large item) and per byte of a small item
#: (in flight whole), and the working memory beside the blocks, fitted on bench/bench_doctor.py
#: (256 MiB .. 2 GiB, two meshes, 1 GiB limit) with 8 blocks held (4 threads and more) and with
#: 4 (2 threads): all twelve within 22 %; the same reshard measured up to a third apart from
#: run to run.
_BLOCK_COPIES = 1.5
_WORKING = 144 << 20
_ITEM_COPIES = 2.5


def preflight(
    report: ItemReport, placements: dict[str, Placement], hosts: int, mesh: str | None
) -> Memory:
    """The ``memory`` of a diagnosis: totals, the largest array, and per host what the restore
    keeps, reads and holds at peak."""
    arrays = _arrays(report.leaves)
    if not arrays:
        return Memory(0, 0, None, 0, mesh=mesh)
    sizes = {leaf.name: leaf.elements * dtype_itemsize(leaf.dtype or "uint8") for leaf in arrays}
    largest = max(sizes, key=lambda name: sizes[name])
    tallies = _tally(report, placements, hosts)
    per_host = []
    for i, h in enumerate(tallies):
        assert h.per_device is not None
        per_host.append(
            HostMemory(
                host=i,
                devices=tuple(sorted(h.devices)),
                device_bytes=h.device_bytes,
                max_device_bytes=max(h.per_device.values(), default=0),
                kept_bytes=h.kept_bytes,
                read_bytes=h.read_bytes,
                orbax_restore_peak_bytes=orbax_peak(h),
            )
        )
    return Memory(
        sum(sizes.values()),
        len(arrays),
        largest,
        sizes[largest],
        mesh=mesh,
        hosts=tuple(per_host),
        reshard_peak_bytes=reshard_peak(
            sum(sizes.values()), (leaf.array.decoded_chunk_bytes for leaf in arrays if leaf.array)
        ),
    )


def placements(
    report: ItemReport, target: str | None, target_sharded: bool, mesh: MeshSpec | None
) -> dict[str, Placement]:
    """Each array leaf's layout on the restore: ``--mesh`` (each leaf keeps its recorded
    partition spec, axes the mesh lacks dropped, devices 0..N-1), else the target's shardings
    (``--target`` naming them), else the recorded ones (Orbax restores onto those)."""
    if mesh is not None:
        axes = set(mesh.axis_names)
        ids = tuple(range(mesh.size))
        return {
            leaf.name: Placement(mesh, _kept_spec(leaf, axes), ids)
            for leaf in _arrays(report.leaves)
        }
    if target is not None and target_sharded:
        return target_placements(target)
    out = {}
    for leaf in _arrays(report.leaves):
        s = leaf.sharding
        if s is None or s.mesh_shape is None or s.axis_names is None or s.device_ids is None:
            continue
        if len(s.device_ids) != math.prod(s.mesh_shape):
            continue  # a recorded sharding ckpt cannot lay out: counted on device 0
        spec = tuple(s.partition_spec or ())
        out[leaf.name] = Placement(MeshSpec(s.axis_names, s.mesh_shape), spec, s.device_ids)
    return out


def _kept_spec(leaf: Leaf, axes: set[str]) -> tuple[Any, ...]:
    spec = leaf.sharding.partition_spec if leaf.sharding is not None else None
    out: list[Any] = []
    for p in spec or ():
        names = [a for a in (p if isinstance(p, tuple) else (p,)) if a in axes]
        out.append(None if not names else names[0] if len(names) == 1 else tuple(names))
    return tuple(out)


def target_placements(target: str) -> dict[str, Placement]:
    """The shardings the ``--target`` function's abstract state names (imports jax)."""
    require_orbax_extra("--target")
    import jax

    from ckpt_cli.core.spec.target import call_target, key_name

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(call_target(target))[0]:
        sharding = getattr(leaf, "sharding", None)
        shape = getattr(leaf, "shape", None)
        if sharding is None or shape is None:
            continue
        name = ".".join(key_name(k) for k in path)
        jmesh = getattr(sharding, "mesh", None)
        if isinstance(sharding, jax.sharding.NamedSharding) and jmesh is not None:
            mesh = MeshSpec(tuple(str(a) for a in jmesh.axis_names), tuple(jmesh.devices.shape))
            spec = tuple(_entry(p) for p in sharding.spec)
            ids = tuple(int(d.id) for d in jmesh.devices.flat)
            out[name] = Placement(mesh, spec, ids)
        else:  # one device (SingleDeviceSharding), or a layout ckpt does not model: replicated
            ids = tuple(sorted(int(d.id) for d in sharding.device_set))
            out[name] = Placement(MeshSpec(("_",), (len(ids),)), (), ids)
    return out


def _entry(p: Any) -> Any:
    if p is None or isinstance(p, str):
        return p
    return tuple(str(a) for a in p)
