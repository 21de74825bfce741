"""``RemoteLocation``: a path in a bucket, served from one prefix listing.

Object stores have no directories, only keys: a "directory" is a key prefix. The first question
about a location (``exists``, ``list``, ``walk``...) lists its whole prefix once, recursively,
1,000 keys a request with sizes and times (see ``objstore``), and every later question about
anything below it is answered from that listing: ``ls`` of a root of 1,000 steps costs a few
listing requests, not one per step or per file. Locations derived from one another (``child``,
``parent``) share the listing. The price: asking about one step of a root first lists the whole
root; point the command at the step's URL to list only the step.

Small files (metadata: ``read_bytes``, ``read_tail``, ``prefetch``) are read with the store's own
HTTP client, the one that lists (``ObjectStore.read_object``): ``ls`` and ``inspect`` of a bucket
import neither TensorStore nor numpy. Data reads (``iter_bytes``), writes and deletes go through
TensorStore (``kvstore_spec``). The listing is kept in step
with the writes and deletes made through this class; ``refresh()`` drops it after writes made by
TensorStore directly (arrays) and before a re-check that must see the store as it is now.

Object stores have no rename (``requires_commit_marker``): writers write a step in place and put
a commit marker last; ``delete_tree`` deletes object by object, in the order its caller asks.
"""

from __future__ import annotations

import builtins
import contextlib
from collections import deque
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from ckpt_cli.core.storage.base import (
    MAX_METADATA_BYTES,
    Entry,
    Location,
    Lock,
    NotACheckpointDirError,
)
from ckpt_cli.core.storage.bulk import delete_all
from ckpt_cli.core.storage.objstore import PART_BYTES, ObjectStore
from ckpt_cli.core.storage.options import StorageOptions
from ckpt_cli.core.storage.prefixes import Listing
from ckpt_cli.core.storage.remote_bulk import RemoteBulk
from ckpt_cli.core.storage.stores import open_store
from ckpt_cli.errors import CkptError, InvalidMetadataError, NotFoundError, StorageError

#: Ranged reads one ``iter_bytes`` keeps in flight.
READ_AHEAD = 4


