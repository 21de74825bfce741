"""Array access through TensorStore: one kvstore per item, batched zarr header reads, lazy opens.

An item's arrays live in a merged OCDBT database at the item root, in per-process OCDBT databases
only (before Orbax 0.4.4), or as plain zarr directories (``use_ocdbt=False``). ``ItemStore`` hides
which: it reads every leaf's ``.zarray``/``zarr.json`` with one concurrent batch of kvstore reads
(not one ``ts.open`` per leaf) and opens a leaf's data only when asked.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.format.dtypes import dtype_itemsize, normalize_dtype
from ckpt_cli.core.format.headers import DirectReader
from ckpt_cli.core.format.names import (
    array_prefix,
    chunk_index_from_key,
    is_process_db,
    split_key,
    unsafe_as_path,
)
from ckpt_cli.core.format.sizes import size_problem
from ckpt_cli.core.storage import Location
from ckpt_cli.core.storage.base import loads_json
from ckpt_cli.errors import InvalidMetadataError, StorageError

MAX_RANK = 32  # TensorStore's limit
MAX_ELEMENTS = 1 << 62


@dataclass(frozen=True)
class ArrayInfo:
    """What a leaf's zarr header says: the real dtype, global shape and chunking."""

    dtype: str
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    zarr_format: int
    compression: str | None
    inner_chunk_shape: tuple[int, ...] | None = None  # zarr3 sharding_indexed sub-chunks

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return dtype_itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def chunk_grid(self) -> tuple[int, ...]:
        return tuple(
            -(-s // c) if c else 0 for s, c in zip(self.shape, self.chunk_shape, strict=True)
        )

    @property
    def num_chunks(self) -> int:
        return math.prod(self.chunk_grid)

    def chunk_box(self, index: tuple[int, ...]) -> tuple[slice, ...]:
        """The region the chunk at ``index`` covers (cut at the array's edge)."""
        return tuple(
            slice(i * c, min((i + 1) * c, s))
            for i, c, s in zip(index, self.chunk_shape, self.shape, strict=True)
        )

    def chunk_nbytes(self, index: tuple[int, ...]) -> int:
        return math.prod(int(b.stop) - int(b.start) for b in self.chunk_box(index)) * self.itemsize

    @property
    def decode_shape(self) -> tuple[int, ...]:
        """The unit TensorStore decodes whole: a zarr3 shard's inner chunk, else the chunk."""
        return self.inner_chunk_shape or self.chunk_shape

    @property
    def decoded_chunk_bytes(self) -> int:
        unit = zip(self.decode_shape, self.shape, strict=True)
        return math.prod(min(c, s) for c, s in unit) * self.itemsize

    @property
    def num_decoded_chunks(self) -> int:
        unit = zip(self.shape, self.decode_shape, strict=True)
        return math.prod(-(-s // c) if c else 0 for s, c in unit)


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_RANK:
        raise ValueError(f"{what} is not a list of at most {MAX_RANK} dimensions")
    dims = []
    for d in value:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0 or d > MAX_ELEMENTS:
            raise ValueError(f"{what} has an impossible dimension {d!r}")
        dims.append(d)
    return tuple(dims)


def parse_zarr_header(name: str, raw: bytes, where: str) -> ArrayInfo:
    """Validate and read a ``.zarray`` (zarr2) or ``zarr.json`` (zarr3) header."""
    try:
        return _parse_header(raw)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise InvalidMetadataError(
            f"zarr header of leaf {name!r} in {where} is invalid: {str(e).splitlines()[0]}",
            hint="the checkpoint is damaged; run `ckpt verify` on it",
        ) from None


# Trees repeat the same few headers (every layer's kernel alike): parse each distinct one once.
@functools.lru_cache(maxsize=4096)
def _parse_header(raw: bytes) -> ArrayInfo:
    doc = loads_json(raw, "the zarr header")
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("zarr_format") == 3:
        shape = _shape(doc["shape"], "shape")
        chunks = _shape(doc["chunk_grid"]["configuration"]["chunk_shape"], "chunk_shape")
        dtype = normalize_dtype(doc["data_type"])
        inner, compression = None, None
        for codec in doc.get("codecs", []):
            if codec.get("name") == "sharding_indexed":
                conf = codec.get("configuration", {})
                inner = _shape(conf.get("chunk_shape", []), "inner chunk_shape")
                compression = _compression(conf.get("codecs", []))
        if compression is None:
            compression = _compression(doc.get("codecs", []))
        info = ArrayInfo(dtype, shape, chunks, 3, compression, inner)
    elif doc.get("zarr_format") == 2:
        shape = _shape(doc["shape"], "shape")
        chunks = _shape(doc["chunks"], "chunks")
        dtype = normalize_dtype(doc["dtype"])
        comp = doc.get("compressor")
        compression = None if comp is None else _codec_str(comp.get("id"), comp.get("level"))
        info = ArrayInfo(dtype, shape, chunks, 2, compression)
    else:
        raise ValueError("zarr_format is neither 2 nor 3")
    if len(info.chunk_shape) != len(info.shape) or (info.size and 0 in info.chunk_shape):
        raise ValueError(
            f"chunk shape {list(info.chunk_shape)} does not fit shape {list(info.shape)}"
        )
    if info.size > MAX_ELEMENTS // max(1, info.itemsize):
        raise ValueError(f"shape {list(info.shape)} is absurdly large")
    return info


def _codec_str(name: Any, level: Any) -> str:
    return f"{name}:{level}" if level is not None else str(name)


def _compression(codecs: list[Any]) -> str | None:
    for c in codecs:
        if isinstance(c, dict) and c.get("name") not in ("bytes", "transpose", "crc32c"):
            return _codec_str(c.get("name"), c.get("configuration", {}).get("level"))
    return None


class ItemStore:
    """The arrays of one item, wherever the item keeps them."""

    def __init__(self, item: Location, use_zarr3: bool, context: Any = None) -> None:
        #: A ``ts.Context`` shared by every open (a chunk cache for readers that revisit chunks).
        self.context = context
        #: Where a leaf's chunk lies in a local data file, (leaf, chunk key) -> (path, offset,
        #: length) or None, when the caller knows (``verify.gate.chunk_locator``): the readers'
        #: whole-chunk decodes read those bytes from the file, not through the OCDBT kvstore.
        self.locate: Any = None
        self.item = item
        self.use_zarr3 = use_zarr3
        children = {e.name: e for e in item.list()}
        self.merged = "manifest.ocdbt" in children
        #: Per-process databases, whatever their id (``names.is_process_db``).
        self.process_dbs = sorted(n for n, e in children.items() if e.is_dir and is_process_db(n))
        if self.merged:
            self.layout = "ocdbt"
        elif self.process_dbs:
            self.layout = "ocdbt-unmerged"
        else:
            self.layout = "zarr"
        self._kvstores: dict[str, Any] = {}
        self._raw_headers: dict[str, bytes] = {}
        labels = self.process_dbs if self.layout == "ocdbt-unmerged" else [""]
        self.direct = DirectReader(item, self.layout, labels, use_zarr3)  # no TensorStore

    @functools.cached_property
    def stored_bytes(self) -> int:
        """Bytes of every file below the item (listed once, only when a header needs it)."""
        return self.item.du()

    def check_size(self, name: str, info: ArrayInfo, where: str = "") -> ArrayInfo:
        """``info`` unless ``sizes.size_problem`` finds its sizes absurd (InvalidMetadataError)."""
        why = size_problem(info, lambda: self.stored_bytes)
        if why is not None:
            raise InvalidMetadataError(
                f"leaf {name!r} in {where or self.item} cannot be read: {why}",
                hint="the zarr header is damaged or forged; run `ckpt verify` on it",
            )
        return info

    @property
    def header_name(self) -> str:
        return "zarr.json" if self.use_zarr3 else ".zarray"

    def _base_specs(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, kvstore spec) of each database holding this item's arrays, in lookup order."""
        if self.layout == "ocdbt":
            return [("", {"driver": "ocdbt", "base": self.item.kvstore_spec()})]
        if self.layout == "ocdbt-unmerged":
            return [
                (db, {"driver": "ocdbt", "base": self.item.child(db).kvstore_spec()})
                for db in self.process_dbs
            ]
        return [("", self.item.kvstore_spec())]

    def _kvstore(self, label: str, spec: dict[str, Any]) -> Any:
        import tensorstore as ts

        if label not in self._kvstores:
            try:
                self._kvstores[label] = ts.KvStore.open(spec, context=self.context).result()
            except Exception as e:  # TensorStore raises ValueError for every I/O problem
                raise StorageError(
                    f"cannot open the array database of {self.item}: {self.item.describe_error(e)}",
                    hint="run `ckpt verify` on it",
                ) from None
        return self._kvstores[label]

    def read_headers(self, names: list[str]) -> dict[str, tuple[ArrayInfo, str]]:
        """Zarr headers of many leaves in one concurrent batch: name -> (info, database label)."""
        raw, errors = self.read_header_bytes(names)
        if errors:
            n, message = next(iter(errors.items()))
            raise StorageError(
                f"cannot read the zarr header of {n!r} in {self.item}: {message}",
                hint="run `ckpt verify` on it",
            )
        out: dict[str, tuple[ArrayInfo, str]] = {}
        for n, (data, label) in raw.items():
            where = str(self.item) + (f"/{label}" if label else "")
            out[n] = (self.check_size(n, parse_zarr_header(n, data, where), where), label)
        return out

    def read_header_bytes(
        self, names: list[str]
    ) -> tuple[dict[str, tuple[bytes, str]], dict[str, str]]:
        """Raw zarr headers, unparsed and never raising: (name -> (bytes, database label),
        name -> read error); a name in neither has no header in any database. Read directly
        (``headers.py``) where possible, else in one TensorStore batch per database."""
        if (direct := self.direct.headers(names)) is not None:
            self._raw_headers.update((n, data) for n, (data, _) in direct.items())
            return direct, {}
        found, errors, missing = {}, {}, list(names)
        for label, spec in self._base_specs():
            if not missing:
                break
            kv = self._kvstore(label, spec)
            futures = [(n, kv.read(array_prefix(n) + self.header_name)) for n in missing]
            still = []
            for n, fut in futures:
                try:
                    result = fut.result()
                except Exception as e:
                    errors[n] = self.item.describe_error(e)
                    continue
                if result.state != "value":
                    still.append(n)
                    continue
                found[n] = (bytes(result.value), label)
                self._raw_headers[n] = found[n][0]
            missing = still
        return found, errors

    def array_spec(self, name: str, label: str = "") -> dict[str, Any]:
        base = dict(self._base_specs())[label]
        if base["driver"] != "ocdbt" and (why := unsafe_as_path(name)):
            # A plain item keeps arrays in directories named after the leaf: a name such as
            # `..` would lead out of the item. Orbax cannot write one there either.
            raise StorageError(
                f"leaf {name!r} of {self.item} cannot be a directory of a plain (non-OCDBT) "
                f"item: {why}",
                hint="the _METADATA of this item is damaged or was not written by Orbax",
            )
        return {
            "driver": "zarr3" if self.use_zarr3 else "zarr",
            "kvstore": {**base, "path": array_prefix(name)}
            if base["driver"] == "ocdbt"
            else {**base, "path": base["path"] + array_prefix(name)},
            # Orbax writes every chunk, so a missing one is damage, never zeros.
            "fill_missing_data_reads": False,
            # A checkpoint being read does not change: what an open read (the OCDBT manifest
            # and tree nodes, shared by every array of the item in one context) stays valid.
            # Rechecking made every open revalidate the manifest: one request per array, one
            # array after another (10,000 leaves: 5,087 manifest requests behind 25 ms).
            "recheck_cached_metadata": False,
            "recheck_cached_data": False,
        }

    def open_array(self, name: str, label: str = "") -> Any:
        import tensorstore as ts

        try:
            spec = self.array_spec(name, label)
            return ts.open(spec, open=True, read=True, context=self.context).result()
        except Exception as e:
            raise StorageError(
                f"cannot open leaf {name!r} of {self.item}: {self.item.describe_error(e)}",
                hint="run `ckpt verify` on it",
            ) from None

    def read_scalar(self, name: str, info: ArrayInfo, label: str = "") -> int | float:
        """The one element of a one-element leaf: from its chunk directly where it can."""
        value = self.direct.scalar(name, self._raw_headers.get(name), info.dtype, label)
        if value is None:
            value = self.reader(name, info, label).read(()).result().reshape(-1)[0].item()
        return value

    @property
    def multi_chunk_blocks(self) -> bool:
        """Whether this item's readers read blocks spanning chunks (``LeafReader``): all but
        an unmerged OCDBT item of several processes' databases (``_UnmergedReader``)."""
        return not (self.layout == "ocdbt-unmerged" and len(self.process_dbs) > 1)

    def reader(self, name: str, info: ArrayInfo, label: str = "") -> LeafReader:
        if not self.multi_chunk_blocks:
            if name not in self._raw_headers:
                self.read_headers([name])
            return _UnmergedReader(self, name, info)
        reader = LeafReader(self.open_array(name, label), info)
        if self.locate is not None:
            reader.locate = functools.partial(self.locate, name)
        return reader

    def database_keys(self) -> list[bytes]:
        """Every key (headers and chunks) of a merged OCDBT item's database, in one listing."""
        label, spec = self._base_specs()[0]
        kv = self._kvstore(label, spec)
        try:
            return [bytes(k) for k in kv.list().result()]
        except Exception as e:
            raise StorageError(f"cannot list {self.item}: {self.item.describe_error(e)}") from None

    def chunk_keys(self, label: str, name: str) -> list[bytes]:
        """Chunk keys of one leaf in one database (header excluded), prefix-listed."""
        import tensorstore as ts

        kv = self._kvstore(label, dict(self._base_specs())[label])
        prefix = array_prefix(name).encode()
        try:
            if prefix:
                rng = ts.KvStore.KeyRange(inclusive_min=prefix, exclusive_max=prefix[:-1] + b"0")
                keys = kv.list(rng, strip_prefix_length=len(prefix)).result()
            else:  # the dict key '': its chunks are top-level keys of the database
                keys = [k for k in kv.list().result() if split_key(k, self.use_zarr3)[0] == ""]
        except Exception as e:
            raise StorageError(
                f"cannot list leaf {name!r} in {self.item}: {self.item.describe_error(e)}"
            ) from None
        return [k for k in keys if k not in (b".zarray", b"zarr.json")]


class LeafReader:
    """Reads chunk-aligned blocks of one leaf; ``read`` returns a TensorStore future."""

    #: Blocks may span several chunks (False where each chunk lives in its own database).
    multi_chunk_blocks = True

    def __init__(self, array: Any, info: ArrayInfo) -> None:
        from ckpt_cli.core.format.ownreads import OwnReads

        self.array = array
        self.info = info
        self.own = OwnReads(array, info)

    @property
    def locate(self) -> Any:
        """Chunk key -> its place in a local file, or None (the kvstore): set by the store."""
        return self.own.locate

    @locate.setter
    def locate(self, where: Any) -> None:
        self.own.locate = where

    def read(self, block: tuple[slice, ...]) -> Any:
        """A future of the block's values: whole rows of large chunks, and parts of large
        chunks, decoded by ckpt itself (``ownreads``: a ``concurrent.futures.Future``); anything
        else, and any read that fails there, by TensorStore (its values, its errors)."""
        fut = self.own.read(block)
        return fut if fut is not None else self.array[block].read()


class _UnmergedReader(LeafReader):
    """Pre-0.4.4 layout: each process database holds its own chunks; the header is in one."""

    multi_chunk_blocks = False

    def __init__(self, store: ItemStore, name: str, info: ArrayInfo) -> None:
        import tensorstore as ts

        self.info = info
        self.name = name
        header = loads_json(store._raw_headers[name], f"the zarr header of {name}")
        zarr3 = store.use_zarr3
        self.owner: dict[tuple[int, ...], Any] = {}
        for db in store.process_dbs:
            spec = store.array_spec(name, db)
            spec["metadata"] = header
            try:
                arr = ts.open(spec, open=True, assume_metadata=True, context=store.context).result()
            except Exception as e:
                raise StorageError(
                    f"cannot open leaf {name!r} in {store.item}/{db}: {store.item.describe_error(e)}"
                ) from None
            for key in store.chunk_keys(db, name):
                index = () if not info.shape else chunk_index_from_key(key, zarr3)
                self.owner.setdefault(index, arr)

    def read(self, block: tuple[slice, ...]) -> Any:
        """One chunk: a future from its database. Any other region: assembled from the chunks
        it touches, each from the database that holds it (returned as an array)."""
        chunk = self.info.chunk_shape
        first = tuple(s.start // c for s, c in zip(block, chunk, strict=True))
        last = tuple((s.stop - 1) // c for s, c in zip(block, chunk, strict=True))
        if first == last:
            return self._owner(first)[block].read()
        import itertools

        import numpy as np

        out: Any = None
        for index in itertools.product(
            *(range(a, b + 1) for a, b in zip(first, last, strict=True))
        ):
            piece = tuple(
                slice(max(s.start, i * c), min(s.stop, (i + 1) * c))
                for s, i, c in zip(block, index, chunk, strict=True)
            )
            values = self._owner(index)[piece].read().result()
            if out is None:
                out = np.empty([s.stop - s.start for s in block], dtype=values.dtype)
            out[
                tuple(
                    slice(p.start - s.start, p.stop - s.start)
                    for p, s in zip(piece, block, strict=True)
                )
            ] = values
        return out

    def _owner(self, index: tuple[int, ...]) -> Any:
        arr = self.owner.get(index)
        if arr is None:
            raise StorageError(
                f"chunk {list(index)} of leaf {self.name!r} is in none of the per-process databases",
                hint="the checkpoint is damaged; run `ckpt verify` on it",
            )
        return arr


def cached_context(cache_bytes: int) -> Any:
    """A TensorStore context whose chunk cache holds up to ``cache_bytes`` of decoded chunks,
    decoding on this process's threads (``core/threads.py``)."""
    from ckpt_cli.core.threads import ts_context

    return ts_context(cache_pool={"total_bytes_limit": max(0, cache_bytes)})
