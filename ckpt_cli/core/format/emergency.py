"""Orbax's emergency (multi-tier) checkpointing on disk: tell a *local tier* directory, where
each host keeps only the shards its own devices hold, from a damaged checkpoint.

What orbax-checkpoint 0.12.8 writes (``orbax/checkpoint/experimental/emergency/``; real saves
in ``fixtures/orbax012/emergency/``, made by ``fixtures/orbax012/make_emergency.py``):

- ``checkpoint_manager.CheckpointManager`` (multi-slice): the processes of replica 0 write only
  the *persistent* tier, a normal root (item ``default``, no ``metadata/``); the processes of
  the other replicas write only the *local* tier, one directory per host, a normal-looking root
  whose steps hold two items: ``state`` (OCDBT + zarr3, ``ocdbt.process_<i>/`` of that host
  alone, and a merged manifest over that host's chunks only) and ``process_metadata``
  (``global_process_metadata.json``: device ids per process; ``mesh_metadata.json``: the mesh's
  device ids), handler ``...emergency...ProcessMetadataCheckpointHandler``.
- ``replicator_checkpoint_manager.ReplicatorCheckpointManager`` (multi-tier checkpointing
  with the MTC replicator service): the same local steps (``state`` + ``process_metadata``) on
  every host. The service's files sit at the top of a local directory (``replicator.yaml``,
  ``replicator.errors``, ``replicator.failed``, ``jax-init-info.txt``,
  ``<job>-s<step>-n<node>-w<worker>.restore`` links).
- ``p2p.checkpoint_manager.CheckpointManager``: a local tier on every host with the item
  ``state`` alone (plus ``data_iter/pygrain_states.json`` when grain is installed), no marker
  at all; ``p2p_restore/`` appears in the local directory while a restore fetches from peers.
  Its persistent tier is a normal root with item ``state``.

A local-tier step is committed and whole *for that host*: its missing chunks belong to other
hosts' devices. With ``process_metadata`` the host's devices are known and a missing chunk of
one of them is still damage; without it (p2p) they are inferred from which chunks are stored.
Pure functions over names, parsed JSON and chunk indices: nothing here reads storage.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ckpt_cli.core.format.sharding import ShardingInfo, shard_layout
from ckpt_cli.errors import InvalidMetadataError

PROCESS_METADATA_ITEM = "process_metadata"
GLOBAL_PROCESS_METADATA = "global_process_metadata.json"
MESH_METADATA = "mesh_metadata.json"
PROCESS_METADATA_FILES = frozenset({GLOBAL_PROCESS_METADATA, MESH_METADATA})
#: The handler class; its module moved in 0.12 (``multi_tier_checkpointing``), so match the name.
_PROCESS_METADATA_HANDLER = ".ProcessMetadataCheckpointHandler"
STATE_ITEM = "state"
P2P_DATA_ITER_ITEM = "data_iter"
P2P_RESTORE_DIR = "p2p_restore"
#: Files the MTC replicator service and its initialization keep in a local directory.
MTC_ROOT_FILES = frozenset(
    {
        "replicator.yaml",
        "replicator.yaml.tmp",
        "replicator.errors",
        "replicator.failed",
        "jax-init-info.txt",
    }
)
_MTC_RESTORE_RE = re.compile(r"^.+-s\d+-n\d+-w\d+\.restore$")
_WRITER_DB_RE = re.compile(r"^ocdbt\.process_(\d+)$")

Index = tuple[int, ...]
#: How a local tier was recognised: Orbax's ``process_metadata`` item (emergency and replicator
#: managers: certain), or only a ``state`` item written by one process (p2p: a candidate that
#: the stored chunks must confirm, see ``assess_local_tier``).
Marker = Literal["process-metadata", "single-writer"]


def is_process_metadata_handler(handler: str | None) -> bool:
    return (
        handler is not None
        and ".emergency." in handler
        and handler.endswith(_PROCESS_METADATA_HANDLER)
    )


def is_local_root_entry(name: str) -> bool:
    """An entry of a local-tier directory that belongs to the emergency machinery, not a step:
    the MTC replicator's files and restore links, p2p's restore directory."""
    return name in MTC_ROOT_FILES or name == P2P_RESTORE_DIR or bool(_MTC_RESTORE_RE.match(name))


def writer_processes(item_entries: Iterable[str]) -> tuple[int, ...]:
    """The process indices of an item's ``ocdbt.process_<i>`` databases (top-level names)."""
    return tuple(sorted(int(m.group(1)) for n in item_entries if (m := _WRITER_DB_RE.match(n))))


