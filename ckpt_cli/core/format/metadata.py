"""Parsers for the JSON metadata Orbax writes: step, root, metrics, tree, array metadata.

Each parser validates what it relies on and turns damage into ``InvalidMetadataError`` naming the
file; none touches array data. Formats are as written by orbax-checkpoint 0.12 (see FORMAT.md);
``_sharding`` is in ``sharding.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ckpt_cli.core.format.names import (
    ARRAY_ITEM_DIR,
    MANIFEST,
    ROOT_METADATA,
    ROOT_METADATA_DIR,
    STEP_METADATA,
    TREE_METADATA,
    is_process_db,
)
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import InvalidMetadataError

#: Bytes at the end of ``_METADATA`` that hold its storage flags (``peek_storage_flags``).
FLAGS_TAIL_BYTES = 4096
KEY_TYPE_SEQUENCE = 1
KEY_TYPE_DICT = 2
EMPTY_MARKERS = frozenset({"None", "Dict", "List", "Tuple", "NamedTuple"})


@dataclass(frozen=True)
class StepMetadata:
    """``_CHECKPOINT_METADATA`` of a step (all fields optional: older Orbax wrote none)."""

    item_handlers: dict[str, str] | str | None = None
    metrics: dict[str, Any] | None = None
    init_timestamp_nsecs: int | None = None
    commit_timestamp_nsecs: int | None = None
    custom_metadata: dict[str, Any] | None = None
    present: bool = False

    @property
    def committed_at(self) -> datetime | None:
        return timestamp_or_none(self.commit_timestamp_nsecs)


def timestamp_or_none(nsecs: int | None) -> datetime | None:
    """A nanosecond timestamp as a datetime; None when absent or outside what a datetime holds
    (valid JSON such as 1e30: callers then fall back to the directory's mtime)."""
    if nsecs is None:
        return None
    try:
        return datetime.fromtimestamp(nsecs / 1e9, tz=timezone.utc)
    except (OverflowError, ValueError, OSError):
        return None


def read_step_metadata(step_loc: Location) -> StepMetadata:
    raw = step_loc.child(STEP_METADATA).read_json_if_exists()
    if raw is None:
        return StepMetadata()
    where = step_loc.child(STEP_METADATA)
    if not isinstance(raw, dict):
        raise InvalidMetadataError(f"{where} does not hold a JSON object")
    handlers = raw.get("item_handlers")
    if handlers is not None and not isinstance(handlers, (str, dict)):
        raise InvalidMetadataError(f"{where}: item_handlers is neither a string nor an object")
    return StepMetadata(
        item_handlers=handlers,
        metrics=raw.get("metrics") if isinstance(raw.get("metrics"), dict) else None,
        init_timestamp_nsecs=_opt_int(raw.get("init_timestamp_nsecs")),
        commit_timestamp_nsecs=_opt_int(raw.get("commit_timestamp_nsecs")),
        custom_metadata=raw.get("custom_metadata")
        if isinstance(raw.get("custom_metadata"), dict)
        else None,
        present=True,
    )


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_root_metadata(root: Location) -> dict[str, Any] | None:
    """``metadata/_ROOT_METADATA``: the manager's custom metadata, or None when absent. Orbax
    before 0.11 wrote the custom metadata alone to ``metadata/metadata``: shown the same way,
    as ``{"custom_metadata": ...}``."""
    raw = root.child(ROOT_METADATA_DIR, ROOT_METADATA).read_json_if_exists()
    if raw is None:
        legacy = root.child(ROOT_METADATA_DIR, "metadata").read_json_if_exists()
        return {"custom_metadata": legacy} if isinstance(legacy, dict) else None
    if not isinstance(raw, dict):
        raise InvalidMetadataError(
            f"{root.child(ROOT_METADATA_DIR, ROOT_METADATA)} is not a JSON object"
        )
    return raw


def read_metrics(step_loc: Location, step_meta: StepMetadata) -> dict[str, Any] | None:
    """Metrics saved with a step: the ``metrics`` item, else non-empty ``_CHECKPOINT_METADATA``."""
    metrics_dir = step_loc.child("metrics")
    metrics_file = metrics_dir.child("metrics")
    if metrics_dir.is_symlink() or metrics_file.is_symlink():
        # Never read through a link: it may lead anywhere (verify reports it).
        return step_meta.metrics or None
    raw = metrics_file.read_json_if_exists()
    if isinstance(raw, dict):
        return raw
    return step_meta.metrics or None


@dataclass(frozen=True)
class LeafMeta:
    """One leaf of ``_METADATA``: where it sits in the tree and what kind of value it is."""

    keypath: tuple[str, ...]
    key_types: tuple[int, ...]
    value_type: str
    skip_deserialize: bool
    write_shape: tuple[int, ...] | None

    @property
    def name(self) -> str:
        """The storage ("param") name: keypath joined with dots, as Orbax names arrays."""
        return ".".join(self.keypath)

    @property
    def is_empty_marker(self) -> bool:
        return self.value_type in EMPTY_MARKERS

    @property
    def has_array(self) -> bool:
        return not self.skip_deserialize and self.value_type not in ("string", *EMPTY_MARKERS)


@dataclass(frozen=True)
class TreeMetadata:
    """``_METADATA`` of an item."""

    leaves: tuple[LeafMeta, ...]
    #: None: not recorded (Orbax writes the flag only since 0.12; tell OCDBT from the files).
    use_ocdbt: bool | None
    use_zarr3: bool
    custom_metadata: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_tree_metadata(raw: Any, where: Location) -> TreeMetadata:
    if not isinstance(raw, dict) or not isinstance(raw.get("tree_metadata"), dict):
        raise InvalidMetadataError(f"{where} has no 'tree_metadata' object")
    leaves = []
    for outer_key, entry in raw["tree_metadata"].items():
        try:
            keys = entry["key_metadata"]
            value = entry["value_metadata"]
            keypath = tuple(str(k["key"]) for k in keys)
            key_types = tuple(int(k.get("key_type", KEY_TYPE_DICT)) for k in keys)
            value_type = str(value["value_type"])
            write_shape = value.get("write_shape")
            shape = None if write_shape is None else tuple(int(d) for d in write_shape)
            leaves.append(
                LeafMeta(
                    keypath,
                    key_types,
                    value_type,
                    bool(value.get("skip_deserialize", False)),
                    shape,
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InvalidMetadataError(
                f"{where}: entry {outer_key} lacks key_metadata/value_metadata",
                hint="the checkpoint is damaged; run `ckpt verify` on it",
            ) from None
    return TreeMetadata(
        leaves=tuple(leaves),
        use_ocdbt=bool(raw["use_ocdbt"]) if "use_ocdbt" in raw else None,
        use_zarr3=bool(raw.get("use_zarr3", False)),
        custom_metadata=raw.get("custom_metadata"),
        extra={k: v for k, v in raw.items() if k not in {"tree_metadata", "custom_metadata"}},
    )


def read_tree_metadata(item: Location) -> TreeMetadata | None:
    loc = item.child(TREE_METADATA)
    raw = loc.read_json_if_exists()
    return None if raw is None else parse_tree_metadata(raw, loc)


#: The name ``ArrayCheckpointHandler`` (``ArraySave``) stores its one array under.
ARRAY_ITEM_LEAF = ARRAY_ITEM_DIR


def is_array_handler(handler: str | None) -> bool:
    return handler is not None and handler.endswith("ArrayCheckpointHandler")


def legacy_array_tree(item: Location, names: frozenset[str] | None = None) -> TreeMetadata | None:
    """The tree of an ``ArraySave`` item written without ``_METADATA`` (Orbax before 0.12):
    one array stored as ``checkpoint``, in plain zarr (``checkpoint/.zarray``, 0.5-0.11) or in
    an OCDBT database at the item root (0.4). None when ``item`` is no such item."""
    if names is None:
        names = frozenset(e.name for e in item.list())
    if TREE_METADATA in names:
        return None
    ocdbt = MANIFEST in names
    if ocdbt and any(is_process_db(n) or n == "array_metadatas" for n in names):
        # Per-process databases came with 0.5, which writes _METADATA into every PyTree
        # item: such an item without it is damaged, not 0.4's ArraySave.
        return None
    if ocdbt:
        zarr3 = False  # 0.4.x, the only releases that wrote it so, had zarr2 alone
    elif ARRAY_ITEM_LEAF in names and item.child(ARRAY_ITEM_LEAF).is_dir():
        zarr3 = item.child(ARRAY_ITEM_LEAF, "zarr.json").is_file()
        if not zarr3 and not item.child(ARRAY_ITEM_LEAF, ".zarray").is_file():
            return None
    else:
        return None
    value_type = "jax.Array" if "_sharding" in names else "np.ndarray"
    leaf = LeafMeta((ARRAY_ITEM_LEAF,), (KEY_TYPE_DICT,), value_type, False, None)
    return TreeMetadata((leaf,), ocdbt, zarr3)


_ZARR3_FLAG = re.compile(rb'"use_zarr3"\s*:\s*(true|false)')
_OCDBT_FLAG = re.compile(rb'"use_ocdbt"\s*:\s*(true|false)')


def peek_storage_flags(item: Location) -> tuple[bool | None, bool] | None:
    """(use_ocdbt, use_zarr3) of an item without parsing a possibly huge ``_METADATA``;
    use_ocdbt is None where Orbax did not record it (before 0.12).

    Orbax writes the flags after the tree, so the file's tail holds them; ``ls`` over a
    thousand steps of ten thousand leaves each must not parse every tree. 0.5-0.11 write
    ``use_zarr3`` there but no ``use_ocdbt``; 0.4 writes neither (then the tree is parsed).
    """
    loc = item.child(TREE_METADATA)
    if not loc.is_file():
        return None
    tail = loc.read_tail(FLAGS_TAIL_BYTES)
    ocdbt, zarr3 = _OCDBT_FLAG.search(tail), _ZARR3_FLAG.search(tail)
    if zarr3:
        return (ocdbt.group(1) == b"true" if ocdbt else None), zarr3.group(1) == b"true"
    tree = read_tree_metadata(item)
    return None if tree is None else (tree.use_ocdbt, tree.use_zarr3)


@dataclass(frozen=True)
class ArrayMetadata:
    """One entry of ``array_metadatas/process_N``."""

    param_name: str
    write_shape: tuple[int, ...] | None
    chunk_shape: tuple[int, ...] | None
    ext_metadata: dict[str, Any] | None
    process: int


def read_array_metadatas(item: Location) -> dict[str, ArrayMetadata]:
    """All ``array_metadatas/process_*`` files merged by param name (process 0 wins ties)."""
    folder = item.child("array_metadatas")
    if not folder.is_dir():
        return {}
    out: dict[str, ArrayMetadata] = {}
    files = [e.name for e in folder.list() if e.name.startswith("process_")]
    for fname in sorted(
        files,
        key=lambda n: int(n.split("_")[-1]) if n.split("_")[-1].isdigit() else 0,
        reverse=True,
    ):
        loc = folder.child(fname)
        raw = loc.read_json()
        try:
            proc = int(fname.split("_")[-1])
            for entry in raw["array_metadatas"]:
                meta = entry["array_metadata"]
                name = str(meta["param_name"])
                ws, cs = meta.get("write_shape"), meta.get("chunk_shape")
                out[name] = ArrayMetadata(
                    name,
                    None if ws is None else tuple(int(d) for d in ws),
                    None if cs is None else tuple(int(d) for d in cs),
                    meta.get("ext_metadata")
                    if isinstance(meta.get("ext_metadata"), dict)
                    else None,
                    proc,
                )
        except (KeyError, TypeError, ValueError):
            raise InvalidMetadataError(f"{loc} does not have the array_metadatas layout") from None
    return out


def read_strings(item: Location) -> dict[str, str]:
    """``_strings.json``: string leaves by param name."""
    loc = item.child("_strings.json")
    raw = loc.read_json_if_exists()
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidMetadataError(f"{loc} is not a JSON object")
    return {str(k): str(v) for k, v in raw.items()}
