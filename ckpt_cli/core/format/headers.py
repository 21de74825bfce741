"""Zarr headers and one-chunk arrays of an item on an object store, read without TensorStore.

``inspect`` of a bucket needs every leaf's zarr header and, for the step counter, one small
chunk. Plain zarr items keep them as objects: one GET each, all in flight together. OCDBT items
keep them (inline, up to 1,024 bytes) in the leaf nodes of the database's b-tree
(``ocdbt.py``): the manifest, then each level of nodes at once, a handful of ranged GETs for
10,000 leaves, every node decoded once. Importing TensorStore (numpy, ml_dtypes) would cost
more than all of that.

``DirectReader`` answers None wherever it cannot answer as TensorStore would (a local disk,
no libzstd or CRC-32C here, a numbered manifest, damage, a failed request): the caller then
reads through TensorStore, whose answers and error messages stay the reference.
"""

from __future__ import annotations

from typing import Any

from ckpt_cli.core.format import codecs
from ckpt_cli.core.format.names import array_prefix, unsafe_as_path
from ckpt_cli.core.format.ocdbt import Value, read_values
from ckpt_cli.core.storage import Location
from ckpt_cli.core.storage.base import loads_json
from ckpt_cli.errors import CkptError

#: Raw headers by leaf name, each with the label of the database that holds it.
Headers = dict[str, tuple[bytes, str]]


class DirectReader:
    """Headers and small chunks of one item's arrays, by plain requests to its object store."""

    def __init__(self, item: Location, layout: str, databases: list[str], zarr3: bool) -> None:
        self.item = item
        self.layout = layout  # ocdbt | ocdbt-unmerged | zarr
        self.databases = databases  # labels in lookup order ("" for the item itself)
        self.zarr3 = zarr3
        self.header_name = "zarr.json" if zarr3 else ".zarray"
        self._values: dict[str, dict[bytes, Value]] | None = None

    @property
    def usable(self) -> bool:
        if self.layout == "zarr":
            # Plain items on a local disk: TensorStore, as ever (one file per header anyway).
            return self.item.parallel_reads > 1
        return codecs.available()

    def headers(self, names: list[str]) -> Headers | None:
        """Raw headers of ``names`` (a name absent from the result has none); None: read them
        through TensorStore instead."""
        if not self.usable or any(self._unsafe(n) for n in names):
            return None
        try:
            if self.layout == "zarr":
                return self._plain_headers(names)
            return self._database_headers(names)
        except (CkptError, ValueError, NotImplementedError):  # OcdbtFormatError, bad UTF-8
            return None

    def scalar(self, name: str, header: bytes | None, dtype: str, label: str) -> int | float | None:
        """The one element of a one-element array; None: read it through TensorStore."""
        if header is None or not self.usable or self._unsafe(name):
            return None
        try:
            doc = loads_json(header, f"the zarr header of {name}")
            key = array_prefix(name) + _first_chunk_key(doc)
            if self.layout == "zarr":
                chunk = self.item.child(key).read_bytes()
            else:
                found = self._database_values().get(label, {}).get(key.encode())
                if found is None:
                    return None
                chunk = self._resolve({key: found}, label)[key]
        except (CkptError, ValueError, KeyError, TypeError, AttributeError, NotImplementedError):
            return None
        return codecs.zarr_scalar(doc, chunk, dtype) if isinstance(doc, dict) else None

    def _unsafe(self, name: str) -> bool:
        # Plain items keep arrays in directories named after the leaf: names TensorStore
        # refuses there go to TensorStore, for its refusal.
        return self.layout == "zarr" and unsafe_as_path(name) is not None

    def _plain_headers(self, names: list[str]) -> Headers:
        locs = {n: self.item.child(array_prefix(n) + self.header_name) for n in names}
        present = {n: loc for n, loc in locs.items() if loc.is_file()}
        self.item.prefetch(list(present.values()))
        return {n: (loc.read_bytes(), "") for n, loc in present.items()}

    def _database_headers(self, names: list[str]) -> Headers:
        values = self._database_values()
        out: Headers = {}
        for label in self.databases:
            found = values.get(label, {})
            wanted = {
                n: found[key]
                for n in names
                if n not in out and (key := (array_prefix(n) + self.header_name).encode()) in found
            }
            for n, data in self._resolve(wanted, label).items():
                out[n] = (data, label)
        return out

    def _database_values(self) -> dict[str, dict[bytes, Value]]:
        """Every key of each database with its value (inline) or where it is."""
        if self._values is None:
            self._values = {label: self._read_database(label) for label in self.databases}
        return self._values

    def _read_database(self, label: str) -> dict[bytes, Value]:
        db = self.item.child(label) if label else self.item
        manifest = db.child("manifest.ocdbt").read_bytes()

        def fetch(refs: list[tuple[str, int, int]]) -> list[bytes]:
            return self.item.read_ranges([(db.child(p), o, o + n) for p, o, n in refs])

        return read_values(manifest, fetch, _small)

    def _resolve(self, wanted: dict[str, Value], label: str) -> dict[str, bytes]:
        """Inline values as they are; out-of-line ones fetched, all at once."""
        db = self.item.child(label) if label else self.item
        out = {n: v for n, v in wanted.items() if isinstance(v, bytes)}
        refs = [(n, v) for n, v in wanted.items() if not isinstance(v, bytes)]
        data = self.item.read_ranges([(db.child(p), o, o + size) for _, (p, o, size) in refs])
        for (n, _), got in zip(refs, data, strict=True):
            out[n] = got
        return out


def _small(key: bytes) -> bool:
    """Keys worth keeping from a walk: headers, and the chunks of one-chunk arrays (``0``,
    ``c``, ``c/0``...); big chunk values are never fetched, only their references kept."""
    tail = key.rsplit(b"/", 1)[-1]
    return tail in (b".zarray", b"zarr.json") or tail.strip(b"0.") == b"" or tail == b"c"


def _first_chunk_key(doc: Any) -> str:
    """The key of chunk (0, ..., 0) of the array ``doc`` describes."""
    rank = len(doc["shape"])
    if doc.get("zarr_format") == 3:
        encoding = doc.get("chunk_key_encoding", {"name": "default"})
        conf = encoding.get("configuration", {})
        if encoding.get("name") == "v2":
            sep = conf.get("separator", ".")
            return str(sep).join(["0"] * rank) if rank else "0"
        sep = conf.get("separator", "/")
        return str(sep).join(["c", *["0"] * rank])
    sep = doc.get("dimension_separator", ".")
    return str(sep).join(["0"] * rank) if rank else "0"