@dataclass(frozen=True)
class ProcessMetadata:
    """The ``process_metadata`` item: device ids per process (index = process), mesh order."""

    devices_by_process: tuple[tuple[int, ...], ...]
    mesh_device_ids: tuple[int, ...]

    def devices_of(self, process: int) -> tuple[int, ...] | None:
        if 0 <= process < len(self.devices_by_process):
            return self.devices_by_process[process]
        return None


def _int_list(raw: Any, what: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(type(i) is int for i in raw):
        raise InvalidMetadataError(f"{what} is not a list of device ids")
    return tuple(raw)


def parse_process_metadata(global_raw: Any, mesh_raw: Any) -> ProcessMetadata:
    """From the parsed ``global_process_metadata.json`` and ``mesh_metadata.json``."""
    if not isinstance(global_raw, list):
        raise InvalidMetadataError(f"{GLOBAL_PROCESS_METADATA} is not a list per process")
    per_process = tuple(
        _int_list(ids, f"{GLOBAL_PROCESS_METADATA}[{i}]") for i, ids in enumerate(global_raw)
    )
    return ProcessMetadata(per_process, _int_list(mesh_raw, MESH_METADATA))


@dataclass(frozen=True)
class LocalTier:
    """A step recognised as one host's local-tier copy."""

    marker: Marker
    process: int | None  # the writer of its array item; None when not exactly one
    devices: tuple[int, ...] | None = None  # that process's devices, where process_metadata says

    def describe(self) -> str:
        who = f"process {self.process}" if self.process is not None else "one host"
        if self.devices:
            who += " (devices " + ", ".join(str(d) for d in self.devices) + ")"
        manager = (
            "emergency or replicator CheckpointManager"
            if self.marker == "process-metadata"
            else "p2p CheckpointManager"
        )
        return f"local tier of Orbax's {manager}: only the shards of {who} are stored here"

    @property
    def manager(self) -> str:
        """The manager that writes such a tier, in a few words."""
        return "emergency manager" if self.marker == "process-metadata" else "p2p manager"

    def short(self) -> str:
        """``local tier of Orbax's emergency manager, process 2's shards``: for one line."""
        whose = f"process {self.process}'s shards" if self.process is not None else "one host's"
        looks = "" if self.marker == "process-metadata" else "looks like the "
        return f"{looks}local tier of Orbax's {self.manager}, {whose}"


def _has_process_metadata(
    items: Mapping[str, Collection[str]], handlers: Mapping[str, str]
) -> bool:
    if any(is_process_metadata_handler(h) for h in handlers.values()):
        return True
    entries = items.get(PROCESS_METADATA_ITEM)
    return entries is not None and set(entries) >= PROCESS_METADATA_FILES


def local_tier_of_step(
    items: Mapping[str, Collection[str]],
    handlers: Mapping[str, str] | None = None,
    metadata: ProcessMetadata | None = None,
) -> LocalTier | None:
    """Whether a step looks like a local-tier copy, from ``items`` (item name -> its top-level
    entry names), the ``item_handlers`` of its ``_CHECKPOINT_METADATA`` and, when read, its
    ``process_metadata``. A ``single-writer`` answer is only a candidate (a one-process save
    of an item named ``state`` looks the same): ``assess_local_tier`` decides with the chunks."""
    handlers = handlers or {}
    array_items = [
        n
        for n in items
        if n != PROCESS_METADATA_ITEM and not is_process_metadata_handler(handlers.get(n))
    ]
    writers = {p for n in array_items for p in writer_processes(items[n])}
    process = next(iter(writers)) if len(writers) == 1 else None
    if _has_process_metadata(items, handlers):
        devices = metadata.devices_of(process) if metadata and process is not None else None
        return LocalTier("process-metadata", process, devices)
    if STATE_ITEM in items and set(items) <= {STATE_ITEM, P2P_DATA_ITER_ITEM}:
        state_writers = writer_processes(items[STATE_ITEM])
        if len(state_writers) == 1:
            return LocalTier("single-writer", state_writers[0])
    return None


@dataclass(frozen=True)
class LeafChunks:
    """One array of the item: its geometry, its ``_sharding`` entry and the chunks stored."""

    name: str
    shape: Index
    chunk_shape: Index
    sharding: ShardingInfo | None
    present: frozenset[Index]

    @property
    def grid(self) -> Index:
        return tuple(
            -(-s // c) if c else 0 for s, c in zip(self.shape, self.chunk_shape, strict=True)
        )

    def all_chunks(self) -> frozenset[Index]:
        return frozenset(_indices(tuple((0, g) for g in self.grid)))


def _indices(ranges: Sequence[tuple[int, int]]) -> Iterable[Index]:
    return itertools.product(*(range(lo, hi) for lo, hi in ranges))


def chunks_by_device(leaf: LeafChunks) -> dict[int, frozenset[Index]]:
    """Device id -> the chunk indices inside the blocks it holds; {} without a named mesh.
    A chunk belongs to a block when it starts inside it (chunks never straddle the blocks of
    one write: Orbax's chunk shape is the shard shape or divides it)."""
    s = leaf.sharding
    if s is None or s.mesh_shape is None or not all(leaf.chunk_shape):
        return {}
    layout = shard_layout(leaf.shape, s, leaf.name)
    out: dict[int, set[Index]] = {}
    for block in layout.blocks:
        ranges = [
            (-(-lo // c), -(-hi // c))
            for (lo, hi), c in zip(block.bounds, leaf.chunk_shape, strict=True)
        ]
        chunks = set(_indices(ranges))
        for d in block.devices:
            out.setdefault(d, set()).update(chunks)
    return {d: frozenset(c) for d, c in out.items()}


def infer_host_devices(leaves: Sequence[LeafChunks]) -> frozenset[int] | None:
    """The devices whose shards a partial item holds, when the stored chunks are exactly the
    shards of one set of devices in every sharded leaf (what a per-host save leaves); None
    when the item is complete, has no named mesh, or misses chunks in any other pattern."""
    maps = [(leaf, m) for leaf in leaves if (m := chunks_by_device(leaf))]
    if not maps:
        return None
    every = frozenset(d for _, m in maps for d in m)
    held = set(every)
    for leaf, m in maps:
        held &= {d for d, chunks in m.items() if chunks <= leaf.present}
    if not held or held == every:
        return None
    for leaf, m in maps:
        if leaf.present != frozenset().union(*(m.get(d, frozenset()) for d in held)):
            return None
    return frozenset(held)


@dataclass(frozen=True)
class HostChunks:
    """One leaf of a local-tier item: which of its missing chunks are expected."""

    name: str
    expected: frozenset[Index]  # the chunks the host's devices hold
    lost: frozenset[Index]  # expected but not stored: damage, even in a local tier
    elsewhere: frozenset[Index]  # not stored, held only by other hosts' devices: by design


def host_chunks(leaf: LeafChunks, devices: Collection[int]) -> HostChunks:
    m = chunks_by_device(leaf)
    if not m:  # no mesh recorded: a single-device leaf lives on one host, whole
        expected = leaf.all_chunks()
    else:
        expected = frozenset().union(*(m.get(d, frozenset()) for d in devices))
    missing = leaf.all_chunks() - leaf.present
    return HostChunks(leaf.name, expected, missing & expected, missing - expected)


@dataclass(frozen=True)
class TierVerdict:
    """What verify should say of one local-tier item."""

    tier: LocalTier
    devices: frozenset[int] | None  # the host's devices: from process_metadata, else inferred
    leaves: tuple[HostChunks, ...]

    @property
    def lost(self) -> tuple[HostChunks, ...]:
        return tuple(h for h in self.leaves if h.lost)

    @property
    def partial(self) -> tuple[HostChunks, ...]:
        return tuple(h for h in self.leaves if h.elsewhere)


def assess_local_tier(tier: LocalTier | None, leaves: Sequence[LeafChunks]) -> TierVerdict | None:
    """The verdict on an item of a step that ``local_tier_of_step`` recognised; None when it is
    not a local tier after all (a ``single-writer`` candidate whose chunks do not show one
    host's shards: then missing chunks are damage, as in any checkpoint)."""
    if tier is None:
        return None
    devices: frozenset[int] | None = frozenset(tier.devices) if tier.devices else None
    if devices is None:
        devices = infer_host_devices(leaves)
    if devices is None:
        if tier.marker == "single-writer":
            return None
        return TierVerdict(tier, None, ())  # process_metadata says so, the chunks cannot tell
    return TierVerdict(tier, devices, tuple(host_chunks(leaf, devices) for leaf in leaves))