class RemoteLocation(RemoteBulk, Location):
    """``s3://bucket/key`` or ``gs://bucket/key``; ``key`` has no leading or trailing slash."""

    requires_commit_marker = True

    def __init__(self, listing: Listing, key: str) -> None:
        self._listing = listing
        self.key = key.strip("/")

    @property
    def store(self) -> ObjectStore:
        return self._listing.store

    @property
    def options(self) -> StorageOptions:
        return self.store.options

    @property
    def parallel_reads(self) -> int:  # type: ignore[override]
        return self.options.max_requests

    @property
    def _dir(self) -> str:
        return self.key + "/" if self.key else ""

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1] if self.key else self.store.bucket

    @property
    def parent(self) -> RemoteLocation:
        return RemoteLocation(self._listing, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def child(self, *parts: str) -> RemoteLocation:
        rel = "/".join(p.strip("/") for p in parts if p.strip("/"))
        return RemoteLocation(self._listing, f"{self._dir}{rel}")

    # Questions answered from the listing.

    def _children(self) -> dict[str, list[tuple[str, int, float]]]:
        """The keys below, with their sizes and times, by child name (taken in one go: see
        ``Listing.below_info``)."""
        groups: dict[str, list[tuple[str, int, float]]] = {}
        for k in self._listing.below_info(self._dir):
            groups.setdefault(k[0][len(self._dir) :].split("/", 1)[0], []).append(k)
        groups.pop("", None)  # a "directory marker" object named like the prefix itself
        return groups

    def is_dir(self) -> bool:
        if not self.key:
            return True
        self._listing.ensure(self._dir)
        return bool(self._listing.below(self._dir))

    def is_file(self) -> bool:
        if not self.key:
            return False
        if not self._listing.covered(self.key):
            with self._listing.lock:
                if not self._listing.covered(self.key):
                    try:
                        first = next(iter(self.store.list_objects(self.key, limit=1)), None)
                    except Exception as e:
                        raise self.store.error(f"cannot list {self}", e) from None
                    if first is not None and first.key == self.key:
                        self._listing.added(first.key, first.size, first.mtime, first.tag)
                    return first is not None and first.key == self.key
        return self.key in self._listing.info

    def exists(self) -> bool:
        return self.is_dir() or self.is_file()

    def is_symlink(self) -> bool:
        return False

    def list(self) -> list[Entry]:
        groups = self._children()
        if not groups:
            if self.is_file():
                raise NotACheckpointDirError(f"{self} is a file, not a directory")
            raise NotFoundError(f"{self} does not exist")
        out = []
        for name, keys in sorted(groups.items()):
            if len(keys) == 1 and keys[0][0] == f"{self._dir}{name}":
                out.append(Entry(name, False, keys[0][1], keys[0][2]))
            else:
                out.append(Entry(name, True, 0, max(mtime for _, _, mtime in keys)))
        return out

    def walk(self) -> Iterator[tuple[str, Entry]]:
        for k, size, mtime in self._listing.below_info(self._dir):
            if k.endswith("/"):
                continue
            rel = k[len(self._dir) :]
            yield rel, Entry(rel.rsplit("/", 1)[-1], False, size, mtime)

    def mtime(self) -> float:
        if self.is_file():
            return self._listing.info[self.key][1]
        keys = self._listing.below(self._dir) if self.is_dir() else []
        if not keys:
            raise NotFoundError(f"{self} does not exist")
        return max(self._listing.info[k][1] for k in keys)

    def size(self) -> int:
        if not self.is_file():
            raise NotFoundError(f"{self} does not exist")
        return self._listing.info[self.key][0]

    def content_tag(self) -> str | None:
        return self._listing.tags.get(self.key) if self.is_file() else None

    def resolve(self) -> RemoteLocation:
        return self

    def is_within(self, other: Location) -> bool:
        if not isinstance(other, RemoteLocation) or other.store is not self.store:
            return False
        return not other.key or self.key == other.key or self.key.startswith(other._dir)

    # Small reads through the store's HTTP client; data reads and writes through TensorStore.

    def _read(self, start: int | None = None, end: int | None = None) -> bytes:
        try:
            data = self.store.read_object(self.key, start, end)
        except Exception as e:
            raise self.store.error(f"cannot read {self}", e) from None
        if data is None:
            if self.is_dir():
                raise InvalidMetadataError(f"{self} is a directory, expected a file")
            raise NotFoundError(f"{self} does not exist")
        return data

    def read_bytes(self, limit: int = MAX_METADATA_BYTES) -> bytes:
        if self.key in self._listing.info and self._listing.info[self.key][0] > limit:
            raise InvalidMetadataError(f"{self} is larger than {limit} bytes")
        data = self._listing.take(self.key, None)
        if data is None:
            data = self._read()
        if len(data) > limit:
            raise InvalidMetadataError(f"{self} is larger than {limit} bytes")
        return data

    def read_tail(self, size: int) -> bytes:
        # A suffix range longer than the object fails (OUT_OF_RANGE): start from its known size.
        total = self.size() if self.is_file() else None
        if total is None or total <= size:
            return self._listing.take(self.key, None) or self._read()
        return self._listing.take(self.key, size) or self._read(total - size, total)

    def iter_bytes(self, block_size: int = 4 << 20) -> Iterator[bytes]:
        """Pieces in order, ``READ_AHEAD`` ranged reads in flight (memory: that many pieces)."""
        total = self.size()
        kv = self._listing.kv()
        starts = iter(range(0, total, block_size))
        pending: deque[Any] = deque()
        while True:
            while len(pending) < READ_AHEAD and (a := next(starts, None)) is not None:
                pending.append(kv.read(self.key, byte_range=slice(a, min(total, a + block_size))))
            if not pending:
                return
            try:
                result = pending.popleft().result()
            except Exception as e:
                raise self.store.error(f"cannot read {self}", e) from None
            if result.state != "value":
                raise NotFoundError(f"{self} does not exist")
            yield bytes(result.value)

    def write_bytes(self, data: bytes, *, create_parents: bool = True) -> None:
        """A plain put: an object appears whole or not at all, no temporary name needed."""
        import time

        try:
            self._listing.kv().write(self.key, data).result()
        except Exception as e:
            raise self.store.error(f"cannot write {self}", e) from None
        self._listing.added(self.key, len(data), time.time())

    def write_stream(self, pieces: Iterable[bytes], size: int) -> None:
        """Up to ``PART_BYTES``: one put of the joined pieces; larger: the store's multipart
        or resumable upload, a part at a time (memory: one part)."""
        import time

        if size <= PART_BYTES:
            data = b"".join(pieces)
            if len(data) != size:
                raise StorageError(f"cannot write {self}: {len(data)} bytes, not {size}")
            self.write_bytes(data)
            return
        try:
            self.store.upload(self.key, _parts(pieces, PART_BYTES), size)
        except Exception as e:
            raise self.store.error(f"cannot write {self}", e) from None
        self._listing.added(self.key, size, time.time())

    def make_dirs(self) -> None:
        """Nothing to do: directories are implicit in object stores."""

    def delete_tree(self, *, first: Collection[str] = (), last: Collection[str] = ()) -> None:
        """Delete every object below: those named in ``first`` (anywhere below), then the rest,
        then those named in ``last`` directly inside this directory."""
        self.refresh()
        keys = self._children_keys()
        if not keys:
            raise NotFoundError(f"{self} does not exist")
        early = [k for k in keys if k.rsplit("/", 1)[-1] in first]
        late = [k for k in keys if k[len(self._dir) :] in last and k not in early]
        ordered = set(early) | set(late)
        self._delete(early)
        self._delete([k for k in keys if k not in ordered])
        self._delete(late)

    def delete_file(self) -> None:
        if not self.is_file():
            raise NotFoundError(f"{self} does not exist")
        self._delete([self.key])

    def _children_keys(self) -> builtins.list[str]:
        self._listing.ensure(self._dir)
        return self._listing.below(self._dir) if self.key else []

    def _delete(self, keys: builtins.list[str]) -> None:
        failed = delete_all(self.store, keys)
        for k in keys:
            if k not in failed:
                self._listing.removed(k)
        if failed:
            key, why = next(iter(failed.items()))
            raise StorageError(f"cannot delete {self.store.url(key)}: {why}")

    def rename(self, new_name: str) -> Location:
        raise StorageError(f"cannot rename {self}: object stores have no rename")

    def try_lock(self, owner: str, *, record_required: bool = True) -> Lock | None:
        """A lock object put only if absent (a conditional put: S3 If-None-Match, GCS
        ifGenerationMatch=0). Released by deleting it; a holder that is killed leaves it behind,
        and the next caller is refused until someone deletes it (see the message)."""
        kv = self._listing.kv()
        try:
            current = kv.read(self.key).result()
            if current.state == "value":
                return None
            stamp = kv.write(self.key, owner.encode(), if_equal=current.stamp.generation).result()
        except Exception as e:
            raise self.store.error(f"cannot take the lock {self}", e) from None
        if not stamp.generation:
            return None  # someone else put it between our read and our write
        return _ObjectLock(self, stamp.generation)

    def refresh(self) -> None:
        self._listing.forget(self.key)

    def notes(self) -> tuple[str, ...]:
        return tuple(self._listing.notes)

    def describe_error(self, e: BaseException) -> str:
        return self.store.describe(e)

    def kvstore_spec(self) -> dict[str, Any]:
        return self.store.kvstore_spec(self._dir)

    def __str__(self) -> str:
        return self.store.url(self.key)

    def __repr__(self) -> str:
        return f"RemoteLocation({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RemoteLocation)
            and other.store.identity() == self.store.identity()
            and other.key == self.key
        )

    def __hash__(self) -> int:
        return hash((self.store.identity(), self.key))


class _ObjectLock(Lock):
    def __init__(self, location: RemoteLocation, generation: bytes) -> None:
        self.location = location
        self.generation: bytes | None = generation

    def release(self) -> None:
        if self.generation is None:
            return
        loc, self.generation = self.location, None
        # On failure the lock stays; the next prune names it and says how to remove it.
        try:
            with contextlib.suppress(CkptError):
                loc._delete([loc.key])
        except BaseException:
            # A signal in the middle of the DELETE (the run's last request, where a Ctrl-C
            # lands often enough): finish releasing, then stop. A second signal meanwhile
            # ends the process at once (app._on_signal).
            with contextlib.suppress(Exception):
                loc._delete([loc.key])
            raise


def _parts(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """``pieces`` regrouped into parts of exactly ``size`` bytes (the last one shorter)."""
    buf = bytearray()
    for piece in pieces:
        buf += piece
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


def open_remote(url: str, options: StorageOptions | None = None) -> RemoteLocation:
    """``s3://bucket/path`` or ``gs://bucket/path`` as a location with a fresh listing."""
    scheme, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    if not bucket:
        from ckpt_cli.errors import UsageError

        raise UsageError(f"{url} names no bucket: use {scheme}://BUCKET/PATH")
    return RemoteLocation(Listing(open_store(scheme, bucket, options)), key)
